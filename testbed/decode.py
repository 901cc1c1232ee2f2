"""A decode host (BubbleTea): receives prefilled KV caches from the training workers of its DC
over the emulated network and records time to first token; by default it also runs the decode
steps of each request (greedy, one token at a time, padded to the emulated GPU's time).

``python -m testbed.decode CONFIG.json DC``, run by the runner inside a host of DC that is not a
training worker. Listens on TCP port ``prefill.DECODE_PORT`` of its own address. Writes one JSON
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

from . import trace as T
from .bubbletea import decode_seconds
from .inference import InferenceModel, KVCache, decode_step
from .model import ModelConfig
from .prefill import DECODE_PORT, FRAME


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class DecodeHost:
    def __init__(self, cfg: dict, dc: str) -> None:
        bt = cfg["bubbletea"]
        self.spec, self.s_per_flop, self.padded = bt["spec"], bt["s_per_flop"], bt["padded"]
        self.model = InferenceModel(ModelConfig(**self.spec["model"]), cfg["experiment"]["seed"])
        out = Path(cfg["out_dir"]) / "requests"
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / f"decode-{dc}.jsonl", "a", buffering=1)
        self.lock = threading.Lock()
        self.jobs: queue.Queue = queue.Queue()
        self.address = bt["decode_hosts"][dc]

    def write(self, row: dict) -> None:
        with self.lock:
            self.log.write(json.dumps(row) + "\n")

    def serve(self) -> None:
        srv = socket.create_server((self.address, DECODE_PORT), backlog=64)
        if self.spec["decode"]:
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
            t = T.now_ns()
            self.write({"event": "first_token", **header, "kv_arrival_ns": t, "first_token_ns": t})
            if self.spec["decode"]:
                self.jobs.put((header, payload))

    def _decode_loop(self) -> None:
        while True:
            header, payload = self.jobs.get()
            t0 = T.now_ns()
            cache = KVCache.from_bytes(payload)
            token, real = header["first_token"], 0
            for _ in range(max(0, header["output_tokens"] - 1)):
                s0 = T.now_ns()
                target = decode_seconds(self.model.cfg, cache.length, self.s_per_flop)
                cache, logits = decode_step(self.model, token, cache)
                token = int(torch.argmax(logits))
                real += T.now_ns() - s0
                if self.padded:
                    while (left := s0 + int(target * 1e9) - T.now_ns()) > 0:
                        time.sleep(left / 1e9)
            self.write({"event": "decoded", "rid": header["rid"], "decode_start_ns": t0, "decode_end_ns": T.now_ns(),
                        "output_tokens": header["output_tokens"], "decode_real_ns": real})


def main(config_path: str, dc: str) -> None:
    torch.set_num_threads(1)
    try:
        os.nice(10)  # decode hosts must not take CPU time from the emulated GPUs that train
    except OSError:
        pass
    DecodeHost(json.loads(Path(config_path).read_text()), dc).serve()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
