"""One machine of an inventory (``inventory.py``): its fields and their reading, every error naming
the field, the value and the fix. No value is ever pasted into a shell: commands are argument
lists quoted by ``ssh.remote_command``."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.specfile import FieldReader

DEFAULT_WORKDIR = "/var/tmp/testbed"
DEFAULT_PYTHON = "python3"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}\Z")
#: useradd(8)'s default NAME_REGEX
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}\Z")
#: RFC 1123 host names
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
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


#: an inventory's ``machines[i]``: defaults are ``Machine``'s
MACHINE_FIELDS = FieldTable(
    "inventory: machines[i]",
    "machines[i]",
    "One machine of `--backend remote`, reached over SSH, and the DCs it builds.",
    (
        Field(
            "name",
            "text",
            "a short name for messages and trace files (letters, digits, `.`, `_`, `-`)",
            default=REQUIRED,
        ),
        Field("address", "text", "where SSH reaches it: an IPv4 or IPv6 address or a host name", default=REQUIRED),
        Field("port", "int", "the SSH port", default=22, low=1, high=65535, fix="give a whole number from 1 to 65535"),
        Field("user", "text", "the login: root, or a user with root's keys", default=REQUIRED),
        Field("key", "path", "the SSH private key", default_text="ssh-agent and ~/.ssh/id_*"),
        Field("dcs", "list", "the topology's DCs built on this machine", default=REQUIRED),
        Field(
            "python", "text", "the Python with torch and pyroute2 there (a path or a command)", default=DEFAULT_PYTHON
        ),
        Field(
            "tunnel_address",
            "text",
            "the IPv4 address the WAN tunnels (VXLAN, UDP 4789) use",
            default="",
            default_text="`address`, which must then be IPv4",
        ),
        Field("workdir", "text", "where the run's code and traces go there", default=DEFAULT_WORKDIR),
    ),
)


def text_field(r: FieldReader, key: str, default: Any = REQUIRED) -> Any:
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
    value = text_field(r, "address")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOSTNAME.match(value):
        raise r.fail(
            "address",
            "is neither an IP address nor a host name (RFC 1123: letters, digits, '-', '.')",
            "give the machine's IP address or DNS name",
        )
    return value


def expand_path(r: FieldReader, key: str, value: str, base: Path | None) -> Path:
    """``~`` expanded, a relative path taken from the inventory's folder, made absolute."""
    if "\0" in value:
        raise r.fail(key, "contains a NUL character", "give a plain path")
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # ~nosuchuser
        raise r.fail(
            key,
            "names the home folder of a user this machine does not have",
            "give an absolute path, or ~/ for your own home",
        ) from None
    return (p if p.is_absolute() else (base or Path.cwd()) / p).absolute()


def _path(r: FieldReader, key: str, must_exist: bool, base: Path | None) -> Path | None:
    value = text_field(r, key, None)
    if value is None:
        return None
    p = expand_path(r, key, value, base)
    if must_exist and not p.is_file():
        raise r.fail(
            key,
            "is not a readable file",
            f"give the path of the file ({key}; relative paths start at the inventory's folder)",
        )
    return p


def _tunnel_ok(text: str) -> bool:
    ip = ipaddress.IPv4Address(text)
    return not (
        ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip == ipaddress.IPv4Address("255.255.255.255")
    )


def read_machine(source: str, data: Any, i: int, base: Path | None = None) -> Machine:
    if isinstance(data, dict) and "hosts" in data:  # MaxiNet#45: hosts moved silently off their DC's machine
        raise SpecError(
            source,
            f"machines[{i}].hosts",
            data["hosts"],
            "places hosts, but a host runs on the machine of its DC, with its DC's router (a DC's hosts and "
            "router share one bridge, which does not span machines)",
            "list whole DCs under dcs; to spread hosts over machines, split the DC into several DCs in the topology",
        )
    r = FieldReader(source, data, f"machines[{i}]", MACHINE_FIELDS)
    name = text_field(r, "name")
    if not _NAME.match(name):
        raise r.fail("name", "is not a short name", "use letters, digits, '.', '_' or '-' (at most 32 characters)")
    address = _address(r)
    port = r.value("port")
    user = text_field(r, "user")
    if not _USER.match(user):
        raise r.fail(
            "user", "is not a user name", "give a login name such as root (lower-case letters, digits, '_', '-')"
        )
    dcs = r.data["dcs"]
    if isinstance(dcs, str):
        dcs = [dcs]
    if not isinstance(dcs, list) or not dcs or not all(isinstance(d, str) and d for d in dcs):
        raise r.fail("dcs", "is not a list of DC names", "write the DCs this machine builds, e.g. dcs: [east, west]")
    python = text_field(r, "python", DEFAULT_PYTHON)
    if not (_SAFE_PATH.match(python) or _COMMAND.match(python)):
        raise r.fail(
            "python",
            "is neither an absolute path nor a command name",
            "give e.g. python3 or /opt/testbed/.venv/bin/python (no spaces or shell characters)",
        )
    tunnel = text_field(r, "tunnel_address", None)
    if tunnel is None:
        if not _ipv4(address):
            raise r.fail(
                "address",
                "is not an IPv4 address, and the machine has no tunnel_address",
                "add tunnel_address: the machine's IPv4 address that the WAN tunnels (VXLAN) use",
            )
        if not _tunnel_ok(address):
            raise r.fail(
                "address",
                "cannot carry the WAN tunnels (a loopback, multicast or unspecified address)",
                "give the machine's own address, or add tunnel_address: an address other machines reach",
            )
        tunnel = address
    elif not _ipv4(tunnel):
        raise r.fail("tunnel_address", "is not an IPv4 address", "give the machine's IPv4 address for the WAN tunnels")
    elif not _tunnel_ok(tunnel):
        raise r.fail(
            "tunnel_address",
            "is a loopback, multicast, broadcast or unspecified address",
            "give an IPv4 address of the machine that the other machines reach",
        )
    workdir = text_field(r, "workdir", DEFAULT_WORKDIR)
    if not _SAFE_PATH.match(workdir) or ".." in workdir.split("/") or workdir.rstrip("/") in ("", "/"):
        raise r.fail(
            "workdir",
            "is not an absolute path of a folder below /",
            "give e.g. /var/tmp/testbed (letters, digits, '.', '_', '-', '/' only)",
        )
    return Machine(
        name, address, user, tuple(dcs), port, _path(r, "key", True, base), python, tunnel, workdir.rstrip("/")
    )
