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
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError
from .specfile import REQUIRED, FieldReader, read_spec_file
from .topology import TopologySpec

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_WORKDIR = "/var/tmp/testbed"
DEFAULT_PYTHON = "python3"
MAX_MACHINES = 1024
MAX_INVENTORY_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}\Z")
#: useradd(8)'s default NAME_REGEX
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}\Z")
#: RFC 1123 host names
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z")
_COMMAND = re.compile(r"[A-Za-z0-9._+-]+\Z")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._+/@-]*\Z")


@dataclass(frozen=True)
class Machine:
    """One machine of the inventory (see the module docstring for each field)."""

    name: str
    address: str
    user: str
    dcs: tuple[str, ...]
    port: int = 22
    key: Path | None = None
    python: str = DEFAULT_PYTHON
    tunnel_address: str = ""
    workdir: str = DEFAULT_WORKDIR


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
        return {"source": self.source, "known_hosts": str(self.known_hosts),
                "accept_unknown_host_keys": self.accept_unknown_host_keys,
                "machines": [{"name": m.name, "address": m.address, "port": m.port, "user": m.user, "dcs": list(m.dcs),
                              "python": m.python, "tunnel_address": m.tunnel_address, "workdir": m.workdir,
                              "key": str(m.key) if m.key else None} for m in self.machines]}


def _get_str(r: FieldReader, key: str, default: Any = REQUIRED) -> Any:
    if key not in r.data or r.data[key] is None:
        if default is REQUIRED:
            raise SpecError(r.source, r.at(key), None, "is missing", f"add '{key}:'")
        return default
    value = r.data[key]
    if not isinstance(value, str) or not value.strip():
        raise r.fail(key, "is not a text value", f"write {key} as text")
    return value


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
        return True
    except ValueError:
        return False


def _address(r: FieldReader) -> str:
    value = _get_str(r, "address")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOSTNAME.match(value):
        raise r.fail("address", "is neither an IP address nor a host name (RFC 1123: letters, digits, '-', '.')",
                     "give the machine's IP address or DNS name")
    return value


def _expand(r: FieldReader, key: str, value: str, base: Path | None) -> Path:
    """``~`` expanded, a relative path taken from the inventory's folder, made absolute."""
    if "\0" in value:
        raise r.fail(key, "contains a NUL character", "give a plain path")
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # ~nosuchuser
        raise r.fail(key, "names the home folder of a user this machine does not have",
                     "give an absolute path, or ~/ for your own home") from None
    return (p if p.is_absolute() else (base or Path.cwd()) / p).absolute()


def _path(r: FieldReader, key: str, must_exist: bool, base: Path | None) -> Path | None:
    value = _get_str(r, key, None)
    if value is None:
        return None
    p = _expand(r, key, value, base)
    if must_exist and not p.is_file():
        raise r.fail(key, "is not a readable file", f"give the path of the file ({key}; relative paths start at "
                     "the inventory's folder)")
    return p


def _tunnel_ok(text: str) -> bool:
    ip = ipaddress.IPv4Address(text)
    return not (ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip == ipaddress.IPv4Address("255.255.255.255"))


def _machine(source: str, data: Any, i: int, base: Path | None = None) -> Machine:
    r = FieldReader(source, data, f"machines[{i}]", ("name", "address", "port", "user", "key", "dcs", "python",
                                                     "tunnel_address", "workdir"), ("name", "address", "user", "dcs"))
    name = _get_str(r, "name")
    if not _NAME.match(name):
        raise r.fail("name", "is not a short name", "use letters, digits, '.', '_' or '-' (at most 32 characters)")
    address = _address(r)
    port = r.data.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise r.fail("port", "is not a TCP port", "give a whole number from 1 to 65535")
    user = _get_str(r, "user")
    if not _USER.match(user):
        raise r.fail("user", "is not a user name", "give a login name such as root (lower-case letters, digits, '_', '-')")
    dcs = r.data["dcs"]
    if isinstance(dcs, str):
        dcs = [dcs]
    if not isinstance(dcs, list) or not dcs or not all(isinstance(d, str) and d for d in dcs):
        raise r.fail("dcs", "is not a list of DC names", "write the DCs this machine builds, e.g. dcs: [east, west]")
    python = _get_str(r, "python", DEFAULT_PYTHON)
    if not (_SAFE_PATH.match(python) or _COMMAND.match(python)):
        raise r.fail("python", "is neither an absolute path nor a command name",
                     "give e.g. python3 or /opt/testbed/.venv/bin/python (no spaces or shell characters)")
    tunnel = _get_str(r, "tunnel_address", None)
    if tunnel is None:
        if not _ipv4(address):
            raise r.fail("address", "is not an IPv4 address, and the machine has no tunnel_address",
                         "add tunnel_address: the machine's IPv4 address that the WAN tunnels (VXLAN) use")
        if not _tunnel_ok(address):
            raise r.fail("address", "cannot carry the WAN tunnels (a loopback, multicast or unspecified address)",
                         "give the machine's own address, or add tunnel_address: an address other machines reach")
        tunnel = address
    elif not _ipv4(tunnel):
        raise r.fail("tunnel_address", "is not an IPv4 address", "give the machine's IPv4 address for the WAN tunnels")
    elif not _tunnel_ok(tunnel):
        raise r.fail("tunnel_address", "is a loopback, multicast, broadcast or unspecified address",
                     "give an IPv4 address of the machine that the other machines reach")
    workdir = _get_str(r, "workdir", DEFAULT_WORKDIR)
    if not _SAFE_PATH.match(workdir) or ".." in workdir.split("/") or workdir.rstrip("/") in ("", "/"):
        raise r.fail("workdir", "is not an absolute path of a folder below /",
                     "give e.g. /var/tmp/testbed (letters, digits, '.', '_', '-', '/' only)")
    return Machine(name, address, user, tuple(dcs), port, _path(r, "key", True, base), python, tunnel,
                   workdir.rstrip("/"))


