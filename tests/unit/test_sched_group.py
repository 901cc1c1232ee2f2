"""The scheduling groups a run records in ``env.json`` (``run/records.sched_group``), read from
hand-written procfs and cgroupfs files in the layouts of cgroup v1, v2 and a hybrid, and from this
machine's; and how its kernel schedules (``sched_kernel``)."""

from __future__ import annotations

import gzip
import platform
from pathlib import Path

from testbed.run.records import sched_group, sched_kernel


def _proc(tmp_path: Path, cgroup: str | None, autogroup: str | None, enabled: str | None) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    if cgroup is not None:
        (proc / "self" / "cgroup").write_text(cgroup)
    if autogroup is not None:
        (proc / "self" / "autogroup").write_text(autogroup + "\n")
    if enabled is not None:
        (proc / "sys" / "kernel").mkdir(parents=True)
        (proc / "sys" / "kernel" / "sched_autogroup_enabled").write_text(enabled + "\n")
    return proc


def _cgroup2(tmp_path: Path, subtree_control: dict[str, str]) -> Path:
    root = tmp_path / "cgroup2"
    for path, controllers in subtree_control.items():
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/") / "cgroup.subtree_control").write_text(controllers + "\n")
    return root


def test_cgroup_v1_with_autogroups_on(tmp_path):
    cgroup = "4:memory:/agent/1\n2:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n"
    got = sched_group(_proc(tmp_path, cgroup, "/autogroup-25 nice -10", "1"), tmp_path / "none")
    assert got == {"cpu_cgroup": "/", "autogroup": "/autogroup-25", "autogroup_nice": -10}


def test_init_session_is_the_default_autogroup_with_no_nice(tmp_path):
    # /proc/1/autogroup and a service of init's session print nothing: the root task group
    got = sched_group(_proc(tmp_path, "2:cpu,cpuacct:/\n", "", "1"), tmp_path / "none")
    assert got == {"cpu_cgroup": "/", "autogroup": "/", "autogroup_nice": None}


def test_cgroup_v2_follows_the_cpu_controller_down_and_autogroups_off_are_none(tmp_path):
    session = "/user.slice/user-1000.slice/session-3.scope"
    cgroup2 = _cgroup2(tmp_path, {"/": "cpuset cpu io memory pids", "/user.slice": "cpu memory pids"})
    (cgroup2 / session.lstrip("/")).mkdir(parents=True)
    (cgroup2 / "user.slice" / "user-1000.slice" / "cgroup.subtree_control").write_text("memory pids\n")
    got = sched_group(_proc(tmp_path, f"0::{session}\n", "/autogroup-7 nice 0", "0"), cgroup2)
    # user-1000.slice enables no cpu for its children: the scheduler groups the session by it
    assert got == {"cpu_cgroup": "/user.slice/user-1000.slice", "autogroup": None, "autogroup_nice": None}


def test_cgroup_v2_without_the_cpu_controller_is_the_root_where_autogroups_count(tmp_path):
    cgroup2 = _cgroup2(tmp_path, {"/": "memory pids"})
    got = sched_group(_proc(tmp_path, "0::/system.slice/ssh.service\n", "/autogroup-9 nice 0", "1"), cgroup2)
    assert got == {"cpu_cgroup": "/", "autogroup": "/autogroup-9", "autogroup_nice": 0}


def test_hybrid_takes_the_v1_cpu_controller_and_no_autogroup_support_is_none(tmp_path):
    cgroup = "0::/init.scope\n3:cpu,cpuacct:/system.slice/ssh.service\n"
    got = sched_group(_proc(tmp_path, cgroup, None, "1"), tmp_path / "none")  # no /proc/self/autogroup
    assert got == {"cpu_cgroup": "/system.slice/ssh.service", "autogroup": None, "autogroup_nice": None}


def test_unreadable_or_garbled_files_are_none_not_an_error(tmp_path):
    assert sched_group(_proc(tmp_path, None, None, None), tmp_path / "none") == {
        "cpu_cgroup": None,
        "autogroup": None,
        "autogroup_nice": None,
    }
    garbled = sched_group(_proc(tmp_path / "g", "no colons here\n", "/autogroup-3 nice high", "1"), tmp_path / "none")
    assert garbled == {"cpu_cgroup": None, "autogroup": None, "autogroup_nice": None}


def test_this_machines_autogroup_is_the_one_procfs_shows():
    got = sched_group()
    assert got["cpu_cgroup"] is not None and got["cpu_cgroup"].startswith("/")
    on = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if on.exists() and on.read_text().strip() == "1":
        shown = Path("/proc/self/autogroup").read_text().strip()
        if shown:  # a session of its own
            assert f"{got['autogroup']} nice {got['autogroup_nice']}" == shown
        else:  # init's session (a CI service started with no setsid): the default autogroup
            assert got["autogroup"] == "/" and got["autogroup_nice"] is None
    else:
        assert got["autogroup"] is None and got["autogroup_nice"] is None


