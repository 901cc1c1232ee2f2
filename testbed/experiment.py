"""Experiment description: which topology, model, data, parallelism, schedule and compute model.

Pure data, validated at load time like topologies (errors name file, field, value and fix).
Layout (DESIGN.md section 1): ``stages`` pipeline stages placed on DCs in file order, each DC
taking as many consecutive stages as its hosts hold with all ``replicas`` data-parallel replicas
of a stage inside it; the global batch is replicas x microbatches x microbatch_size sequences.

Emulated-GPU compute: each forward and backward of a stage on one microbatch is padded to a
target duration, given in ms (``compute.forward_ms``/``backward_ms``) or derived from a reference
model's FLOPs and a device's peak FLOP/s times an efficiency (``compute.device``); the backward
takes twice the forward's FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters", section 5.1: 3x forward for forward plus backward).
"""
from __future__ import annotations

import math

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import SpecError
from .model import ModelConfig
from .schedule import SCHEDULES
from .specfile import REQUIRED, FieldReader, read_spec_file

WORKLOAD_DIR = Path(__file__).resolve().parent.parent / "workloads"
DEFAULT_EXPERIMENT = "default"
#: pp-fair: PP across DCs, DP inside a DC, TCP shares each WAN link; dp-wan: each replica's whole
#: pipeline in one DC, replicas spread over DCs (the gradient all-reduce crosses the WAN); atlas:
#: Atlas's placement (largest DCs first), striped transfers and the link-granting controller.
POLICIES = ("pp-fair", "dp-wan", "atlas")
#: highest synthetic request rate (per second) an experiment may ask for
MAX_REQUEST_RATE = 1000.0
#: smallest prefill chunk worth starting (tokens); smaller leftovers of a bubble stay idle
MIN_CHUNK_TOKENS = 16
#: any policy followed by this suffix also fills the pipeline bubbles with prefill (BubbleTea)
BUBBLETEA_SUFFIX = "+bubbletea"


def split_policy(policy: str) -> tuple[str, bool]:
    """``"atlas+bubbletea"`` -> ("atlas", True); ``"pp-fair"`` -> ("pp-fair", False)."""
    if policy.endswith(BUBBLETEA_SUFFIX):
        return policy[: -len(BUBBLETEA_SUFFIX)], True
    return policy, False


def known_policies() -> tuple[str, ...]:
    return POLICIES + tuple(p + BUBBLETEA_SUFFIX for p in POLICIES)


@dataclass(frozen=True)
class BubbleTeaSpec:
    """Prefill-in-the-bubbles (BubbleTea, DESIGN.md section 1 item 5), used by ``<policy>+bubbletea``.

    ``model``: the inference model each worker holds beside its stage (real weights from the
    experiment's seed; ``seq_len`` is its context). Requests: the Azure 2023 trace's CSV
    (``requests``, with ``time_scale`` and ``rate_factor``) or, without one, a synthetic stream at
    ``request_rate`` per second fitted to that trace (``requests.synthetic_requests``). Prompts are
    clipped to ``max_prompt_tokens`` and decode to ``max_output_tokens`` (both within the context).
    A chunk holds at most ``max_chunk_tokens``; a worker starts a chunk only if its predicted end
    plus ``guard_ms`` falls inside the predicted bubble, predicted as the minimum of the slot's
    last ``profile_iterations`` bubbles. ``decode``: decode hosts run the decode steps."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=2048))
    request_rate: float = 4.0
    requests: str | None = None
    time_scale: float = 1.0
    rate_factor: float = 1.0
    max_prompt_tokens: int = 1536
    max_output_tokens: int = 256
    max_chunk_tokens: int = 128
    guard_ms: float = 3.0
    profile_iterations: int = 3
    decode: bool = True


@dataclass(frozen=True)
class DeviceModel:
    """A GPU's dense peak FLOP/s and the share a training step reaches (MFU), with their source."""

    name: str
    peak_tflops: float
    efficiency: float
    source: str


@dataclass(frozen=True)
class ComputeModel:
    """``mode``: ``padded`` (each operation padded to its target) or ``real`` (CPU speed, no padding)."""

    mode: str = "padded"
    forward_ms: float = 40.0
    backward_ms: float = 80.0
    device: DeviceModel | None = None
    reference_forward_tflop: float | None = None  # FLOPs of one stage's forward on one microbatch


