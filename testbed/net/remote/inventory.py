"""Inventory files of ``--backend remote``: the machines a topology's DCs are spread over.

Pure data: loading and validating needs no network and no root. Format (YAML)::

    known_hosts: ~/.ssh/known_hosts     # optional (this default): host keys are checked against it
    accept_unknown_host_keys: false     # optional: true trusts a key never seen before (not advised)
    machines:
      - name: m0                        # a short name for messages and trace files
        address: 192.0.2.10             # where SSH reaches it (IPv4, IPv6 or a host name)
        port: 22                        # optional
        user: root                      # the testbed builds namespaces there: root, or root's keys
        key: ~/.ssh/id_ed25519          # optional: else ssh-agent and ~/.ssh/id_*
        dcs: [east]                     # the topology's DCs built on this machine
        python: /opt/testbed/.venv/bin/python   # optional (default python3): with torch, pyroute2
        tunnel_address: 192.0.2.10      # optional: IPv4 the WAN tunnels (VXLAN, UDP 4789) use;
                                        # default: address, which must then be IPv4
        workdir: /var/tmp/testbed       # optional: where the run's code and traces go there

Every DC of the topology must be on exactly one machine (:func:`check_against`). Errors are
SpecErrors naming the field, the value and the fix. No value is ever pasted into a shell: commands
are argument lists quoted by ``ssh.remote_command``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.net.remote.machine import DEFAULT_PYTHON, MACHINE_FIELDS, Machine, expand_path, read_machine, text_field
from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.specfile import FieldReader, read_spec_file
from testbed.spec.topology import TopologySpec

__all__ = ["DEFAULT_PYTHON", "Inventory", "Machine", "check_against", "load_inventory", "parse_inventory"]

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
MAX_MACHINES = 1024
MAX_INVENTORY_BYTES = 1 << 20

#: an inventory file's top level
INVENTORY_FIELDS = FieldTable(
    "inventory",
    "",
    "An inventory file (`--backend remote --inventory FILE`): the machines a topology's DCs are spread over.",
    (
        Field(
            "machines",
            "list",
            f"the machines, each DC of the topology on exactly one (at most {MAX_MACHINES})",
            default=REQUIRED,
            table=MACHINE_FIELDS.name,
        ),
        Field("known_hosts", "path", "host keys are checked against this file", default=DEFAULT_KNOWN_HOSTS),
        Field(
            "accept_unknown_host_keys",
            "bool",
            "trust a host key never seen before (only on a network you trust)",
            default=False,
            fix="write true only to trust host keys never seen before (leave it out otherwise)",
        ),
    ),
)


@dataclass(frozen=True)
class Inventory:
    source: str
    machines: tuple[Machine, ...]
    known_hosts: Path = field(default_factory=lambda: Path(DEFAULT_KNOWN_HOSTS).expanduser())
    accept_unknown_host_keys: bool = False

    def machine_of(self, dc: str) -> Machine:
        for m in self.machines:
            if dc in m.dcs:
                return m
        raise KeyError(f"no machine hosts DC {dc!r}")

    def to_dict(self) -> dict:
        """Everything but secrets (the key's path is kept; its contents are never read here)."""
        return {
            "source": self.source,
            "known_hosts": str(self.known_hosts),
            "accept_unknown_host_keys": self.accept_unknown_host_keys,
            "machines": [
                {
                    "name": m.name,
                    "address": m.address,
                    "port": m.port,
                    "user": m.user,
                    "dcs": list(m.dcs),
                    "python": m.python,
                    "tunnel_address": m.tunnel_address,
                    "workdir": m.workdir,
                    "key": str(m.key) if m.key else None,
                }
                for m in self.machines
            ],
        }


def parse_inventory(data: Any, source: str, base: Path | None = None) -> Inventory:
    """Validate an inventory given as parsed YAML; relative paths start at ``base`` (the file's
    folder; default: the current one). Raises SpecError."""
    r = FieldReader(source, data, "", INVENTORY_FIELDS)
    raw = r.data["machines"]
    if not isinstance(raw, list) or not raw:
        raise r.fail("machines", "is not a list of machines", "list at least one machine (see inventory.py)")
    if len(raw) > MAX_MACHINES:
        raise r.fail("machines", f"lists {len(raw)} machines", f"use at most {MAX_MACHINES}")
    machines = tuple(read_machine(source, m, i, base) for i, m in enumerate(raw))
    seen: dict[str, int] = {}
    where: dict[tuple[str, int], int] = {}
    tunnels: dict[str, int] = {}
    owner: dict[str, int] = {}
    for i, m in enumerate(machines):
        if m.name in seen:
            raise SpecError(
                source,
                f"machines[{i}].name",
                m.name,
                f"is also machines[{seen[m.name]}]'s name",
                "give every machine its own name",
            )
        seen[m.name] = i
        if (m.address, m.port) in where:
            raise SpecError(
                source,
                f"machines[{i}].address",
                m.address,
                f"port {m.port} is also machines[{where[(m.address, m.port)]}]'s",
                "list each machine once, with all its DCs",
            )
        where[(m.address, m.port)] = i
        if m.tunnel_address in tunnels:
            raise SpecError(
                source,
                f"machines[{i}].tunnel_address",
                m.tunnel_address,
                f"is also machines[{tunnels[m.tunnel_address]}]'s: two entries for one machine?",
                "list each machine once, with all its DCs",
            )
        tunnels[m.tunnel_address] = i
        for dc in m.dcs:
            if dc in owner:
                raise SpecError(
                    source,
                    f"machines[{i}].dcs",
                    dc,
                    f"is also on machines[{owner[dc]}]",
                    "put every DC on one machine only",
                )
            owner[dc] = i
    accept = r.value("accept_unknown_host_keys")
    known = expand_path(r, "known_hosts", text_field(r, "known_hosts", DEFAULT_KNOWN_HOSTS), base)
    return Inventory(source, machines, known, accept)


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate an inventory file. Raises SpecError."""
    p = Path(path).absolute()
    if not p.is_file():
        raise SpecError(
            str(path),
            "(file)",
            str(path),
            "is not a file",
            "give the path of an inventory file (docs/backends.md, 'Several machines')",
        )
    if p.stat().st_size > MAX_INVENTORY_BYTES:
        raise SpecError(
            str(path),
            "(file)",
            str(path),
            f"is {p.stat().st_size} bytes long",
            f"an inventory lists machines: keep it under {MAX_INVENTORY_BYTES // 1024} KiB",
        )
    p, data = read_spec_file(p, p.parent, "inventory")
    return parse_inventory(data, str(p), p.parent)


def check_against(inv: Inventory, topo: TopologySpec) -> None:
    """Every DC of ``topo`` on exactly one machine, and no machine naming a DC ``topo`` lacks; no
    link with a profile or route failover on more than one machine (each machine builds its own
    DCs on its own clock: not supported yet). Raises SpecError."""
    names = [dc.name for dc in topo.dcs]
    for i, m in enumerate(inv.machines):
        for dc in m.dcs:
            if dc not in names:
                close = difflib.get_close_matches(dc, names, n=1)
                raise SpecError(
                    inv.source,
                    f"machines[{i}].dcs",
                    dc,
                    f"is not a DC of topology {topo.name}",
                    f"did you mean {close[0]!r}?" if close else f"its DCs are {', '.join(names)}",
                )
    for i, link in enumerate(topo.links):
        field = "profile" if link.profile else "failover" if link.failover else None
        if field and len(inv.machines) > 1:
            raise SpecError(
                topo.source,
                f"links[{i}].{field}",
                f"{link.a}:{link.b}",
                "is not replayed on a topology spread over several machines yet (each machine builds its own "
                "DCs, on its own clock, and moves only its own routes)",
                "remove the links' profile and failover fields for a run over several machines, or run on one",
            )
    placed = {dc for m in inv.machines for dc in m.dcs}
    missing = [n for n in names if n not in placed]
    if missing:
        raise SpecError(
            inv.source,
            "machines",
            ", ".join(missing),
            f"(DCs of topology {topo.name}) are on no machine",
            "add them to a machine's dcs list",
        )