def parse_inventory(data: Any, source: str, base: Path | None = None) -> Inventory:
    """Validate an inventory given as parsed YAML; relative paths start at ``base`` (the file's
    folder; default: the current one). Raises SpecError."""
    r = FieldReader(source, data, "", ("machines", "known_hosts", "accept_unknown_host_keys"), ("machines",))
    raw = r.data["machines"]
    if not isinstance(raw, list) or not raw:
        raise r.fail("machines", "is not a list of machines", "list at least one machine (see inventory.py)")
    if len(raw) > MAX_MACHINES:
        raise r.fail("machines", f"lists {len(raw)} machines", f"use at most {MAX_MACHINES}")
    machines = tuple(_machine(source, m, i, base) for i, m in enumerate(raw))
    seen: dict[str, int] = {}
    where: dict[tuple[str, int], int] = {}
    tunnels: dict[str, int] = {}
    owner: dict[str, int] = {}
    for i, m in enumerate(machines):
        if m.name in seen:
            raise SpecError(source, f"machines[{i}].name", m.name, f"is also machines[{seen[m.name]}]'s name",
                            "give every machine its own name")
        seen[m.name] = i
        if (m.address, m.port) in where:
            raise SpecError(source, f"machines[{i}].address", m.address, f"port {m.port} is also machines"
                            f"[{where[(m.address, m.port)]}]'s", "list each machine once, with all its DCs")
        where[(m.address, m.port)] = i
        if m.tunnel_address in tunnels:
            raise SpecError(source, f"machines[{i}].tunnel_address", m.tunnel_address, f"is also machines"
                            f"[{tunnels[m.tunnel_address]}]'s: two entries for one machine?",
                            "list each machine once, with all its DCs")
        tunnels[m.tunnel_address] = i
        for dc in m.dcs:
            if dc in owner:
                raise SpecError(source, f"machines[{i}].dcs", dc, f"is also on machines[{owner[dc]}]",
                                "put every DC on one machine only")
            owner[dc] = i
    accept = r.data.get("accept_unknown_host_keys", False)
    if not isinstance(accept, bool):
        raise r.fail("accept_unknown_host_keys", "is not true or false",
                     "write true only to trust host keys never seen before (leave it out otherwise)")
    known = _expand(r, "known_hosts", _get_str(r, "known_hosts", DEFAULT_KNOWN_HOSTS), base)
    return Inventory(source, machines, known, accept)


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate an inventory file. Raises SpecError."""
    p = Path(path).absolute()
    if not p.is_file():
        raise SpecError(str(path), "(file)", str(path), "is not a file",
                        "give the path of an inventory file (README: Several machines)")
    if p.stat().st_size > MAX_INVENTORY_BYTES:
        raise SpecError(str(path), "(file)", str(path), f"is {p.stat().st_size} bytes long",
                        f"an inventory lists machines: keep it under {MAX_INVENTORY_BYTES // 1024} KiB")
    p, data = read_spec_file(p, p.parent, "inventory")
    return parse_inventory(data, str(p), p.parent)


def check_against(inv: Inventory, topo: TopologySpec) -> None:
    """Every DC of ``topo`` on exactly one machine, and no machine naming a DC ``topo`` lacks.
    Raises SpecError."""
    names = [dc.name for dc in topo.dcs]
    for i, m in enumerate(inv.machines):
        for dc in m.dcs:
            if dc not in names:
                close = difflib.get_close_matches(dc, names, n=1)
                raise SpecError(inv.source, f"machines[{i}].dcs", dc, f"is not a DC of topology {topo.name}",
                                f"did you mean {close[0]!r}?" if close else f"its DCs are {', '.join(names)}")
    placed = {dc for m in inv.machines for dc in m.dcs}
    missing = [n for n in names if n not in placed]
    if missing:
        raise SpecError(inv.source, "machines", ", ".join(missing), f"(DCs of topology {topo.name}) are on no machine",
                        "add them to a machine's dcs list")
