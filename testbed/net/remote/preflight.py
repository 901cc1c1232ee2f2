"""Before anything is built on any machine of ``--backend remote``: every machine is checked for
root, the tools and Python modules the run needs (with the same torch and pyroute2 versions as
here), libnetfilter_queue's header (to build the delay element), VXLAN in its kernel, and TCP's
congestion control: the topology's ``tcp_congestion`` available and allowed in namespaces, or,
without one, the same default on every machine. All problems, on all machines, come back as one
list.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from testbed.errors import RemoteError
from testbed.net.registry import RUN_DIR
from testbed.net.remote.inventory import Inventory, Machine
from testbed.net.remote.ssh import Connection

#: what the agent and the workers import, checked on every machine before anything is built
MODULES = ("torch", "pyroute2", "numpy", "pandas", "yaml")
TOOLS = {
    "nsenter": "util-linux",
    "ip": "iproute2",
    "tc": "iproute2",
    "iptables-restore": "iptables",
    "iperf3": "iperf3",
    "ping": "iputils-ping",
    "unshare": "util-linux",
}
#: the NFQUEUE delay element is compiled there when the kernel has no sch_netem
BUILD_TOOLS = {"gcc": "gcc"}

PREFLIGHT = r"""
import json, os, shutil, subprocess, sys
out = {"uid": os.geteuid(), "python": sys.version.split()[0], "modules": {}, "tools": {}}
for m in %(modules)r:
    try:
        out["modules"][m] = getattr(__import__(m), "__version__", "?")
    except Exception as e:
        out["modules"][m] = None
for t in %(tools)r:
    out["tools"][t] = shutil.which(t)
out["nfq_header"] = os.path.exists("/usr/include/libnetfilter_queue/libnetfilter_queue.h")
p = subprocess.run(["unshare", "--net", "ip", "link", "add", "tbprobe", "type", "vxlan", "id", "1", "dstport",
                    "4789"], capture_output=True, text=True)
out["vxlan"] = p.returncode == 0
out["vxlan_error"] = p.stderr.strip()
cc = "/proc/sys/net/ipv4/tcp_%%s_congestion_control"
want = %(congestion)r
if want and want not in open(cc %% "available").read().split() and shutil.which("modprobe"):
    subprocess.run(["modprobe", "tcp_" + want], capture_output=True)
