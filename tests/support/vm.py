"""A test box for the netem path: a small Debian system with Debian's stock kernel (which has
``sch_netem`` as a module), booted with qemu, that runs a chosen set of the project's tests and
brings back their result and a log.

The development and CI machines have no ``sch_netem``; almost every user's machine has it. This box
is how that path is tested here (``scripts/vm_check``; the suite's ``tests/integration/test_vm.py``).

- **The box** (built once, cached in ``/var/cache/testbed/vm/<key>/``): ``debootstrap`` makes a
  minimal root filesystem of the host's own Debian release from its apt mirror, with
  ``linux-image-amd64`` (kernel, modules, initramfs) and the tools the tests use (iproute2,
  iptables, iperf3, ping, Python); ``mke2fs -d`` turns it into an ext4 image without mounting
  anything. No network is needed inside the VM: the project and its ``.venv`` come from the host,
  shared read-only over virtio-9p at the same path, so the box must have the host's Python
  version (checked). The key hashes the release, the mirror, the package list and the box's init
  script, so a change of any of them builds a new box.
- **A run** boots the cached image through a throw-away qcow2 overlay (the image never changes),
  with a second 9p share, the *job folder*, holding the script to run and receiving its results
  (``pytest.log``, ``junit.xml``, ``rc``). The box's init mounts what it needs, runs the job,
  and powers the machine off. KVM is used where ``/dev/kvm`` works; where the guest does not
  report it booted within ``KVM_BOOT_S`` (seen here: KVM stopped in the kernel's decompression),
  the run starts again under software emulation (TCG), and later runs of the same machine boot go
  straight to TCG. ``VmRun.accel`` says which ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.lifetime import die_with_parent
from testbed.net.features import boot_id

CACHE = Path("/var/cache/testbed/vm")
#: what the box holds besides the minimal base: the kernel and the tools the tests run
PACKAGES = (
    "linux-image-amd64",
    "iproute2",
    "iptables",
    "iperf3",
    "iputils-ping",
    "kmod",
    "procps",
    "util-linux",
    "python3",
    "python3-yaml",  # the host's .venv may take PyYAML from the system (it sees system packages)
)
#: host tools a box needs: (command, Debian package)
HOST_TOOLS = (
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("qemu-img", "qemu-utils"),
    ("debootstrap", "debootstrap"),
    ("mke2fs", "e2fsprogs"),
)
ACCELS = ("auto", "kvm", "tcg")
#: seconds a KVM guest has to report that it booted before the run falls back to TCG
KVM_BOOT_S = 30.0
#: seconds a TCG guest has to report that it booted
TCG_BOOT_S = 120.0
BOOTED = "testbed-vm: booted"
IMAGE_SIZE = "3G"

# The box's /sbin/init: mount what a system needs, mount the job folder (9p), run its script,
# power off. Kernel messages stay off the console so that the job's output is readable.
INIT = """#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
echo 1 > /proc/sys/kernel/printk
hostname testbed-vm
ip link set lo up
modprobe 9pnet_virtio && modprobe 9p
mkdir -p /job
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 job /job; then
  echo "testbed-vm: booted $(uname -r)"
  echo "$(uname -r)" > /job/booted
  /bin/sh /job/run.sh > /job/job.log 2>&1
  echo "testbed-vm: job ended with status $?"
else
  echo "testbed-vm: cannot mount the job folder"
fi
sync
echo o > /proc/sysrq-trigger
sleep 30
"""


def _die_with_parent() -> None:
    """In the qemu child: SIGKILL when the test dies, so no VM outlives a killed run."""
    die_with_parent(signal.SIGKILL)


class VmError(Exception):
    """The box cannot be built or run; the message says what is missing and how to get it."""


def missing_host_tools(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The Debian packages of host tools a box needs and this machine lacks."""
    return [pkg for cmd, pkg in HOST_TOOLS if which(cmd) is None]


def check_host(which: Callable[[str], str | None] = shutil.which) -> None:
    """Raise VmError naming what to install when a host tool is missing, or when not root."""
    missing = missing_host_tools(which)
    if missing:
        raise VmError(
            f"the VM test box needs {', '.join(missing)}: apt-get install {' '.join(missing)} "
            "(or run scripts/setup.sh --test)"
        )
    if os.geteuid() != 0:
        raise VmError("the VM test box needs root (debootstrap, /var/cache/testbed): run it with sudo")


