"""Experiment description: which topology, model, data, parallelism, schedule, compute model and
policy.

Pure data, validated when made (errors name file, field, value and fix); files are read by
``experiment_file.py``. An experiment holds its loaded topology (``topology_spec``) and its
resolved policy (``policy``, see ``policy.py``), so a run reads both from here, once.
Layout (DESIGN.md section 1): ``stages`` pipeline stages placed on DCs, each DC taking as many
consecutive stages as its hosts hold with all ``replicas`` data-parallel replicas of a stage inside
it (under ``dp-wan``: each replica's pipeline in its own DC); the global batch is replicas x
microbatches x microbatch_size sequences.

Emulated-GPU compute: each forward and backward of a stage on one microbatch is padded to a
target duration, given in ms (``compute.forward_ms``/``backward_ms``) or derived from a reference
model's FLOPs and a device's peak FLOP/s times an efficiency (``compute.device``); the backward
takes twice the forward's FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters", section 5.1: 3x forward for forward plus backward).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any

from testbed.errors import SpecError
from testbed.spec.bubbletea import BubbleTeaSpec, bubbletea_from_dict, check_bubbletea, check_model_size, served_model
from testbed.spec.compute import COMPUTE_FIELDS, ComputeModel, compute_from_dict, resolve_compute
from testbed.spec.experiment_fields import EXPERIMENT_FIELDS
from testbed.spec.model import ModelConfig, activation_bytes, largest_stage_blocks
from testbed.spec.pipeline_schedules import chunks_per_worker, schedule_problem
from testbed.spec.policy import DEFAULT_POLICY, Policy, UnknownPolicy, parse_policy
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import load_topology
from testbed.spec.wan_profile import WanProfile


def tokens_per_iteration(replicas: int, microbatches: int, microbatch_size: int, seq_len: int) -> int:
    """Tokens trained per iteration: the global batch (replicas x microbatches x microbatch_size
    sequences) times the sequence length."""
    return replicas * microbatches * microbatch_size * seq_len


@dataclass(frozen=True)
class Experiment:
    """A validated experiment. ``topology`` is the name or path as written; ``topology_spec`` the
    topology it names (loaded from ``topology`` when not given); ``policy`` a :class:`Policy` (a
    policy name is resolved when the experiment is made)."""

    name: str
    topology: str
    topology_spec: TopologySpec = None  # type: ignore[assignment]  # loaded in __post_init__ when None
    schedule: str = "1f1b"
    #: model chunks per worker under interleaved-1f1b (None: ``DEFAULT_VIRTUAL_STAGES``); ``chunks``
    virtual_stages: int | None = None
    iterations: int = 10
    warmup_iterations: int = 2
    stages: int = 3
    replicas: int = 2
    microbatches: int = 4
    microbatch_size: int = 4
    model: ModelConfig = field(default_factory=ModelConfig)
    lr: float = 3e-4
    seed: int = 0
    data: str | None = None
    compute: ComputeModel = field(default_factory=ComputeModel)
    policy: Policy = field(default_factory=lambda: parse_policy(DEFAULT_POLICY))
    #: with striping, TCP connections each cross-DC transfer is striped over (concurrent gloo
    #: operations); 0: chosen from the bandwidth-delay product and the per-connection window.
    #: Without striping, one connection.
    wan_connections: int = 0
    #: share of a WAN link one TCP connection fills on the real link modelled (None: no cap, one
    #: connection can fill the emulated link); the hosts' socket buffers are capped to reproduce it
    wan_connection_share: float | None = None
    #: instead of ``wan_connection_share``: the most bytes one TCP connection keeps in flight on the
    #: WAN (its window), so that it carries at most window / RTT on every path (the simulator's
    #: scenarios, ``scenario.py``); None: from ``wan_connection_share``
    wan_window_bytes: int | None = None
    #: under Atlas's grants, the share of a link a pipeline's class keeps while another holds the
    #: grant (0 starves it: its TCP flow then backs off; see atlas/controller.py)
    atlas_floor_share: float = 0.05
    #: under Atlas's grants, whether held classes (and the granted one) may borrow the link's idle
    #: capacity (HTB ceil at the link rate: work-conserving) or stay at their rates (ceil = rate);
    #: borrowing measured 1.07x faster on the sharing experiment (docs/results.md)
    atlas_borrow: bool = True
    #: memory of one emulated GPU (MiB), scaled like the rest of the experiment (DESIGN.md 2a); plans
    #: whose stage does not fit are infeasible (``plan/memory.py``'s ``gpu_bytes``); None: unchecked
    gpu_memory_mb: float | None = None
    #: how long a WAN link may stay down before the run aborts (µs; ``run/outage_watch.py``)
    outage_timeout: int = 60_000_000
    #: the emulated world runs this many times slower than described (``dilation.py``): the run
    #: dilates the experiment and reports its figures in the emulated frame
    time_dilation: float = 1.0
    bubbletea: BubbleTeaSpec = field(default_factory=BubbleTeaSpec)
    #: what one TCP connection carried on each WAN path of a run, measured (``wan_profile.py``;
    #: ``testbed run --profile-wan``): the simulator then uses it in place of the modelled window.
    #: Not an experiment file's field: ``testbed sim --validate`` sets it from the run's record
    wan_profile: WanProfile | None = None
    source: str = "<memory>"

    def __post_init__(self) -> None:
        if isinstance(self.policy, str):
            object.__setattr__(self, "policy", resolve_policy(self.source, self.policy))
        if self.topology_spec is None:
            object.__setattr__(self, "topology_spec", load_topology(self.topology))
        if self.bubbletea.model is None:  # BubbleTea serves a model of the training model's shape
            object.__setattr__(
                self, "bubbletea", replace(self.bubbletea, model=served_model(self.bubbletea, self.model))
            )

    @property
    def chunks(self) -> int:
        """Virtual stages (model chunks) each worker holds under the schedule."""
        return chunks_per_worker(self.schedule, self.virtual_stages)

    @property
    def global_batch(self) -> int:
        """Sequences per iteration, over all replicas."""
        return self.replicas * self.microbatches * self.microbatch_size

    @property
    def tokens_per_iteration(self) -> int:
        return tokens_per_iteration(self.replicas, self.microbatches, self.microbatch_size, self.model.seq_len)

    @property
    def tokens_per_microbatch(self) -> int:
        return self.microbatch_size * self.model.seq_len

    @property
    def block_s(self) -> tuple[float, float]:
        """(forward, backward) seconds of one block on one microbatch on the emulated GPU: the
        padding targets of a stage over the blocks of the largest stage (a stage with fewer blocks
        is padded to the same target; the largest one sets the GPU's speed)."""
        blocks = largest_stage_blocks(self.model.n_layers, self.stages)
        return self.compute.forward_ms / 1000 / blocks, self.compute.backward_ms / 1000 / blocks

    @property
    def activation_bytes(self) -> int:
        """Bytes of one microbatch's activations (or their gradients) at a stage boundary."""
        return activation_bytes(self.model, self.microbatch_size)

    def to_dict(self) -> dict[str, Any]:
        """The resolved experiment as plain data (``config.json``): the policy by its name, the
        topology as written (``topology``) and resolved (``topology_spec``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TopologySpec):
                value = value.to_dict()
            elif isinstance(value, Policy):
                value = value.name
            elif is_dataclass(value):
                value = asdict(value)  # type: ignore[arg-type]
            out[f.name] = value
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Experiment:
        """``to_dict``'s record back (a run folder's ``config.json``; keys it does not know, such
        as the placement, are ignored). Raises KeyError, TypeError or ValueError for data of
        another form."""
        known = {f.name for f in fields(Experiment)}
        return Experiment(
            **{
                **{k: v for k, v in d.items() if k in known},
                "topology_spec": TopologySpec.from_dict(d["topology_spec"]),
                "model": ModelConfig(**d["model"]),
                "compute": compute_from_dict(d["compute"]),
                "policy": parse_policy(d["policy"]),
                "bubbletea": bubbletea_from_dict(d["bubbletea"]),
                "wan_profile": WanProfile.from_dict(d["wan_profile"]) if d.get("wan_profile") else None,
            }
        )

    def with_overrides(self, **kw: Any) -> Experiment:
        """The experiment with main fields replaced (None values ignored), re-validated. A new
        ``topology`` (a shipped name or a path from the working folder, as on the command line) is
        loaded; a policy may be given by name; a ``schedule`` other than interleaved-1f1b drops the
        ``virtual_stages`` of the one it replaces."""
        changed = {k: v for k, v in kw.items() if v is not None}
        served = served_model(replace(self.bubbletea, model=None), self.model)
        if self.bubbletea.model == served:  # the served default: the training model's shape
            section = changed.get("bubbletea", self.bubbletea)
            if section.model == served and ("model" in changed or "bubbletea" in changed):
                # the training model or the section changed, not the served model: re-derive it
                changed["bubbletea"] = replace(section, model=None)
        if changed.get("schedule", "interleaved-1f1b") != "interleaved-1f1b" and "virtual_stages" not in changed:
            changed["virtual_stages"] = None  # a file's chunks belong to its interleaved schedule
        if "topology" in changed and "topology_spec" not in changed:
            changed["topology_spec"] = load_topology(changed["topology"])
        if isinstance(changed.get("policy"), str):
            changed["policy"] = resolve_policy(self.source, changed["policy"])
        out = replace(self, **changed)
        out = replace(out, compute=resolve_compute(out.source, out.compute))
        check_experiment(out)
        return out


def resolve_policy(source: str, name: str) -> Policy:
    """The policy ``name`` stands for. Raises SpecError naming the experiment's ``policy`` field."""
    try:
        return parse_policy(name)
    except UnknownPolicy as e:
        raise SpecError(source, "policy", name, "is not a known policy", str(e)) from None


