"""Copying what a run's processes write on the machines of ``--backend remote`` into the local run
folder as it is written (about every 0.3 s), so that watching and analysis see one run folder. The
copying doubles as the agents' heartbeat (``agent.py``'s watchdog)."""

from __future__ import annotations

import threading
from pathlib import Path

from testbed.errors import RemoteError
from testbed.net.remote.agent_client import AgentClient

SYNC_INTERVAL_S = 0.3


def merged_path(out_dir: Path, machine: str, rel: str) -> Path:
    """Where a file a machine wrote (``rel``, relative to its run folder) goes here: traces and logs
    merge into the run folder; other files (the machine's own topology.json) keep to
    ``machines/<machine>/``."""
    merged = rel.endswith(".jsonl") or rel.startswith("logs/") or rel.startswith("events/")
    return out_dir / rel if merged else out_dir / "machines" / machine / rel


class TraceSync:
    """Appends what each agent's processes wrote to the local run folder ``out_dir``."""

    def __init__(self, agents: dict[str, AgentClient], out_dir: Path) -> None:
        self.agents, self.out_dir = agents, out_dir
        self.halt = threading.Event()
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="remote-sync", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.halt.wait(SYNC_INTERVAL_S):
            self.sync(wait=False)

    def stop(self) -> None:
        self.halt.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None

    def sync(self, wait: bool = True) -> None:
        """Append what the machines' processes wrote since the last call. ``wait=False`` skips
        agents busy with another request (a build, a measurement) and agents that are gone (their
        failure is reported by the request that found it)."""
        with self._lock:
            for name, agent in list(self.agents.items()):
                if not wait and (agent.gone or agent.busy):
                    continue
                try:
                    files = agent.call("read")["files"]
                except RemoteError:
                    if wait:
                        raise
                    continue
                for rel, text in files.items():
                    dest = merged_path(self.out_dir, name, rel)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with open(dest, "ab") as f:
                        f.write(text.encode("latin-1"))
