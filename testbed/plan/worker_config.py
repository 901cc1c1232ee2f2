"""The contract between the runner and the processes it starts in the emulated hosts (training
workers, BubbleTea's decode hosts): ``worker_config.json``, written by one function and read by one.

Everything a process needs is here, typed, with the policy already resolved into what the worker
does: how many connections a cross-DC transfer is striped over, whether (and where) it reports its
transfers to Atlas's controller, and BubbleTea's part. Paths are as the hosts' processes see them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.plan.workers import WorkerSpec
from testbed.spec.bubbletea import BubbleTeaSpec, bubbletea_from_dict
from testbed.spec.experiment import Experiment
from testbed.spec.model import ModelConfig
from testbed.trace.jsonl import write_json_atomic


@dataclass(frozen=True)
class TrainingConfig:
    """What every worker trains: the model, data, batch, schedule and emulated compute of the
    experiment. ``data``: the corpus as the hosts name it (None: the default corpus);
    ``wan_connections``: connections a cross-DC transfer is striped over (1: not striped);
    ``forward_ms``/``backward_ms``/``optimizer_target_ms``: padding targets, applied when ``padded``."""

    stages: int
    replicas: int
    microbatches: int
    microbatch_size: int
    iterations: int
    schedule: str
    model: ModelConfig
    lr: float
    seed: int
    data: str | None
    forward_ms: float
    backward_ms: float
    optimizer_target_ms: float
    padded: bool
    wan_connections: int
    #: model chunks (virtual stages) per worker (``Experiment.chunks``)
    chunks: int = 1

    @classmethod
    def of(cls, exp: Experiment, data: str | None, wan_connections: int) -> TrainingConfig:
        return cls(
            exp.stages,
            exp.replicas,
            exp.microbatches,
            exp.microbatch_size,
            exp.iterations,
            exp.schedule,
            exp.model,
            exp.lr,
            exp.seed,
            data,
            exp.compute.forward_ms,
            exp.compute.backward_ms,
            exp.compute.optimizer_target_ms,
            exp.compute.padded,
            wan_connections,
            exp.chunks,
        )


@dataclass(frozen=True)
class BubbleTeaConfig:
    """BubbleTea's part: the spec, the emulated GPU's seconds per FLOP, the Unix sockets of the
    workers' inboxes (``inbox`` holds ``{rank}``) and of the dispatcher, and the decode host's
    address in each DC (prefill and decode are padded when training is: ``TrainingConfig.padded``)."""

    spec: BubbleTeaSpec
    s_per_flop: float
    inbox: str
    dispatcher: str
    decode_hosts: dict[str, str]
    #: each worker's predicted bubbles before any is observed (rank as a string -> slot -> s; empty:
    #: none, as under real compute, whose times are not known before the run)
    prior_s: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the iteration the prior comes from (s; 0: none)
    prior_iteration_s: float = 0.0
    #: what each worker's emulated GPU holds besides KV caches (rank as a string -> bytes:
    #: ``plan/memory.device_bytes_besides_kv``) and the budget (``gpu_memory_mb`` in bytes; None:
    #: no admission control)
    device_bytes: dict[str, int] = field(default_factory=dict)
    gpu_memory_bytes: int | None = None
    #: prefill served alone, no training (``+prefill-alone``): the workers serve windows of
    #: ``prior_iteration_s`` (``bubbletea/alone.py``)
    alone: bool = False

    def inbox_of(self, rank: int) -> str:
        return self.inbox.format(rank=rank)

    def prior_of(self, rank: int) -> dict[str, float]:
        return self.prior_s.get(str(rank), {})

    def device_bytes_of(self, rank: int) -> int:
        return self.device_bytes.get(str(rank), 0)


@dataclass(frozen=True)
class WorkerConfig:
    """One run's configuration of its processes. ``control_socket``: where workers report their
    transfers to Atlas's controller (None: no controller); ``bubbletea``: None without BubbleTea."""

    training: TrainingConfig
    workers: tuple[WorkerSpec, ...]
    out_dir: str
    init_method: str
    timeout_s: float
    control_socket: str | None = None
    bubbletea: BubbleTeaConfig | None = None
    #: planned grants: how long each replica's first stage waits after an iteration's optimizer
    #: step before it starts the next (``plan/grant_plan.py``'s stagger; empty: not at all)
    stagger_s: tuple[float, ...] = ()
    #: planned grants under real compute: where the runner writes the stagger it planned from the
    #: first iteration's profile (``write_stagger``); the first stages read it between iterations
    stagger_file: str | None = None

    def worker(self, rank: int) -> WorkerSpec:
        return self.workers[rank]


def write_worker_config(path: Path, cfg: WorkerConfig) -> None:
    """Write ``cfg`` as JSON (the run folder's ``worker_config.json``): the training part under
    ``experiment``, the rest under its field names."""
    data: dict[str, Any] = {
        "experiment": asdict(cfg.training),
        "workers": [asdict(w) for w in cfg.workers],
        "out_dir": cfg.out_dir,
        "init_method": cfg.init_method,
        "timeout_s": cfg.timeout_s,
        "control_socket": cfg.control_socket,
        "bubbletea": asdict(cfg.bubbletea) if cfg.bubbletea is not None else None,
        "stagger_s": list(cfg.stagger_s),
        "stagger_file": cfg.stagger_file,
    }
    path.write_text(json.dumps(data))


def read_worker_config(path: Path | str) -> WorkerConfig:
    """The configuration ``write_worker_config`` wrote. Raises OSError, ValueError or KeyError for
    a file it did not write."""
    data = json.loads(Path(path).read_text())
    t = data["experiment"]
    training = TrainingConfig(**{**t, "model": ModelConfig(**t["model"])})
    bt = data.get("bubbletea")
    return WorkerConfig(
        training,
        tuple(WorkerSpec(**w) for w in data["workers"]),
        data["out_dir"],
        data["init_method"],
        data["timeout_s"],
        data.get("control_socket"),
        BubbleTeaConfig(**{**bt, "spec": bubbletea_from_dict(bt["spec"])}) if bt else None,
        tuple(data.get("stagger_s", ())),
        data.get("stagger_file"),
    )


#: the stagger file's name in the run folder (``WorkerConfig.stagger_file``)
STAGGER_FILE = "stagger.json"


def write_stagger(path: Path, stagger_s: tuple[float, ...]) -> None:
    """Write each replica's offset (s) for ``read_stagger``, atomically (a reader never sees half)."""
    write_json_atomic(path, list(stagger_s))


def read_stagger(path: str) -> tuple[float, ...] | None:
    """The offsets ``write_stagger`` wrote, or None while there are none (no file yet, or not a list
    of numbers: workers never wait for it)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, list) or not all(isinstance(x, (int, float)) for x in data):
        return None
    return tuple(float(x) for x in data)
