"""Small experiments on small topologies for the planner's and the fit checks' unit tests."""

from __future__ import annotations

from testbed.spec.compute import ComputeModel
from testbed.spec.experiment import Experiment
from testbed.spec.model import ModelConfig
from testbed.spec.topology_file import parse_topology


def topo(hosts: dict[str, int], rate="100mbit", delay="10ms"):
    names = list(hosts)
    links = [{"between": [a, b], "rate": rate, "delay": delay} for a, b in zip(names, names[1:])]
    return parse_topology({"dcs": [{"name": n, "hosts": h} for n, h in hosts.items()], "links": links}, "t.yaml")


def exp(**kw):
    base = {
        "name": "e",
        "topology": "t.yaml",
        "topology_spec": topo({"a": 2, "b": 2}),
        "stages": 2,
        "replicas": 2,
        "microbatches": 4,
        "microbatch_size": 4,
        "iterations": 3,
        "warmup_iterations": 1,
        "model": ModelConfig(n_layers=4, d_model=64, n_heads=4, seq_len=128),
        "compute": ComputeModel(forward_ms=40, backward_ms=80),
    }
    base.update(kw)
    return Experiment(**base)