def apt_source(sources: list[Path] | None = None) -> str:
    """The host's Debian mirror (first ``deb`` source); the box is built from the same place."""
    files = sources or [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+)", text, re.M) or re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    return "http://deb.debian.org/debian"


def host_release(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's Debian release codename (``bookworm``). Raises VmError on a non-Debian host."""
    try:
        fields = dict(
            line.split("=", 1)
            for line in os_release.read_text().splitlines()
            if "=" in line and not line.startswith("#")
        )
    except OSError as e:
        raise VmError(f"cannot read {os_release} ({e}): the box is built from the host's Debian release") from None
    code = fields.get("VERSION_CODENAME", "").strip('"')
    if fields.get("ID", "").strip('"') != "debian" or not code:
        raise VmError(
            f"the VM test box is built with debootstrap from Debian's packages; {os_release} names no Debian release"
        )
    return code


def venv_python_version(project: Path) -> str:
    """``major.minor`` of the interpreter the project's .venv was made with (its ``pyvenv.cfg``).
    Raises VmError without a .venv."""
    cfg = project / ".venv" / "pyvenv.cfg"
    try:
        pairs = (line.split("=", 1) for line in cfg.read_text().splitlines() if "=" in line)
        fields = {k.strip(): v.strip() for k, v in pairs}
    except OSError:
        raise VmError(f"no {cfg}: run scripts/setup.sh first (the box uses the host's .venv)") from None
    version = (fields.get("version") or fields.get("version_info") or "").strip()
    return ".".join(version.split(".")[:2])


def box_key(release: str, mirror: str) -> str:
    """The cache key: everything a box is made from (the release fixes its Python)."""
    blob = json.dumps([release, mirror, PACKAGES, INIT], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class Box:
    """A built box: its image (raw ext4), kernel and initramfs, and what it holds."""

    folder: Path
    kernel_release: str
    python: str

    @property
    def image(self) -> Path:
        return self.folder / "rootfs.img"

    @property
    def kernel(self) -> Path:
        return self.folder / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.folder / "initrd.img"


def kernel_files(rootfs: Path) -> tuple[str, Path, Path]:
    """(release, kernel, initramfs) that ``linux-image-amd64`` installed in ``rootfs``. Raises
    VmError when it installed none (the package missing from the mirror, or its initramfs not made)."""
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise VmError(
            f"no kernel in {rootfs / 'boot'}: the box takes Debian's stock kernel from the package "
            "linux-image-amd64, which the mirror did not provide (apt-cache policy linux-image-amd64)"
        )
    kernel = kernels[-1]
    release = kernel.name[len("vmlinuz-") :]
    initrd = rootfs / "boot" / f"initrd.img-{release}"
    if not initrd.exists():
        raise VmError(f"linux-image-amd64 installed {kernel.name} but no {initrd.name}: initramfs-tools failed")
    if not (rootfs / "lib" / "modules" / release / "kernel" / "net" / "sched").is_dir():
        raise VmError(f"the kernel {release} came without its modules in /lib/modules/{release}")
    return release, kernel, initrd


def box_python(rootfs: Path) -> str:
    """``major.minor`` of the box's python3."""
    found = sorted(p.name for p in (rootfs / "usr" / "bin").glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name))
    if not found:
        raise VmError("the box has no python3")
    return found[-1][len("python") :]


def _run(argv: list[str], log: Callable[[str], None], **kw) -> None:
    log("$ " + " ".join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise VmError(f"{argv[0]} failed (status {proc.returncode}):\n{tail}")


def _check_python(box_python: str, project: Path) -> None:
    venv = venv_python_version(project)
    if box_python != venv:
        raise VmError(
            f"the box's Python is {box_python} but the project's .venv runs on {venv}: the box shares "
            "the host's .venv, so both must come from the same Debian release"
        )


def build_box(project: Path, log: Callable[[str], None] = print, rebuild: bool = False) -> Box:
    """The cached box for the checkout ``project``, built first if needed (about 2 minutes here:
    debootstrap fetches about 150 MB from the host's mirror). Raises VmError."""
    check_host()
    release, mirror = host_release(), apt_source()
    folder = CACHE / box_key(release, mirror)
    info = folder / "box.json"
    if info.exists() and not rebuild:
        meta = json.loads(info.read_text())
        _check_python(meta["python"], project)
        return Box(folder, meta["kernel_release"], meta["python"])
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE))
    try:
        rootfs = work / "rootfs"
        log(f"building the VM test box: Debian {release} from {mirror} into {folder} (once)")
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                release,
                str(rootfs),
                mirror,
            ],
            log,
        )
        rel, kernel, initrd = kernel_files(rootfs)
        python = box_python(rootfs)
        _check_python(python, project)
        init = rootfs / "sbin" / "testbed-vm-init"
        init.write_text(INIT)
        init.chmod(0o755)
        (rootfs / "etc" / "fstab").write_text("")
        for junk in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            junk.unlink()
        shutil.copy2(kernel, work / "vmlinuz")
        shutil.copy2(initrd, work / "initrd.img")
        _run(
            [
                "mke2fs",
                "-q",
                "-F",
                "-t",
                "ext4",
                "-L",
                "testbed-vm",
                "-d",
                str(rootfs),
                str(work / "rootfs.img"),
                IMAGE_SIZE,
            ],
            log,
        )
        shutil.rmtree(rootfs)
        (work / "box.json").write_text(
            json.dumps(
                {"release": release, "mirror": mirror, "kernel_release": rel, "python": python, "packages": PACKAGES}
            )
        )
        if folder.exists():
            shutil.rmtree(folder)
        work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    meta = json.loads(info.read_text())
    return Box(folder, meta["kernel_release"], meta["python"])


