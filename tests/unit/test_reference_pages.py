"""The documentation's reference pages are written from the code (``cli/reference.py``): a committed
page that differs from what the code gives fails here, and a field, flag or metric added to the code
appears on its page unasked."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from testbed.cli import build_parser
from testbed.cli.reference import FILE_FORMATS, anchor, cli_page, files_page, metrics_page, stale_pages
from testbed.spec.experiment_fields import EXPERIMENT_FIELDS
from testbed.spec.fields import Field
from testbed.trace.metrics import METRICS, Metric

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_generated_pages_are_what_the_code_and_data_give():
    assert not stale_pages(REPO), "stale generated pages: run .venv/bin/python scripts/reference_pages.py"


def test_a_field_added_to_a_table_appears_on_the_files_page():
    added = Field("pipeline_colour", "choice", "a field nobody has", default="red", choices=("red", "blue"))
    table = replace(EXPERIMENT_FIELDS, fields=(*EXPERIMENT_FIELDS.fields, added))
    formats = [(h, w, tuple(table if t is EXPERIMENT_FIELDS else t for t in tables)) for h, w, tables in FILE_FORMATS]
    before, after = files_page(), files_page(formats)
    assert after != before
    new_lines = set(after.splitlines()) - set(before.splitlines())
    assert new_lines == {"| `pipeline_colour` | name |  | `red` | `red`, `blue` | a field nobody has |"}


def test_every_field_of_every_table_is_on_the_files_page():
    page = files_page()
    for _, _, tables in FILE_FORMATS:
        for table in tables:
            assert f"{{#{anchor(table.name)}}}" in page
            for f in table.fields:
                assert f"| `{f.name}` |" in page, (table.name, f.name)


def test_a_flag_added_to_the_parser_appears_on_the_cli_page():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["plan"]
    sub.add_argument("--colour", default="red", help="a flag nobody has")
    assert "| `--colour` `COLOUR` | `red` | a flag nobody has |" in cli_page(parser)
    assert "a flag nobody has" not in cli_page()


def test_a_metric_added_to_the_table_appears_on_the_metrics_page():
    page = metrics_page([*METRICS, Metric("pipelines_happy", "Training", "", "a figure nobody has")])
    assert "| `pipelines_happy` |  | a figure nobody has |" in page and page != metrics_page()
    assert all(f"| `{m.name}` |" in metrics_page() for m in METRICS)