@dataclass(frozen=True)
class Experiment:
    name: str
    topology: str
    schedule: str = "1f1b"
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
    policy: str = "pp-fair"
    #: under atlas, TCP connections each cross-DC transfer is striped over (concurrent gloo
    #: operations); 0: chosen from the bandwidth-delay product and the per-connection window.
    #: Other policies use one connection.
    wan_connections: int = 0
    #: share of a WAN link one TCP connection fills on the real link modelled (None: no cap, one
    #: connection can fill the emulated link); the hosts' socket buffers are capped to reproduce it
    wan_connection_share: float | None = None
    #: under atlas, the share of a link a pipeline's class keeps while another holds the grant
    #: (0 starves it: its TCP flow then backs off; see controller.py)
    atlas_floor_share: float = 0.05
    bubbletea: BubbleTeaSpec = field(default_factory=BubbleTeaSpec)
    source: str = "<memory>"

    @property
    def base_policy(self) -> str:
        """The network policy without the BubbleTea suffix."""
        return split_policy(self.policy)[0]

    @property
    def uses_bubbletea(self) -> bool:
        return split_policy(self.policy)[1]

    @property
    def global_batch(self) -> int:
        """Sequences per iteration, over all replicas."""
        return self.replicas * self.microbatches * self.microbatch_size

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch * self.model.seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, **kw: Any) -> "Experiment":
        """The experiment with main fields replaced (None values ignored), re-validated."""
        changed = {k: v for k, v in kw.items() if v is not None}
        out = replace(self, **changed)
        out = replace(out, compute=_resolve_compute(out.source, out.compute))
        _check(out)
        return out


def _num(kind, example):
    def parse(v: Any):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            from .units import UnitError

            raise UnitError(f"is not {'a whole number' if kind is int else 'a number'}; write e.g. {example}")
        return kind(v)
    return parse


def parse_experiment(data: Any, source: str = "<memory>") -> Experiment:
    """Validate parsed YAML into an Experiment. Raises SpecError naming field, value and fix."""
    keys = ("name", "description", "topology", "schedule", "iterations", "warmup_iterations", "stages",
            "replicas", "microbatches", "microbatch_size", "model", "lr", "seed", "data", "compute", "policy",
            "wan_connections", "wan_connection_share", "atlas_floor_share", "bubbletea")
    r = FieldReader(source, data, "", keys, ("topology",))
    kw: dict[str, Any] = {"name": str(data.get("name") or Path(source).stem), "source": source,
                          "topology": str(data["topology"])}
    if "wan_connection_share" in data:
        kw["wan_connection_share"] = r.get("wan_connection_share", _num(float, 0.1), REQUIRED)
    if "atlas_floor_share" in data:
        kw["atlas_floor_share"] = r.get("atlas_floor_share", _num(float, 0.05), REQUIRED)
    for key in ("iterations", "warmup_iterations", "stages", "replicas", "microbatches", "microbatch_size", "seed",
                "wan_connections"):
        if key in data:
            kw[key] = r.get(key, _num(int, 4), REQUIRED)
    if "lr" in data:
        kw["lr"] = r.get("lr", _num(float, 0.0003), REQUIRED)
    for key in ("schedule", "data", "policy"):
        if data.get(key) is not None:
            kw[key] = str(data[key])
    if "model" in data:
        kw["model"] = _parse_model(source, data["model"], "model")
    if "compute" in data:
        c = FieldReader(source, data["compute"], "compute", ("mode", "forward_ms", "backward_ms", "device",
                                                          "reference_forward_tflop"))
        ckw: dict[str, Any] = {k: c.get(k, _num(float, 40.0), REQUIRED) for k in ("forward_ms", "backward_ms",
                                                                                   "reference_forward_tflop")
                               if k in c.data}
        if "mode" in c.data:
            ckw["mode"] = str(c.data["mode"])
        if "device" in c.data:
            d = FieldReader(source, c.data["device"], "compute.device", ("name", "peak_tflops", "efficiency", "source"),
                        ("name", "peak_tflops", "efficiency", "source"))
            dev = DeviceModel(str(d.data["name"]), d.get("peak_tflops", _num(float, 312.0), REQUIRED),
                              d.get("efficiency", _num(float, 0.4), REQUIRED), str(d.data["source"]))
            if dev.peak_tflops <= 0:
                raise d.fail("peak_tflops", "is not positive", "give the device's dense peak in TFLOP/s, e.g. 312")
            if not 0 < dev.efficiency <= 1:
                raise d.fail("efficiency", "is not in (0, 1]", "give the reached share of peak (MFU), e.g. 0.4")
            ckw["device"] = dev
        kw["compute"] = _resolve_compute(source, ComputeModel(**ckw))
    if "bubbletea" in data:
        kw["bubbletea"] = _parse_bubbletea(source, data["bubbletea"])
    exp = Experiment(**kw)
    _check(exp)
    return exp


