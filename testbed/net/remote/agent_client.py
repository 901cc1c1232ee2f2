"""The runner's end of a machine's agent (``agent.py``): one JSON request per line, one reply per
line, over the SSH channel; and the agent's processes seen as ``subprocess.Popen``-like objects."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from testbed.errors import RemoteError
from testbed.net.remote.ssh import Connection


class AgentClient:
    """The request/reply channel to one machine's agent. Thread-safe (one request at a time)."""

    def __init__(
        self, conn: Connection, root: str, log_path: Path, idle_s: float = 30.0, answer_s: float = 30.0
    ) -> None:
        self.conn = conn
        #: how long a request waits for its answer unless it says otherwise (s)
        self.answer_s = answer_s
        m = conn.machine
        self.chan = conn.start(
            [m.python, "-m", "testbed.net.remote.agent"],
            env={
                "PYTHONPATH": f"{root}/code",
                "TESTBED_AGENT_REMOVE": f"{root}/code",
                "TESTBED_AGENT_IDLE_S": f"{idle_s:g}",
            },
            cwd=root,
        )
        self._out = self.chan.makefile("rb")
        self._lock = threading.Lock()
        self._next_id = 0
        #: why the agent cannot be used any more, as the error that first said so ("" while it can):
        #: every later call raises the same message, whichever thread (the heartbeat's or the run's)
        #: met the event first
        self.gone = ""
        self._log = open(log_path, "ab")
        self._drain = threading.Thread(target=self._drain_stderr, name=f"agent-{m.name}-stderr", daemon=True)
        self._drain.start()

    def _drain_stderr(self) -> None:
        f = self.chan.makefile_stderr("rb")
        for line in f:
            self._log.write(line)
            self._log.flush()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def call(self, op: str, timeout_s: float | None = None, **kwargs) -> dict:
        """Send one request and return its reply. Raises RemoteError when the agent reports a
        failure, and (marking the agent gone: later calls fail at once) when it does not answer
        in ``timeout_s`` (default ``answer_s``), exits, or the connection breaks."""
        where = self.conn.where
        timeout_s = self.answer_s if timeout_s is None else timeout_s
        with self._lock:
            if self.gone:
                raise RemoteError(self.gone)
            self._next_id += 1
            want = self._next_id
            try:
                self.chan.settimeout(timeout_s)
                self.chan.sendall((json.dumps({"op": op, "id": want, **kwargs}) + "\n").encode())
                while True:  # a reply to an earlier, abandoned request (e.g. interrupted) is skipped
                    line = self._out.readline()
                    if not line:
                        raise self._exited()
                    reply = json.loads(line)
                    if reply.get("id") == want:
                        break
            except TimeoutError:
                raise self._lost(f"{where}: the agent did not answer {op!r} within {timeout_s:g} s") from None
            except OSError as e:
                # a channel the server closed while the SSH connection lives on: the agent ended
                # (a send after its exit fails with "Socket is closed" before any read sees EOF)
                transport = self.chan.get_transport()
                if self.chan.exit_status_ready() and transport is not None and transport.is_active():
                    raise self._exited() from None
                raise self._lost(f"{where}: the connection to the agent broke ({e})") from None
        if not reply.pop("ok"):
            raise RemoteError(f"{where}: {op} failed: {reply['type']}: {reply['error']}")
        return reply

    def _exited(self) -> RemoteError:
        return self._lost(
            f"{self.conn.where}: the agent exited or was killed (its output: {self._log.name}); "
            "what it built there is removed at teardown"
        )

    def _lost(self, message: str) -> RemoteError:
        """The agent cannot be used any more: ``message`` says why, now and on every later call."""
        self.gone = message
        return RemoteError(message)

    def close(self, timeout_s: float = 30.0) -> None:
        """Close the channel: EOF to the agent, which tears down and exits, waited for up to
        ``timeout_s``; not waited for where the agent is gone (it exited, or its machine or the
        network stopped answering: nothing would come)."""
        try:
            self.chan.shutdown_write()  # EOF: the agent tears down and exits
            deadline = time.monotonic() + (0 if self.gone else timeout_s)
            while not self.chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.05)
        except (OSError, EOFError):
            pass
        self.chan.close()
        self._drain.join(timeout=2)
        self._log.close()


class RemoteProcess:
    """A process started by an agent, with the subset of ``subprocess.Popen`` the runner uses."""

    def __init__(self, agent: AgentClient, pid: int) -> None:
        self.agent, self.pid = agent, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.agent.call("poll", pids=[self.pid])["codes"][str(self.pid)]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            self.returncode = self.agent.call("wait", timeout_s=left + 30, pid=self.pid, limit_s=left)["code"]
        assert self.returncode is not None  # the loop ends when the process has exited
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.agent.call("signal", pid=self.pid, signal=int(sig))

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)
