"""A torch.distributed script run in one process group on this machine, over loopback: the
reference a launched job's result is set beside (``tests/integration/test_launch.py``).

``python -m tests.support.process_group N SCRIPT [ARGS...]`` imports torch once, then forks N
ranks, each with the environment ``torchrun --standalone --nproc-per-node N`` gives its workers
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``
127.0.0.1, ``MASTER_PORT``), and runs ``SCRIPT`` as ``__main__`` in each. Each rank's output
goes to files of its own, written to this process's stdout and stderr rank by rank once all
have ended (each under a status line on stderr, a failed rank's last; the first rank to fail
ends the others, which would wait in a collective for it); it exits 0 when every rank did, else
with the first failing rank's status.
torchrun itself started an agent and N interpreters that each imported torch: 14.6 s and 15.8 s
for the two shipped examples on the 2-core development VM, against about half that forked.
"""

from __future__ import annotations

import os
import runpy
import signal
import socket
import sys
import tempfile
import traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(nproc: int, script: str, args: list[str]) -> int:
    """Fork ``nproc`` ranks of ``script`` with ``args``; the first nonzero exit status, or 0."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401 - imported once, before the ranks are forked
    import torch.distributed  # noqa: F401

    port = _free_port()
    pids = []
    outputs = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in range(nproc)]  # stdout, stderr
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:  # the rank
            status = 1
            try:
                os.environ.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE=str(nproc),
                    GROUP_RANK="0",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                )
                sys.argv = [script, *args]
                # each rank's own files: on one shared pipe the ranks' writes interleave, and a
                # line can go on from another rank's unfinished one (print writes the text and
                # the newline apart; a reference run once printed "...0.0708final loss 0.237806")
                os.dup2(outputs[rank][0].fileno(), 1)
                os.dup2(outputs[rank][1].fileno(), 2)
                runpy.run_path(script, run_name="__main__")
                status = 0
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        pids.append(pid)
    status: dict[int, int] = {}
    first_failure = 0
    try:
        while len(status) < nproc:  # as the ranks end; the first to fail ends the others
            pid, wait_status = os.waitpid(-1, 0)
            status[pid] = os.waitstatus_to_exitcode(wait_status)
            if status[pid] != 0 and not first_failure:
                first_failure = status[pid]
                for other in pids:
                    if other not in status:
                        os.kill(other, signal.SIGKILL)
    finally:
        for pid in pids:  # none outlives this process: ended, if an error or a signal cut the wait short
            if pid not in status:
                os.kill(pid, signal.SIGKILL)
                status[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        # rank by rank, each rank's lines whole, a failed rank's last; its status on stderr
        codes = [status.get(pid) for pid in pids]
        for rank in sorted(range(nproc), key=lambda k: codes[k] not in (0, -signal.SIGKILL)):  # stable
            sys.stderr.write(f"== rank {rank}: exit status {codes[rank]}\n")
            for f, to in zip(outputs[rank], (sys.stdout, sys.stderr)):
                f.seek(0)
                to.flush()
                to.buffer.write(f.read())
                to.flush()
                f.close()
    return first_failure


if __name__ == "__main__":
    sys.exit(run_ranks(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
