"""The launcher: one process that imports torch, loads the corpus and builds the seeded model once,
then forks every training worker of a run, each of which enters its host's network namespace
before it opens any socket. Started by the runner on the machine that holds the namespaces; it
replaces one interpreter start, one torch import and one corpus load per worker (seconds each on a
busy 2-core machine) with one.

``python -m testbed.train.launcher PARENT_PID``. Protocol: one JSON request per line on stdin, one
JSON line per reply or event on stdout:

- ``{"op": "prepare", "config": PATH}`` -> ``{"ready": true}`` once the run is preloaded;
- ``{"op": "fork", "rank": R, "netns": PATH, "log": PATH, "env": {...}}`` -> ``{"forked": R, "pid": P}``:
  the worker runs in a child with ``env`` added to its environment, its output appended to ``log``;
- ``{"exited": P, "code": C}`` whenever a worker ends (C: its exit status, or -signal).

A failure is ``{"error": "..."}``. When stdin closes the launcher exits; its workers, and it, die
with their parent (PR_SET_PDEATHSIG), so a killed runner leaves no worker training on its own; one
whose parent died before it could ask for that (PARENT_PID for the launcher) exits at once.
The launcher is single-threaded when it forks (torch runs with one thread and starts none here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import signal
import sys
import traceback
from typing import Any

from testbed.lifetime import die_with_parent
from testbed.trace import task_names
from testbed.trace.task_names import name_this_thread

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def enter_netns(path: str) -> None:
    """Move this (single-threaded) process into the network namespace at ``path``
    (``/run/netns/<name>``): setns(2), as nsenter --net does. Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _reply(out: Any, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _child(req: dict[str, Any], cfg: Any, pre: Any, proto_fd: int, launcher_pid: int) -> int:
    """In the forked child: become the worker of ``req["rank"]``; returns its exit status."""
    from testbed.train.worker import run
    from testbed.train.worker_start import startup_mark

    die_with_parent(signal.SIGKILL)
    if os.getppid() != launcher_pid:  # the launcher died before the line above: no orphan worker
        return 1
    os.close(proto_fd)  # the runner sees the launcher's end of the protocol, not the workers' copies
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    try:
        enter_netns(req["netns"])
        os.environ.update(req.get("env", {}))
        startup_mark(cfg, req["rank"], "forked")
        run(cfg, req["rank"], pre)
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the worker's failure goes to its log, the code to the runner
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(parent_pid: int | None = None) -> None:
    """The launcher's loop (see the module docstring)."""
    die_with_parent()
    name_this_thread(task_names.LAUNCHER)
    if parent_pid is not None and os.getppid() != parent_pid:  # the runner died before the line above
        return
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints go to stderr; the protocol owns the original stdout
    from testbed.train.preload import warm_up  # torch, once, while the runner builds the network

    warm_up()
    cfg = pre = None
    launcher_pid = os.getpid()
    children: dict[int, int] = {}  # pid -> rank
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.pop(pid, None)
            _reply(proto, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            req = json.loads(line)
            try:
                if req["op"] == "prepare":
                    from testbed.plan.worker_config import read_worker_config
                    from testbed.train.preload import preload

                    cfg = read_worker_config(req["config"])
                    pre = preload(cfg)
                    _reply(proto, {"ready": True})
                elif req["op"] == "fork":
                    if pre is None:
                        raise ValueError("fork before prepare")
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        os._exit(_child(req, cfg, pre, proto.fileno(), launcher_pid))
                    children[pid] = req["rank"]
                    _reply(proto, {"forked": req["rank"], "pid": pid})
                else:
                    raise ValueError(f"unknown request {req.get('op')!r}")
            except Exception as e:  # noqa: BLE001 - reported to the runner, which fails the run
                traceback.print_exc()
                _reply(proto, {"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else None)
