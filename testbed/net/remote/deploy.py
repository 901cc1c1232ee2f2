"""Copying what a run needs onto each machine of ``--backend remote``: the whole package tree (every
subpackage, and the delay element's C source) into ``<workdir>/<run prefix>/code``, and shared
files (the workers' configuration, the corpus) into ``<workdir>/<run prefix>/shared``, over SFTP."""

from __future__ import annotations

from pathlib import Path

from testbed.errors import RemoteError
from testbed.net.remote.ssh import Connection

#: the installed package's root folder (``testbed/``), deployed whole to every machine
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def package_files() -> list[Path]:
    """The files deployed to each machine: every module of the package, in every subpackage, and
    the delay element's C source, as paths relative to the package root."""
    return sorted(
        p.relative_to(PACKAGE_ROOT)
        for p in PACKAGE_ROOT.rglob("*")
        if p.suffix in (".py", ".c") and "__pycache__" not in p.parts
    )


def deploy(conn: Connection, root: str) -> None:
    """Make the run's folders under ``root`` on the machine and copy the package there."""
    folders = sorted({f"{root}/code/testbed/{rel.parent}".rstrip("/.") for rel in package_files()})
    code, _, err = conn.run(["mkdir", "-p", "--", *folders, f"{root}/run", f"{root}/shared"])
    if code != 0:
        raise RemoteError(f"{conn.where}: cannot create {root}: {err.strip()}")
    sftp = conn.sftp()
    try:
        for rel in package_files():
            sftp.put(str(PACKAGE_ROOT / rel), f"{root}/code/testbed/{rel}")
    finally:
        sftp.close()


def share(conn: Connection, root: str, name: str, data: bytes) -> str:
    """Write ``data`` to ``<root>/shared/<name>`` on the machine; returns the path relative to the
    agent's folder (``root``), which the run's processes there use."""
    rel = f"shared/{name}"
    sftp = conn.sftp()
    try:
        with sftp.open(f"{root}/{rel}", "wb") as f:
            f.set_pipelined(True)
            f.write(data)
    finally:
        sftp.close()
    return rel
