"""The Vagrantfile is valid (Debian's vagrant validates it without a provider, in about a second)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant is not installed: scripts/test installs it")
def test_vagrantfile_validates(tmp_path):
    proc = subprocess.run(["vagrant", "validate"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path),
                               "VAGRANT_HOME": str(tmp_path / "vagrant.d")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout


def test_vagrant_provisions_with_the_readme_setup_script():
    text = (REPO / "Vagrantfile").read_text()
    assert "scripts/setup.sh" in text and "sch_netem" in text
    assert (REPO / "scripts" / "setup.sh").stat().st_mode & 0o111
