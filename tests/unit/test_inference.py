"""Chunked prefill with a KV cache, greedy decode, cache bytes, chunking and FLOPs."""

import threading
import time

import pytest
import torch

from testbed.bubbletea.bubble_end import Arrived, Deadline
from testbed.bubbletea.chunk_batch import decode_batch
from testbed.bubbletea.inference import (
    InferenceModel,
    chunk_bounds,
    decode_step,
    greedy_decode,
    prefill_chunk,
    prompt_tokens_for,
)
from testbed.bubbletea.kv_cache import KV_HEADER_BYTES, InferenceError, KVCache
from testbed.model.gpt import build_model
from testbed.spec.model import ModelConfig, decode_flops, prefill_flops

CFG = ModelConfig(n_layers=3, d_model=32, n_heads=4, seq_len=64)
SEED = 5
ATOL = 1e-5


class _Looks:
    """A bubble end that answers each look from ``answers`` (and never blocks)."""

    t_ns = None

    def __init__(self, answers) -> None:
        self.answers = answers

    def is_set(self) -> bool:
        return next(self.answers)

    def wait(self, timeout=None) -> bool:
        return self.is_set()

    def until_woken(self) -> None:
        pass


@pytest.fixture(scope="module")
def model():
    return InferenceModel(CFG, SEED)


def reference_logits(tokens: torch.Tensor) -> torch.Tensor:
    """The plain training model over the whole sequence: (len, vocab)."""
    with torch.no_grad():
        return build_model(CFG, SEED)(tokens[None])[0]


def prefill(model, tokens, max_chunk):
    cache = None
    for s, e in chunk_bounds(len(tokens), max_chunk):
        cache, logits = prefill_chunk(model, tokens[s:e], cache)
    return cache, logits


# ---- prefill -----------------------------------------------------------------------------------


def test_whole_prefill_equals_plain_gpt_forward(model):
    prompt = prompt_tokens_for(1, 40, 0)
    cache, logits = prefill_chunk(model, prompt, None)
    want = reference_logits(prompt)
    assert logits.shape == (CFG.vocab,)
    assert torch.allclose(logits, want[-1], atol=ATOL)
    assert cache.length == 40
    assert cache.n_layers == CFG.n_layers
    for k, v in zip(cache.keys, cache.values):
        assert k.shape == v.shape == (CFG.n_heads, 40, CFG.d_model // CFG.n_heads)


@pytest.mark.parametrize("max_chunk", [1, 7, 10, 39, 40])
def test_chunked_prefill_equals_one_prefill(model, max_chunk):
    prompt = prompt_tokens_for(2, 40, 0)
    whole, whole_logits = prefill_chunk(model, prompt, None)
    cache, logits = prefill(model, prompt, max_chunk)
    assert cache.length == whole.length == 40
    assert torch.allclose(logits, whole_logits, atol=ATOL)
    assert torch.allclose(logits, reference_logits(prompt)[-1], atol=ATOL)
    for a, b in zip((*cache.keys, *cache.values), (*whole.keys, *whole.values)):
        assert torch.allclose(a, b, atol=ATOL)


def test_every_chunk_returns_its_own_last_position_logits(model):
    prompt = prompt_tokens_for(3, 30, 0)
    want = reference_logits(prompt)
    cache = None
    for s, e in chunk_bounds(30, 8):
        cache, logits = prefill_chunk(model, prompt[s:e], cache)
        assert torch.allclose(logits, want[e - 1], atol=ATOL)


def test_prefill_leaves_the_input_cache_unchanged(model):
    prompt = prompt_tokens_for(4, 20, 0)
    first, _ = prefill_chunk(model, prompt[:10], None)
    before = [t.clone() for t in first.keys]
    second, _ = prefill_chunk(model, prompt[10:], first)
    assert first.length == 10 and second.length == 20
    assert all(torch.equal(a, b) for a, b in zip(first.keys, before))


# ---- decode ------------------------------------------------------------------------------------


def test_decode_with_cache_equals_full_forward(model):
    prompt = prompt_tokens_for(6, 25, 0)
    cache, logits = prefill(model, prompt, 9)
    out = greedy_decode(model, cache, logits, 12)
    assert len(out) == 12 and all(0 <= t < CFG.vocab for t in out)
    full = torch.cat([prompt, torch.tensor(out)])
    want = reference_logits(full)
    # token j is the argmax after prompt + out[:j]
    for j, tok in enumerate(out):
        assert tok == int(want[len(prompt) - 1 + j].argmax())
    # and each decode step's logits match the full forward at that position
    for j, tok in enumerate(out[:-1]):
        cache, logits = decode_step(model, tok, cache)
        assert cache.length == len(prompt) + j + 1
        assert torch.allclose(logits, want[len(prompt) + j], atol=ATOL)


def test_batched_decode_equals_each_request_alone(model):
    """Continuous batching: caches of different lengths stepped together give each request the
    logits and cache it gets alone, and requests join and leave between steps."""
    caches, tokens = [], []
    for rid, n in ((10, 5), (11, 17), (12, 30)):
        c, lg = prefill(model, prompt_tokens_for(rid, n, 0), 8)
        caches.append(c)
        tokens.append(int(lg.argmax()))
    alone = [decode_step(model, t, c) for t, c in zip(tokens, caches)]
    together, logits = decode_batch(model, tokens, caches)
    assert logits.shape == (3, CFG.vocab)
    for (c1, l1), c2, l2 in zip(alone, together, logits):
        assert c2.length == c1.length
        assert torch.allclose(l2, l1, atol=ATOL)
        assert all(torch.allclose(a, b, atol=ATOL) for a, b in zip((*c1.keys, *c1.values), (*c2.keys, *c2.values)))
    # the first request leaves, the others take a second step together
    again, logits2 = decode_batch(model, [int(lg.argmax()) for lg in logits[1:]], together[1:])
    for lg, (c1, l1) in zip(logits2, alone[1:]):
        _, want = decode_step(model, int(l1.argmax()), c1)
        assert torch.allclose(lg, want, atol=ATOL)
    assert [c.length for c in again] == [19, 32]


def test_batched_decode_refuses_mismatched_lists_and_long_requests(model):
    cache, logits = prefill_chunk(model, prompt_tokens_for(13, CFG.seq_len, 0), None)
    with pytest.raises(InferenceError, match="one token per cache"):
        decode_batch(model, [1, 2], [cache])
    with pytest.raises(InferenceError, match="one token per cache"):
        decode_batch(model, [], [])
    with pytest.raises(InferenceError, match=f"seq_len={CFG.seq_len}"):
        decode_batch(model, [1], [cache])


def test_greedy_decode_zero_and_one_token(model):
    cache, logits = prefill_chunk(model, prompt_tokens_for(7, 5, 0), None)
    assert greedy_decode(model, cache, logits, 0) == []
    assert greedy_decode(model, cache, logits, 1) == [int(logits.argmax())]


def test_decode_fills_the_context_exactly(model):
    cache, logits = prefill_chunk(model, prompt_tokens_for(8, CFG.seq_len - 3, 0), None)
    assert len(greedy_decode(model, cache, logits, 4)) == 4  # the 4th token is not fed back
    with pytest.raises(InferenceError, match=f"seq_len={CFG.seq_len}"):
        greedy_decode(model, cache, logits, 5)


# ---- context limit and bad input ----------------------------------------------------------------


def test_over_length_prompt_is_rejected_with_limit_and_fix(model):
    prefill_chunk(model, prompt_tokens_for(9, CFG.seq_len, 0), None)  # exactly the context: fine
    with pytest.raises(
        InferenceError,
        match=rf"needs {CFG.seq_len + 1} positions.*seq_len={CFG.seq_len}.*"
        rf"seq_len >= {CFG.seq_len + 1}.*clip",
    ):
        prefill_chunk(model, prompt_tokens_for(9, CFG.seq_len + 1, 0), None)
    cache, _ = prefill_chunk(model, prompt_tokens_for(9, CFG.seq_len - 2, 0), None)
    with pytest.raises(ValueError, match="seq_len"):  # InferenceError is a ValueError
        prefill_chunk(model, prompt_tokens_for(9, 3, 0), cache)
    full, _ = prefill_chunk(model, prompt_tokens_for(9, CFG.seq_len, 0), None)
    with pytest.raises(InferenceError, match="positions"):
        decode_step(model, 1, full)


@pytest.mark.parametrize(
    "tokens",
    [
        torch.tensor([], dtype=torch.long),
        torch.tensor([[1, 2]]),
        torch.tensor([1.0, 2.0]),
        torch.tensor([1, 256]),
        torch.tensor([-1, 3]),
    ],
)
def test_bad_tokens_rejected(model, tokens):
    with pytest.raises(InferenceError, match="tokens"):
        prefill_chunk(model, tokens, None)


def test_cache_of_another_model_rejected(model):
    other = KVCache.empty(ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=64))
    with pytest.raises(InferenceError, match="n_layers, n_heads, head_dim"):
        prefill_chunk(model, torch.tensor([1]), other)


