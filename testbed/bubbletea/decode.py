"""A decode host (BubbleTea): receives prefilled KV caches from the training workers of its DC
over the emulated network and records time to first token; by default it also runs the decode
steps (greedy), several requests at a time (continuous batching), each step padded to the emulated
GPU's time for it: its FLOPs or, where longer (as in decode they are), the bytes it reads.

``python -m testbed.bubbletea.decode CONFIG.json DC``, run by the runner inside a host of DC that is not a
training worker. Listens on TCP port ``kv_sender.DECODE_PORT`` of its own address. Writes one JSON
line per request to ``requests/decode-<DC>.jsonl`` as soon as its first token exists (event
``first_token``) and one when its decode ends (``decoded``). TTFT = first token time - arrival
(the first token is the argmax of the prompt's last logits, sent with the cache, so it exists
once the cache has arrived: the KV transfer is included).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from testbed.bubbletea.chunk_batch import decode_batch
from testbed.bubbletea.decisions import decode_step_seconds
from testbed.bubbletea.inference import InferenceModel
from testbed.bubbletea.kv_cache import InferenceError, KVCache
from testbed.bubbletea.kv_sender import DECODE_PORT, FRAME
from testbed.plan.worker_config import WorkerConfig, read_worker_config
from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.trace import task_names
from testbed.trace.clock import now_ns, sleep_until
from testbed.trace.task_names import name_this_thread

#: the decode steps' scheduling class: SCHED_IDLE, so that they run on CPU time the training
#: workers leave (a woken worker's thread preempts them at once). A decode host stands for GPUs of
#: its own, apart from the training hosts; here its real compute shares their CPUs, and nice 10 (the
#: whole host, still) did not keep it off the run queues training's late threads waited on
#: (docs/history.md, with the figures). Steps stay padded to the emulated GPU's time, and those
#: whose real time overran it are counted (``decode_overrun_fraction``). The threads receiving
#: caches, which stamp the first token, keep their class.
DECODE_POLICY = os.SCHED_IDLE


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class DecodeHost:
    """The decode host at ``address`` serving ``spec`` (its inference model built from ``seed``,
    decode steps padded to ``s_per_flop`` when ``padded``), logging to
    ``out_dir/requests/decode-<dc>.jsonl``. ``from_config`` builds the one of a run's DC."""

    def __init__(
        self, spec: BubbleTeaSpec, s_per_flop: float, padded: bool, seed: int, out_dir: Path, dc: str, address: str
    ) -> None:
        if spec.model is None:
            raise InferenceError("the BubbleTea section has no resolved model: build it through Experiment")
        self.spec, self.s_per_flop, self.padded, self.address = spec, s_per_flop, padded, address
        self.model = InferenceModel(spec.model, seed)
        out = Path(out_dir) / "requests"
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / f"decode-{dc}.jsonl", "a", buffering=1)
        self.lock = threading.Lock()
        self.jobs: queue.Queue = queue.Queue()

    @classmethod
    def from_config(cls, cfg: WorkerConfig, dc: str) -> DecodeHost:
        """The decode host of DC ``dc`` in a run configured by ``cfg`` (which has BubbleTea's part;
        ``InferenceError``, a ValueError, otherwise)."""
        bt = cfg.bubbletea
        if bt is None:
            raise InferenceError("the run's configuration has no BubbleTea part: no decode host runs")
        training = cfg.training
        return cls(bt.spec, bt.s_per_flop, training.padded, training.seed, Path(cfg.out_dir), dc, bt.decode_hosts[dc])

    def start_decoding(self) -> threading.Thread:
        """Start the decode loop (a daemon thread) on what arrives in ``jobs``."""
        t = threading.Thread(target=self._decode_loop, daemon=True)
        t.start()
        return t

    def write(self, row: dict) -> None:
        with self.lock:
            self.log.write(json.dumps(row) + "\n")

    def listen(self) -> socket.socket:
        """Bind the listening socket (connections queue up from here on)."""
        return socket.create_server((self.address, DECODE_PORT), backlog=64)

    def serve(self, srv: socket.socket) -> None:
        if self.spec.decode:
            self.start_decoding()
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        while True:
            head = _recv_exact(conn, FRAME.size)
            if head is None:
                return
            hlen, plen = FRAME.unpack(head)
            header = json.loads(_recv_exact(conn, hlen))
            payload = _recv_exact(conn, plen)
            if payload is None:
                return
            t = now_ns()
            self.write({"event": "first_token", **header, "kv_arrival_ns": t, "first_token_ns": t})
            if self.spec.decode:
                self.jobs.put((header, payload))

    def _decode_loop(self) -> None:
        """Continuous batching: between two steps, requests whose cache has arrived join the batch
        (up to ``max_decode_batch``) and finished ones leave it; one step feeds every request of
        the batch one token (``decode_batch``), padded to its roofline time
        (``decisions.decode_step_seconds``: memory-bound, so a larger batch costs little more while
        the weights outweigh the batch's KV caches)."""
        batch: list[_Decoding] = []
        try:
            os.sched_setscheduler(0, DECODE_POLICY, os.sched_param(0))  # this thread only: not the receiving ones
        except OSError as e:  # decoded all the same, at nice 10 (``main``)
            print(f"decode host {self.address}: the decode steps stay in their class: {e}", file=sys.stderr)
        else:
            name_this_thread(task_names.DECODE_STEP)  # named for its class, which a trace does not show
        while True:
            self._admit(batch)
            s0 = now_ns()
            target_ns = int(decode_step_seconds(self.model.cfg, [d.cache.length for d in batch], self.s_per_flop) * 1e9)
            caches, logits = decode_batch(self.model, [d.token for d in batch], [d.cache for d in batch])
            real = now_ns() - s0
            for d, cache, token in zip(batch, caches, logits.argmax(dim=-1).tolist()):
                d.cache, d.token, d.left = cache, token, d.left - 1
                d.real_ns, d.overruns = d.real_ns + real, d.overruns + (real > target_ns)
                d.batch_sum += len(batch)
            if self.padded:
                sleep_until(s0 + target_ns)
            for d in [d for d in batch if d.left == 0]:
                batch.remove(d)
                self._decoded(d)

    def _admit(self, batch: list[_Decoding]) -> None:
        """Move arrived caches into ``batch`` (waiting for one while it is empty); a request with
        nothing to decode (one output token: the first, already made) ends at once."""
        while len(batch) < self.spec.max_decode_batch:
            try:
                header, payload = self.jobs.get(block=not batch)
            except queue.Empty:
                return
            d = _Decoding(header, KVCache.from_bytes(payload), header["first_token"], header["output_tokens"] - 1)
            if d.left > 0:
                batch.append(d)
            else:
                self._decoded(d)

    def _decoded(self, d: _Decoding) -> None:
        steps = d.header["output_tokens"] - 1
        self.write(
            {
                "event": "decoded",
                "rid": d.header["rid"],
                "decode_start_ns": d.start_ns,
                "decode_end_ns": now_ns(),
                "output_tokens": d.header["output_tokens"],
                "decode_real_ns": d.real_ns,
                # steps whose real time exceeded their padded target (the emulated GPU's)
                "decode_overrun_steps": d.overruns,
                # requests in the batch, averaged over this request's steps
                "decode_mean_batch": d.batch_sum / steps if steps > 0 else None,
            }
        )


