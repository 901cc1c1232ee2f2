"""BubbleTea's decisions as pure functions: time model, chunk sizing, bubble prediction, dispatch."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from testbed.bubbletea.decisions import (
    MIN_CHUNK_TOKENS,
    SlotPredictor,
    SoonestWorker,
    WorkerLoad,
    choose_worker,
    chunk_that_fits,
    decode_step_seconds,
    may_start,
    prefill_seconds,
    seconds_per_flop,
)
from testbed.bubbletea.requests import AZURE_CONV_2023, QUANTILE_PROBS
from testbed.errors import SpecError
from testbed.spec.bubbletea import LONGEST_PROMPT_TOKENS, QUEUED_PROMPT_TOKENS, BubbleTeaSpec
from testbed.spec.experiment_file import load_experiment, parse_experiment
from testbed.spec.model import ModelConfig
from testbed.spec.policy import parse_policy

CFG = ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=2048)


def test_emulated_gpu_speed_comes_from_the_training_targets():
    exp = load_experiment()  # 6 blocks over 3 stages: 2 blocks, 2 x 64 tokens, d 128, 40 ms forward
    d, t = 128, 128
    flops = 2 * (2 * (12 * d * d + 13 * d) * t + 2 * 64 * d * t)
    assert seconds_per_flop(exp) == pytest.approx(0.040 / flops)
    # prefill time of a training-sized workload on the training model equals the forward target
    assert exp.model.block_forward_flops(t) * 2 * seconds_per_flop(exp) == pytest.approx(0.040)


def test_a_decode_step_is_timed_by_the_roofline_and_batching_shares_the_weights():
    from testbed.bubbletea.kv_cache import InferenceError
    from testbed.plan.memory import decode_step_bytes
    from testbed.spec.devices import DEVICES, EMULATED_MACHINE_BALANCE
    from testbed.spec.model import decode_flops

    # the A100's balance, 312 TFLOP/s x 0.49 over 2,039 GB/s, kept by the emulated GPU
    assert DEVICES["a100"].machine_balance == pytest.approx(312e12 * 0.49 / 2.039e12)
    assert EMULATED_MACHINE_BALANCE == pytest.approx(DEVICES["a100"].machine_balance)
    assert DEVICES["emulated"].flops < 1e-3 * DEVICES["a100"].flops
    # by hand: CFG's blocks (2 x (12 x 64^2 + 13 x 64)) and head (64 x 256 + 256 + 2 x 64) in fp32,
    # and a cache of 2 layers x 2 (key, value) x 64 fp32 values a position
    weights = 4 * (2 * (12 * 64 * 64 + 13 * 64) + (64 * 256 + 256 + 2 * 64))
    kv = 4 * 2 * 2 * 64
    assert decode_step_bytes(CFG, [100, 7]) == weights + kv * 101 + kv * 8
    spf = 1e-9

    def by_hand(lengths):
        moved = weights + sum(kv * (n + 1) for n in lengths)
        return max(sum(decode_flops(CFG, n) for n in lengths), moved * EMULATED_MACHINE_BALANCE) * spf

    one = decode_step_seconds(CFG, [100], spf)
    assert one == pytest.approx(by_hand([100]))
    assert one > 10 * decode_flops(CFG, 100) * spf  # memory-bound: the bytes, not the FLOPs, set it
    assert decode_step_seconds(CFG, [100] * 8, spf) == pytest.approx(by_hand([100] * 8))
    # short caches: the weights are read once for the batch, so per request it is far cheaper
    one, eight = decode_step_seconds(CFG, [10], spf), decode_step_seconds(CFG, [10] * 8, spf)
    assert one < eight < 1.5 * one
    # long caches: the KV bytes grow with each request, and so the step
    assert decode_step_seconds(CFG, [2000] * 8, spf) > 4 * decode_step_seconds(CFG, [2000], spf)
    with pytest.raises(InferenceError, match="at least one"):
        decode_step_seconds(CFG, [], spf)


@pytest.mark.parametrize("start", [0, 37, 1900])
def test_the_chunk_that_fits_is_the_largest_to_the_token(start):
    spf = 1e-9  # 1 ns per FLOP
    whole = prefill_seconds(CFG, 0, 128, spf)
    assert chunk_that_fits(CFG, 0, 1000, 128, whole, spf) == 128
    assert chunk_that_fits(CFG, 0, 40, 128, whole, spf) == 40  # the rest of a short prompt
    for room in (whole * 0.9, whole * 0.5, whole * 0.23, prefill_seconds(CFG, start, 77, spf)):
        n = chunk_that_fits(CFG, start, 1000, 128, room, spf)
        # by hand: every chunk size from the minimum up, the last that fits
        want = max((m for m in range(MIN_CHUNK_TOKENS, 129) if prefill_seconds(CFG, start, m, spf) <= room), default=0)
        assert n == want and (n == 0 or prefill_seconds(CFG, start, n + 1, spf) > room)
    assert chunk_that_fits(CFG, start, 1000, 128, prefill_seconds(CFG, start, 77, spf), spf) == 77
    tiny = prefill_seconds(CFG, start, MIN_CHUNK_TOKENS, spf)
    assert chunk_that_fits(CFG, start, 1000, 128, tiny * 0.99, spf) == 0  # not even the smallest chunk
    assert chunk_that_fits(CFG, start, 5, 128, tiny, spf) == 5  # a leftover shorter than the minimum
    assert chunk_that_fits(CFG, start, 0, 128, whole, spf) == 0  # nothing left
    # attention makes later chunks dearer: what fits at position 0 may not at 1900
    assert chunk_that_fits(CFG, 1900, 128, 128, whole, spf) < 128


def test_the_chunk_that_fits_is_every_chunk_tried_on_models_of_every_size():
    """The quadratic's estimate and the steps from it give what trying every chunk gives, on
    models from the emulator's to GPT-3's and rooms a hair either side of a chunk's time."""
    rng = random.Random(5)
    for _ in range(300):
        d = rng.choice([64, 4096, 12288])
        cfg = ModelConfig(
            n_layers=rng.choice([2, 32, 96]), d_model=d, n_heads=4, seq_len=8192, vocab=rng.choice([256, 50257])
        )
        start, most, spf = rng.randrange(0, 4000), rng.randrange(1, 600), 10 ** rng.uniform(-15, -9)
        room = prefill_seconds(cfg, start, rng.randrange(1, 700), spf) * rng.uniform(0.99, 1.01)
        fits = [m for m in range(MIN_CHUNK_TOKENS, most + 1) if prefill_seconds(cfg, start, m, spf) <= room]
        assert chunk_that_fits(cfg, start, 1000, most, room, spf) == max(fits, default=0)
    assert chunk_that_fits(CFG, 0, 200, 96, math.inf, 1e-9) == 96  # an unbounded room: the pass's tokens


