"""Mininet ``Topo`` classes for the shipped topology files, for Mininet's own tools::

    sudo mn --custom topologies/mininet_topos.py --topo three_dc --controller none --test pingall
    sudo mn --custom topologies/mininet_topos.py --topo two_dc --controller none --link tc

Each gives the network ``testbed topo up --backend mininet`` builds (same hosts, addresses,
interface names, routes; see testbed/mininet_topo.py). No switch and no controller is used, so Open
vSwitch is not needed: always pass ``--controller none``. Shaping under ``mn`` is Mininet's own and
only with ``--link tc`` (TCLink: rate up to 1 Gbit/s; delay, jitter and loss need sch_netem and are
dropped without it); the testbed's HTB classes and delay fallback come with ``testbed topo up
--backend mininet``. Any other topology file: ``--topo file,PATH``.

``mn`` runs with the system Python: this file puts the repository on its path, and needs PyYAML
(Debian package python3-yaml, installed by scripts/setup.sh).
"""

import inspect
import sys
from pathlib import Path

# mn runs this file with exec(), without __file__; the code object still knows the file's name
_here = Path(globals().get("__file__") or inspect.currentframe().f_code.co_filename).resolve()
sys.path.insert(0, str(_here.parent.parent))

from testbed.net.mininet_topo import SpecTopo  # noqa: E402
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology  # noqa: E402


def _topo(name_or_path: str) -> SpecTopo:
    return SpecTopo(load_topology(name_or_path))


#: ``--topo NAME`` for every shipped topology file, and ``--topo file,PATH`` for any other
topos = {path.stem: (lambda stem=path.stem: _topo(stem)) for path in sorted(TOPOLOGY_DIR.glob("*.yaml"))}
topos["file"] = _topo