# ---- cache bytes ---------------------------------------------------------------------------------


def test_cache_bytes_round_trip_exactly(model):
    cache, _ = prefill(model, prompt_tokens_for(10, 33, 0), 10)
    data = cache.to_bytes()
    hd = CFG.d_model // CFG.n_heads
    assert cache.nbytes() == 2 * CFG.n_layers * CFG.n_heads * 33 * hd * 4
    assert len(data) == KV_HEADER_BYTES + cache.nbytes()
    back = KVCache.from_bytes(data)
    assert back.length == 33
    for a, b in zip((*cache.keys, *cache.values), (*back.keys, *back.values)):
        assert a.dtype == b.dtype == torch.float32
        assert torch.equal(a, b)
    # the rebuilt cache continues the request as the original does
    _, la = decode_step(model, 65, cache)
    _, lb = decode_step(model, 65, back)
    assert torch.equal(la, lb)


def test_keys_and_values_travel_in_their_own_places(model):
    cache, _ = prefill_chunk(model, prompt_tokens_for(11, 6, 0), None)
    back = KVCache.from_bytes(cache.to_bytes())
    assert not torch.equal(back.keys[0], back.values[0])
    assert not torch.equal(back.keys[0], back.keys[1])


def test_empty_cache_round_trips():
    back = KVCache.from_bytes(KVCache.empty(CFG).to_bytes())
    assert back.length == 0 and back.nbytes() == 0 and back.n_layers == CFG.n_layers


def test_the_kv_senders_thread_names_itself_apart_from_its_stream():
    """A stream's KV sender thread keeps the normal policy while the stream turns SCHED_IDLE, so
    it carries a name of its own (``task_names.KV_SENDER``), which a scheduler trace reads back."""
    import os
    import time

    from testbed.bubbletea.kv_sender import KVSender
    from testbed.trace.task_names import KV_SENDER, role_of

    name = KV_SENDER.format(rank=3)
    sender = KVSender(None, lambda n: None, name)
    try:
        for _ in range(100):  # until its thread has started and named itself
            comms = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
            if name in comms:
                break
            time.sleep(0.01)
        assert name in comms and role_of(name, False) == ("kv sender", 3)
    finally:
        sender.close()


def test_the_kv_sender_sends_the_caches_own_memory_in_the_wire_format(model):
    """``KVCache.buffers`` are views of the tensors (nothing copied), and what ``KVSender`` puts on
    a socket is one frame: the lengths, the JSON header, the cache that ``from_bytes`` reads back;
    the cache's bytes are released from the memory budget once sent."""
    import json
    import socket

    import numpy as np

    from testbed.bubbletea.decisions import KVBudget
    from testbed.bubbletea.kv_sender import DECODE_PORT, FRAME, KVSender

    cache, _ = prefill(model, torch.arange(40) % CFG.vocab, 16)
    bufs = cache.buffers()
    assert np.shares_memory(np.asarray(bufs[1]), cache.keys[0].numpy())
    assert b"".join(bufs) == cache.to_bytes()
    with socket.create_server(("127.0.0.1", DECODE_PORT)) as srv:
        budget = KVBudget(0)
        budget.hold(1000)
        sender = KVSender("127.0.0.1", budget.release)
        sender.put({"rid": 7}, cache, 1000)
        conn, _ = srv.accept()
        sender.close()  # sends what is queued, then closes its connection
        data = b""
        with conn:
            while chunk := conn.recv(1 << 16):
                data += chunk
    hlen, plen = FRAME.unpack_from(data)
    header = json.loads(data[FRAME.size : FRAME.size + hlen])
    payload = data[FRAME.size + hlen :]
    assert header["rid"] == 7 and header["kv_bytes"] == plen == len(payload) == KV_HEADER_BYTES + cache.nbytes()
    back = KVCache.from_bytes(payload)
    assert all(torch.equal(a, b) for a, b in zip(back.keys + back.values, cache.keys + cache.values))
    assert budget.held_bytes == 0