@dataclass
class VmRun:
    """What a run of the box brought back."""

    accel: str  # "kvm" or "tcg"
    kernel_release: str
    returncode: int | None  # the job's exit status (None: it never finished)
    job_dir: Path
    console: str
    wall_s: float

    @property
    def job_log(self) -> str:
        p = self.job_dir / "job.log"
        return p.read_text(errors="replace") if p.exists() else ""


def kvm_usable() -> bool:
    """Whether /dev/kvm exists and opens, and no guest has failed to boot under it since this
    machine booted (whether one gets past its boot is seen only by booting; a failure is
    remembered in ``CACHE/kvm-failed`` so that later runs go straight to TCG)."""
    failed = CACHE / "kvm-failed"
    if failed.exists() and failed.read_text().strip() == boot_id():
        return False
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


def qemu_argv(box: Box, overlay: Path, job_dir: Path, project: Path, accel: str, cpus: int, mem_mb: int) -> list[str]:
    """The qemu command line of one run (no network device: the box needs none)."""
    append = "root=/dev/vda rw console=ttyS0 panic=-1 quiet loglevel=1 init=/sbin/testbed-vm-init"
    return [
        "qemu-system-x86_64",
        "-accel",
        accel,
        "-cpu",
        "host" if accel == "kvm" else "max",
        "-smp",
        str(cpus),
        "-m",
        str(mem_mb),
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
        "-kernel",
        str(box.kernel),
        "-initrd",
        str(box.initrd),
        "-append",
        append,
        "-drive",
        f"file={overlay},if=virtio,format=qcow2",
        "-virtfs",
        f"local,path={project},mount_tag=project,security_model=none,readonly=on",
        "-virtfs",
        f"local,path={job_dir},mount_tag=job,security_model=none",
    ]


#: what ``scripts/vm_check`` runs in the box by default: the VM tier
DEFAULT_TESTS = ("tests/vm", "-q", "-rA")


def pytest_command(args: Sequence[str] = DEFAULT_TESTS) -> str:
    """The shell command that runs the project's pytest in the box with ``args``, writing nothing
    into the (read-only) checkout; JUnit results go to the job folder."""
    return (
        ".venv/bin/python -m pytest -p no:cacheprovider --basetemp=/tmp/pytest "
        f"--junitxml=/job/junit.xml {shlex.join(args)}"
    )


