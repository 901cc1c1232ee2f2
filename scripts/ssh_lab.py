#!/usr/bin/env python3
"""Stand-in machines for --backend remote on this box: sshd instances in their own network, mount
(and optionally time) namespaces, with an inventory to use them (testbed/net/remote/lab.py).

    sudo .venv/bin/python scripts/ssh_lab.py --topology three_dc --machines 2 --shift 0,1000 --out /tmp/lab
    # in another shell, while it runs:
    sudo .venv/bin/testbed run --backend remote --inventory /tmp/lab/inventory.yaml

DCs are split over the machines in file order (the first machines get one more when they do not
divide evenly). Ctrl-C stops the lab; `testbed clean` removes it if this process is killed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.net.remote.lab import SshLab  # noqa: E402
from testbed.spec.topology_file import load_topology  # noqa: E402


def split(names: list[str], n: int) -> list[list[str]]:
    per, extra = divmod(len(names), n)
    out, at = [], 0
    for i in range(n):
        k = per + (1 if i < extra else 0)
        out.append(names[at : at + k])
        at += k
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="three_dc", help="topology file or shipped name (default three_dc)")
    p.add_argument("--machines", type=int, default=2, help="stand-in machines (default 2)")
    p.add_argument(
        "--shift", default="0,1000", help="CLOCK_MONOTONIC shift of each machine in seconds (default 0,1000)"
    )
    p.add_argument("--out", type=Path, required=True, help="folder for keys, sshd configs, inventory.yaml")
    args = p.parse_args()
    names = [dc.name for dc in load_topology(args.topology).dcs]
    if not 1 <= args.machines <= len(names):
        p.error(f"--machines must be 1..{len(names)} (the topology's DCs)")
    shifts = [float(x) for x in args.shift.split(",") if x]

    def stop(signum, frame):
        print(f"{signal.Signals(signum).name}: stopping", flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with & (SIGINT ignored)
    with SshLab(split(names, args.machines), args.out, shifts=shifts) as lab:
        for m in lab.machines:
            print(f"machine {m.name}: {m.ip}, DCs {', '.join(m.dcs)}, clock shifted by {m.shift_s:g} s")
        print(f"inventory: {lab.inventory}\nCtrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