@pytest.mark.parametrize(
    "cut", [lambda d: d[:-4], lambda d: d + b"\0" * 4, lambda d: b"XXXX" + d[4:], lambda d: d[: KV_HEADER_BYTES - 1]]
)
def test_damaged_cache_bytes_rejected(model, cut):
    cache, _ = prefill_chunk(model, prompt_tokens_for(12, 4, 0), None)
    with pytest.raises(InferenceError, match="KV cache bytes"):
        KVCache.from_bytes(cut(cache.to_bytes()))


def test_inconsistent_cache_tensors_rejected():
    with pytest.raises(InferenceError):
        KVCache((torch.zeros(2, 3, 4),), (torch.zeros(2, 4, 4),))
    with pytest.raises(InferenceError):
        KVCache((torch.zeros(2, 3, 4),), ())
    with pytest.raises(InferenceError):
        KVCache((torch.zeros(2, 3, 4, dtype=torch.float64),), (torch.zeros(2, 3, 4, dtype=torch.float64),))


# ---- chunk bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, m, want",
    [
        (1, 1, [(0, 1)]),
        (5, 1, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
        (10, 4, [(0, 4), (4, 8), (8, 10)]),
        (8, 4, [(0, 4), (4, 8)]),
        (3, 100, [(0, 3)]),
    ],
)
def test_chunk_bounds(n, m, want):
    assert chunk_bounds(n, m) == want


@pytest.mark.parametrize("n, m", [(0, 4), (-1, 4), (4, 0), (4, -2), (4.0, 2), (4, 2.5), (True, 2), ("4", 2)])
def test_chunk_bounds_bad_input(n, m):
    with pytest.raises(InferenceError):
        chunk_bounds(n, m)


# ---- synthetic prompts ------------------------------------------------------------------------------


def test_prompt_tokens_deterministic_and_distinct():
    a = prompt_tokens_for(3, 50, 1)
    assert a.dtype == torch.long and a.shape == (50,)
    assert int(a.min()) >= 0 and int(a.max()) <= 255
    assert torch.equal(a, prompt_tokens_for(3, 50, 1))
    assert torch.equal(a[:20], prompt_tokens_for(3, 20, 1))
    assert not torch.equal(a, prompt_tokens_for(4, 50, 1))
    assert not torch.equal(a, prompt_tokens_for(3, 50, 2))
    assert not torch.equal(a, prompt_tokens_for(3, 50, 1 + 2**32))  # every bit of the seed counts
    assert not torch.equal(prompt_tokens_for(1, 50, 0), prompt_tokens_for(0, 50, 1))


@pytest.mark.parametrize("rid, n, seed", [(-1, 5, 0), (0, 0, 0), (0, 5, -1), (1.0, 5, 0), (0, 5, True)])
def test_prompt_tokens_bad_input(rid, n, seed):
    with pytest.raises(InferenceError):
        prompt_tokens_for(rid, n, seed)


# ---- FLOPs ------------------------------------------------------------------------------------------

BIG = ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=2048)


def attention_flops(cfg, start, chunk):
    """prefill_flops less its parameter terms (blocks on every token, norm and head once)."""
    d = cfg.d_model
    params = 2.0 * cfg.n_layers * (12 * d * d + 13 * d) * chunk + 2.0 * (d * cfg.vocab + cfg.vocab + 2 * d)
    return prefill_flops(cfg, start, chunk) - params


def test_prefill_flops_by_hand():
    # n_layers=1, d=2, vocab=3: blocks 12*4+26 = 74 params, output 2*3+3+4 = 13 params
    cfg = ModelConfig(n_layers=1, d_model=2, n_heads=1, seq_len=8, vocab=3)
    # positions 4, 5: attended keys 5 + 6 = 11
    assert prefill_flops(cfg, 4, 2) == 2 * 74 * 2 + 2 * 13 + 4 * 1 * 2 * 11
    assert decode_flops(cfg, 4) == 2 * 74 + 2 * 13 + 4 * 2 * 5


def test_prefill_parameters_split_as_model_counts_them():
    # blocks + final norm and head + the two embedding tables = ModelConfig.params()
    for cfg in (CFG, BIG, ModelConfig()):
        d = cfg.d_model
        body = cfg.n_layers * (12 * d * d + 13 * d) + d * cfg.vocab + cfg.vocab + 2 * d
        assert body + (cfg.vocab + cfg.seq_len) * d == cfg.params()
        assert (
            sum(
                p.numel()
                for n, p in InferenceModel(cfg, 0).named_parameters()
                if not n.startswith(("gpt.tok.", "gpt.pos."))
            )
            == body
        )


def test_flops_grow_with_start_position():
    f = [prefill_flops(BIG, s, 256) for s in (0, 256, 1024, 1792)]
    assert f == sorted(f) and len(set(f)) == 4
    # attention grows linearly in start: 4 n_layers d chunk per extra position
    assert f[1] - f[0] == 4 * BIG.n_layers * BIG.d_model * 256 * 256
    d = [decode_flops(BIG, p) for p in (0, 1, 100)]
    assert d[1] - d[0] == 4 * BIG.n_layers * BIG.d_model
    assert d[2] - d[0] == 100 * 4 * BIG.n_layers * BIG.d_model