def _parse_model(source: str, data: Any, where: str, defaults: ModelConfig | None = None) -> ModelConfig:
    """A model section; fields it omits come from ``defaults`` (the training model's otherwise)."""
    m = FieldReader(source, data, where, ("n_layers", "d_model", "n_heads", "seq_len"))
    return replace(defaults or ModelConfig(), **{k: m.get(k, _num(int, 128), REQUIRED) for k in m.data})


def _parse_bubbletea(source: str, data: Any) -> BubbleTeaSpec:
    keys = ("model", "request_rate", "requests", "time_scale", "rate_factor", "max_prompt_tokens",
            "max_output_tokens", "max_chunk_tokens", "guard_ms", "profile_iterations", "decode")
    b = FieldReader(source, data, "bubbletea", keys)
    kw: dict[str, Any] = {}
    for key in ("request_rate", "time_scale", "rate_factor", "guard_ms"):
        if key in b.data:
            kw[key] = b.get(key, _num(float, 4.0), REQUIRED)
    for key in ("max_prompt_tokens", "max_output_tokens", "max_chunk_tokens", "profile_iterations"):
        if key in b.data:
            kw[key] = b.get(key, _num(int, 128), REQUIRED)
    if b.data.get("requests") is not None:
        req = b.data["requests"]
        path = Path(req) if isinstance(req, str) and req else None
        if path is not None and not path.is_absolute():
            path = Path(source).resolve().parent / path     # relative to the experiment file
        if path is None or not path.is_file():
            raise b.fail("requests", "is not a file",
                         "give the path (absolute, or relative to the experiment file) of a CSV in the Azure LLM "
                         "inference trace format (TIMESTAMP,ContextTokens,GeneratedTokens), or omit it for the "
                         "synthetic stream")
        kw["requests"] = str(path)
    if "decode" in b.data:
        if not isinstance(b.data["decode"], bool):
            raise b.fail("decode", "is not true or false", "write decode: true or decode: false")
        kw["decode"] = b.data["decode"]
    if "model" in b.data:
        kw["model"] = _parse_model(source, b.data["model"], "bubbletea.model", BubbleTeaSpec().model)
    return BubbleTeaSpec(**kw)


def _resolve_compute(source: str, c: ComputeModel) -> ComputeModel:
    """Derive forward/backward targets from the device model when one is given."""
    if c.device is None:
        return c
    if c.reference_forward_tflop is None or c.reference_forward_tflop <= 0:
        raise SpecError(source, "compute.reference_forward_tflop", c.reference_forward_tflop,
                        "is missing or not positive while compute.device is given",
                        "give the FLOPs (in TFLOP) of one stage's forward pass on one microbatch")
    fwd_ms = c.reference_forward_tflop / (c.device.peak_tflops * c.device.efficiency) * 1000
    return replace(c, forward_ms=fwd_ms, backward_ms=2 * fwd_ms)


