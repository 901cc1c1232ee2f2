"""``docs/architecture.md`` names every module of the package under its folder, one line each, and
names none that is gone: a module added without its line fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"


def listed_modules() -> set[str]:
    """``folder/module.py`` for each bullet of the page, the folder taken from the heading above it
    (``### net/remote: ...``; ``## testbed/`` and the bottom layer's heading for the top level)."""
    folder: str | None = None
    listed = set()
    for line in PAGE.read_text().splitlines():
        heading = re.match(r"#{2,3} ([\w/]+)(:|/$)", line)
        if heading:
            folder = "" if heading.group(1) == "testbed" else heading.group(1)
        elif line.startswith("## errors, lifetime, thread_slice"):  # the bottom layer: top-level modules
            folder = ""
        elif line.startswith("#"):
            folder = None
        bullet = re.match(r"- `([\w.]+\.py)`", line)
        if bullet and folder is not None:
            listed.add(f"{folder}/{bullet.group(1)}".lstrip("/"))
    return listed


def test_every_module_has_its_line_and_every_line_its_module():
    package = REPO / "testbed"
    modules = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts and (p.name != "__init__.py" or p.read_text().strip())
    }
    listed = listed_modules()
    assert not modules - listed, f"modules without a line in docs/architecture.md: {sorted(modules - listed)}"
    assert not listed - modules - {"__init__.py"}, f"lines for modules that are gone: {sorted(listed - modules)}"
