"""A user job's layout (``testbed launch --mesh pp=P,dp=D``, or ``--placement FILE``): how many
pipeline stages and data-parallel replicas its ranks form, and, from a placement file, the host of
each. The ranks make a (pp, dp) mesh in row-major order, rank =
stage x dp + replica, as the testbed's own workers' ranks (``plan/workers.rank_of``) and as
``torch.distributed.device_mesh.init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))``
numbers them.

Pure: no kernel, no processes.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from testbed.errors import SpecError
from testbed.spec.addressing import host_name
from testbed.spec.topology import TopologySpec

#: the dimensions a mesh names, in rank order (the first varies slowest)
DIMENSIONS = ("pp", "dp")
#: the most ranks a job may have (the testbed's own limit on stages and replicas)
MAX_SIZE = 1024


@dataclass(frozen=True)
class Mesh:
    """``pp`` pipeline stages of ``dp`` data-parallel replicas each."""

    pp: int
    dp: int

    @property
    def size(self) -> int:
        return self.pp * self.dp


def parse_mesh(text: str) -> Mesh:
    """``pp=P,dp=D`` (either may be left out: 1; any order). Raises SpecError naming ``--mesh``,
    the part at fault and the fix."""
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in DIMENSIONS:
            raise SpecError("--mesh", "--mesh", part, "is not pp=N or dp=N", "write e.g. --mesh pp=3,dp=2")
        if name in sizes:
            raise SpecError("--mesh", f"--mesh {name}", part, "is given twice", "give each dimension once")
        try:
            n = int(value)
        except ValueError:
            n = 0
        if not 1 <= n <= MAX_SIZE:
            raise SpecError("--mesh", f"--mesh {name}", value, f"is not a whole number from 1 to {MAX_SIZE}", "e.g. 2")
        sizes[name] = n
    return Mesh(sizes.get("pp", 1), sizes.get("dp", 1))


#: the fields of one entry of a placement file (``rank`` and ``dc`` optional, checked where given:
#: a launched job's own ``job.json`` is a placement file)
PLACEMENT_KEYS = ("stage", "replica", "host", "rank", "dc")


def read_placement(data: Any, source: str, topo: TopologySpec) -> tuple[Mesh, dict[tuple[int, int], str]]:
    """A placement file's content (``testbed launch --placement FILE``): a list of entries ``{stage,
    replica, host}``, or a mapping with such a list under ``workers`` (a job's ``job.json``). Returns
    the mesh the entries form and each (stage, replica)'s host. Raises SpecError naming the entry,
    the field, the value and the fix: an entry that is not one, a field missing or unknown, a host
    the topology does not have (or keeps for decode), a host given twice, a rank or DC that
    disagrees, or (stage, replica) pairs that are not a whole grid, each once."""
    entries = data.get("workers") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise SpecError(source, "workers", str(data)[:80], "is not a list of workers", _PLACEMENT_FIX)
    training = {host_name(dc.name, k): dc.name for dc in topo.dcs for k in range(dc.training_hosts)}
    every = {host_name(dc.name, k) for dc in topo.dcs for k in range(dc.hosts)}
    hosts: dict[tuple[int, int], str] = {}
    used: dict[str, int] = {}
    for i, e in enumerate(entries):
        where = f"workers[{i}]"
        if not isinstance(e, dict) or not {"stage", "replica", "host"} <= set(e):
            raise SpecError(source, where, str(e)[:80], "is not {stage, replica, host}", _PLACEMENT_FIX)
        unknown = sorted(set(e) - set(PLACEMENT_KEYS))
        if unknown:
            raise SpecError(
                source, f"{where}.{unknown[0]}", str(e[unknown[0]]), "is not a field of a worker", _PLACEMENT_FIX
            )
        for key in ("stage", "replica"):
            if isinstance(e[key], bool) or not isinstance(e[key], int) or not 0 <= e[key] < MAX_SIZE:
                raise SpecError(
                    source, f"{where}.{key}", str(e[key]), f"is not a whole number from 0 to {MAX_SIZE - 1}", "e.g. 0"
                )
        host = e["host"]
        if host not in training:
            close = difflib.get_close_matches(str(host), sorted(training), n=1)
            why = "is a decode host (it does not train)" if host in every else f"is not a host of topology {topo.name}"
            hint = f"did you mean {close[0]}? " if close else ""
            raise SpecError(
                source, f"{where}.host", str(host), why, f"{hint}name a training host, as in testbed topo show"
            )
        if host in used:
            raise SpecError(
                source, f"{where}.host", host, f"is also workers[{used[host]}]'s", "give each rank its own host"
            )
        used[host] = i
        if "dc" in e and e["dc"] != training[host]:
            raise SpecError(
                source, f"{where}.dc", str(e["dc"]), f"is not {host}'s DC ({training[host]})", "leave dc out"
            )
        cell = (e["stage"], e["replica"])
        if cell in hosts:
            raise SpecError(source, where, f"stage {cell[0]} replica {cell[1]}", "is given twice", "give each once")
        hosts[cell] = host
    mesh = Mesh(max(s for s, _ in hosts) + 1, max(r for _, r in hosts) + 1)
    missing = sorted({(s, r) for s in range(mesh.pp) for r in range(mesh.dp)} - set(hosts))
    if missing:
        s, r = missing[0]
        raise SpecError(
            source, "workers", f"stage {s} replica {r}", f"is missing: {len(hosts)} workers do not fill "
            f"{mesh.pp} stages x {mesh.dp} replicas", "give every stage every replica, each on its host",
        )  # fmt: skip
    for i, e in enumerate(entries):
        if "rank" in e and e["rank"] != e["stage"] * mesh.dp + e["replica"]:
            raise SpecError(
                source, f"workers[{i}].rank", str(e["rank"]), f"is not stage x {mesh.dp} + replica "
                f"({e['stage'] * mesh.dp + e['replica']})", "leave rank out: the mesh numbers the ranks",
            )  # fmt: skip
    return mesh, hosts


_PLACEMENT_FIX = "write a list of {stage: S, replica: R, host: DC-hK}, every stage with every replica"
