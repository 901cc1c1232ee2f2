"""Stand-in machines for ``--backend remote`` on one Linux box (DESIGN.md section 3): each "machine"
is an ``sshd`` in its own network namespace and its own mount namespace (private ``/run/netns``,
``/run/testbed`` and work folder, so deployment really copies files), optionally in a time namespace
with a shifted CLOCK_MONOTONIC (``unshare --time --monotonic``), so clock offsets are real. The
machines share a LAN (a bridge in a namespace of its own) that this namespace reaches through one
veth, ``<prefix>-op``, whose other end lives in the LAN namespace (removing that namespace removes
it). Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range).

The lab is registered like a run (``testbed clean`` removes it after ``kill -9``) and writes an
inventory, a client key and a known_hosts file, so::

    sudo .venv/bin/python scripts/ssh_lab.py --machines 2 --shift 1000 --out /tmp/lab
    sudo testbed run --backend remote --inventory /tmp/lab/inventory.yaml --topology two_dc ...
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testbed.errors import BuildError
from testbed.net import netlink
from testbed.net.features import require_root, require_tools
from testbed.net.hostproc import stop_popen
from testbed.net.registry import RunRecord, clean_run

LAB_POOL = ipaddress.IPv4Network("198.18.0.0/15")
SSHD = "/usr/sbin/sshd"


@dataclass
class LabMachine:
    name: str
    netns: str
    ip: str
    shift_s: float
    dcs: list[str]
    proc: subprocess.Popen | None = None


@dataclass
class SshLab:
    """``machines`` stand-in machines; machine i hosts ``dcs[i]`` and is shifted by ``shifts[i]``
    seconds. ``out`` receives keys, sshd configs and logs, ``inventory.yaml`` and ``known_hosts``."""

    dcs: list[list[str]]
    out: Path
    shifts: list[float] = field(default_factory=list)
    python: str = ""
    workdir: str = "/var/tmp/testbed-lab"
    prefix: str = field(default_factory=lambda: "tl" + secrets.token_hex(2))
    machines: list[LabMachine] = field(default_factory=list)
    inventory: Path | None = None
    _record: RunRecord | None = None

    @property
    def lan_netns(self) -> str:
        return f"{self.prefix}-lan"

    def _subnet(self) -> ipaddress.IPv4Network:
        return list(LAB_POOL.subnets(new_prefix=24))[int(self.prefix[2:], 16) % 512]

    def __enter__(self) -> SshLab:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        import sys

        require_root("the SSH lab")
        require_tools(["nsenter", "unshare", "ssh-keygen"], "the SSH lab")
        if not Path(SSHD).exists():
            raise BuildError(f"{SSHD} is missing: apt-get install openssh-server")
        self.python = self.python or sys.executable
        self.out.mkdir(parents=True, exist_ok=True)
        net = self._subnet()
        hosts = list(net.hosts())
        names = [f"{self.prefix}-m{i}" for i in range(len(self.dcs))]
        self._record = RunRecord.new(self.prefix, kind="sshlab", out_dir=str(self.out))
        self._record.add_namespaces([self.lan_netns, *names])
        key = self.out / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testbed-lab", "-f", str(key)], check=True)
        (self.out / "authorized_keys").write_text((self.out / "id_ed25519.pub").read_text())
        lan = netlink.create_netns(self.lan_netns, {})
        br = netlink.add_bridge(lan, "br0")
        netlink.up(lan, br)
        # this namespace's way in: <prefix>-op here, its peer on the LAN's bridge
        op = f"{self.prefix}-op"
        with netlink.IPRoute() as here:
            here.link("add", ifname=op, kind="veth", peer={"ifname": "op", "net_ns_fd": self.lan_netns})
            idx = netlink.ifindex(here, op)
            netlink.add_address(here, idx, str(hosts[0]), net.prefixlen)
            netlink.up(here, idx)
        self._port(lan, br, "op")
        known = []
        for i, (ns, dcs) in enumerate(zip(names, self.dcs)):
            shift = self.shifts[i] if i < len(self.shifts) else 0.0
            m = LabMachine(f"m{i}", ns, str(hosts[10 + i]), shift, list(dcs))
            ipr = netlink.create_netns(ns, {})
            netlink.add_veth(lan, f"m{i}", "eth0", ns)
            self._port(lan, br, f"m{i}")
            eth = netlink.ifindex(ipr, "eth0")
            netlink.add_address(ipr, eth, m.ip, net.prefixlen)
            netlink.up(ipr, eth)
            netlink.up(ipr, netlink.ifindex(ipr, "lo"))
            ipr.close()
            known.append(self._start_sshd(m))
            self.machines.append(m)
        lan.close()
        (self.out / "known_hosts").write_text("".join(known))
        self._wait_listening()
        self.inventory = self.write_inventory(self.out / "inventory.yaml", [m.dcs for m in self.machines])

    def write_inventory(self, path: Path, dcs: list[list[str]], **top) -> Path:
        """An inventory of this lab's machines hosting ``dcs[i]`` on machine i; ``top`` adds or
        replaces top-level fields (such as known_hosts)."""
        path.write_text(
            yaml.safe_dump(
                {
                    "known_hosts": str(self.out / "known_hosts"),
                    "machines": [
                        {
                            "name": m.name,
                            "address": m.ip,
                            "user": "root",
                            "key": str(self.out / "id_ed25519"),
                            "dcs": list(d),
                            "python": self.python,
                            "workdir": self.workdir,
                        }
                        for m, d in zip(self.machines, dcs)
                    ],
                    **top,
                },
                sort_keys=False,
            )
        )
        return path

    @staticmethod
    def _port(ipr, br: int, ifname: str) -> None:
        idx = netlink.ifindex(ipr, ifname)
        netlink.set_master(ipr, idx, br)
        netlink.up(ipr, idx)

    def _start_sshd(self, m: LabMachine) -> str:
        d = self.out / m.name
        d.mkdir(exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_ed25519")], check=True)
        (d / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {m.ip}",
                    "Port 22",
                    f"HostKey {d / 'host_ed25519'}",
                    f"AuthorizedKeysFile {self.out / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PidFile none",
                    "Subsystem sftp internal-sftp",
                    "MaxSessions 64",
                    "MaxStartups 64",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        Path(self.workdir).mkdir(parents=True, exist_ok=True)
        # a private mount namespace: its own /run/netns, /run/testbed and work folder
        inner = " && ".join(
            [f"mount -t tmpfs tmpfs {p}" for p in ("/run/netns", "/run/testbed", self.workdir)]
            + [f"exec {SSHD} -D -e -f {shlex.quote(str(d / 'sshd_config'))}"]
        )
        Path("/run/netns").mkdir(exist_ok=True)
        Path("/run/testbed").mkdir(exist_ok=True)
        argv = ["nsenter", f"--net=/run/netns/{m.netns}", "unshare", "--mount", "--propagation", "private"]
        if m.shift_s:
            argv += ["--time", "--monotonic", f"{m.shift_s:g}"]
        argv += ["--fork", "--kill-child", "--", "sh", "-c", inner]
        log = open(d / "sshd.log", "ab")
        m.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._record.add_process(m.proc.pid, f"sshd of lab machine {m.name}")
        return (
            f"{m.ip} {(d / 'host_ed25519.pub').read_text().split(' ')[0]} "
            f"{(d / 'host_ed25519.pub').read_text().split(' ')[1]}\n"
        )

    def _wait_listening(self, timeout_s: float = 10.0) -> None:
        import socket

        deadline = time.monotonic() + timeout_s
        for m in self.machines:
            while True:
                if m.proc.poll() is not None:
                    raise BuildError(
                        f"sshd of lab machine {m.name} exited: {(self.out / m.name / 'sshd.log').read_text()}"
                    )
                try:
                    with socket.create_connection((m.ip, 22), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise BuildError(f"sshd of lab machine {m.name} does not listen on {m.ip}:22") from None
                    time.sleep(0.05)

    def stop(self) -> None:
        for m in self.machines:
            if m.proc is not None and m.proc.poll() is None:
                try:  # unshare --fork waits for its child: stop sshd itself
                    os.kill(_sshd_pid(m.proc.pid), signal.SIGTERM)
                except (OSError, BuildError):
                    pass
                stop_popen(m.proc, grace_s=5)
        if self._record is not None:
            # this namespace's end of the LAN first: a namespace is destroyed asynchronously, and
            # the veth would outlive the LAN namespace's removal for a moment
            with netlink.IPRoute() as here:
                found = here.link_lookup(ifname=f"{self.prefix}-op")
                if found:
                    here.link("del", index=found[0])
            clean_run(self._record)  # also ends sshd sessions still open in the machines
            self._record = None

    def run_in(self, m: LabMachine, argv: list[str]) -> str:
        """``argv``'s output, run inside machine ``m`` (its network and mount namespaces: its own
        /run/netns), as its sshd's sessions see it."""
        enter = ["nsenter", "-t", str(_sshd_pid(m.proc.pid)), "-m", "-n", "--"]
        return subprocess.run([*enter, *argv], capture_output=True, text=True).stdout

    def machine_state(self, m: LabMachine) -> dict:
        """What a machine holds of the testbed's: its namespaces, registered runs, work folder
        entries and processes (seen from inside its namespaces)."""

        def out(*argv: str) -> list[str]:
            lines = self.run_in(m, list(argv)).splitlines()
            return sorted(line.split()[0].split("@")[0] for line in lines if line.strip())

        return {
            "netns": out("ls", "/run/netns"),
            "runs": out("ls", "/run/testbed/runs"),
            "workdir": out("ls", "-A", self.workdir),
            "links": out("ip", "-br", "link"),
        }


def _sshd_pid(unshare_pid: int) -> int:
    """The sshd below ``unshare --fork`` (its only child)."""
    children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
    if not children:
        raise BuildError(f"lab process {unshare_pid} has no sshd child")
    return int(children[0])