def test_slot_predictor_is_the_minimum_of_the_last_window():
    p = SlotPredictor(3)
    for b in (0.050, 0.040):
        p.observe("F1", b)
    assert p.predict("F1") is None  # not enough history yet
    p.observe("F1", 0.060)
    assert p.predict("F1") == pytest.approx(0.040)
    p.observe("F1", 0.070)  # the 0.050 leaves the window
    p.observe("F1", 0.080)
    assert p.predict("F1") == pytest.approx(0.060)
    p.observe("B0", -0.001)  # a negative gap (clock jitter) counts as none
    assert p.seen["B0"][0] == 0.0
    assert p.per_iteration_s() == pytest.approx(0.060) and p.largest_s() == pytest.approx(0.060)


def test_a_chunk_starts_only_inside_a_predicted_bubble_with_its_guard():
    assert may_start(0.050, 0.010, 0.030, 0.005)
    assert not may_start(0.050, 0.010, 0.036, 0.005)
    assert not may_start(None, 0.0, 0.001, 0.0)


def test_requests_go_to_the_worker_that_drains_soonest():
    loads = {
        0: WorkerLoad(0.2, 0.1, 1.0, 0.4),  # 2 s of backlog at 0.2 s of bubble per second
        1: WorkerLoad(0.5, 0.2, 1.0, 0.5),  # 1 s
        2: WorkerLoad(0.9, 0.004, 1.0, 0.0),
    }  # idle, but its bubbles are too small for a chunk
    assert choose_worker(loads, smallest_chunk_s=0.005, guard_s=0.003) == 1
    loads[1].backlog_s = 1.0
    assert choose_worker(loads, 0.005, 0.003) == 0  # tie at 2 s: lowest rank
    assert choose_worker({0: WorkerLoad()}, 0.005, 0.003) is None  # no profile yet


