"""A process's lifetime tied to its parent's: Linux's prctl(PR_SET_PDEATHSIG), so that a process
the testbed started (a worker, the Atlas controller, a prefill stream) never outlives the one
that started it, even one killed with -9 (prctl(2))."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Have the kernel send this process ``sig`` when its parent dies. With ``parent_pid`` (the
    parent's pid, taken before the fork), a parent already gone sends it at once. Raises OSError
    if the kernel refuses."""
    if _libc.prctl(PR_SET_PDEATHSIG, sig) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if parent_pid is not None and os.getppid() != parent_pid:  # it died before the call above
        os.kill(os.getpid(), sig)
