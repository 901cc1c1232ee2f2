"""How a command or a script that builds networks ends when it is interrupted: SIGTERM and SIGHUP
become ``SystemExit`` (so every ``with`` block tears its network down, as Ctrl-C does), SIGINT
raises ``KeyboardInterrupt`` even in a process started with ``&`` (a shell leaves SIGINT ignored
there, and Python keeps an ignored SIGINT), and on the way out any network of this process whose
own teardown an interruption cut short is torn down. ``testbed``'s commands and the scripts in
``scripts/`` that run experiments all go through ``tears_down_on_signals``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from testbed.invocation import sudo_testbed
from testbed.net.network import tear_down_unfinished


def err(msg: str) -> None:
    """One ``testbed: ...`` line on stderr (the command line's messages use it too)."""
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


#: the process that installed ``on_sigterm`` (a child forked from it, such as pyroute2's helper
#: that opens a netlink socket in a namespace, inherits the handler and is ended with SIGTERM)
_INSTALLED_BY: int | None = None


def on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP: say so and end as ``SystemExit(128 + signum)``, tearing down on the way. A
    process forked from the one that installed it (with its handlers) just ends, silently: it
    tears nothing down."""
    if _INSTALLED_BY is not None and os.getpid() != _INSTALLED_BY:
        os._exit(128 + signum)
    # os.write, not print: the main thread may be inside a print to stderr (a reentrant call fails)
    os.write(2, f"testbed: {signal.Signals(signum).name}: tearing down\n".encode())
    raise SystemExit(128 + signum)


def tear_down_left_behind() -> None:
    """A command's last resort before it exits: tear down any network of this process whose own
    teardown an interruption or an error cut short (``net.network.tear_down_unfinished``)."""
    try:
        prefixes = tear_down_unfinished()
    except (KeyboardInterrupt, SystemExit):  # a signal held back during that teardown: ending anyway
        return
    except Exception as e:  # noqa: BLE001 - said, with the fix; the command's own outcome stands
        err(f"error: a teardown failed ({e}); run '{sudo_testbed('clean')}' to remove what is left")
        return
    if prefixes:
        err(f"tore down run {', '.join(prefixes)}, which an interruption had left up")


@contextmanager
def tears_down_on_signals() -> Iterator[None]:
    """Install the handlers above for the ``with`` block (the main thread only), then tear down
    what was left up and put the previous handlers back."""
    global _INSTALLED_BY
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    _INSTALLED_BY = os.getpid()
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        tear_down_left_behind()
        for s, handler in previous.items():
            signal.signal(s, handler)