def test_the_soonest_worker_kept_as_backlogs_change_is_choose_workers_choice():
    """The simulator's dispatcher (``SoonestWorker``) against ``choose_worker`` on the same loads
    after each of 2,000 changes: a request assigned or prefill done, ties made on purpose (equal
    backlogs at equal rates), some workers never eligible."""
    rng = random.Random(7)
    loads = {
        r: WorkerLoad(rng.choice([0.2, 0.4]), rng.choice([0.002, 0.05, 0.1]), 1.0, rng.choice([0.0, 0.5]))
        for r in range(40)
    }
    soonest = SoonestWorker(loads, smallest_chunk_s=0.005, guard_s=0.003)
    picked = set()
    for _ in range(2000):
        chosen = soonest.choose()
        assert chosen == choose_worker(loads, 0.005, 0.003)
        picked.add(chosen)
        r = chosen if rng.random() < 0.6 else rng.randrange(40)
        if r is None:
            continue
        loads[r].backlog_s = max(0.0, loads[r].backlog_s + rng.choice([0.25, 0.5, -0.25, -1.0]))
        soonest.changed(r)
    assert len(picked) > 10
    assert SoonestWorker({0: WorkerLoad()}, 0.005, 0.003).choose() is None  # no profile yet


def test_bubbletea_policies_and_section_are_validated():
    assert (parse_policy("atlas+bubbletea").base, parse_policy("atlas+bubbletea").bubbletea) == ("atlas", True)
    assert (parse_policy("dp-wan").base, parse_policy("dp-wan").bubbletea) == ("dp-wan", False)
    base = {"topology": "three_dc", "policy": "pp-fair+bubbletea"}
    exp = parse_experiment({**base, "bubbletea": {"request_rate": 2, "decode": False}}, "x.yaml")
    assert exp.policy.bubbletea and exp.policy.base == "pp-fair"
    assert exp.bubbletea.request_rate == 2.0 and exp.bubbletea.decode is False
    # by default BubbleTea serves a model of the training model's shape, with a context that
    # holds the longest prompt (never clipped) and its output
    t = exp.model
    assert exp.bubbletea.max_prompt_tokens is None
    assert exp.bubbletea.model == ModelConfig(t.n_layers, t.d_model, t.n_heads, LONGEST_PROMPT_TOKENS + 256)
    assert AZURE_CONV_2023.prompt_tokens_q[-1] == LONGEST_PROMPT_TOKENS  # the stream's longest fits
    p90 = AZURE_CONV_2023.prompt_tokens_q[QUANTILE_PROBS.index(0.90)]
    assert QUEUED_PROMPT_TOKENS == math.ceil(p90)  # the memory estimate's queued prompts
    written = parse_experiment({**base, "bubbletea": {"max_prompt_tokens": None}}, "x.yaml")
    assert written.bubbletea == replace(exp.bubbletea, request_rate=BubbleTeaSpec().request_rate, decode=True)
    # a model given whose context the longest prompt passes: refused with the figures of both fixes
    with pytest.raises(
        SpecError, match=r"seq_len: 4096 cannot hold an unclipped.*14306 or more.*max_prompt_tokens <= 3840"
    ):
        parse_experiment({**base, "bubbletea": {"model": {"seq_len": 4096}}}, "x.yaml")
    with pytest.raises(SpecError, match=r"lower max_output_tokens below 100"):  # no clip can help
        parse_experiment({**base, "bubbletea": {"model": {"seq_len": 100}}}, "x.yaml")
    # a BubbleTea section replaced through the API: the served default's context follows it
    shorter = exp.with_overrides(bubbletea=replace(exp.bubbletea, max_prompt_tokens=512, max_output_tokens=64))
    assert shorter.bubbletea.model.seq_len == 576
    given = exp.with_overrides(bubbletea=replace(exp.bubbletea, model=replace(exp.bubbletea.model, seq_len=20000)))
    assert given.bubbletea.model.seq_len == 20000  # a model the caller set is kept
    with pytest.raises(SpecError, match="policy"):
        parse_experiment({**base, "policy": "atlas+tea"}, "x.yaml")
    with pytest.raises(SpecError, match="exceeds the inference model's context"):  # a model given
        section = {"max_prompt_tokens": 2000, "max_output_tokens": 100, "model": {"seq_len": 2048}}
        parse_experiment({**base, "bubbletea": section}, "x.yaml")
    longer = parse_experiment({**base, "bubbletea": {"max_prompt_tokens": 2000, "max_output_tokens": 100}}, "x.yaml")
    assert longer.bubbletea.model.seq_len == 2100  # the served default's context grows with them
    with pytest.raises(SpecError, match="bubbletea.request_rate"):
        parse_experiment({**base, "bubbletea": {"request_rate": 0}}, "x.yaml")
    with pytest.raises(SpecError, match="decode"):
        parse_experiment({**base, "bubbletea": {"decode": "yes"}}, "x.yaml")
    with pytest.raises(SpecError, match="guard"):
        parse_experiment({**base, "bubbletea": {"guard": 3}}, "x.yaml")


