"""The names the testbed gives its processes and threads, as the kernel keeps them (``comm``, at
most 15 bytes: prctl(2) PR_SET_NAME), so that a scheduler trace (``testbed run --sched-trace``),
``top -H`` or ``ps -L`` tells them apart; and the role a name stands for, which
``results/sched_trace.py`` reads back. A thread starts with the name of the thread that started
it: a worker names itself before gloo starts its threads, so torch's carry the worker's name
(told apart from its main thread by their thread id); gloo's name themselves
(``gloo_tcp_loop``, ``pt_gloo_runloop``), and the trace's process ids tell whose they are."""

from __future__ import annotations

import ctypes
import ctypes.util
import re

#: a training worker of rank ``rank`` (its main thread, and the threads gloo and torch start in it)
WORKER = "tb-w{rank}"
#: the thread of worker ``rank`` that gives prefill GPU time in a bubble (BubbleTea)
FILL = "tb-w{rank}-fill"
#: worker ``rank``'s prefill stream, a process of its own (BubbleTea), and its threads but one:
STREAM = "tb-w{rank}-pf"
#: the stream's thread that hands KV caches to the decode host (``bubbletea/kv_sender.py``), of
#: the normal policy while the stream computes in ``SCHED_IDLE``
KV_SUFFIX = "-kv"
KV_SENDER = STREAM + KV_SUFFIX
LAUNCHER = "tb-launcher"  # the process the workers are forked from (``train/launcher.py``)
RUNNER = "testbed"  # the runner's main thread: the ``testbed`` command's own name, left as it is
DECODE = "tb-decode"  # a decode host (BubbleTea), its threads but one:
DECODE_STEP = "tb-decode-step"  # its thread that runs the decode steps, once in SCHED_IDLE
CONTROLLER = "tb-atlas"  # Atlas's controller
DISPATCHER = "tb-dispatch"  # BubbleTea's dispatcher, a thread of the runner
SAMPLER = "tb-sampler"  # the WAN classes' counters sampler, a thread of the runner
DELAY = "nfq_delay"  # the NFQUEUE delay element: its program's name begins so (net/delay_element.py)

COMM_BYTES = 15
PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
#: the role of each thread a worker names apart, by the suffix its name adds to ``WORKER``'s
_SUFFIX_ROLES = {
    t.removeprefix(WORKER): role for t, role in ((FILL, "fill"), (STREAM, "stream"), (KV_SENDER, "kv sender"))
}
_WORKER_PREFIX = WORKER.removesuffix("{rank}")
_WORKER_RE = re.compile(
    re.escape(_WORKER_PREFIX)
    + r"(\d+)("
    + "|".join(re.escape(x) for x in sorted(_SUFFIX_ROLES, key=len, reverse=True))
    + ")?$"
)


def kernel_name(name: str) -> str:
    """``name`` as the kernel keeps it (``comm``): clipped to ``COMM_BYTES``."""
    return name.encode()[:COMM_BYTES].decode(errors="ignore")


def name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` (``kernel_name``). Raises OSError if the kernel refuses."""
    if _libc.prctl(PR_SET_NAME, kernel_name(name).encode(), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NAME, {name!r})")


def role_of(comm: str, main_thread: bool) -> tuple[str, int | None]:
    """(role, worker rank or None) of a task named ``comm``; ``main_thread``: its thread id is its
    process id. Roles: ``worker`` (a worker's main thread), ``worker thread`` (gloo's and torch's
    threads of a worker, those that keep its name), ``fill`` and ``stream`` (BubbleTea's, of a
    worker), ``launcher``, ``runner``, ``decode``, ``controller``, ``dispatcher``, ``sampler``,
    ``delay element``, ``idle`` (no task: the kernel's swapper) and ``other`` (anything else on
    the machine, threads that name themselves, such as gloo's ``gloo_tcp_loop``, included: the
    trace's process ids tell whose they are, ``results/sched_trace.relative_role``)."""
    m = _WORKER_RE.match(comm)
    if m:
        kind = _SUFFIX_ROLES.get(m.group(2) or "", "worker" if main_thread else "worker thread")
        return kind, int(m.group(1))
    named = {
        LAUNCHER: "launcher",
        RUNNER: "runner",
        DECODE: "decode",
        DECODE_STEP: "decode step",
        CONTROLLER: "controller",
        DISPATCHER: "dispatcher",
        SAMPLER: "sampler",
    }
    if comm in named:
        return named[comm], None
    if comm.startswith(DELAY):
        return "delay element", None
    if comm.startswith("swapper/"):
        return "idle", None
    return "other", None