def _kernel_files(
    tmp_path: Path,
    config: str | None,
    cmdline: str,
    sysctls: dict[str, str],
    debug: str | None,
    tunables: dict | None = None,
) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    if config is not None:
        (proc / "config.gz").write_bytes(gzip.compress(config.encode()))
    (proc / "cmdline").write_text(cmdline + "\n")
    for name, value in sysctls.items():
        (proc / "sys" / "kernel" / name).write_text(value + "\n")
    if debug is not None:
        (tmp_path / "debug" / "sched").mkdir(parents=True)
        (tmp_path / "debug" / "sched" / "preempt").write_text(debug + "\n")
        for name, value in (tunables or {}).items():
            (tmp_path / "debug" / "sched" / name).write_text(f"{value}\n")
    return proc


def test_the_kernels_tick_preemption_model_and_scheduler_sysctls_as_it_tells_them(tmp_path):
    """``sched_kernel``: the tick rate and preemption model from the configuration, the model
    debugfs shows chosen before the command line's before the configuration's, and every
    readable ``sched_*`` sysctl, a platform's own included."""
    config = "# comment\nCONFIG_HZ_250=y\nCONFIG_HZ=250\nCONFIG_PREEMPT_NONE=y\nCONFIG_PREEMPT_DYNAMIC=y\n"
    sysctls = {"sched_autogroup_enabled": "1", "sched_vcpu_pack": "15", "sched_domain_names": "MC DIE"}
    proc = _kernel_files(tmp_path, config, "console=ttyS0 quiet", sysctls, None)
    got = sched_kernel(proc, tmp_path / "boot", tmp_path / "debug")
    assert got == {
        "kernel_hz": 250,
        "kernel_preempt": "none",
        "sched_sysctls": {"sched_autogroup_enabled": 1, "sched_domain_names": "MC DIE", "sched_vcpu_pack": 15},
        "sched_tunables": {},
    }
    (proc / "cmdline").write_text("quiet preempt=full\n")
    assert sched_kernel(proc, tmp_path / "boot", tmp_path / "debug")["kernel_preempt"] == "full"
    _kernel_files(tmp_path / "d", None, "", {}, "none voluntary (lazy) full", {"base_slice_ns": 700000})
    got = sched_kernel(proc, tmp_path / "boot", tmp_path / "d" / "debug")
    assert got["kernel_preempt"] == "lazy" and got["sched_tunables"] == {"base_slice_ns": 700000}
    # a kernel without PREEMPT_DYNAMIC ignores preempt=: its configured model stands
    static = _kernel_files(tmp_path / "s", "CONFIG_HZ=1000\nCONFIG_PREEMPT_VOLUNTARY=y\n", "preempt=full", {}, None)
    assert sched_kernel(static, tmp_path / "boot", tmp_path / "s" / "debug")["kernel_preempt"] == "voluntary"
    rt = _kernel_files(tmp_path / "r", "CONFIG_PREEMPT=y\nCONFIG_PREEMPT_RT=y\n", "", {}, None)
    assert sched_kernel(rt, tmp_path / "boot", tmp_path / "r" / "debug")["kernel_preempt"] == "rt"


def test_a_kernel_that_tells_nothing_gives_none_not_an_error(tmp_path):
    proc = _kernel_files(tmp_path, None, "", {}, None)
    (proc / "config.gz").write_bytes(b"not gzip")
    nothing = {"kernel_hz": None, "kernel_preempt": None, "sched_sysctls": {}, "sched_tunables": {}}
    assert sched_kernel(proc, tmp_path / "boot", tmp_path / "debug") == nothing
    (proc / "config.gz").write_bytes(gzip.compress(b"CONFIG_HZ=250\n")[:-12] + b"garbled-tail")  # a bad stream
    assert sched_kernel(proc, tmp_path / "boot", tmp_path / "debug") == nothing
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / f"config-{platform.release()}").write_text("CONFIG_HZ=1000\nCONFIG_PREEMPT=y\n")
    got = sched_kernel(proc, tmp_path / "boot", tmp_path / "debug")
    assert (got["kernel_hz"], got["kernel_preempt"]) == (1000, "full")


def test_this_machines_kernel_as_it_tells_it():
    got = sched_kernel()
    assert set(got) == {"kernel_hz", "kernel_preempt", "sched_sysctls", "sched_tunables"}
    assert got["kernel_hz"] is None or got["kernel_hz"] in (100, 250, 300, 1000)
    on = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if on.exists():
        assert got["sched_sysctls"]["sched_autogroup_enabled"] == int(on.read_text())
