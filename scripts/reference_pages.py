#!/usr/bin/env python3
"""Write the documentation's pages that come from the code and from recorded data
(``testbed/cli/reference.py``): the reference pages (``docs/reference/``: description files,
command line, summary metrics) and the results page's tables (from ``docs/results/*.json``, which
the benchmark scripts write). Run it after changing a field table, a command's arguments or a
metric, or rerunning a benchmark; the test suite fails while a page is stale.

    .venv/bin/python scripts/reference_pages.py
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.cli.reference import write_pages


def main() -> int:
    changed = write_pages(REPO)
    for path in changed:
        print(f"wrote {path.relative_to(REPO)}")
    if not changed:
        print("the reference pages are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
