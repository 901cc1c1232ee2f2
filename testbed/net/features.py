"""Detection of what this machine has: root, tools, kernel features. Detected, never assumed.

Results that need a namespace (netem) are probed inside the caller's own namespace and cached
per boot in ``/run/testbed/features.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from pyroute2 import IPRoute

from testbed.errors import FeatureError, PrivilegeError
from testbed.net import netlink_tc, registry

#: tool -> Debian package that provides it
TOOLS = {
    "iperf3": "iperf3",
    "ping": "iputils-ping",
    "iptables-restore": "iptables",
    "nsenter": "util-linux",
    "tc": "iproute2",
    "ss": "iproute2",
}
DELAY_MECHANISMS = ("auto", "netem", "nfqueue")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise PrivilegeError(f"{what} needs root (network namespaces, qdiscs, iptables): run it with sudo")


def missing_tools(names: list[str]) -> list[str]:
    """Messages for the tools in ``names`` that are not on PATH, each naming its package."""
    return [f"{n} (apt-get install {TOOLS.get(n, n)})" for n in names if shutil.which(n) is None]


def require_tools(names: list[str], why: str) -> None:
    missing = missing_tools(names)
    if missing:
        raise FeatureError(f"{why} needs missing tools: {', '.join(missing)}")


AVAILABLE_CONGESTION = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


ALLOWED_CONGESTION = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def require_congestion(name: str | None) -> None:
    """Make sure the kernel lets every namespace use TCP congestion control ``name`` (None: the
    machine's default, nothing to check): its module (``tcp_<name>``) loaded, and, since a namespace
    other than the machine's own may only choose the *allowed* ones (Linux's
    tcp_set_default_congestion_control), on ``net.ipv4.tcp_allowed_congestion_control``, a setting
    of the whole machine that the testbed does not change. Raises FeatureError naming the fix."""
    if name is None:
        return
    if name not in AVAILABLE_CONGESTION.read_text().split():
        _load_congestion(name)
    allowed = allowed_congestion()
    if name not in allowed:
        raise FeatureError(
            f"namespaces may choose only the allowed TCP congestion controls ({' '.join(allowed)}), "
            f"not {name!r}: allow it for the whole machine with "
            f"sysctl -w net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, name])}', "
            "or leave the topology's tcp_congestion out to use the machine's default"
        )


def allowed_congestion() -> list[str]:
    """The congestion controls any namespace may choose (net.ipv4.tcp_allowed_congestion_control)."""
    return ALLOWED_CONGESTION.read_text().split()


def _load_congestion(name: str) -> None:
    if shutil.which("modprobe") is None:
        tried = "no modprobe to load its module"
    else:
        proc = subprocess.run(["modprobe", f"tcp_{name}"], capture_output=True, text=True)
        tried = f"modprobe tcp_{name}: {proc.stderr.strip() or 'loaded nothing'}"
    available = AVAILABLE_CONGESTION.read_text().split()
    if name not in available:
        raise FeatureError(
            f"the kernel has no TCP congestion control {name!r} (available: {', '.join(available)}; "
            f"{tried}): set the topology's tcp_congestion to one of those"
        )


def default_congestion() -> str:
    """The TCP congestion control new namespaces inherit (this machine's default)."""
    return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _cache_path() -> Path:
    return registry.RUN_DIR / "features.json"


def cached_features() -> dict:
    try:
        data = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if data.get("boot_id") == boot_id() else {}


def store_feature(key: str, value: object) -> None:
    data = cached_features() or {"boot_id": boot_id()}
    data[key] = value
    _cache_path().parent.mkdir(parents=True, exist_ok=True)
    _cache_path().write_text(json.dumps(data))


def check_delay_mechanism(requested: str) -> None:
    """Raise FeatureError for a name that is no delay mechanism."""
    if requested not in DELAY_MECHANISMS:
        raise FeatureError(f"unknown delay mechanism {requested!r}: use one of {', '.join(DELAY_MECHANISMS)}")


def resolve_delay_mechanism(requested: str, netem_ok: bool) -> str:
    """``auto`` -> netem where the kernel has it, else the NFQUEUE fallback. Forcing netem on a
    kernel without it raises FeatureError with the fix."""
    check_delay_mechanism(requested)
    if requested == "netem" and not netem_ok:
        raise FeatureError(
            "this kernel has no sch_netem (tc qdisc netem fails with ENOENT): use "
            "--delay-mechanism nfqueue (or auto), or install your distribution's extra "
            "kernel modules (Ubuntu: linux-modules-extra-$(uname -r))"
        )
    if requested == "auto":
        return "netem" if netem_ok else "nfqueue"
    return requested


def detect_delay_mechanism(requested: str, own_ipr: IPRoute) -> str:
    """The delay mechanism to use for ``requested`` (``auto``, ``netem``, ``nfqueue``): whether the
    kernel has sch_netem is probed once per boot inside a namespace of our own (``own_ipr``) and
    cached. Raises FeatureError as ``resolve_delay_mechanism`` does."""
    feats = cached_features()
    if "netem" not in feats:
        feats["netem"] = netlink_tc.netem_available(own_ipr)
        store_feature("netem", feats["netem"])
    return resolve_delay_mechanism(requested, feats["netem"])


def describe_mechanism(mechanism: str) -> str:
    if mechanism == "netem":
        return "netem (kernel qdisc; jitter reorders packets)"
    return "nfqueue (userspace NFQUEUE delay element on the receiving side; jitter keeps packet order)"