def test_decode_hosts_are_free_hosts_of_the_training_dcs():
    from testbed.plan.placement import decode_hosts, place
    from testbed.spec.topology_file import load_topology

    exp = load_experiment()
    topo = load_topology("three_dc")  # 3 hosts per DC, 2 train in each
    assert decode_hosts(topo, place(exp, topo)) == {"east": "east-h2", "central": "central-h2", "west": "west-h2"}
    dp = place(exp, topo, parse_policy("dp-wan"))  # east and central: 3 stages each, every host trains
    with pytest.raises(SpecError, match="no host in DC east for a BubbleTea decode host.*decode_hosts: 1"):
        decode_hosts(topo, dp)


def test_declared_decode_hosts_never_train():
    from testbed.plan.placement import decode_hosts, place
    from testbed.spec.topology_file import parse_topology

    topo = parse_topology(
        {
            "dcs": [{"name": "a", "hosts": 3, "decode_hosts": 1}, {"name": "b", "hosts": 2}],
            "links": [{"between": ["a", "b"], "rate": "10mbit", "delay": "5ms"}],
        },
        "t.yaml",
    )
    exp = load_experiment().with_overrides(stages=2, replicas=2, topology="two_dc")
    # a's 2 training hosts take stage 0, b stage 1; a-h2 is reserved for decoding, b has none left
    workers = place(exp, topo, parse_policy("pp-fair"))
    assert {w.host for w in workers} == {"a-h0", "a-h1", "b-h0", "b-h1"}
    with pytest.raises(SpecError, match="decode_hosts: 1"):
        decode_hosts(topo, workers)
    with pytest.raises(SpecError, match="decode_hosts"):
        parse_topology({"dcs": [{"name": "a", "hosts": 2, "decode_hosts": 2}], "links": []}, "t.yaml")


@pytest.mark.parametrize(
    "section, field, problem",
    [
        ({"model": {"n_heads": 0}}, "bubbletea.model.n_heads", "below 1"),
        ({"model": {"d_model": -64}}, "bubbletea.model.d_model", "below 1"),
        ({"requests": "/nonexistent.csv"}, "bubbletea.requests", "is not a file"),
        ({"requests": 42}, "bubbletea.requests", "is not a file"),
        ({"guard_ms": float("nan")}, "bubbletea.guard_ms", "finite"),
        ({"guard_ms": float("inf")}, "bubbletea.guard_ms", "finite"),
        ({"ttft_slo_s": 0}, "bubbletea.ttft_slo_s", "above 0"),
        ({"ttft_slo_s": float("nan")}, "bubbletea.ttft_slo_s", "finite"),
        ({"ttft_slo_scale": 0.5}, "bubbletea.ttft_slo_scale", "1 or more"),
        ({"ttft_slo_scale": float("inf")}, "bubbletea.ttft_slo_scale", "finite"),
        ({"ttft_slo_scale": "3x"}, "bubbletea.ttft_slo_scale", "number"),
        ({"request_rate": float("inf")}, "bubbletea.request_rate", "finite"),
        ({"request_rate": 5000}, "bubbletea.request_rate", "is not in (0, 1000]"),
        ({"max_chunk_tokens": 4}, "bubbletea.max_chunk_tokens", "smallest chunk"),
        ({"profile_iterations": 8}, "bubbletea.profile_iterations", "not below iterations"),
        ({"fill_every_bubble": "yes"}, "bubbletea.fill_every_bubble", "true or false"),
        ({"fill_every_bubble": 1}, "bubbletea.fill_every_bubble", "true or false"),
    ],
)
def test_bad_bubbletea_values_are_refused_at_load_time(section, field, problem):
    data = {"topology": "three_dc", "policy": "atlas+bubbletea", "iterations": 8, "bubbletea": section}
    with pytest.raises(SpecError) as e:
        parse_experiment(data, "x.yaml")
    assert e.value.field == field and problem in str(e.value)