def test_chunks_sum_to_the_whole_prompt_plus_one_head_per_extra_chunk():
    bounds = chunk_bounds(1000, 256)
    parts = sum(prefill_flops(BIG, s, e - s) for s, e in bounds)
    head = 2.0 * (BIG.d_model * BIG.vocab + BIG.vocab + 2 * BIG.d_model)
    assert parts == prefill_flops(BIG, 0, 1000) + (len(bounds) - 1) * head


@pytest.mark.parametrize("L", [16, 128, 2048])
def test_attention_term_matches_kaplan_in_the_limit(L):
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=L)
    kaplan = cfg.forward_flops(L) - 2.0 * cfg.params() * L  # 2 n_layers seq_len d per token
    ours = attention_flops(cfg, 0, L)
    assert ours == kaplan + 2.0 * cfg.n_layers * cfg.d_model * L  # causal: L (L + 1) / 2 keys, not L^2 / 2
    assert ours / kaplan == pytest.approx(1 + 1 / L)


def test_whole_prompt_flops_versus_model_formula():
    # forward_flops counts the embeddings and the head on every token; prefill neither
    cfg, L = BIG, BIG.seq_len
    d = cfg.d_model
    head = 2.0 * (d * cfg.vocab + cfg.vocab + 2 * d)
    gap = 2.0 * (cfg.vocab + cfg.seq_len) * d * L + head * (L - 1) - 2.0 * cfg.n_layers * d * L
    assert cfg.forward_flops(L) - prefill_flops(cfg, 0, L) == gap


@pytest.mark.parametrize("start, chunk", [(-1, 4), (0, 0), (0, -3), (1.5, 4)])
def test_prefill_flops_bad_input(start, chunk):
    with pytest.raises(ValueError, match="is not an integer"):
        prefill_flops(BIG, start, chunk)


@pytest.mark.parametrize("stop_after", [0, 1, 2])
def test_a_prefill_stopped_at_a_layer_boundary_resumes_exactly(stop_after):
    """A chunk stopped after ``stop_after`` of 3 blocks, another request's chunk run in between,
    then resumed: the same cache and logits, bit for bit, as the chunk run straight through; and the
    next chunk after it too."""
    from testbed.bubbletea.chunk_batch import ChunkBatch
    from testbed.bubbletea.inference import InferenceModel, prefill_chunk

    model = InferenceModel(ModelConfig(n_layers=3, d_model=32, n_heads=4, seq_len=64), seed=5)
    prompt = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1))
    first, _ = prefill_chunk(model, prompt[:16], None)
    straight, logits = prefill_chunk(model, prompt[16:32], first)
    part = ChunkBatch(model, [(prompt[16:32], first)])
    for _ in range(stop_after):
        part.step()
    assert part.layers_done == stop_after and not part.done
    with pytest.raises(InferenceError, match=f"after {stop_after} of 3 blocks"):
        part.result()
    prefill_chunk(model, prompt[:8], None)  # another request in between
    while not part.done:
        part.step()
    [(cache, got)] = part.result()
    assert torch.equal(got, logits)
    assert all(torch.equal(a, b) for a, b in zip(cache.keys + cache.values, straight.keys + straight.values))
    assert torch.equal(prefill_chunk(model, prompt[32:], cache)[1], prefill_chunk(model, prompt[32:], straight)[1])


def test_chunks_of_several_requests_in_one_pass_equal_each_alone(model):
    """One forward pass over three requests' chunks (a prompt's start, and two later chunks over
    caches of different lengths), stopped after one block and resumed: each request gets the cache
    and logits its chunk gets alone, and no request sees another's tokens."""
    from testbed.bubbletea.chunk_batch import ChunkBatch

    prompts = [prompt_tokens_for(rid, 30, 0) for rid in (20, 21, 22)]
    c21, _ = prefill_chunk(model, prompts[1][:5], None)
    c22, _ = prefill_chunk(model, prompts[2][:19], None)
    parts = [(prompts[0][:12], None), (prompts[1][5:21], c21), (prompts[2][19:26], c22)]
    alone = [prefill_chunk(model, t, c) for t, c in parts]
    batch = ChunkBatch(model, parts)
    batch.step()
    assert batch.layers_done == 1
    while not batch.done:
        batch.step()
    for (c1, l1), (c2, l2) in zip(alone, batch.result()):
        assert c2.length == c1.length
        assert torch.allclose(l2, l1, atol=ATOL)
        assert all(torch.allclose(a, b, atol=ATOL) for a, b in zip(c1.keys + c1.values, c2.keys + c2.values))
    with pytest.raises(InferenceError, match="at least one"):
        ChunkBatch(model, [])
    with pytest.raises(InferenceError, match=f"seq_len={CFG.seq_len}"):  # a part past its context
        ChunkBatch(model, [(prompts[0][:5], None), (torch.zeros(CFG.seq_len, dtype=torch.long), c21)])


# ---- memory: the KV caches' budget ---------------------------------------------------------------


def test_a_kv_cache_is_the_bytes_the_formula_gives(model):
    from testbed.plan.memory import kv_cache_bytes

    cache, _ = prefill(model, torch.arange(40) % CFG.vocab, 16)
    assert len(cache.to_bytes()) - KV_HEADER_BYTES == kv_cache_bytes(CFG, 40)


