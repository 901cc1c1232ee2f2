"""A user job's layout (``testbed launch --mesh pp=P,dp=D``): how many pipeline stages and
data-parallel replicas its ranks form. The ranks make a (pp, dp) mesh in row-major order, rank =
stage x dp + replica, as the testbed's own workers' ranks (``plan/workers.rank_of``) and as
``torch.distributed.device_mesh.init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))``
numbers them.

Pure: no kernel, no processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import SpecError

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
