"""The contracts between parts: the workers' configuration written and read back, what a backend
can do known before it is built, the rank of (stage, replica), the shaping-log record."""

from __future__ import annotations

from dataclasses import replace

import pytest

from testbed.errors import SpecError
from testbed.net.network import require_live_shaping
from testbed.plan.placement import place, rank_of
from testbed.plan.worker_config import (
    BubbleTeaConfig,
    TrainingConfig,
    WorkerConfig,
    read_worker_config,
    write_worker_config,
)
from testbed.run.backends import BACKENDS, offers_live_shaping
from testbed.run.runner import check_runnable
from testbed.spec.experiment_file import load_experiment
from testbed.trace.shaping_log import class_id, class_minor, shaping_record


def test_the_workers_configuration_reads_back_as_written(tmp_path):
    exp = load_experiment().with_overrides(policy="atlas+bubbletea")
    workers = place(exp)
    bt = BubbleTeaConfig(exp.bubbletea, 1.5e-12, "/run/x/w{rank}.sock", "/run/x/bt.sock", {"east": "10.100.0.4"})
    cfg = WorkerConfig(
        TrainingConfig.of(exp, "/data/corpus.txt", 13),
        tuple(workers),
        "results/r",
        "tcp://10.0.0.1:1",
        90.0,
        "/run/x/c.sock",
        bt,
    )
    write_worker_config(tmp_path / "worker_config.json", cfg)
    back = read_worker_config(tmp_path / "worker_config.json")
    assert back == cfg
    assert back.training.model == exp.model and back.bubbletea.spec == exp.bubbletea
    assert back.worker(3) == workers[3] and back.bubbletea.inbox_of(5) == "/run/x/w5.sock"
    assert back.training.padded and back.training.wan_connections == 13
    plain = replace(cfg, control_socket=None, bubbletea=None)
    write_worker_config(tmp_path / "plain.json", plain)
    assert read_worker_config(tmp_path / "plain.json") == plain
    with pytest.raises((KeyError, ValueError, TypeError)):
        (tmp_path / "bad.json").write_text('{"experiment": {}}')
        read_worker_config(tmp_path / "bad.json")


def test_what_a_backend_can_do_is_known_before_it_is_built():
    assert [offers_live_shaping(b) for b in BACKENDS] == [True, True, True]
    with pytest.raises(SpecError, match="is not a backend"):
        offers_live_shaping("docker")
    exp = load_experiment()
    for policy in ("pp-fair", "dp-wan", "atlas", "atlas/sharing=fifo", "atlas+bubbletea", "pp-fair+bubbletea"):
        assert len(check_runnable(exp.with_overrides(policy=policy), "remote").workers) == 6
    assert len(check_runnable(exp.with_overrides(policy="atlas"), "mininet").workers) == 6


def test_a_network_without_live_shaping_is_refused_by_name():
    class Remote:
        backend = "remote"
        shaping = None

    with pytest.raises(SpecError, match="cannot change shaping live, which Atlas's controller needs"):
        require_live_shaping(Remote(), "Atlas's controller")  # type: ignore[arg-type]


def test_rank_of_stage_and_replica_is_the_same_under_every_placement():
    exp = load_experiment()
    assert [rank_of(s, r, 2) for s in range(3) for r in range(2)] == list(range(6))
    for policy in ("pp-fair", "dp-wan", "atlas"):
        workers = place(exp.with_overrides(policy=policy))
        assert [w.rank for w in workers] == [rank_of(w.stage, w.replica, exp.replicas) for w in workers]


def test_the_shaping_log_record():
    row = shaping_record(5, "change", "tb1a2b-east-r", "w-west", 0x20, 10_000_000, 12_000_000, 300)
    assert row == {
        "t_ns": 5,
        "event": "change",
        "netns": "tb1a2b-east-r",
        "ifname": "w-west",
        "classid": "1:20",
        "rate_bps": 10_000_000,
        "ceil_bps": 12_000_000,
        "duration_ns": 300,
    }
    assert class_id(0x10) == "1:10" and class_minor("1:2a") == 0x2A
    with pytest.raises(ValueError):
        class_minor("2:10")