def test_a_request_waits_while_its_kv_cache_would_exceed_the_budget(tmp_path):
    """Admission control (``KVBudget``): a budget with room for one 32-token prompt's cache beside
    what the GPU holds admits the first queued request and not the second until the first's cache
    has been handed off; the peak is what was held at most."""
    from dataclasses import replace

    from testbed.bubbletea.decisions import KVBudget
    from testbed.bubbletea.passes import Job
    from testbed.bubbletea.prefill import PrefillServer
    from testbed.plan.memory import kv_cache_bytes
    from testbed.spec.bubbletea import BubbleTeaSpec
    from testbed.trace.events import EventWriter

    one = kv_cache_bytes(CFG, 32)
    budget = KVBudget(device_bytes=1000, budget_bytes=1000 + one + one // 2)
    spec = replace(BubbleTeaSpec(), model=CFG, max_prompt_tokens=32, max_output_tokens=8, max_chunk_tokens=64)
    server = PrefillServer(
        spec, 1e-12, SEED, 0, EventWriter(tmp_path / "ev.jsonl"), str(tmp_path / "in.sock"),
        str(tmp_path / "d.sock"), None, False, None, budget,
    )  # fmt: skip
    try:
        first, second = (Job(rid, 0, torch.arange(32) % CFG.vocab, 8) for rid in (1, 2))
        server.jobs.extend([first, second])
        work = server._next_pass(predicted_s=1.0, elapsed_s=0.0)
        assert work.jobs == [first] and work.tokens == [32]  # the second's cache would not fit beside it
        server._run_pass(work, Arrived())
        assert first.pos == 32 and budget.held_bytes == one and budget.peak_bytes == 1000 + one
        assert not budget.admits(one)
        server.jobs.remove(first)
        assert server._next_pass(1.0, 0.0) is None  # the second waits: its cache would not fit
        budget.release(first.kv_bytes)  # the first's cache handed to the decode host
        assert server._next_pass(1.0, 0.0).jobs == [second]
    finally:
        server.close()


def test_admission_takes_queued_requests_in_order_each_counting_against_the_next():
    """``KVBudget.admitted``: in queue order, each request whose cache fits beside those held and
    those admitted ahead of it; one that does not fit is passed over and a later, smaller one may
    still start; a request admitted before (need 0) always fits; at most ``limit``."""
    from testbed.bubbletea.decisions import KVBudget

    budget = KVBudget(device_bytes=100, budget_bytes=200)
    budget.hold(30)
    assert budget.admitted([50, 40, 10, 0, 5], limit=10) == [0, 2, 3, 4]  # 100 + 30 + 50 + 10 + 5 = 195 <= 200
    assert budget.admitted([50, 40, 10, 0, 5], limit=2) == [0, 2]
    assert budget.admitted([80, 0], limit=10) == [1]
    assert KVBudget(device_bytes=100).admitted([10**12, 1], limit=10) == [0, 1]  # no budget


def _padded_server(tmp_path, chunk_s: float, prior: dict[str, float] | None = None):
    """A prefill server on an emulated GPU that takes ``chunk_s`` to prefill a fresh 20-token
    chunk, passes of up to 48 tokens, no guard."""
    from dataclasses import replace

    from testbed.bubbletea.prefill import PrefillServer
    from testbed.spec.bubbletea import BubbleTeaSpec
    from testbed.trace.events import EventWriter

    spec = replace(BubbleTeaSpec(), model=CFG, max_chunk_tokens=48, guard_ms=0.0)
    return PrefillServer(
        spec, chunk_s / prefill_flops(CFG, 0, 20), SEED, 0, EventWriter(tmp_path / "ev.jsonl"),
        str(tmp_path / "in.sock"), str(tmp_path / "d.sock"), None, True, prior,
    )  # fmt: skip


def test_a_bubble_is_filled_only_with_something_queued_and_a_prediction(tmp_path):
    """``bubble_to_fill``: the slot's predicted bubble where a request is queued, else None (the
    worker then waits for its input itself); the prediction is kept for the wait's event either
    way, and ``fill`` of such a bubble runs nothing."""
    from testbed.bubbletea.passes import Job
    from testbed.trace import schema as T
    from testbed.trace.clock import now_ns

    server = _padded_server(tmp_path, chunk_s=0.05, prior={"recv": 0.2})
    try:
        assert server.bubble_to_fill("recv") is None  # nothing queued
        assert server.observe("recv", 0.25) == {T.BUBBLE_NS: 250_000_000, T.PREDICTED_BUBBLE_NS: 200_000_000}
        assert server.fill("recv", now_ns(), Arrived()) is None and not server.stopped
        server.jobs.append(Job(1, 0, prompt_tokens_for(1, 20, 0), 4))
        assert server.bubble_to_fill("other") is None  # no prediction for that slot yet
        assert server.bubble_to_fill("recv") == pytest.approx(0.25)  # refined by the bubble observed
    finally:
        server.close()


def test_a_pass_waits_on_its_bubble_end_for_the_rest_of_its_time_rather_than_polling(tmp_path):
    """While a pass has the emulated GPU, the worker's thread blocks on the bubble's end (woken by
    the thread that sees training's input: ``bubble_end.py``) for the rest of the pass's time, not
    in polls of ``POLL_S``."""
    from testbed.bubbletea.bubble_end import POLL_S
    from testbed.bubbletea.passes import Job

    class NeverEnds:
        def __init__(self) -> None:
            self.timeouts: list[float] = []

        def is_set(self) -> bool:
            return False

        def wait(self, timeout=None) -> bool:
            self.timeouts.append(timeout)
            threading.Event().wait(timeout)
            return False

    server = _padded_server(tmp_path, chunk_s=0.05)
    try:
        server.jobs.append(Job(1, 0, prompt_tokens_for(1, 20, 0), 4))
        work = server._next_pass(1.0, 0.0)
        end = NeverEnds()
        assert server._run_pass(work, end) is None and work.left_s == 0
        assert end.timeouts[0] == pytest.approx(0.05, abs=0.01) and end.timeouts[0] > 100 * POLL_S
    finally:
        server.close()


def test_a_pass_batches_several_requests_and_a_stopped_pass_resumes_first(tmp_path):
    """With room, one forward pass holds chunks of several queued requests (within
    ``max_chunk_tokens``); when training's data arrives the pass stops at once, with part of its
    GPU time given; the prefill stream computes its blocks meanwhile, but it is not done until a
    later bubble has given it the rest; it is resumed before any new pass, and its requests then
    end with the caches a straight prefill gives."""
    from testbed.bubbletea.passes import Job
    from testbed.trace.clock import now_ns

    server = _padded_server(tmp_path, chunk_s=0.05)
    try:
        tokens = [prompt_tokens_for(rid, n, 0) for rid, n in ((1, 20), (2, 20), (3, 20))]
        jobs = [Job(rid, 0, t, 4) for rid, t in zip((1, 2, 3), tokens)]
        server.jobs.extend(jobs)
        work = server._next_pass(1.0, 0.0)
        assert work.jobs == jobs[:2] and work.tokens == [20, 20]  # 40 of the pass's 48 tokens
        assert work.target_s == pytest.approx(0.1)
        arrival = now_ns() + 30_000_000
        ready = server._run_pass(work, Deadline(arrival))  # training's data, 30 ms in
        assert ready == arrival and server.stopped == [work]  # its GPU time ends at the arrival
        assert 0.02 <= work.paid_s <= 0.03 and jobs[0].pos == 0
        # its blocks are computed while it is stopped; it still owes the GPU the rest of its time
        assert _computed_within(server.stream, work.slot) and work.left_s > 0
        # a bubble too short for the stopped pass's rest: a new pass, without the stopped one's jobs
        other = server._next_pass(work.left_s * 0.9, 0.0)  # a lone 20-token chunk takes 0.05 s
        assert other is not None and other.jobs == [jobs[2]] and server.stopped == [work]
        server.stream.drop(other.slot)  # never run: the stream forgets it
        assert server._next_pass(1.0, 0.0) is work  # resumed before a new pass
        t0, left = now_ns(), work.left_s
        assert server._run_pass(work, Arrived()) is None
        assert (now_ns() - t0) / 1e9 >= left and work.left_s == 0  # the rest of its GPU time
        for job, t in zip(jobs[:2], tokens[:2]):  # the stream's process holds the caches
            want, logits = prefill_chunk(server.model, t, None)
            cache, got = server.stream.result(job.rid)
            assert job.pos == 20 and torch.allclose(got, logits, atol=ATOL)
            assert all(
                torch.allclose(a, b, atol=ATOL) for a, b in zip(cache.keys + cache.values, want.keys + want.values)
            )
        server.jobs.remove(jobs[0])
        server.jobs.remove(jobs[1])
        assert server._next_pass(1.0, 0.0).jobs == [jobs[2]]
    finally:
        server.close()


def test_an_arrival_marked_wakes_a_waiting_thread_only_when_told():
    """``Arrived.end`` marks the bubble ended (``is_set``, ``t_ns``) without waking a thread in
    ``wait``: the worker wakes it once its operation has started (``wake``)."""
    came, seen = Arrived(), []
    waiter = threading.Thread(target=lambda: seen.append(came.wait(30.0)))
    waiter.start()
    came.end(123)
    assert came.is_set() and came.t_ns == 123
    waiter.join(0.2)
    assert waiter.is_alive() and not seen  # marked, not woken: still waiting
    came.wake()
    waiter.join(5.0)
    assert seen == [True]
    assert came.wait(0.0) is True  # once woken, a wait returns at once


@pytest.mark.parametrize("woken_after_s", [0.0, 0.08])
def test_a_bubble_filled_from_its_own_thread_ends_when_the_worker_says_the_input_came(tmp_path, woken_after_s):
    """``start_fill``: a thread fills the bubble while the worker's thread waits for its input
    itself; ``Fill.end`` stops the pass there, its GPU time and its slice ending at the input's
    time, even when the thread is woken (``settle``) only after the pass's time was up (0.08 s
    against a 0.05 s pass); ``settle`` says a pass had the GPU then; the next bubble waits for
    the thread first."""
    import json

    from testbed.bubbletea.passes import Job
    from testbed.trace import schema as T
    from testbed.trace.clock import now_ns

    server = _padded_server(tmp_path, chunk_s=0.05, prior={"recv": 1.0})
    try:
        server.jobs.append(Job(1, 0, prompt_tokens_for(1, 20, 0), 4))
        predicted = server.bubble_to_fill("recv")
        t0 = now_ns()
        fill = server.start_fill(predicted, t0)
        time.sleep(0.02)
        arrived = now_ns()
        fill.end(arrived)
        time.sleep(woken_after_s)
        assert fill.settle() is True
        [work] = server.stopped
        assert work.slices == 1 and 0 < work.paid_s <= (arrived - t0) / 1e9
        assert server.bubble_to_fill("recv") is not None  # the next bubble, once the thread is done
        server.ev.write_deferred()
        [row] = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
        assert row[T.KIND] == T.PREFILL and row[T.END_NS] == arrived
    finally:
        server.close()


def test_one_filling_thread_fills_a_workers_bubbles_one_after_another():
    """``Filler``: every bubble handed to it is filled by the same thread, named for the kernel,
    in turn; ``settle`` returns each one's outcome; ``close`` ends the thread. It sets the
    process's switch interval, so that the worker's thread takes the interpreter lock back soon."""
    import sys
    import threading
    from pathlib import Path

    from testbed.bubbletea.fill import SWITCH_INTERVAL_S, Filler

    before = sys.getswitchinterval()
    filler = Filler("tb-w7-fill")
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S) and SWITCH_INTERVAL_S < 0.005  # Python's own
    seen: list[tuple[int, int]] = []
    for k in range(3):
        fill = filler.start(lambda arrived, k=k: seen.append((k, threading.get_native_id())) or (k if k else None))
        assert fill.settle() is (k > 0)
    assert [k for k, _ in seen] == [0, 1, 2] and len({tid for _, tid in seen}) == 1
    tid = seen[0][1]
    assert Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "tb-w7-fill"
    filler.close()
    assert not filler._thread.is_alive() and sys.getswitchinterval() == before  # set back
    with pytest.raises(RuntimeError, match="closed"):
        filler.start(lambda arrived: None)
    filler.close()  # twice: nothing more


