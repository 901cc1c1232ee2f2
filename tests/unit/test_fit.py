"""Refusing a run before anything is built: the worker-memory estimate on hand-computed cases, and
the refusals of ``run/fit.py`` naming the field, the value, the figure and the fix."""

from __future__ import annotations

import pytest
from experiments import exp

from testbed.errors import SpecError
from testbed.plan.memory import RUNTIME_BYTES, block_activation_bytes, in_flight, largest_worker, worker_memory
from testbed.plan.run_plan import make_plan
from testbed.run.fit import GIB, MAX_ITERATION_S, check_corpus, check_iteration_time, check_memory
from testbed.spec.experiment_file import load_experiment
from testbed.spec.model import ModelConfig


def test_block_activations_follow_korthikanti():
    cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, seq_len=4)
    # 34 s b h + 5 a s^2 b bytes of 16-bit values with s=4, b=3, h=8, a=2; fp32 doubles them
    assert block_activation_bytes(cfg, 3) == 2 * (34 * 4 * 3 * 8 + 5 * 2 * 16 * 3) == 2 * 3744
    bf16 = ModelConfig(n_layers=2, d_model=8, n_heads=2, seq_len=4, value_bytes=2)
    assert block_activation_bytes(bf16, 3) == 3744
    # tensor parallel over t = 2: s b h (10 + 24 / 2) + 5 a s^2 b / 2
    assert block_activation_bytes(bf16, 3, tensor_parallel=2) == 96 * 22 + 480 // 2 * 1 * 1 == 2352
    # full recomputation keeps only the block's input: 2 s b h
    assert block_activation_bytes(bf16, 3, tensor_parallel=2, recompute=True) == 2 * 96


def test_microbatches_in_flight_depend_on_the_schedule():
    e = exp(stages=4, microbatches=8, schedule="gpipe")
    assert [in_flight(e, s) for s in range(4)] == [8, 8, 8, 8]
    e1 = e.with_overrides(schedule="1f1b")
    assert [in_flight(e1, s) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight(exp(stages=4, microbatches=2, schedule="1f1b"), 0) == 2


def test_worker_memory_by_part():
    cfg = ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=128)
    e = exp(model=cfg, stages=2, microbatches=4, microbatch_size=4, schedule="1f1b")
    m = worker_memory(e, 0)
    assert m.model_bytes == 4 * cfg.params()
    # stage 0: two blocks and the embeddings; gradients and two AdamW moments
    assert m.optimizer_bytes == 3 * 4 * (2 * cfg.block_params + cfg.embedding_params)
    boundary = 4 * 4 * 128 * 64  # one microbatch's activations at the stage boundary, fp32
    # 1F1B: stage 0 of 2 holds 2 microbatches, each 2 blocks' saved values plus a received boundary
    assert m.activation_bytes == 2 * (2 * block_activation_bytes(cfg, 4) + boundary)
    assert worker_memory(e.with_overrides(schedule="gpipe"), 0).activation_bytes == 2 * m.activation_bytes
    assert m.bubbletea_bytes == 0
    assert m.total_bytes == m.model_bytes + m.optimizer_bytes + m.activation_bytes + RUNTIME_BYTES
    assert m.largest_part == "activations"


def test_bubbletea_adds_the_inference_model():
    e = load_experiment()
    with_bt = e.with_overrides(policy="atlas+bubbletea")
    assert worker_memory(e, 0).bubbletea_bytes == 0
    assert worker_memory(with_bt, 0).bubbletea_bytes > 4 * e.bubbletea.model.params()
    # the prefill stream's process adds its written pages as a worker does
    assert worker_memory(with_bt, 0).runtime_bytes == 2 * worker_memory(e, 0).runtime_bytes == 2 * RUNTIME_BYTES


def test_the_default_experiment_fits_a_small_machine():
    e = load_experiment()
    assert largest_worker(e).total_bytes < GIB
    check_memory(make_plan(e), available=4 * GIB)


