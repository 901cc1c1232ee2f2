"""The figures the documentation quotes, as data: a benchmark script records its table
(``record_result``: rows, columns, the command, the commit, the date and the machine) in
``docs/results/<name>.json``, and a page of the docs (the results page, mostly) shows it between
the markers ``<!-- results-table: NAME -->`` and ``<!-- /results-table -->`` (``refresh_page``,
run by ``scripts/reference_pages.py``; a unit test fails while a page is stale). A rerun of the script
updates the page; no figure is typed in by hand."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: where the recorded tables live, from the repository root
RESULTS_DIR = Path("docs") / "results"
#: how a recorded table's block begins in a page
TABLE_MARK = "<!-- results-table: "
_BLOCK = re.compile(r"(<!-- results-table: ([\w-]+) -->\n)(.*?)(<!-- /results-table -->)", re.S)


@dataclass(frozen=True)
class Column:
    """One column of a recorded table: its ``header`` and the formats of its cell (``str.format``
    with the row's keys, e.g. ``"{speedup:.3f}x ({noise:.1%})"``): the first whose keys the row
    holds (not None) is used, and a cell none fits is left empty."""

    header: str
    cells: tuple[str, ...]


def machine() -> dict[str, Any]:
    """This machine as a recorded figure names it: CPUs, memory (GiB), the kernel."""
    mem_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    return {"cpus": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1), "kernel": platform.release()}


def commit(repo: Path) -> str:
    """The checkout's commit (short), with ``-dirty`` where its tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=repo, capture_output=True).returncode != 0
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def record_result(
    repo: Path,
    name: str,
    columns: list[Column],
    rows: list[dict[str, Any]],
    script: str,
    command: str,
    at_commit: str | None = None,
) -> Path:
    """Write ``docs/results/<name>.json`` under ``repo``: the table's columns and rows, the script
    and the exact command that made it, the commit (``at_commit``: the one a script took when it
    began, before its runs and before any table it records marks the tree as changed; default:
    the checkout's now), the date and the machine. Returns the file."""
    path = repo / RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "name": name,
        "script": script,
        "command": command,
        "commit": at_commit or commit(repo),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "columns": [{"header": c.header, "cells": list(c.cells)} for c in columns],
        "rows": rows,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def _cell(formats: tuple[str, ...], row: dict[str, Any]) -> str:
    for fmt in formats:
        if all(row.get(k) is not None for k in re.findall(r"{(\w+)", fmt)):
            return fmt.format(**row)
    return ""


def table_markdown(columns: list[Column], rows: list[dict[str, Any]]) -> str:
    """The table as Markdown: a header, then a line per row, each cell its column's first format
    the row fills."""
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(c.cells, row) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def render_table(data: dict[str, Any]) -> str:
    """A recorded table as Markdown, with a line saying where its figures come from."""
    cols = [Column(c["header"], tuple(c["cells"])) for c in data["columns"]]
    m = data["machine"]
    lines = [
        table_markdown(cols, data["rows"]),
        "",
        f"*`{data['command']}` at {data['commit']}, {data['date']}; {m['cpus']} CPUs, {m['memory_gib']:g} GiB, "
        f"kernel {m['kernel']} (`docs/results/{data['name']}.json`).*",
    ]
    return "\n".join(lines) + "\n"


def refresh_page(text: str, results: Path) -> str:
    """``text`` with every recorded table's block rendered from ``results/<name>.json``. Raises
    FileNotFoundError naming a block whose data is not there."""

    def block(m: re.Match[str]) -> str:
        path = results / f"{m.group(2)}.json"
        if not path.exists():
            raise FileNotFoundError(f"the page shows results table {m.group(2)!r}, but {path} is not there")
        return m.group(1) + render_table(json.loads(path.read_text())) + m.group(4)

    return _BLOCK.sub(block, text)