def job_script(project: Path, command: str) -> str:
    """The job's run.sh: mount the project at its host path (read-only), run ``command`` there in a
    subshell (so that its exit status is recorded whatever it does), record the status."""
    where = shlex.quote(str(project))
    return f"""set -u
mkdir -p {where}
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 project {where} || exit 90
cd {where} || exit 91
export HOME=/root PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TESTBED_IN_VM=1
( {command}
)
echo $? > /job/rc
sync
"""


def boot(
    box: Box,
    command: str,
    project: Path,
    job_dir: Path,
    timeout_s: float = 900.0,
    accel: str = "auto",
    cpus: int = 2,
    mem_mb: int = 2048,
    log: Callable[[str], None] = print,
) -> VmRun:
    """Boot ``box``, run the shell ``command`` in ``project`` (mounted at the same path), and
    return what came back in ``job_dir``. ``accel``: ``kvm``, ``tcg`` or ``auto`` (KVM where it
    boots, else TCG). Raises VmError when the box does not boot."""
    if accel not in ACCELS:
        raise VmError(f"accel {accel!r} is not one of {', '.join(ACCELS)}")
    if "," in str(project):
        raise VmError(f"qemu's -virtfs cannot share a path with a comma: {project}")
    if job_dir.exists() and any(job_dir.iterdir()):
        raise VmError(f"{job_dir} is not empty: give the box a new or empty folder for its results")
    order = ["kvm", "tcg"] if accel == "auto" and kvm_usable() else (["tcg"] if accel == "auto" else [accel])
    for i, mode in enumerate(order):
        last = i == len(order) - 1
        run = _boot_once(box, command, project, job_dir, mode, timeout_s, cpus, mem_mb, log, last)
        if run is not None:
            return run
        if mode == "kvm":
            (CACHE / "kvm-failed").write_text(boot_id())
        log(f"the box did not boot under {mode} (console: {job_dir / f'console-{mode}.log'}): trying {order[i + 1]}")
    raise VmError(f"the box did not boot under any of {', '.join(order)}")


def _boot_once(
    box: Box,
    command: str,
    project: Path,
    job_dir: Path,
    accel: str,
    timeout_s: float,
    cpus: int,
    mem_mb: int,
    log: Callable[[str], None],
    last: bool,
) -> VmRun | None:
    job_dir.mkdir(parents=True, exist_ok=True)
    for name in ("run.sh", "booted", "rc", "job.log"):  # what a failed attempt under another accelerator wrote
        (job_dir / name).unlink(missing_ok=True)
    (job_dir / "run.sh").write_text(job_script(project, command))
    overlay = job_dir.parent / f".{job_dir.name}-overlay.qcow2"
    overlay.unlink(missing_ok=True)
    _run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(box.image), str(overlay)], log)
    console_path = job_dir / f"console-{accel}.log"
    argv = qemu_argv(box, overlay, job_dir, project, accel, cpus, mem_mb)
    log(f"booting the box ({box.kernel_release}) under {accel}")
    t0 = time.monotonic()
    boot_limit = KVM_BOOT_S if accel == "kvm" else TCG_BOOT_S
    with open(console_path, "wb") as console:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        try:
            booted = False
            while proc.poll() is None:
                elapsed = time.monotonic() - t0
                if not booted and (job_dir / "booted").exists():
                    booted = True
                    log(f"booted in {elapsed:.1f} s under {accel}")
                if not booted and elapsed > boot_limit:
                    if not last:
                        return None
                    raise VmError(f"the box did not boot under {accel} within {boot_limit:g} s; see {console_path}")
                if elapsed > timeout_s:
                    log(f"the job ran past {timeout_s:g} s: stopping the VM")
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            overlay.unlink(missing_ok=True)
    rc_file = job_dir / "rc"
    rc = int(rc_file.read_text().strip()) if rc_file.exists() and rc_file.read_text().strip() else None
    booted_file = job_dir / "booted"
    if not booted_file.exists():
        if not last:
            return None
        raise VmError(f"the box exited without booting under {accel}; see {console_path}")
    return VmRun(
        accel,
        booted_file.read_text().strip(),
        rc,
        job_dir,
        console_path.read_text(errors="replace"),
        time.monotonic() - t0,
    )