def test_a_partial_bubbletea_model_keeps_the_served_defaults(tmp_path):
    data = {"topology": "three_dc", "model": {"n_layers": 4, "d_model": 64}, "bubbletea": {"model": {"n_heads": 8}}}
    exp = parse_experiment(data, "x.yaml")
    assert exp.bubbletea.model == ModelConfig(n_layers=4, d_model=64, n_heads=8, seq_len=LONGEST_PROMPT_TOKENS + 256)
    # a served model of the training model's shape follows it when the training model changes
    plain = parse_experiment({"topology": "three_dc"}, "x.yaml")
    bigger = plain.with_overrides(model=ModelConfig(n_layers=6, d_model=256, n_heads=8, seq_len=64))
    assert bigger.bubbletea.model == ModelConfig(6, 256, 8, LONGEST_PROMPT_TOKENS + 256)
    assert exp.with_overrides(model=bigger.model).bubbletea.model.n_heads == 8  # one given stays
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    (tmp_path / "exp.yaml").write_text("topology: three_dc\nbubbletea: {requests: trace.csv}\n")
    assert load_experiment(tmp_path / "exp.yaml").bubbletea.requests == str(trace)  # relative to the file


def test_profile_iterations_matter_only_under_bubbletea():
    exp = parse_experiment({"topology": "three_dc", "iterations": 3}, "x.yaml")
    assert exp.bubbletea.profile_iterations == 3 and not exp.policy.bubbletea


def test_a_prior_predicts_before_any_bubble_is_seen_and_the_first_observation_refines_it():
    p = SlotPredictor(3, prior={"F1": 0.05, "B0": 0.02})
    assert p.ready and p.predict("F1") == 0.05 and p.predict("B2") is None
    assert p.per_iteration_s() == pytest.approx(0.07) and p.largest_s() == 0.05
    p.observe("F1", 0.03)  # shorter than predicted: taken at once (an over-predicted bubble delays training)
    assert p.predict("F1") == 0.03
    p.observe("F1", 0.06)
    assert p.predict("F1") == 0.03  # the minimum of what was seen
    # a slot without a prior waits for the full window, as before
    for _ in range(2):
        p.observe("B2", 0.01)
    assert p.predict("B2") is None
    p.observe("B2", 0.01)
    assert p.predict("B2") == 0.01
    assert not SlotPredictor(3).ready


def test_the_prior_comes_from_the_schedule_for_every_worker():
    from testbed.plan.placement import place
    from testbed.plan.run_plan import make_plan
    from testbed.run.bubbletea_setup import bubble_prior
    from testbed.spec.experiment_file import load_experiment

    e = load_experiment().with_overrides(policy="atlas+bubbletea")
    prior, iteration_s = bubble_prior(make_plan(e))
    assert set(prior) == {str(w.rank) for w in place(e)}  # every worker waits somewhere
    assert all(d > 0 for slots in prior.values() for d in slots.values())
    assert 0.5 < iteration_s < 2.0
    # stage 1 waits for its first input: a bubble before F0
    assert prior["2"]["F0"] > 0
    real = e.with_overrides(compute=type(e.compute)(mode="real"))
    assert bubble_prior(make_plan(real)) == ({}, 0.0)


