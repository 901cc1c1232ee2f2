"""The Vagrantfile is valid. ``vagrant validate --ignore-provider`` checks it without VirtualBox or
libvirt (a fresh machine has neither: plain ``vagrant validate`` answers "No usable default provider
could be found" there), in about a second."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _validate(folder: Path, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["vagrant", "validate", "--ignore-provider"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "VAGRANT_HOME": str(home / "vagrant.d"),
            "VAGRANT_DOTFILE_PATH": str(home / "dot-vagrant"),
        },  # nothing written into the checkout
    )


needs_vagrant = pytest.mark.skipif(
    shutil.which("vagrant") is None, reason="vagrant is not installed: scripts/test installs it"
)


@needs_vagrant
def test_vagrantfile_validates(tmp_path):
    proc = _validate(REPO, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout


@needs_vagrant
def test_validation_without_a_provider_still_catches_a_broken_vagrantfile(tmp_path):
    """--ignore-provider skips the provider's section only: a wrong setting elsewhere still fails."""
    box = tmp_path / "box"
    box.mkdir()
    text = (REPO / "Vagrantfile").read_text()
    (box / "Vagrantfile").write_text(text.replace("config.vm.box", "config.vm.no_such_setting", 1))
    proc = _validate(box, tmp_path)
    assert proc.returncode != 0 and "no_such_setting" in proc.stdout + proc.stderr


def test_vagrant_provisions_with_the_readme_setup_script():
    text = (REPO / "Vagrantfile").read_text()
    assert "scripts/setup.sh" in text and "sch_netem" in text
    assert (REPO / "scripts" / "setup.sh").stat().st_mode & 0o111
