"""SIGTERM under ``tears_down_on_signals`` (``run/interrupts.py``): the process that installed the
handler says so and ends through SystemExit (tearing down on the way); a child forked from it with
the handler (such as pyroute2's helper for a socket in a namespace) ends at once, silently."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap


def test_a_forked_child_ends_silently_and_the_installer_says_so():
    code = textwrap.dedent(
        """
        import os, signal, sys, time
        from testbed.run.interrupts import tears_down_on_signals
        with tears_down_on_signals():
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            time.sleep(0.3)  # a signal before the child has set itself up after fork is dropped
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=os.getcwd())
    assert proc.stdout.strip() == f"child {128 + signal.SIGTERM}", proc
    assert proc.stderr.count("testbed: SIGTERM: tearing down") == 1, proc.stderr
    assert proc.returncode == 128 + signal.SIGTERM