def test_work_choice_resumes_a_stopped_pass_first_then_batches_any_requests_that_fit():
    from testbed.bubbletea.decisions import NewBatch, QueuedPrompt, Resume, choose_work

    spf = 1e-9
    small = prefill_seconds(CFG, 0, 64, spf)  # a fresh request's whole 64-token prompt
    # late in a long prompt even the smallest chunk (attention over 1,900 positions) costs more
    late = prefill_seconds(CFG, 1900, MIN_CHUNK_TOKENS, spf)
    assert late > small
    room = (small + late) / 2 + 0.001  # the guard's 1 ms on top: room for the fresh one only
    queue = [QueuedPrompt(1900, 64), QueuedPrompt(0, 64)]
    assert choose_work([], queue, CFG, room, 0.0, 0.001, 128, spf) == NewBatch(((1, 64),), pytest.approx(small))
    # with room for both, one pass holds the head's chunk and the other's, within 128 tokens
    both = prefill_seconds(CFG, 1900, 64, spf) + small
    assert choose_work([], queue, CFG, both + 0.002, 0.0, 0.001, 128, spf) == NewBatch(
        ((0, 64), (1, 64)), pytest.approx(both)
    )
    # the pass's token budget: 96 tokens leave the second request only 32
    three = [QueuedPrompt(0, 64), QueuedPrompt(0, 64), QueuedPrompt(0, 64)]
    picked = choose_work([], three, CFG, 1.0, 0.0, 0.001, 96, spf)
    assert picked.chunks == ((0, 64), (1, 32))
    # a stopped pass goes first, if its rest fits; one whose rest does not fit is passed over
    rest = 0.004
    assert choose_work([0.5, rest], queue, CFG, rest + 0.0015, 0.0, 0.001, 128, spf) == Resume(1)
    assert choose_work([0.5, rest], queue, CFG, rest + 0.0015, 0.001, 0.001, 128, spf) != Resume(1)  # 1 ms in
    # nothing fits: None; no prediction: None
    assert choose_work([], queue, CFG, 0.0005, 0.0, 0.001, 128, spf) is None
    assert choose_work([0.001], queue, CFG, None, 0.0, 0.001, 128, spf) is None


def test_a_pass_is_what_trying_every_queued_request_in_turn_gives():
    """The pass stops scanning the queue where the room left is below any chunk's time; on random
    queues (leftovers shorter than the smallest chunk among them, late positions) and rooms it
    holds the chunks that ``chunk_that_fits`` on every request in turn gives."""
    from testbed.bubbletea.decisions import NewBatch, QueuedPrompt, choose_work

    rng, spf = random.Random(11), 1e-9
    one_token = prefill_seconds(CFG, 0, 1, spf)
    for _ in range(2000):
        queue = [
            QueuedPrompt(rng.randrange(0, 1900), rng.choice([1, 2, 5, 20, 64, 300])) for _ in range(rng.randrange(1, 9))
        ]
        room = one_token * rng.uniform(0.5, 60)
        most = rng.choice([16, 96, 256])
        budget, total, chunks = most, 0.0, []
        for i, q in enumerate(queue):
            n = chunk_that_fits(CFG, q.pos, q.left, budget, room - total, spf)
            if n:
                chunks.append((i, n))
                total += prefill_seconds(CFG, q.pos, n, spf)
                budget -= n
            if budget < MIN_CHUNK_TOKENS:
                break
        want = NewBatch(tuple(chunks), pytest.approx(total)) if chunks else None
        assert choose_work([], queue, CFG, room, 0.0, 0.0, most, spf) == want


def test_work_choice_fills_every_bubble_when_training_preempts_prefill():
    """``every_bubble``: where nothing fits what is left of the predicted bubble (or the bubble has
    outlasted its prediction) the oldest stopped pass is resumed, else a pass of the full token
    budget starts; where something fits, the choice is the same as without it."""
    from testbed.bubbletea.decisions import NewBatch, QueuedPrompt, Resume, choose_work

    spf = 1e-9
    queue = [QueuedPrompt(0, 200), QueuedPrompt(0, 64)]
    small = prefill_seconds(CFG, 0, MIN_CHUNK_TOKENS, spf)
    for elapsed in (0.0, 0.01):  # a bubble too short for any chunk; one past its predicted end
        assert choose_work([0.5, 0.2], queue, CFG, small / 2, elapsed, 0.0, 128, spf, every_bubble=True) == Resume(0)
        assert choose_work([0.5], queue, CFG, small / 2, elapsed, 0.0, 128, spf) is None
        full = choose_work([], queue, CFG, small / 2, elapsed, 0.0, 96, spf, every_bubble=True)
        assert full == NewBatch(((0, 96),), pytest.approx(prefill_seconds(CFG, 0, 96, spf)))
    assert choose_work([], [], CFG, 1.0, 0.0, 0.0, 96, spf, every_bubble=True) is None  # nothing queued
    assert choose_work([0.5], queue, CFG, None, 0.0, 0.0, 96, spf, every_bubble=True) is None  # no bubble known
    room = prefill_seconds(CFG, 0, 40, spf)
    fits = choose_work([], queue, CFG, room, 0.0, 0.0, 96, spf)
    assert fits == choose_work([], queue, CFG, room, 0.0, 0.0, 96, spf, every_bubble=True) and fits.chunks == ((0, 40),)


