"""The hook loaded into every rank of a user's own job before its script (``testbed launch``): it
marks the rank's joining of the job (its ``init_process_group``, so that the launcher can name the
ranks that never join) and, under Atlas's link sharing (``--policy .../sharing=fifo``), reports
each point-to-point transfer across a stage boundary between DCs to Atlas's controller and, where
asked, stripes it over several TCP connections. The job's code is not changed.

``testbed launch`` starts every rank as ``torchrun ... -m testbed.train.job_hook SCRIPT ARGS``:
this module wraps torch.distributed's ``init_process_group`` and, for Atlas, ``isend``, ``irecv``,
``send`` and ``recv`` (and with them ``batch_isend_irecv`` and ``P2POp``, which call them;
``torch.distributed.pipelining`` goes through these), then runs the script as ``python SCRIPT
ARGS`` would (``runpy``, as ``__main__``: the same ``sys.argv``, ``sys.path[0]`` and environment).

A transfer is managed when its sender and receiver are a pipeline's neighbours in different DCs
(the pairs the controller has classes for, ``job.json``'s ``managed_pairs``); everything else,
collectives included, is left alone. For a managed transfer, as the built-in worker does
(``atlas/channel.py``): the sender says ``ready`` when it starts the send, the receiver ``recv``
when it posts the receive and ``done`` when its wait returns (the data is in). The two sides name
a transfer alike without talking: the iteration the job marked last (0 where it marks none) and
the n-th transfer from one rank to the other in it (gloo matches a pair's operations in the order
they are posted); in a 1F1B or GPipe job n is the microbatch, as Atlas's grant plan names it.
Striping (``STRIPES_ENV`` > 1) sends a managed tensor as that many chunks at once on a process
group of the hook's own, made right after the job's ``init_process_group`` with gloo's interface
repeated (one connection per chunk: ``striping.py``); the job's own groups keep one connection
per pair.

Every managed transfer is also an event line (``send`` and ``recv_wait``, with its bytes, its
peer and the hook's own time on it, ``schema.HOOK_NS``) in the rank's event file
(``trace/job.py``), filed under the iteration the job last marked, if it marks any.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from testbed.atlas.channel import DONE, READY, RECV, ControlClient
from testbed.trace import schema as T
from testbed.trace.clock import now_ns
from testbed.trace.job import JOB_DIR_ENV, JOB_FILE, current_iteration, rank_writer

#: the controller's socket (set only under Atlas's sharing)
CONTROL_ENV = "TESTBED_JOB_CONTROL"
#: connections a managed transfer is striped over (absent or 1: not striped)
STRIPES_ENV = "TESTBED_JOB_STRIPES"
#: where each rank marks, in the job's folder, that it has called ``init_process_group`` (``r<rank>``)
JOINED_DIR = "joined"
#: tags of a striped transfer's chunks: tag x TAG_STRIDE + chunk (as ``striping.send_striped``)
TAG_STRIDE = 64


class _Received:
    """A receive's work, saying ``done`` (once) when the job's wait on it returns, or when it
    finds it completed; everything else is the work's own."""

    def __init__(self, works: list, finish: Any) -> None:
        self._works, self._finish, self._said = works, finish, False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        waited = [w.wait(*args, **kwargs) for w in self._works]  # every one, not up to the first False
        self._done()
        return all(r is not False for r in waited)

    def is_completed(self) -> bool:
        completed = all(w.is_completed() for w in self._works)
        if completed:
            self._done()
        return completed

    def _done(self) -> None:
        if not self._said:
            self._said = True
            self._finish()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._works[-1], name)


class _Sent:
    """A striped send's works as one."""

    def __init__(self, works: list) -> None:
        self._works = works

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        waited = [w.wait(*args, **kwargs) for w in self._works]  # every one, not up to the first False
        return all(r is not False for r in waited)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._works[-1], name)


