#!/usr/bin/env python3
"""Rebuild the regions table the package ships (``testbed/data/regions/skyplane_2022.csv``) from
Skyplane's published profiles: a folder holding ``latency.csv`` and ``throughput.csv`` as in
skyplane-project/skyplane's ``profiles/`` (2022-11-01). What is kept and how it is combined:
``testbed/spec/regions_table.py`` (``derive_rows``) and ``testbed/data/regions/README.md``.

    .venv/bin/python scripts/regions_table.py [FOLDER] [-o CSV]

FOLDER defaults to ``../shared/data/skyplane-2022`` (from the checkout's root); the package never
reads it at run time.
"""

import argparse
import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.spec.regions_table import TABLE_PARTS, derive_rows, read_table, table_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=REPO.parent / "shared" / "data" / "skyplane-2022",
        help="the folder of latency.csv and throughput.csv (default: ../shared/data/skyplane-2022)",
    )
    ap.add_argument("-o", "--out", type=Path, default=REPO / "testbed" / Path(*TABLE_PARTS), help="the CSV written")
    args = ap.parse_args()
    try:
        with (
            (args.folder / "latency.csv").open(newline="") as lat,
            (args.folder / "throughput.csv").open(newline="") as thr,
        ):
            rows = derive_rows(csv.DictReader(lat), csv.DictReader(thr))
    except (OSError, KeyError) as e:
        print(f"regions_table: {args.folder}: {e!r}; give the folder of Skyplane's latency.csv and throughput.csv")
        return 1
    text = table_text(rows)
    table = read_table(text, str(args.out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}: {len(rows)} pairs of {len(table.names)} regions, {len(text) / 1000:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
