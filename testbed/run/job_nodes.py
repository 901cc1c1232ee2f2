"""One node of a launched job (``testbed launch``, ``user_job.py``): its command (torchrun, one
process, the static rendezvous, the script under the hook, in mount and UTS namespaces of its own
with its host's name and an ``/etc/hosts`` naming every emulated host), its environment (torchrun's,
with nothing of this machine's torch.distributed variables), its output streamed with a rank
prefix, and the script's own status as torchrun reports it."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.net.hostproc import local_process_env
from testbed.net.network import Network
from testbed.spec.addressing import host_name
from testbed.spec.topology import TopologySpec
from testbed.trace.job import JOB_DIR_ENV
from testbed.train.job_hook import CONTROL_ENV, STRIPES_ENV

#: where rank 0's host serves the job's rendezvous (torchrun's static rendezvous, its default port)
RENDEZVOUS_PORT = 29500
#: each rank's output, in the job's folder
RANKS_DIR = "ranks"
#: this machine's torch.distributed variables, which must not reach the job (torchrun sets its own)
HOST_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)
#: the module every rank runs its script under (``train/job_hook.py``)
HOOK_MODULE = "testbed.train.job_hook"
#: a node's own mount and UTS namespaces: its /etc/hosts and hostname, then torchrun
NODE_SHELL = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'


def hosts_file(net: Network, topo: TopologySpec, management: dict[str, str] | None = None) -> str:
    """``/etc/hosts`` as the job's nodes see it: every emulated host's name and address, also in
    its IPv4-mapped IPv6 form (c10d's store accepts on a dual-stack socket and looks its peers up
    by that form); then each host's ``management`` address, if any, as ``<host>-mgmt``."""
    lines = ["127.0.0.1 localhost"]
    for dc in topo.dcs:
        for k in range(dc.hosts):
            name = host_name(dc.name, k)
            ip = net.host(name).ip
            lines += [f"{ip} {name}", f"::ffff:{ip} {name}"]
    for name, ip in (management or {}).items():
        lines += [f"{ip} {name}-mgmt", f"::ffff:{ip} {name}-mgmt"]
    return "\n".join(lines) + "\n"


def node_argv(
    python: str,
    hosts_path: str,
    host: str,
    node_rank: int,
    nodes: int,
    master: str,
    script: str,
    args: Sequence[str],
) -> list[str]:
    """One node of the job: its own mount and UTS namespaces (``NODE_SHELL``), then torchrun with
    one process, the static rendezvous at ``master`` and no restarts (a failed rank ends the job),
    the rank running the script under the hook (``python -m testbed.train.job_hook SCRIPT ARGS``,
    torchrun's ``-m``: it marks the rank's joining and, under Atlas, manages its transfers)."""
    program = ["-m", HOOK_MODULE, script]
    torchrun = [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--nproc-per-node", "1", "--node-rank", str(node_rank),
        "--master-addr", master, "--master-port", str(RENDEZVOUS_PORT), "--max-restarts", "0",
        *program, *args,
    ]  # fmt: skip
    return ["unshare", "--mount", "--uts", "--", "sh", "-c", NODE_SHELL, "sh", hosts_path, host, *torchrun]


def job_env(job_dir: Path, control: Path | None = None, stripes: int = 1) -> dict[str, str]:
    """A node's environment: this machine's without its torch.distributed variables, the package on
    PYTHONPATH (the job may import ``testbed.trace.job``), the job's folder (``JOB_DIR_ENV``), one
    thread per rank (the emulated GPU's CPU share), gloo and NCCL on the host's interface
    (``hostproc.HOST_SOCKET_ENV`` is added by the network); under the hook, the controller's
    socket (``control``, Atlas's sharing) and the connections a transfer is striped over."""
    extra = {"OMP_NUM_THREADS": "1", JOB_DIR_ENV: str(job_dir.resolve())}
    if control is not None:
        extra[CONTROL_ENV] = str(control)
    if stripes > 1:
        extra[STRIPES_ENV] = str(stripes)
    env = local_process_env(extra)
    for name in HOST_VARIABLES:
        env.pop(name, None)
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
    return env


class RankStreamer(threading.Thread):
    """Copies each rank's new output lines to ``write`` with a ``[rank R]`` prefix."""

    def __init__(self, paths: dict[int, Path], write: Callable[[str], Any]) -> None:
        super().__init__(name="rank-streamer", daemon=True)
        self.paths, self.write = paths, write
        self._halt = threading.Event()
        self._pos = dict.fromkeys(paths, 0)
        self._partial = dict.fromkeys(paths, "")

    def _drain(self) -> None:
        for rank, path in self.paths.items():
            try:
                with open(path, errors="replace") as f:
                    f.seek(self._pos[rank])
                    text = f.read()
                    self._pos[rank] = f.tell()
            except FileNotFoundError:
                continue
            *lines, self._partial[rank] = (self._partial[rank] + text).split("\n")
            for line in lines:
                self.write(f"[rank {rank}] {line}")

    def run(self) -> None:
        while not self._halt.wait(0.2):
            self._drain()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self._drain()
        for rank, rest in self._partial.items():
            if rest:
                self.write(f"[rank {rank}] {rest}")


def script_status(log: Path) -> int | None:
    """The script's own exit status as torchrun reports a failed process in ``log`` (torchrun itself
    exits 1), None where it reported none."""
    try:
        found = re.search(r"exitcode\s*:\s*(-?\d+)", log.read_text(errors="replace"))
    except OSError:
        return None
    return int(found.group(1)) if found else None
