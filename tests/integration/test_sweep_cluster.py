"""``testbed sim --sweep --scheduler ADDRESS``: a sweep's points simulated on a Dask distributed
cluster (here a ``LocalCluster`` of two worker processes) give the rows the local process pool gives."""

from __future__ import annotations

import pytest

from testbed.errors import SpecError
from testbed.sim import sweep as sweep_module
from testbed.sim.sweep import parse_sweep, sweep
from testbed.spec.scenario_file import parse_scenario

#: a small scenario (seconds to simulate): 16 A100s in two DCs
SMALL = {
    "name": "small",
    "model": {"n_layers": 8, "d_model": 1024, "n_heads": 16, "seq_len": 1024, "vocab": 32000},
    "device": "a100",
    "tensor_parallel": 2,
    "stages": 4,
    "global_batch": 16,
    "inference_model": {"n_layers": 8, "d_model": 1024, "n_heads": 16, "seq_len": 2048, "vocab": 32000},
    "dcs": [{"name": "east", "gpus": 8}, {"name": "west", "gpus": 8}],
    "links": [{"between": ["east", "west"], "rate": "100gbit", "delay": "10ms"}],
}


def test_a_sweep_on_a_dask_cluster_gives_the_local_pools_rows():
    from distributed import LocalCluster

    sc = parse_scenario(SMALL, "small.yaml")
    grid = parse_sweep("wan_rate=10gbit,100gbit,delay=5ms,50ms")
    local = sweep(sc, grid, workers=2)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        remote = sweep(sc, grid, scheduler=cluster.scheduler_address)
    assert remote == local and len(local) == 4 * 4  # every point and policy, in the same order


def test_a_scheduler_that_does_not_answer_is_named(monkeypatch):
    monkeypatch.setattr(sweep_module, "SCHEDULER_TIMEOUT_S", 1)
    sc = parse_scenario(SMALL, "small.yaml")
    with pytest.raises(SpecError, match=r"--scheduler: 'tcp://127.0.0.1:9' has no Dask scheduler answering"):
        sweep(sc, parse_sweep("delay=5ms"), scheduler="tcp://127.0.0.1:9")