out["congestion"] = {k: open(cc %% k).read().split() for k in ("available", "allowed")}
out["congestion"]["default"] = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
state = os.stat("/run/testbed") if os.path.isdir("/run/testbed") else None
out["state_dir"] = [boot, state.st_dev, state.st_ino] if state else None
print(json.dumps(out))
"""


def last_json_line(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object (a login banner may come first)."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        return value if isinstance(value, dict) else None
    return None


def check_machine(
    name: str, report: dict, torch_version: str, pyroute2_version: str, congestion: str | None = None
) -> list[str]:
    """Problems of one machine's preflight report (empty: ready); ``congestion``: the topology's
    ``tcp_congestion`` (None: the machines' defaults, compared by ``check_congestion_defaults``).
    Pure: unit-tested."""
    if not isinstance(report.get("modules"), dict) or not isinstance(report.get("tools"), dict):
        return [
            f"{name}: its python printed something other than the preflight report: give the inventory's "
            "python as a Python 3 interpreter there"
        ]
    problems = []
    if report.get("uid") != 0:
        problems.append(
            "the login is not root (uid 0): the testbed builds network namespaces there; log in as root with a key"
        )
    missing = [
        f"{m} (install it into that Python, e.g. with scripts/setup.sh)"
        for m, v in report["modules"].items()
        if v is None
    ]
    if missing:
        problems.append("Python modules missing: " + ", ".join(missing))
    want = {"torch": torch_version, "pyroute2": pyroute2_version}
    for mod, version in want.items():
        got = report["modules"].get(mod)
        if got is not None and got != version:
            problems.append(
                f"{mod} {got} differs from this machine's {version} (workers must match: install "
                f"{mod}=={version.split('+')[0]})"
            )
    tools = [
        f"{t} (apt-get install {pkg})" for t, pkg in {**TOOLS, **BUILD_TOOLS}.items() if not report["tools"].get(t)
    ]
    if tools:
        problems.append("tools missing: " + ", ".join(tools))
    if not report.get("nfq_header"):
        problems.append(
            "libnetfilter_queue's header is missing (apt-get install libnetfilter-queue-dev), "
            "needed to build the delay element where the kernel has no sch_netem"
        )
    if not report.get("vxlan"):
        problems.append(
            f"the kernel cannot create VXLAN interfaces ({report.get('vxlan_error') or 'no reason given'}): "
            "load the vxlan module (modprobe vxlan)"
        )
    cc = report.get("congestion") or {}
    if congestion and cc and congestion not in cc.get("available", []):
        problems.append(
            f"the kernel has no TCP congestion control {congestion!r} (available: {', '.join(cc['available'])}; "
            f"modprobe tcp_{congestion} loaded none): set the topology's tcp_congestion to one every machine has"
        )
    elif congestion and cc and congestion not in cc.get("allowed", []):
        problems.append(
            f"namespaces may choose only the allowed TCP congestion controls ({' '.join(cc['allowed'])}), not "
            f"{congestion!r}: allow it there with sysctl -w net.ipv4.tcp_allowed_congestion_control="
            f"'{' '.join([*cc['allowed'], congestion])}'"
        )
    return [f"{name}: {p}" for p in problems]


def state_dir_id(path: Path) -> list | None:
    """(boot id, device, inode) of a testbed state folder (``registry.RUN_DIR``): two machines with
    the same are one machine, as the preflight script reports it there."""
    if not path.is_dir():
        return None
    st = path.stat()
    return [Path("/proc/sys/kernel/random/boot_id").read_text().strip(), st.st_dev, st.st_ino]


def check_not_here(name: str, report: dict, here: list | None) -> list[str]:
    """A problem where machine ``name`` is this one (the same kernel and state folder): its agent
    would register the run under the runner's own name and bind the runner's control sockets.
    Pure: unit-tested."""
    if here is not None and report.get("state_dir") == here:
        return [
            f"{name}: is this machine (the same kernel and {RUN_DIR}): the runner and that machine's agent would "
            "share the run's registry entry and control sockets; run the command from a machine outside the "
            "inventory"
        ]
    return []


def check_congestion_defaults(reports: dict[str, dict]) -> list[str]:
    """With no ``tcp_congestion`` in the topology each end of a link runs its machine's default: a
    problem where the machines' defaults differ (the two directions of a link would share it unlike
    each other, silently). Pure: unit-tested."""
    defaults = {name: (r.get("congestion") or {}).get("default") for name, r in reports.items()}
    if len({d for d in defaults.values() if d}) > 1:
        listed = ", ".join(f"{name} {d}" for name, d in sorted(defaults.items()))
        return [
            f"the machines' default TCP congestion controls differ ({listed}): set the topology's "
            "tcp_congestion so that every end runs the same one"
        ]
    return []


def local_versions() -> dict[str, str]:
    """This machine's torch and pyroute2 versions, which every machine's must equal."""
    out = {}
    for mod in ("torch", "pyroute2"):
        try:
            out[mod] = metadata.version(mod)
        except metadata.PackageNotFoundError:
            out[mod] = "not installed"
    return out


def preflight(
    conn: Connection, m: Machine, want: dict[str, str], congestion: str | None = None
) -> tuple[dict[str, Any] | None, list[str]]:
    """(the machine's preflight report or None, its problems) over an open connection;
    ``congestion``: the topology's ``tcp_congestion``."""
    code, out, err = conn.run(["id", "-u"], timeout_s=30)
    if code != 0 or out.strip().splitlines()[-1:] != ["0"]:
        return None, [
            f"{m.name}: the login {m.user} is not root (id -u: {(out or err).strip()[-80:]!r}): the "
            "testbed builds network namespaces there; log in as root with a key"
        ]
    script = PREFLIGHT % {"modules": MODULES, "tools": tuple({**TOOLS, **BUILD_TOOLS}), "congestion": congestion}
    code, out, err = conn.run([m.python, "-c", script], timeout_s=60)
    report = last_json_line(out)
    if code != 0 or report is None:
        return None, [
            f"{m.name}: {m.python} gave no preflight report (exit {code}): {(err or out).strip()[-300:]!r}; "
            "give the inventory's python as a Python 3 interpreter there, and make sure the login "
            "prints nothing else"
        ]
    return report, check_machine(m.name, report, want["torch"], want["pyroute2"], congestion)


def require_ready(problems: list[str], what: str) -> None:
    """Raise RemoteError listing every problem, if any."""
    if problems:
        raise RemoteError(f"{what}; nothing was built:\n  " + "\n  ".join(problems))


def connect_and_check(
    inventory: Inventory,
    conns: dict[str, Connection],
    reports: dict[str, dict[str, Any]],
    congestion: str | None = None,
) -> None:
    """Open a connection to every machine of ``inventory`` into ``conns`` (by machine name) and
    check each (``preflight``, its report into ``reports``; ``congestion``: the topology's
    ``tcp_congestion``, or the machines' defaults compared), before anything is built anywhere.
    Raises RemoteError listing every machine's problems: first those reaching them, then those
    of the machines reached. Connections opened stay in ``conns``, for the caller to close."""

    def reach(m: Machine) -> str | None:
        try:
            conns[m.name] = Connection(m, inventory.known_hosts, inventory.accept_unknown_host_keys).open()
        except RemoteError as e:
            return str(e)
        return None

    with ThreadPoolExecutor(max_workers=len(inventory.machines), thread_name_prefix="connect") as pool:
        problems = [p for p in pool.map(reach, inventory.machines) if p is not None]
    require_ready(problems, "cannot use the inventory's machines")
    want = local_versions()
    # every machine at once: each runs a Python that imports torch, seconds of its own CPU
    with ThreadPoolExecutor(max_workers=len(inventory.machines), thread_name_prefix="preflight") as pool:
        checked = list(pool.map(lambda m: preflight(conns[m.name], m, want, congestion), inventory.machines))
    here = state_dir_id(RUN_DIR)
    for m, (report, found) in zip(inventory.machines, checked):
        if report is not None:
            reports[m.name] = report
            found += check_not_here(m.name, report, here)
        problems += found
    if congestion is None:
        problems += check_congestion_defaults(reports)
    require_ready(problems, "machines are not ready")
