"""How the user runs the testbed's command line, for a message that names a command to run: as
this process was invoked (``.venv/bin/testbed``, ``python -m testbed.cli``, or ``testbed`` where it
is on PATH). A machine set up by ``scripts/go`` has no ``testbed`` on PATH, and ``sudo`` resets
PATH, so a bare ``sudo testbed clean`` would fail there."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def testbed_command(argv0: str | None = None, executable: str | None = None) -> str:
    """The command that runs the testbed's CLI as this process's was run (``argv0``, default
    ``sys.argv[0]``; ``executable``, default ``sys.executable``): the console script as typed, or
    its absolute path where it was found on PATH but sudo's would not find it; ``<python> -m
    testbed.cli`` for the module; ``testbed`` when the CLI is not what runs (a script using the
    package)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if Path(argv0).name == "testbed":
        if os.sep not in argv0:  # found on this PATH: sudo's secure_path may not have it
            found = shutil.which(argv0)
            return found if found and not found.startswith(("/usr/bin/", "/usr/local/bin/", "/bin/")) else argv0
        return argv0
    if Path(argv0).parts[-3:] == ("testbed", "cli", "__main__.py"):
        return f"{executable} -m testbed.cli"
    return "testbed"


def sudo_testbed(args: str) -> str:
    """``sudo <testbed_command()> <args>``, as a message quotes it."""
    return f"sudo {testbed_command()} {args}"