@dataclass
class _Decoding:
    """A request in the decode batch: its cache, the token to feed next and the steps left."""

    header: dict
    cache: KVCache
    token: int
    left: int
    start_ns: int = field(default_factory=now_ns)
    real_ns: int = 0
    overruns: int = 0
    batch_sum: int = 0


def main(config_path: str, dc: str) -> None:
    name_this_thread(task_names.DECODE)
    torch.set_num_threads(1)
    try:
        os.nice(10)  # decode hosts must not take CPU time from the emulated GPUs that train (the steps: DECODE_POLICY)
    except OSError:
        pass
    cfg = read_worker_config(config_path)
    host = DecodeHost.from_config(cfg, dc)
    srv = host.listen()
    assert cfg.bubbletea is not None  # DecodeHost refuses a configuration without it
    announce_ready(cfg.bubbletea.dispatcher, dc)
    host.serve(srv)


#: how often a decode host says again that it listens (s)
ANNOUNCE_EVERY_S = 0.2


def announce_ready(dispatcher: str, dc: str) -> None:
    """Tell the dispatcher (its Unix datagram socket) that DC ``dc``'s decode host listens: the
    request stream starts only once every decode host does, so no finished KV cache finds a
    closed port. Said again every ``ANNOUNCE_EVERY_S`` for the host's life, from a thread of its
    own: the dispatcher may not be listening yet, and across machines a datagram may be lost on its
    way (``net/remote/control_relay.py``); the dispatcher takes each DC once. A dispatcher that
    was never there for a minute is reported."""
    msg = json.dumps({"ev": "decode_ready", "dc": dc}).encode()

    def repeat() -> None:
        failed_since = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            while True:
                try:
                    s.sendto(msg, dispatcher)
                    failed_since = time.monotonic()
                except OSError:
                    if time.monotonic() - failed_since > 60:
                        print(f"decode host of {dc}: the dispatcher at {dispatcher} never answered", file=sys.stderr)
                        return
                time.sleep(ANNOUNCE_EVERY_S)

    threading.Thread(target=repeat, name="decode-announce", daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
