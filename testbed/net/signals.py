"""Signals that must not split what belongs together.

Creating a kernel object or a process and registering it with its run, or tearing a run down, must
not be cut in the middle by Ctrl-C or a SIGTERM: the run would leave something that nothing records,
or stop half torn down. :func:`deferred_signals` holds SIGINT, SIGTERM and SIGHUP back while such a
section runs and delivers the first that came to its handler when the outermost section ends.
Only the main thread runs Python signal handlers (signal(2), Python's ``signal`` module), so the
sections are the main thread's; in another thread the body runs as it is.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the signals that end a command (and tear its run down): held back by ``deferred_signals``
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Deferral:
    """The state of ``deferred_signals`` (the main thread's: only it runs signal handlers)."""

    depth = 0
    #: the handlers in place when the outermost section began, by signal
    saved: dict[int, Any] = {}
    #: signals that came during the sections, in order
    pending: list[int] = []
    note: str | None = None


def _before(signum: int) -> Any:
    """The handler in place before the outermost section began; where it was not one Python can
    put back (set by C code, or a section's own left behind), Python's default: KeyboardInterrupt
    for SIGINT, the default action for the others."""
    return _Deferral.saved.get(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


def _deliver(signum: int) -> None:
    """Act on ``signum`` as the handler in place before the sections would."""
    handler = _before(signum)
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def _hold(signum: int, frame: object) -> None:
    if _Deferral.depth == 0:  # the section ended while this handler was still in place
        _deliver(signum)
        return
    if not _Deferral.pending and _Deferral.note:
        # os.write, not print: the main thread may be inside a print to stderr
        os.write(2, f"testbed: {signal.Signals(signum).name}: {_Deferral.note}\n".encode())
    _Deferral.pending.append(signum)


@contextmanager
def deferred_signals(note: str | None = None) -> Iterator[None]:
    """Run the body with SIGINT, SIGTERM and SIGHUP held back; when the outermost such section
    ends, the first that came is delivered to the handler that was in place (which may raise,
    KeyboardInterrupt or SystemExit, from the ``with`` statement). ``note``: printed on stderr when
    one is held back (for a section that may take seconds). Sections nest; in a thread other than
    the main one (which runs no signal handler) the body runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if note is not None and _Deferral.note is None:
        _Deferral.note = note
    if _Deferral.depth == 0:
        _Deferral.saved = {}  # never an earlier section's: it may be long gone
        for sig in ENDING_SIGNALS:
            old = signal.signal(sig, _hold)
            if old is not _hold and old is not None:  # (None: a handler not set from Python)
                _Deferral.saved[sig] = old
    _Deferral.depth += 1
    try:
        yield
    finally:
        _Deferral.depth -= 1
        if _Deferral.depth == 0:
            pending, _Deferral.pending, _Deferral.note = _Deferral.pending, [], None
            # a signal from here on is delivered at once, by _hold until its handler is back
            for sig in ENDING_SIGNALS:
                signal.signal(sig, _before(sig))
            if pending:
                _deliver(pending[0])


def signals_deferred() -> bool:
    """Whether a ``deferred_signals`` section is running."""
    return _Deferral.depth > 0
