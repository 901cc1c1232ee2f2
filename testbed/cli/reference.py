"""The pages of the documentation written from the code, so that the two cannot disagree
(``docs/reference/``): every field of every description file (the tables of ``spec/fields.py``),
every command and flag (the argument parser, with its examples) and every summary figure with its
definition (``trace/metrics.METRICS``); and the results page's recorded tables, rendered from the
data the benchmark scripts write (``results/published.py``). ``scripts/reference_pages.py`` writes
them; a unit test regenerates them and fails where a committed page differs."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from pathlib import Path

from testbed.cli import build_parser
from testbed.cli.examples import EXAMPLES, subcommands
from testbed.net.remote.inventory import INVENTORY_FIELDS
from testbed.net.remote.machine import MACHINE_FIELDS
from testbed.results.published import RESULTS_DIR, TABLE_MARK, refresh_page
from testbed.spec.bubbletea import BUBBLETEA_FIELDS
from testbed.spec.compute import COMPUTE_FIELDS, DEVICE_FIELDS
from testbed.spec.experiment_fields import EXPERIMENT_FIELDS
from testbed.spec.fields import KINDS, Field, FieldTable
from testbed.spec.link_profile_fields import GENERATOR_FIELDS, PROFILE_FILE_FIELDS
from testbed.spec.model import MODEL_FIELDS
from testbed.spec.scenario_file import SCENARIO_DC_FIELDS, SCENARIO_FIELDS, SCENARIO_MODEL_FIELDS
from testbed.spec.topology_fields import ADDRESSING_FIELDS, DC_FIELDS, LINK_FIELDS, MATRIX_FIELDS, TOPOLOGY_FIELDS
from testbed.spec.units import format_duration_us, format_rate
from testbed.trace.metrics import METRICS, Metric

#: where the pages go, from the repository root
REFERENCE_DIR = Path("docs") / "reference"
GENERATED = "<!-- written by scripts/reference_pages.py from the code: edit the code, not this page -->"

#: the description files: (heading, where they live, their tables: the top level first)
FILE_FORMATS: tuple[tuple[str, str, tuple[FieldTable, ...]], ...] = (
    (
        "Experiment files",
        "`workloads/*.yaml`, or any path: `testbed run EXPERIMENT`",
        (EXPERIMENT_FIELDS, MODEL_FIELDS, COMPUTE_FIELDS, DEVICE_FIELDS, BUBBLETEA_FIELDS),
    ),
    (
        "Topology files",
        "`topologies/*.yaml`, or any path: `testbed topo show FILE`",
        (TOPOLOGY_FIELDS, DC_FIELDS, LINK_FIELDS, MATRIX_FIELDS, ADDRESSING_FIELDS),
    ),
    (
        "Link profiles",
        "a topology link's `profile`: a CSV (`time`, `rate`, `delay`, `jitter`, `loss` columns, a value with its "
        "unit per cell, `down`/`up` for the rate), a Mahimahi trace, a YAML file holding one of these mappings, "
        "or the mapping itself",
        (PROFILE_FILE_FIELDS, *GENERATOR_FIELDS.values()),
    ),
    (
        "Scenario files",
        "`workloads/scenarios/*.yaml`, or any path with a `device` key: `testbed sim SCENARIO`",
        (SCENARIO_FIELDS, SCENARIO_DC_FIELDS, SCENARIO_MODEL_FIELDS),
    ),
    ("Inventory files", "any path: `--backend remote --inventory FILE`", (INVENTORY_FIELDS, MACHINE_FIELDS)),
)


def anchor(heading: str) -> str:
    """The anchor a heading gets (``attr_list``'s ``{#...}``): lower case, words joined by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(f: Field) -> str:
    if f.required:
        return "required"
    if f.default_text:
        return f.default_text
    value = f.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if f.kind == "rate":
        return f"`{format_rate(value)}`"
    if f.kind == "duration":
        return f"`{format_duration_us(value)}`"
    if f.kind == "percent":
        return f"`{value:g}%`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _field_row(f: Field) -> str:
    what = f.doc + (f" (see [{f.table}](#{anchor(f.table)}))" if f.table else "")
    unit = f.unit if f.kind in ("int", "number") else ""
    cells = (f"`{f.name}`", KINDS[f.kind][0], unit, _default(f), f.allowed_text(), what)
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def table_section(table: FieldTable) -> str:
    """A table's heading, sentence and one row per field."""
    lines = [
        f"### {table.name} {{#{anchor(table.name)}}}",
        "",
        table.doc + (f" Written as `{table.where}`." if table.where else ""),
        "",
        "| field | kind | unit | default | allowed | what it is |",
        "|---|---|---|---|---|---|",
        *(_field_row(f) for f in table.fields),
    ]
    return "\n".join(lines)


def files_page(formats: Iterable[tuple[str, str, tuple[FieldTable, ...]]] = FILE_FORMATS) -> str:
    """``files.md``: every field of every description file, from its table."""
    parts = [
        GENERATED,
        "# Description files",
        "",
        "Every field of every file the testbed reads, with its kind, unit, default and allowed values. A file is "
        "checked when it is loaded: an error names the file, the field, the value and the fix. Rates, durations "
        "and sizes are written with their unit (`100mbit`, `10ms`, `64MiB`); a duration is one way.",
    ]
    for heading, where, tables in formats:
        parts += ["", f"## {heading}", "", f"Where: {where}.", ""]
        parts += [table_section(t) + "\n" for t in tables]
    return "\n".join(parts).rstrip() + "\n"


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    shown = ", ".join(f"`{s}`" for s in action.option_strings)
    if action.nargs != 0:
        value = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
        shown += f" `{action.metavar or value}`"
    return shown


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": "testbed"}
    return text


def _flag_default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    return f"`{action.default}`"


def _command_helps(parser: argparse.ArgumentParser, words: str = "") -> dict[str, str]:
    """Each subcommand's one-line help, as its parent lists it, by its words after ``testbed``."""
    out: dict[str, str] = {}
    for action in parser._actions:  # argparse keeps its subparsers there and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                full = f"{words} {choice.dest}".strip()
                out[full] = choice.help or ""
                out |= _command_helps(action.choices[choice.dest], full)
    return out


def cli_page(parser: argparse.ArgumentParser | None = None) -> str:
    """``cli.md``: every command, its usage, its arguments and flags, and its examples."""
    parser = parser or build_parser()
    helps = _command_helps(parser)
    parts = [GENERATED, "# Command line", "", "`testbed` and each of its commands, from the argument parser."]
    for words, sub in subcommands(parser).items():
        title = f"testbed {words}".strip()
        parts += ["", f"## `{title}` {{#{anchor(title)}}}", ""]
        if helps.get(words) or sub.description:
            parts += [(helps.get(words) or sub.description or "").rstrip(".") + ".", ""]
        usage = " ".join(sub.format_usage().split())
        usage = usage.removeprefix("usage: ")
        parts += ["```", usage, "```"]
        rows = [
            "| " + " | ".join(_cell(c) for c in (_flags(a), _flag_default(a), _help(a))) + " |"
            for a in sub._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if rows:
            parts += ["", "| argument | default | what it does |", "|---|---|---|", *rows]
        if EXAMPLES.get(words):
            parts += ["", "Examples:", "", "```sh", *EXAMPLES[words], "```"]
    return "\n".join(parts).rstrip() + "\n"


def metrics_page(metrics: Iterable[Metric] = METRICS) -> str:
    """``metrics.md``: every figure of a run's ``summary.json``, with its unit and definition."""
    parts = [
        GENERATED,
        "# Summary metrics",
        "",
        "Every figure of a run's `summary.json` (and, per policy, of `comparison.json`), from "
        "`testbed/trace/metrics.py`. A share is from 0 to 1; a figure a run cannot give is `null`.",
    ]
    group = None
    for m in metrics:
        if m.group != group:
            group = m.group
            parts += ["", f"## {group}", "", "| figure | unit | definition |", "|---|---|---|"]
        parts.append("| " + " | ".join(_cell(c) for c in (f"`{m.name}`", m.unit, m.definition)) + " |")
    return "\n".join(parts).rstrip() + "\n"


def pages() -> dict[str, str]:
    """Each reference page's file name and text."""
    return {"files.md": files_page(), "cli.md": cli_page(), "metrics.md": metrics_page()}


def generated(root: Path) -> dict[Path, str]:
    """Every page written from the code or from recorded data, by its path under ``root``, with
    the text it should have: the reference pages, and every page of ``docs/`` that shows a
    recorded table (the results page, the job's page) with each table rendered from
    ``docs/results/`` (``results/published.py``)."""
    out = {root / REFERENCE_DIR / name: text for name, text in pages().items()}
    for page in sorted((root / "docs").glob("*.md")):
        text = page.read_text()
        if TABLE_MARK in text:
            out[page] = refresh_page(text, root / RESULTS_DIR)
    return out


def write_pages(root: Path) -> list[Path]:
    """Write the generated pages under ``root``; returns the files whose text changed."""
    changed = []
    for path, text in generated(root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def stale_pages(root: Path) -> list[str]:
    """The generated pages under ``root`` whose text differs from what the code and data give now."""
    return [str(p.relative_to(root)) for p, t in generated(root).items() if not p.exists() or p.read_text() != t]
