"""The ``testbed`` command line: it parses arguments (``parser.py``) and calls the package (one
module per group of commands: ``topo.py``, ``train.py``, ``machine.py``, ``sim.py``, each imported
only when one of its commands runs, so that ``testbed clean`` does not load the simulator and
pandas: seconds under an emulated CPU); its errors and interruptions become messages and exit
statuses. ``python -m testbed.cli`` runs it too."""

from __future__ import annotations

import argparse
import sys
import warnings

from testbed.cli.common import err
from testbed.cli.parser import build_parser
from testbed.errors import SpecError, TestbedError, TestbedWarning
from testbed.invocation import testbed_command
from testbed.run.interrupts import tears_down_on_signals

__all__ = ["build_parser", "main", "split_job"]


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """The testbed's own warnings as ``testbed: warning: ...``; others as Python prints them."""
    if issubclass(category, TestbedWarning):
        err(f"warning: {message}")
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: list[str] | None = None) -> int:
    with tears_down_on_signals():
        argv, job = split_job(sys.argv[1:] if argv is None else argv)
        args = build_parser(testbed_command()).parse_args(argv)
        if job is not None:
            args.job = job
        warnings.showwarning = show_warning
        return _command(args)


def split_job(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``testbed launch ... -- SCRIPT ARGS``: (the arguments before ``--``, the job's after it);
    the job None for any other command or without ``--`` (argparse leaves what follows ``--`` to
    positionals, which the job's own options would upset)."""
    if "launch" not in argv or "--" not in argv or argv.index("--") < argv.index("launch"):
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def _command(args: argparse.Namespace) -> int:
    """Run the command; its errors and interruptions become messages and exit statuses."""
    try:
        return args.func(args)
    except SpecError as e:
        err(f"error: {e}")
        return 2
    except TestbedError as e:
        err(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        err("interrupted; everything the run created was removed")
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # stdout went to a pager or head that quit early
        return 0