def test_a_filling_thread_that_cannot_set_itself_up_raises_that_from_every_fill(monkeypatch):
    """A failure while the filling thread sets itself up (here its nice value) neither hangs the
    worker nor loses the thread: the constructor returns, and every fill raises the failure."""
    from testbed.bubbletea import fill as F

    def fail(*args, **kwargs):
        raise RuntimeError("no attributes")

    monkeypatch.setattr(F, "slice_or_report", fail)
    filler = F.Filler("tb-w6-fill")
    assert filler.nice is None
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no attributes"):
            filler.start(lambda arrived: None).settle()
    filler.close()
    assert not filler._thread.is_alive()


def test_a_bubble_fill_raises_its_error_in_the_worker(tmp_path):
    """What the filling thread raises is raised again in the worker's thread, by ``settle``."""
    import threading

    from testbed.bubbletea.passes import Job

    called = threading.Event()

    def boom(*_):
        called.set()
        raise RuntimeError("a fault of the filling thread's")

    server = _padded_server(tmp_path, chunk_s=0.05, prior={"recv": 1.0})
    try:
        server.jobs.append(Job(1, 0, prompt_tokens_for(1, 20, 0), 4))
        server._next_pass = boom
        fill = server.start_fill(1.0, 0)
        assert called.wait(5)  # the data comes after the thread chose its pass (before, it chooses none)
        fill.end(1)
        with pytest.raises(RuntimeError, match="filling thread"):
            server.settle()
    finally:
        server.close()