def _check(e: Experiment) -> None:
    src = e.source

    def bad(field: str, value: Any, problem: str, fix: str) -> SpecError:
        return SpecError(src, field, value, problem, fix)

    for key in ("iterations", "stages", "replicas", "microbatches", "microbatch_size"):
        if getattr(e, key) < 1:
            raise bad(key, getattr(e, key), "is not positive", "use 1 or more")
    for where, model in (("model", e.model), ("bubbletea.model", e.bubbletea.model)):
        for key, low in (("n_layers", 1), ("d_model", 1), ("n_heads", 1), ("seq_len", 2)):
            if getattr(model, key) < low:
                raise bad(f"{where}.{key}", getattr(model, key), f"is below {low}", f"use {low} or more")
    if not 0 <= e.warmup_iterations < e.iterations:
        raise bad("warmup_iterations", e.warmup_iterations, f"must be from 0 to iterations - 1 ({e.iterations - 1})",
                  "measure at least one iteration after warm-up: " + (
                      "use 0 or more warm-up iterations" if e.warmup_iterations < 0 else
                      f"run at least {e.warmup_iterations + 1} iterations (--iterations), or lower "
                      "warmup_iterations in the experiment file"))
    if e.schedule not in SCHEDULES:
        raise bad("schedule", e.schedule, "is not a known schedule", f"use one of {', '.join(SCHEDULES)}")
    if e.stages > e.model.n_layers:
        raise bad("stages", e.stages, f"exceeds model.n_layers ({e.model.n_layers})", "use at most one stage per block")
    if e.model.d_model % e.model.n_heads:
        raise bad("model.n_heads", e.model.n_heads, f"does not divide d_model ({e.model.d_model})",
                  "choose heads that divide d_model")
    if e.compute.mode not in ("padded", "real"):
        raise bad("compute.mode", e.compute.mode, "is not padded or real", "use padded (emulated GPU) or real")
    if not (e.compute.forward_ms > 0 and e.compute.backward_ms > 0):
        raise bad("compute.forward_ms", e.compute.forward_ms, "is not positive", "give targets above 0 ms")
    if not 0 <= e.wan_connections <= 16:
        raise bad("wan_connections", e.wan_connections, "is outside 0..16",
                  "stripe over 1 to 16 connections, or 0 to choose from the bandwidth-delay product")
    if e.wan_connection_share is not None and not 0 < e.wan_connection_share <= 1:
        raise bad("wan_connection_share", e.wan_connection_share, "is not in (0, 1]",
                  "give the share of a link one connection fills, e.g. 0.1")
    if not (math.isfinite(e.atlas_floor_share) and 0 <= e.atlas_floor_share < 1 / max(e.replicas, 1)):
        raise bad("atlas_floor_share", e.atlas_floor_share, f"is not in [0, 1/replicas) = [0, {1 / e.replicas:.3g})",
                  "give the share a held pipeline keeps, e.g. 0.05 (0: starve it)")
    if e.base_policy not in POLICIES:
        raise bad("policy", e.policy, "is not a known policy",
                  f"use one of {', '.join(POLICIES)}, each optionally followed by {BUBBLETEA_SUFFIX}")
    bt = e.bubbletea
    for key in ("request_rate", "time_scale", "rate_factor"):
        v = getattr(bt, key)
        if not (math.isfinite(v) and v > 0):
            raise bad(f"bubbletea.{key}", v, "is not a finite number above 0", "give e.g. 4 (request_rate) or 1")
    if bt.request_rate > MAX_REQUEST_RATE:
        raise bad("bubbletea.request_rate", bt.request_rate, f"is above {MAX_REQUEST_RATE:g} requests per second",
                  "lower it: the workers' bubbles hold a few tens of prefills per second")
    if not (math.isfinite(bt.guard_ms) and bt.guard_ms >= 0):
        raise bad("bubbletea.guard_ms", bt.guard_ms, "is not a finite number of ms >= 0", "give e.g. 3")
    for key in ("max_prompt_tokens", "max_output_tokens", "max_chunk_tokens", "profile_iterations"):
        if getattr(bt, key) < 1:
            raise bad(f"bubbletea.{key}", getattr(bt, key), "is not positive", "use 1 or more")
    if bt.max_chunk_tokens < MIN_CHUNK_TOKENS:
        raise bad("bubbletea.max_chunk_tokens", bt.max_chunk_tokens, f"is below the smallest chunk ({MIN_CHUNK_TOKENS})",
                  f"use {MIN_CHUNK_TOKENS} or more")
    if e.uses_bubbletea and bt.profile_iterations >= e.iterations:
        raise bad("bubbletea.profile_iterations", bt.profile_iterations, f"is not below iterations ({e.iterations})",
                  "run more iterations (requests start once every worker has seen this many), or lower it")
    if bt.max_prompt_tokens + bt.max_output_tokens > bt.model.seq_len:
        raise bad("bubbletea.max_prompt_tokens", bt.max_prompt_tokens,
                  f"plus max_output_tokens ({bt.max_output_tokens}) exceeds the inference model's context "
                  f"(bubbletea.model.seq_len {bt.model.seq_len})", "lower them or raise bubbletea.model.seq_len")
    if bt.model.d_model % bt.model.n_heads:
        raise bad("bubbletea.model.n_heads", bt.model.n_heads, f"does not divide d_model ({bt.model.d_model})",
                  "choose heads that divide d_model")
    if not 0 < e.lr < 1:
        raise bad("lr", e.lr, "is not a learning rate in (0, 1)", "use e.g. 0.0003")


def load_experiment(name_or_path: str | Path | None = None) -> Experiment:
    """Load and validate an experiment file (default: the shipped ``default`` experiment)."""
    path, data = read_spec_file(name_or_path or DEFAULT_EXPERIMENT, WORKLOAD_DIR, "experiment")
    return parse_experiment(data, str(path))