def test_a_model_too_large_for_memory_is_refused_by_name():
    big = exp(model=ModelConfig(n_layers=48, d_model=4096, n_heads=32, seq_len=128), source="big.yaml")
    with pytest.raises(SpecError) as err:
        check_memory(make_plan(big), available=24 * GIB)
    assert err.value.field == "model.d_model" and err.value.value == 4096
    assert "GiB" in err.value.problem and "24 GiB this machine has available" in err.value.problem
    assert "smaller model" in err.value.fix


def test_long_microbatches_are_refused_by_their_activations():
    e = exp(model=ModelConfig(n_layers=4, d_model=256, n_heads=8, seq_len=2048), microbatch_size=64)
    with pytest.raises(SpecError) as err:
        check_memory(make_plan(e), available=24 * GIB)
    assert err.value.field == "microbatch_size" and err.value.value == 64  # 16x its default, seq_len 16x
    assert "mostly activations" in err.value.problem and "1f1b" in err.value.fix


def test_a_sequence_longer_than_the_corpus_is_refused(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("x" * 100)
    e = exp(data=str(text), model=ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=128))
    with pytest.raises(
        SpecError, match=r"model.seq_len: 128 is not shorter than the corpus's training split \(90 bytes\)"
    ):
        check_corpus(e)
    check_corpus(exp(data=str(text), model=ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=64)))


def test_the_refusal_blames_the_size_furthest_above_its_default():
    e = exp(model=ModelConfig(n_layers=4, d_model=10**9, n_heads=4, seq_len=128))
    with pytest.raises(SpecError) as err:
        check_iteration_time(make_plan(e))
    assert (err.value.field, err.value.value) == ("model.d_model", 10**9)
    assert "use a smaller model.d_model" in err.value.fix


def test_an_iteration_of_hours_is_refused_unless_forced():
    e = exp(microbatches=10**7)
    plan = make_plan(e)
    with pytest.raises(SpecError) as err:
        check_iteration_time(plan)
    assert err.value.field == "microbatches" and err.value.value == 10**7
    assert f"above the {MAX_ITERATION_S:g} s limit" in err.value.problem and "--force" in err.value.fix
    assert check_iteration_time(plan, force=True) > MAX_ITERATION_S
    assert check_iteration_time(make_plan(exp())) < MAX_ITERATION_S


def test_a_window_under_four_segments_is_refused_naming_the_share_that_fits():
    from testbed.plan.connections import connection_window_bytes
    from testbed.run.fit import MIN_WINDOW_SEGMENTS, check_connection_window
    from testbed.spec.wire import TCP_MSS_WITH_TIMESTAMPS

    e = load_experiment("two_dc")  # 100 Mbit/s, 20 ms one way: a share of 0.2 is a 100 kB window
    check_connection_window(make_plan(e))
    least = MIN_WINDOW_SEGMENTS * TCP_MSS_WITH_TIMESTAMPS / 500_000  # over the 500 kB bandwidth-delay product
    small = e.with_overrides(wan_connection_share=least * 0.9)
    plan = make_plan(small)
    assert connection_window_bytes(small, small.topology_spec, list(plan.workers)) < 4 * TCP_MSS_WITH_TIMESTAMPS
    with pytest.raises(SpecError) as err:
        check_connection_window(plan)
    assert err.value.field == "wan_connection_share" and "4 full segments" in err.value.problem
    assert f"use at least {least:.3g}" in err.value.fix
    check_connection_window(make_plan(e.with_overrides(wan_connection_share=least * 1.01)))
    with pytest.raises(SpecError) as err:
        check_connection_window(make_plan(e.with_overrides(wan_connection_share=None, wan_window_bytes=3000)))
    assert err.value.field == "wan_window_bytes" and "use at least 5792" in err.value.fix


def test_the_timeouts_last_three_predicted_iterations_at_least():
    from testbed.run.runner import TIMEOUT_ITERATIONS, timeout_s

    e = load_experiment("default")
    floor = timeout_s(e)
    assert floor >= 60.0
    assert timeout_s(e, predicted_iteration_s=1.0) == floor  # a short iteration keeps the floor
    assert timeout_s(e, predicted_iteration_s=50.0) == TIMEOUT_ITERATIONS * 50.0 > floor
