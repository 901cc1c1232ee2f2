"""What processes in hosts on this machine see of it (the netns and Mininet backends: one machine,
one filesystem): this interpreter, this environment with the package on PYTHONPATH, and the run
folder under its own path. ``LocalNetwork`` takes these parts of the ``Network`` contract from
``LocalFiles``; the remote backend ships files and names interpreters per machine instead."""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.net.hostproc import local_process_env


class LocalFiles:
    """The file and interpreter side of ``Network`` for hosts on this machine; ``out_dir`` is the
    run folder."""

    out_dir: Path

    def python(self, host: str) -> str:
        """The Python interpreter processes in ``host`` run with (this one)."""
        return sys.executable

    def process_env(self, extra: dict[str, str]) -> dict[str, str]:
        """The environment of a testbed process (worker, decode host) in a host: this one's, with
        the package on PYTHONPATH, plus ``extra``."""
        return local_process_env(extra)

    @property
    def local_files(self) -> bool:
        """Processes in the hosts see this machine's files."""
        return True

    def share_file(self, path: Path) -> str:
        """``path`` as the hosts' processes name it: here the same path."""
        return str(path)

    def share_bytes(self, name: str, data: bytes) -> str:
        """``data`` as a file the hosts' processes can read (``shared/<name>`` in the run folder)."""
        path = self.out_dir / "shared" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return str(path)

    @property
    def host_out_dir(self) -> str:
        """The run folder as the hosts' processes see it (they write their events and logs there)."""
        return str(self.out_dir)
