"""BubbleTea's dispatcher: plays the request stream and hands each request to a training worker.

A thread of the runner. Workers report their bubble profile after every iteration (predicted
bubble seconds per iteration, largest bubble, iteration time, queued prefill) over a Unix datagram
socket outside the emulated network. The stream starts once every worker's profile predicts a bubble
(at the start, from the schedule's prediction; without one, after ``profile_iterations``
iterations seen) and every decode host listens (it says so with a
``decode_ready`` datagram); each request, at its arrival time, goes to the worker
``decisions.choose_worker`` picks, or waits in the dispatcher until one has room. Every
assignment is a line of ``requests/dispatch.jsonl`` (arrival and assignment times, worker).

The thread waits in one place: on the profile socket, until a datagram comes, the next request
arrives, or ``POLL_S`` passes (to see ``stop``); it never sleeps past an arrival.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections import deque
from pathlib import Path

from testbed.bubbletea.decisions import MIN_CHUNK_TOKENS, WorkerLoad, choose_worker, prefill_seconds
from testbed.bubbletea.request_table import Request
from testbed.spec.bubbletea import BubbleTeaSpec, dispatched_prompt
from testbed.trace import task_names
from testbed.trace.clock import now_ns
from testbed.trace.task_names import name_this_thread

POLL_S = 0.05  # the longest wait on the socket: how soon ``stop`` is seen


def wait_s(t_ns: int, next_arrival_ns: int | None, pending: bool) -> float:
    """How long the dispatcher may wait on its socket at ``t_ns``, in seconds: until the next
    request's arrival (``next_arrival_ns``, None when no request is to come or the stream has not
    started), at most ``POLL_S``; ``POLL_S`` while requests wait for a worker with room (only a
    profile datagram, which ends the wait at once, can make room); 0 when an arrival is due."""
    if pending or next_arrival_ns is None:
        return POLL_S
    return min(POLL_S, max(0.0, (next_arrival_ns - t_ns) / 1e9))


class Dispatcher(threading.Thread):
    def __init__(
        self,
        spec: BubbleTeaSpec,
        requests: list[Request],
        ranks: list[int],
        s_per_flop: float,
        sock_path: Path,
        inbox_template: str,
        out_dir: Path,
        decode_dcs: tuple[str, ...] = (),
    ) -> None:
        super().__init__(name="bubbletea-dispatcher", daemon=True)
        self.spec, self.requests, self.s_per_flop = spec, requests, s_per_flop
        self.loads = {r: WorkerLoad() for r in ranks}
        self.ready_ranks: set[int] = set()  # workers whose profile predicts a bubble
        self.decode_waiting = set(decode_dcs)  # decode hosts not yet listening
        self.sock_path, self.inbox_template = Path(sock_path), inbox_template
        (out_dir / "requests").mkdir(parents=True, exist_ok=True)
        self.log = open(out_dir / "requests" / "dispatch.jsonl", "a", buffering=1)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock_path.unlink(missing_ok=True)
        self.sock.bind(str(self.sock_path))
        self.sock.setblocking(False)
        self.out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.out.setblocking(False)
        self._halt = threading.Event()
        self.t0_ns: int | None = None
        self.failed: BaseException | None = None
        self.smallest_chunk_s = prefill_seconds(spec.model, 0, MIN_CHUNK_TOKENS, s_per_flop)

    def _profiles(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a datagram, then take in every one queued."""
        select.select([self.sock], [], [], timeout_s)
        while True:
            try:
                msg = json.loads(self.sock.recv(1024))
            except BlockingIOError:
                return
            if msg.get("ev") == "decode_ready":
                self.decode_waiting.discard(msg["dc"])
                continue
            w = self.loads[msg["rank"]]
            w.bubble_per_iteration_s, w.largest_bubble_s = msg["bubble_s"], msg["largest_s"]
            w.iteration_s, w.backlog_s = msg["iteration_s"], msg["backlog_s"]
            if msg.get("ready"):
                self.ready_ranks.add(msg["rank"])

    def _arrival_ns(self, r: Request) -> int:
        """When request ``r`` arrives, on the run's clock (the stream started at ``t0_ns``)."""
        assert self.t0_ns is not None, "the stream has not started"
        return self.t0_ns + int(r.arrival_s * 1e9)

    def _ready(self) -> bool:
        return not self.decode_waiting and self.ready_ranks == set(self.loads)

    def run(self) -> None:
        try:
            name_this_thread(task_names.DISPATCHER)
            self._run()
        except BaseException as e:  # noqa: BLE001 - reported by the runner
            self.failed = e

    def _run(self) -> None:
        pending: deque[tuple[Request, int]] = deque()
        upcoming = deque(self.requests)
        while not self._halt.is_set():
            next_ns = self._arrival_ns(upcoming[0]) if self.t0_ns is not None and upcoming else None
            self._profiles(wait_s(now_ns(), next_ns, bool(pending)))
            if self.t0_ns is None:
                if self._ready():
                    self.t0_ns = now_ns()
                    self.log.write(json.dumps({"event": "stream_start", "t_ns": self.t0_ns}) + "\n")
                continue
            now = now_ns()
            while upcoming and self._arrival_ns(upcoming[0]) <= now:
                r = upcoming.popleft()
                pending.append((r, self._arrival_ns(r)))
            while pending:
                r, arrival_ns = pending[0]
                rank = choose_worker(self.loads, self.smallest_chunk_s, self.spec.guard_ms / 1000)
                if rank is None:
                    break
                pending.popleft()
                prompt = dispatched_prompt(r.prompt_tokens, self.spec.max_prompt_tokens)
                output = min(r.output_tokens, self.spec.max_output_tokens)
                self.loads[rank].backlog_s += prefill_seconds(self.spec.model, 0, prompt, self.s_per_flop)
                msg = {"rid": r.rid, "arrival_ns": arrival_ns, "prompt": prompt, "output": output}
                try:
                    self.out.sendto(json.dumps(msg).encode(), self.inbox_template.format(rank=rank))
                except OSError:
                    continue  # the worker is gone (end of run): the request is not completed
                self.log.write(json.dumps({"event": "assign", **msg, "assigned_ns": now_ns(), "worker": rank}) + "\n")

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        self.sock.close()
        self.out.close()
        self.log.close()
        self.sock_path.unlink(missing_ok=True)
