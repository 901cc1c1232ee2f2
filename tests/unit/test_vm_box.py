"""The VM test box refuses clearly what it cannot run with (pure checks; the box itself runs in
tests/integration/test_vm.py)."""

from __future__ import annotations

import pytest

from tests.support.vm import VmError, apt_source, box_key, check_host, host_release, kernel_files, pytest_command


def test_missing_qemu_is_named_with_its_package():
    with pytest.raises(VmError, match=r"qemu-system-x86.*apt-get install qemu-system-x86"):
        check_host(lambda cmd: None if cmd == "qemu-system-x86_64" else f"/usr/bin/{cmd}")


def test_missing_tools_are_named_together():
    with pytest.raises(VmError, match=r"qemu-utils, debootstrap"):
        check_host(lambda cmd: None if cmd in ("qemu-img", "debootstrap") else f"/usr/bin/{cmd}")


def test_a_root_filesystem_without_the_kernel_package_is_refused(tmp_path):
    (tmp_path / "boot").mkdir()
    with pytest.raises(VmError, match="linux-image-amd64"):
        kernel_files(tmp_path)


def test_a_kernel_without_initramfs_or_modules_is_refused(tmp_path):
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / "vmlinuz-6.1.0-9-amd64").write_bytes(b"")
    with pytest.raises(VmError, match="initrd.img-6.1.0-9-amd64"):
        kernel_files(tmp_path)
    (tmp_path / "boot" / "initrd.img-6.1.0-9-amd64").write_bytes(b"")
    with pytest.raises(VmError, match="modules"):
        kernel_files(tmp_path)
    (tmp_path / "lib" / "modules" / "6.1.0-9-amd64" / "kernel" / "net" / "sched").mkdir(parents=True)
    release, kernel, initrd = kernel_files(tmp_path)
    assert release == "6.1.0-9-amd64" and kernel.name == "vmlinuz-6.1.0-9-amd64"


def test_release_and_mirror_come_from_the_host(tmp_path):
    osr = tmp_path / "os-release"
    osr.write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_CODENAME=bookworm\n')
    assert host_release(osr) == "bookworm"
    osr.write_text("ID=fedora\nVERSION_CODENAME=\n")
    with pytest.raises(VmError, match="Debian"):
        host_release(osr)
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://other.example/debian bookworm main\n")
    assert apt_source([deb822]) == "http://mirror.example/debian"
    assert apt_source([one_line]) == "http://other.example/debian"
    assert apt_source([tmp_path / "absent"]) == "http://deb.debian.org/debian"
    assert box_key("bookworm", "a") != box_key("bookworm", "b")


def test_the_box_runs_pytest_without_writing_into_the_checkout():
    cmd = pytest_command(["tests/vm", "-k", "a b"])
    assert "-p no:cacheprovider" in cmd and "--basetemp=/tmp/pytest" in cmd and "'a b'" in cmd


def test_the_venvs_python_is_read_from_its_pyvenv_cfg(tmp_path):
    from tests.support.vm import venv_python_version

    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "pyvenv.cfg").write_text(
        "home = /usr/bin\nversion = 3.11.2\nexecutable = /usr/bin/python3.11\n"
    )
    assert venv_python_version(tmp_path) == "3.11"
    with pytest.raises(VmError, match="setup.sh"):
        venv_python_version(tmp_path / "elsewhere")
