"""The figures the docs quote, as data (``results/published.py``): a script records its table, the
results page renders it between its markers, and a rerun's data changes the page."""

from __future__ import annotations

import json
import subprocess

import pytest

from testbed.results.published import RESULTS_DIR, Column, record_result, refresh_page, render_table

PAGE = "# Results\n\nintro\n\n<!-- results-table: demo -->\nold text\n<!-- /results-table -->\n\nafter\n"


def _repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_a_recorded_table_is_rendered_between_its_markers_with_where_it_came_from(tmp_path):
    repo = _repo(tmp_path)
    columns = [Column("policy", ("{policy}",)), Column("iteration", ("{t:.3f} s",)), Column("speed-up", ("{x:.2f}x",))]
    rows = [{"policy": "pp-fair", "t": 1.2}, {"policy": "atlas", "t": 1.0, "x": 1.2}]
    path = record_result(repo, "demo", columns, rows, "scripts/demo.py", "scripts/demo.py --repeat 3")
    assert path == repo / RESULTS_DIR / "demo.json"
    data = json.loads(path.read_text())
    assert data["machine"]["cpus"] >= 1 and data["date"] and data["commit"]
    page = refresh_page(PAGE, repo / RESULTS_DIR)
    assert "old text" not in page and page.startswith("# Results\n\nintro\n") and page.endswith("after\n")
    assert "| pp-fair | 1.200 s |  |" in page and "| atlas | 1.000 s | 1.20x |" in page
    assert "`scripts/demo.py --repeat 3` at " in page
    assert refresh_page(page, repo / RESULTS_DIR) == page  # rendering again changes nothing
    # a rerun's figures replace the page's
    record_result(repo, "demo", columns, [{"policy": "atlas", "t": 0.9}], "scripts/demo.py", "scripts/demo.py")
    assert "| atlas | 0.900 s |  |" in refresh_page(page, repo / RESULTS_DIR)


def test_a_cell_takes_the_first_format_whose_figures_the_row_has():
    data = {
        "name": "d",
        "command": "c",
        "commit": "abc",
        "date": "2026-12-06",
        "machine": {"cpus": 2, "memory_gib": 23.0, "kernel": "6.18"},
        "columns": [{"header": "x", "cells": ["{a:.1f} ({b:.0%})", "{a:.1f}"]}],
        "rows": [{"a": 1.0, "b": 0.5}, {"a": 2.0}, {"b": 0.1}],
    }
    assert render_table(data).splitlines()[2:5] == ["| 1.0 (50%) |", "| 2.0 |", "|  |"]


def test_a_page_naming_a_table_nobody_recorded_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="demo"):
        refresh_page(PAGE, tmp_path)