def test_a_trace_prompt_longer_than_the_unclipped_context_is_refused_with_the_fix():
    from testbed.bubbletea.request_table import Request
    from testbed.bubbletea.stream import check_prompts_fit

    bt = load_experiment().bubbletea  # prompts unclipped: the context holds the trace's longest
    check_prompts_fit(bt, [Request(0, 0.0, LONGEST_PROMPT_TOKENS, 10)])
    with pytest.raises(SpecError, match=r"ContextTokens.*8th request.*seq_len >= 20256.*max_prompt_tokens <= 14050"):
        check_prompts_fit(bt, [Request(0, 0.0, 5, 10), Request(7, 1.0, 20000, 10)])
    check_prompts_fit(replace(bt, max_prompt_tokens=1000), [Request(7, 1.0, 20000, 10)])  # clipped: fits


@pytest.mark.parametrize(
    "key, value, problem",
    [
        ("max_decode_batch", 2.5, "whole number"),
        ("max_chunk_tokens", True, "whole number"),
        ("max_output_tokens", "8", "whole number"),
        ("ttft_slo_scale", "3x", "not a number"),
        ("ttft_slo_s", True, "not a number"),
        ("guard_ms", None, "not a number"),
        ("fill_every_bubble", "false", "true or false"),
    ],
)
def test_values_given_through_the_python_api_are_checked_for_their_type(key, value, problem):
    from testbed.spec.bubbletea import check_bubbletea

    with pytest.raises(SpecError, match=problem) as e:
        check_bubbletea("api", replace(BubbleTeaSpec(), **{key: value}), 8)
    assert e.value.field == f"bubbletea.{key}"


def test_a_pass_of_the_head_alone_is_the_one_the_whole_queue_gives():
    """``head_pass_s`` (asked first by ``choose_work`` and the simulator) answers only where the
    head's chunk that fits (``chunk_that_fits``, itself checked against every chunk tried) is all
    of the pass's ``max_chunk`` tokens and may start, with that chunk's prefill seconds, and then
    ``choose_work`` starts that pass; on rooms a hair either side of that chunk's time and inside
    ``windows.fits``'s 1 ns of tolerance, with a guard and time elapsed."""
    from testbed.bubbletea.decisions import NewBatch, QueuedPrompt, choose_work, head_pass_s

    rng, spf = random.Random(13), 1e-9
    answered = 0
    for _ in range(3000):
        lefts = [5, 15, 64, 95, 96, 255, 300]
        queue = [QueuedPrompt(rng.randrange(0, 1900), rng.choice(lefts)) for _ in range(rng.randrange(1, 4))]
        most = rng.choice([16, 96, 256])
        elapsed, guard = rng.uniform(0, 0.01), rng.choice([0.0, 1e-4])
        head = queue[0]
        chunk_s = prefill_seconds(CFG, head.pos, most, spf)
        # a hair either side, or inside may_start's 1 ns of tolerance but past the room
        predicted = elapsed + guard + rng.choice([chunk_s * rng.uniform(0.999, 1.001), chunk_s - 5e-10])
        fills = chunk_that_fits(CFG, head.pos, head.left, most, predicted - elapsed - guard, spf) == most
        want = chunk_s if fills and may_start(predicted, elapsed, chunk_s, guard) else None
        got = head_pass_s(head, CFG, predicted, elapsed, guard, most, spf)
        assert got == want
        if got is not None:
            answered += 1
            assert choose_work([], queue, CFG, predicted, elapsed, guard, most, spf) == NewBatch(((0, most),), got)
    assert 200 < answered < 2500  # both answers were tried