class TransferHook:
    """The wrappers and their bookkeeping for one rank (see the module doc)."""

    def __init__(
        self, rank: int, job: dict[str, Any], control_path: str | None, stripes: int, job_dir: Path | None = None
    ) -> None:
        self.job_dir = job_dir
        self.rank, self.stripes, self.now_ns = rank, stripes, now_ns
        self.client = ControlClient(control_path)
        self.managed = {tuple(p) for p in job.get("managed_pairs", [])}
        self.stage_of = {w["rank"]: w["stage"] for w in job["workers"]}
        # per peer: (the iteration of its last transfer, transfers in that iteration)
        self.sent: dict[int, tuple[int, int]] = {}
        self.received: dict[int, tuple[int, int]] = {}
        self.writer = rank_writer()
        self.stripe_group = None
        self.hook_ns_total = 0
        self.transfers = 0

    def install(self) -> None:
        """Wrap ``init_process_group`` and, where transfers are managed or striped, torch.distributed's
        point-to-point calls (the package's names and the module's own, which ``batch_isend_irecv``
        and ``P2POp`` check against)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self.dist, self.orig = dist, {n: getattr(c10d, n) for n in ("isend", "irecv", "send", "recv")}
        self.orig_init = dist.init_process_group
        dist.init_process_group = self.init_process_group
        if not self.managed:
            return
        wrapped = {"isend": self.isend, "irecv": self.irecv, "send": self.send, "recv": self.recv}
        for name, method in wrapped.items():
            fn = _named(name, method)
            setattr(c10d, name, fn)
            setattr(dist, name, fn)

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        """The rank's joining marked (``JOINED_DIR``), the job's ``init_process_group``, then
        (striping) the hook's group of every rank with one gloo device per stripe, made by every
        rank at the same point."""
        if self.job_dir is not None:
            joined = self.job_dir / JOINED_DIR
            joined.mkdir(exist_ok=True)
            (joined / f"r{self.rank}").touch()
        self.orig_init(*args, **kwargs)
        if self.stripes > 1 and self.managed:
            ifname = os.environ.get("GLOO_SOCKET_IFNAME", "eth0").split(",")[0]
            os.environ["GLOO_SOCKET_IFNAME"] = ",".join([ifname] * self.stripes)
            try:
                self.stripe_group = self.dist.new_group(backend="gloo")
            finally:
                os.environ["GLOO_SOCKET_IFNAME"] = ifname

    def _peer(self, group: Any, peer: int | None, group_peer: int | None) -> int | None:
        if group_peer is None or group is None:
            return peer if group_peer is None else group_peer
        return self.dist.get_global_rank(group, group_peer)

    def isend(self, tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None):
        t0 = self.now_ns()
        peer = self._peer(group, dst, group_dst)
        if (self.rank, peer) not in self.managed:
            return self.orig["isend"](tensor, dst, group, tag, group_dst)
        it, seq = _count(self.sent, peer)
        self.client.send(READY, self.rank, peer, it, seq)
        striped = self.stripe_group is not None and tensor.is_contiguous()
        t_call = self.now_ns()
        if striped:
            chunks = tensor.reshape(-1).chunk(self.stripes)
            work: Any = _Sent(
                [self.orig["isend"](c, peer, self.stripe_group, tag * TAG_STRIDE + i) for i, c in enumerate(chunks)]
            )
        else:
            work = self.orig["isend"](tensor, dst, group, tag, group_dst)
        self._record(T.SEND, t0, self.now_ns(), peer, tensor, it, seq, t_call - t0)
        return work

    def irecv(self, tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None):
        t0 = self.now_ns()
        peer = self._peer(group, src, group_src)
        if peer is None or (peer, self.rank) not in self.managed:
            return self.orig["irecv"](tensor, src, group, tag, group_src)
        it, seq = _count(self.received, peer)
        self.client.send(RECV, peer, self.rank, it, seq)
        t_call = self.now_ns()
        if self.stripe_group is not None and tensor.is_contiguous():
            chunks = tensor.view(-1).chunk(self.stripes)
            works = [self.orig["irecv"](c, peer, self.stripe_group, tag * TAG_STRIDE + i) for i, c in enumerate(chunks)]
        else:
            works = [self.orig["irecv"](tensor, src, group, tag, group_src)]

        def finish() -> None:
            t_in = self.now_ns()
            self.client.send(DONE, peer, self.rank, it, seq)
            self._record(T.RECV_WAIT, t0, t_in, peer, tensor, it, seq, (t_call - t0) + (self.now_ns() - t_in))

        return _Received(works, finish)

    def send(self, tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None):
        self.isend(tensor, dst, group, tag, group_dst).wait()

    def recv(self, tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None):
        peer = self._peer(group, src, group_src)
        if peer is None or (peer, self.rank) not in self.managed:
            return self.orig["recv"](tensor, src, group, tag, group_src)
        self.irecv(tensor, src, group, tag, group_src).wait()
        return src if src is not None else group_src

    def _record(
        self, kind: str, start_ns: int, end_ns: int, peer: int, tensor: Any, it: int, seq: int, hook_ns: int
    ) -> None:
        """The transfer's event line (the n-th transfer of the pair in iteration ``it`` is its
        microbatch, its boundary's lower stage its virtual stage); the line's own writing counts in
        the rank's total."""
        t0 = self.now_ns()
        self.transfers += 1
        if self.writer is not None:
            forward = self.stage_of[peer] > self.stage_of[self.rank]
            if kind == T.RECV_WAIT:
                forward = not forward
            self.writer.write(
                kind,
                start_ns,
                end_ns,
                **{
                    T.ITERATION: it,
                    T.MICROBATCH: seq,
                    T.PEER: peer,
                    T.BYTES: tensor.numel() * tensor.element_size(),
                    T.VIRTUAL_STAGE: min(self.stage_of[self.rank], self.stage_of[peer]),
                    T.TENSOR: T.ACTIVATIONS if forward else T.GRADIENTS,
                    T.HOOK_NS: hook_ns,
                },
            )
        self.hook_ns_total += hook_ns + (self.now_ns() - t0)

    def report(self, path: Path) -> None:
        """This rank's totals: managed transfers (each send and each receive) and the hook's time."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rank": self.rank, "transfers": self.transfers, "hook_ns": self.hook_ns_total}))


def _count(table: dict[int, tuple[int, int]], peer: int) -> tuple[int, int]:
    """(the iteration the job marks now, this transfer's number among the pair's in it), counted
    in ``table``: the name both sides give a transfer (the controller's key, the plan's microbatch
    in a 1F1B or GPipe job, where a pair carries one transfer per microbatch each way)."""
    it = current_iteration()
    last, n = table.get(peer, (it, 0))
    if last != it:
        n = 0
    table[peer] = (it, n + 1)
    return it, n


def _named(name: str, method: Any) -> Any:
    """``method`` as a plain function called ``name`` (P2POp's repr reads the op's name)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def main(argv: list[str]) -> None:
    """``python -m testbed.train.job_hook SCRIPT ARGS``: install the hook, then run SCRIPT as
    ``python SCRIPT ARGS`` would. Raises SystemExit(2) without a script."""
    if not argv:
        raise SystemExit("usage: python -m testbed.train.job_hook SCRIPT [ARGS]")

    job_dir = Path(os.environ[JOB_DIR_ENV])
    rank = int(os.environ["RANK"])
    hook = TransferHook(
        rank,
        json.loads((job_dir / JOB_FILE).read_text()),
        os.environ.get(CONTROL_ENV),
        int(os.environ.get(STRIPES_ENV, "1")),
        job_dir,
    )
    hook.install()
    atexit.register(hook.report, job_dir / "hook" / f"r{rank}.json")
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