def test_a_pass_given_the_gpu_after_the_data_came_had_none_of_it(tmp_path):
    """Training's data that came before a pass was given the GPU (its time stamped before the pass
    began) leaves the pass without GPU time: no slice, a new pass forgotten, its request queued."""
    from testbed.bubbletea.passes import Job
    from testbed.trace.clock import now_ns

    server = _padded_server(tmp_path, chunk_s=0.05)
    try:
        job = Job(1, 0, prompt_tokens_for(1, 20, 0), 4)
        server.jobs.append(job)
        work = server._next_pass(1.0, 0.0)
        came = Arrived()
        came.end(now_ns())  # before the pass begins
        came.wake()
        assert server._run_pass(work, came) is None
        assert not server.stopped and work.slices == 0 and job.first_start_ns is None
        server.ev.close()
        assert (tmp_path / "ev.jsonl").read_text() == ""
        assert server._next_pass(1.0, 0.0).jobs == [job]  # still queued, from its start
    finally:
        server.close()


def test_data_arriving_while_a_pass_is_chosen_runs_no_block_and_keeps_the_stopped_pass(tmp_path):
    """``fill`` looks again after choosing a pass: training's data that arrived meanwhile goes
    first (the pass gets no GPU time, no slice is written), and a stopped pass it had taken stays
    stopped."""
    from testbed.bubbletea.passes import Job
    from testbed.trace.clock import now_ns

    server = _padded_server(tmp_path, chunk_s=0.05, prior={"recv": 1.0})
    try:
        server.jobs.append(Job(1, 0, prompt_tokens_for(1, 20, 0), 4))
        work = server._next_pass(1.0, 0.0)
        server._run_pass(work, Deadline(now_ns() + 5_000_000))  # stopped 5 ms in
        assert server.stopped == [work] and work.slices == 1 and work.left_s > 0
        paid = work.paid_s
        checks = iter([False, True])  # not yet when fill starts; arrived once the pass is chosen
        assert server.fill("recv", now_ns(), _Looks(checks)) is None
        assert next(checks, "both looked at") == "both looked at"
        assert server.stopped == [work] and work.slices == 1 and work.paid_s == paid
        server.ev.close()
        slices = (tmp_path / "ev.jsonl").read_text().splitlines()
        assert len(slices) == 1  # the first slice only
    finally:
        server.close()


def test_prompts_are_real_text_of_the_corpus_the_same_on_every_host():
    from testbed.bubbletea.inference import prompt_tokens_from

    text = torch.frombuffer(bytearray(b"def f(x):\n    return x + 1\n" * 3), dtype=torch.uint8)
    a = prompt_tokens_from(text, 7, 20, 0)
    assert a.dtype == torch.int64 and a.shape == (20,)
    assert torch.equal(a, prompt_tokens_from(text, 7, 20, 0))  # every host draws the same
    joined = bytes(text.tolist()) * 2
    assert bytes(a.tolist()) in joined  # consecutive bytes of the text
    longer = prompt_tokens_from(text, 7, 200, 0)  # longer than the text: it repeats
    assert torch.equal(longer[:20], a) and bytes(longer[: len(text)].tolist()) in joined
    assert not torch.equal(a, prompt_tokens_from(text, 8, 20, 0))
    with pytest.raises(InferenceError, match="empty"):
        prompt_tokens_from(torch.empty(0, dtype=torch.uint8), 1, 5, 0)


def test_serving_alone_fills_back_to_back_windows_and_resumes_a_pass_cut_by_a_window_end(tmp_path):
    """Prefill served alone (``+prefill-alone``): the queue is prefilled through consecutive
    windows, each traced as a serving window; a pass running at a window's end stops there and
    is resumed in the next window, and every prompt ends prefilled in full."""
    import json

    from testbed.bubbletea.alone import serve_alone
    from testbed.bubbletea.passes import Job
    from testbed.trace import schema as T

    window_s = 0.2  # passes of 48 tokens take about 0.12 s: one spans the first window's end
    server = _padded_server(tmp_path, chunk_s=0.05, prior={T.ALONE_SLOT: window_s})
    try:
        server.jobs.extend(Job(rid, 0, prompt_tokens_for(rid, 60, 0), 4) for rid in (1, 2, 3))
        serve_alone(server, 4, window_s, server.ev)
        assert not server.jobs and not server.stopped  # every prompt prefilled in full
        server.ev.close()
        rows = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
        windows = [r for r in rows if r[T.KIND] == T.SERVING_WINDOW]
        assert [w[T.ITERATION] for w in windows] == [0, 1, 2, 3]
        assert windows[0][T.QUEUE_EMPTY_NS] == 0  # a queue from the start
        assert windows[-1][T.QUEUE_EMPTY_NS] > 0.5 * window_s * 1e9  # 180 tokens take about 0.5 s
        for a, b in zip(windows, windows[1:]):
            assert b[T.START_NS] == a[T.START_NS] + int(window_s * 1e9) and a[T.END_NS] >= b[T.START_NS]
        slices = [r for r in rows if r[T.KIND] == T.PREFILL]
        assert sum(s[T.TOKENS] for s in slices) == 180
        cut = [
            (a, b)
            for a, b in zip(slices, slices[1:])
            if a[T.CHUNKS] == b[T.CHUNKS] and a[T.ITERATION] + 1 == b[T.ITERATION]
        ]
        assert cut, f"no pass was stopped at a window's end and resumed in the next: {slices}"
        for a, _ in cut:
            end = next(w[T.START_NS] for w in windows if w[T.ITERATION] == a[T.ITERATION] + 1)
            assert end <= a[T.END_NS] <= end + 20_000_000  # stopped at the window's end
    finally:
        server.close()