def check_experiment(e: Experiment) -> None:
    """Raise SpecError naming the first field of ``e`` that is out of range (its table's range,
    ``EXPERIMENT_FIELDS`` and the sections', or a rule between fields), and the fix."""
    src = e.source

    def bad(field: str, value: Any, problem: str, fix: str) -> SpecError:
        return SpecError(src, field, value, problem, fix)

    EXPERIMENT_FIELDS.check(src, e)
    check_model_size(src, "model", e.model)
    COMPUTE_FIELDS.check(src, e.compute, "compute")
    if e.warmup_iterations >= e.iterations:
        raise bad(
            "warmup_iterations",
            e.warmup_iterations,
            f"must be from 0 to iterations - 1 ({e.iterations - 1})",
            f"measure at least one iteration after warm-up: run at least {e.warmup_iterations + 1} iterations "
            "(--iterations), or lower warmup_iterations in the experiment file",
        )
    if e.stages > e.model.n_layers:
        raise bad("stages", e.stages, f"exceeds model.n_layers ({e.model.n_layers})", "use at most one stage per block")
    problem = schedule_problem(e.schedule, e.stages, e.microbatches, e.virtual_stages, e.model.n_layers)
    if problem is not None:
        raise bad(*problem)
    if e.wan_window_bytes is not None and e.wan_window_bytes < 1:
        raise bad("wan_window_bytes", e.wan_window_bytes, "is not a positive window", "give e.g. 16 MiB in bytes")
    if e.policy.grants and e.atlas_floor_share >= 1 / e.replicas:  # the floor matters only under grants
        if e.atlas_floor_share == EXPERIMENT_FIELDS["atlas_floor_share"].default:  # the user set replicas
            most = math.ceil(1 / e.atlas_floor_share) - 1
            raise bad(
                "replicas",
                e.replicas,
                f"leaves no share of a link to the granted pipeline: the {e.replicas - 1} held ones keep "
                f"atlas_floor_share ({e.atlas_floor_share:g}) each, which must stay below 1/replicas",
                f"use at most {most} replicas under Atlas's grants, or set atlas_floor_share below "
                f"{1 / e.replicas:.3g}",
            )
        raise bad(
            "atlas_floor_share",
            e.atlas_floor_share,
            f"is not in [0, 1/replicas) = [0, {1 / e.replicas:.3g})",
            "give the share a held pipeline keeps, e.g. 0.05 (0: starve it)",
        )
    if e.time_dilation != 1 and not e.compute.padded:
        raise bad(
            "time_dilation",
            e.time_dilation,
            "stretches the compute targets, and compute.mode real has none: its CPU time would stay as it is "
            "while the links slowed down",
            "use compute.mode padded (targets in ms, or a device), or time_dilation 1",
        )
    check_bubbletea(e.source, e.bubbletea, e.iterations if e.policy.bubbletea else None)
