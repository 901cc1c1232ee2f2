"""A decode host (BubbleTea): receives prefilled KV caches from the training workers of its DC
over the emulated network and records time to first token; by default it also runs the decode
steps of each request (greedy, one token at a time, padded to the emulated GPU's time).

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
from pathlib import Path

import torch

from testbed.bubbletea.decisions import decode_seconds
from testbed.bubbletea.inference import InferenceModel, KVCache, decode_step
from testbed.bubbletea.kv_sender import DECODE_PORT, FRAME
from testbed.plan.worker_config import WorkerConfig, read_worker_config
from testbed.trace.clock import now_ns


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class DecodeHost:
    """The decode host of DC ``dc`` in a run configured by ``cfg`` (which has BubbleTea's part)."""

    def __init__(self, cfg: WorkerConfig, dc: str) -> None:
        bt = cfg.bubbletea
        if bt is None:
            raise ValueError("the run's configuration has no BubbleTea part: no decode host runs")
        self.spec, self.s_per_flop, self.padded = bt.spec, bt.s_per_flop, cfg.training.padded
        self.model = InferenceModel(self.spec.model, cfg.training.seed)
        out = Path(cfg.out_dir) / "requests"
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / f"decode-{dc}.jsonl", "a", buffering=1)
        self.lock = threading.Lock()
        self.jobs: queue.Queue = queue.Queue()
        self.address = bt.decode_hosts[dc]

    def write(self, row: dict) -> None:
        with self.lock:
            self.log.write(json.dumps(row) + "\n")

    def listen(self) -> socket.socket:
        """Bind the listening socket (connections queue up from here on)."""
        return socket.create_server((self.address, DECODE_PORT), backlog=64)

    def serve(self, srv: socket.socket) -> None:
        if self.spec.decode:
            threading.Thread(target=self._decode_loop, daemon=True).start()
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
        while True:
            header, payload = self.jobs.get()
            t0 = now_ns()
            cache = KVCache.from_bytes(payload)
            token, real, overruns = header["first_token"], 0, 0
            for _ in range(max(0, header["output_tokens"] - 1)):
                s0 = now_ns()
                target = decode_seconds(self.model.cfg, cache.length, self.s_per_flop)
                cache, logits = decode_step(self.model, token, cache)
                token = int(torch.argmax(logits))
                real += now_ns() - s0
                overruns += now_ns() - s0 > target * 1e9
                if self.padded:
                    while (left := s0 + int(target * 1e9) - now_ns()) > 0:
                        time.sleep(left / 1e9)
            self.write(
                {
                    "event": "decoded",
                    "rid": header["rid"],
                    "decode_start_ns": t0,
                    "decode_end_ns": now_ns(),
                    "output_tokens": header["output_tokens"],
                    "decode_real_ns": real,
                    # steps whose real time exceeded their padded target (the emulated GPU's)
                    "decode_overrun_steps": overruns,
                }
            )


def main(config_path: str, dc: str) -> None:
    torch.set_num_threads(1)
    try:
        os.nice(10)  # decode hosts must not take CPU time from the emulated GPUs that train
    except OSError:
        pass
    cfg = read_worker_config(config_path)
    host = DecodeHost(cfg, dc)
    srv = host.listen()
    assert cfg.bubbletea is not None  # DecodeHost refuses a configuration without it
    announce_ready(cfg.bubbletea.dispatcher, dc)
    host.serve(srv)


def announce_ready(dispatcher: str, dc: str) -> None:
    """Tell the dispatcher (its Unix datagram socket) that DC ``dc``'s decode host listens: the
    request stream starts only once every decode host does, so no finished KV cache finds a
    closed port. The dispatcher may not be listening yet: retried for up to a minute."""
    msg = json.dumps({"ev": "decode_ready", "dc": dc}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for _ in range(600):
            try:
                s.sendto(msg, dispatcher)
                return
            except OSError:
                time.sleep(0.1)
    print(f"decode host of {dc}: the dispatcher at {dispatcher} never answered", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