def test_a_serving_window_must_last(tmp_path):
    from testbed.bubbletea.alone import serve_alone

    server = _padded_server(tmp_path, chunk_s=0.05)
    try:
        with pytest.raises(ValueError, match="more than 0 s"):
            serve_alone(server, 1, 0.0, server.ev)
    finally:
        server.close()


def test_the_prefill_stream_is_a_process_in_the_lowest_scheduling_class(model):
    """The stream is a process of its own (no interpreter lock shared with the worker's thread),
    SCHED_IDLE (any other thread that wakes takes its CPU at once, as a high-priority CUDA
    stream's kernel takes a low-priority one's SMs); the worker keeps its own class."""
    import os

    from testbed.bubbletea.prefill_stream import PrefillStream

    before = os.sched_getscheduler(0)
    stream = PrefillStream(model, None)
    try:
        assert stream.pid != os.getpid()
        deadline = time.monotonic() + 5
        while os.sched_getscheduler(stream.pid) != os.SCHED_IDLE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.sched_getscheduler(stream.pid) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) == before != os.SCHED_IDLE
    finally:
        stream.close()
    assert not os.path.exists(f"/proc/{stream.pid}")  # ended, and reaped


def test_the_prefill_stream_computes_a_pass_and_hands_its_errors_to_the_worker(model):
    """A pass added to the stream is computed block by block in its process (its counters in shared
    memory); a pass the model refuses (a chunk past the context) is raised again, with the model's
    message, in the worker's thread by ``check``."""
    from testbed.bubbletea.prefill_stream import PrefillStream
    from testbed.bubbletea.stream_process import Part

    stream = PrefillStream(model, None)
    try:
        prompt = prompt_tokens_for(1, 20, 0)
        slot = stream.add([Part(1, 0, prompt.numpy().tobytes())])
        stream.run(slot)
        _computed_within(stream, slot)
        assert stream.layers_done(slot) == CFG.n_layers and stream.real_ns(slot) > 0
        stream.check()  # nothing raised
        stream.done(slot)  # its GPU time had: its results are the request's
        cache, logits = stream.result(1)
        want, want_logits = prefill_chunk(model, prompt, None)
        assert cache.length == 20 and torch.allclose(logits, want_logits, atol=ATOL)
        too_long = prompt_tokens_for(2, CFG.seq_len + 1, 0)
        bad = stream.add([Part(2, 0, too_long.numpy().tobytes())])
        assert _computed_within(stream, bad)  # a wait on it ends at once
        with pytest.raises(InferenceError, match="seq_len|context|positions"):
            stream.check()
    finally:
        stream.close()


def test_a_reused_slot_shows_none_of_its_earlier_pass(model):
    """A slot given to a new pass reads as not begun until the stream's process has taken that
    pass up, whatever the earlier pass there (dropped mid-block) wrote last; then it shows the new
    pass's own blocks, and the new pass's chunk meets an empty cache."""
    import os
    import signal
    from collections import deque

    from testbed.bubbletea.prefill_stream import PrefillStream
    from testbed.bubbletea.stream_process import Part, slot_at

    stream = PrefillStream(model, None)
    try:
        stream._free = deque([0])  # one slot: every pass reuses it
        first = stream.add([Part(1, 0, prompt_tokens_for(1, 30, 0).numpy().tobytes())])
        stream.drop(first)
        os.kill(stream.pid, signal.SIGSTOP)  # the process takes nothing up meanwhile
        try:
            second = stream.add([Part(2, 0, prompt_tokens_for(2, 20, 0).numpy().tobytes())])
            assert second == first == 0
            i = slot_at(0)  # the first pass's last block, written after the worker gave the slot again
            stream._shared[i], stream._shared[i + 1], stream._shared[i + 2] = stream._owner[0] - 1, CFG.n_layers, 10**6
            assert stream.layers_done(0) == 0 and stream.real_ns(0) == 0 and not stream.computed(0)
        finally:
            os.kill(stream.pid, signal.SIGCONT)
        stream.run(0)
        _computed_within(stream, 0)
        stream.done(0)
        cache, _ = stream.result(2)
        assert cache.length == 20
        stream.check()
    finally:
        stream.close()


def test_the_prefill_stream_ends_with_its_worker_even_one_killed(tmp_path):
    """A worker killed with -9 leaves no prefill stream behind (the kernel's parent-death signal)."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(
        "import sys, time\n"
        "from testbed.bubbletea.inference import InferenceModel\n"
        "from testbed.bubbletea.prefill_stream import PrefillStream\n"
        "from testbed.spec.model import ModelConfig\n"
        "stream = PrefillStream(InferenceModel(ModelConfig(n_layers=2, d_model=32, n_heads=2), 0), None)\n"
        "print(stream.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    worker = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(worker.stdout.readline())
        assert os.path.exists(f"/proc/{pid}")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid)
    finally:
        worker.kill()
        worker.wait()


def _computed_within(stream, slot: int, timeout_s: float = 10.0) -> bool:
    """Whether the pass in ``slot`` of ``stream`` is computed within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not stream.computed(slot) and time.monotonic() < deadline:
        time.sleep(0.005)
    return stream.computed(slot)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not reaped by init yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_deadline_ends_its_bubble_at_its_time_and_never_sleeps_past_it():
    from testbed.trace.clock import now_ns

    end = Deadline(now_ns() + 20_000_000)
    assert not end.is_set() and end.wait(0.001) is False  # a short wait, still before it
    assert end.wait(10.0) is True  # woken at the deadline, not after 10 s
    assert now_ns() - end.t_ns < 1e9 and end.is_set() and end.wait(5.0) is True
