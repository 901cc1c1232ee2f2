"""Reading experiment files into :class:`experiment.Experiment`: every field checked at load time,
every error naming the file, the field, the value and the fix.

A relative ``topology:`` path resolves against the experiment file's own folder (as inventory
paths do), not the working folder; a bare name such as ``three_dc`` that is no file there names a
shipped topology. ``data:`` and ``bubbletea.requests`` resolve against that folder too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.spec.bubbletea import BubbleTeaSpec, served_model
from testbed.spec.compute import ComputeModel, DeviceModel, resolve_compute
from testbed.spec.experiment import Experiment, check_experiment, resolve_policy
from testbed.spec.model import ModelConfig
from testbed.spec.specfile import REQUIRED, FieldReader, read_spec_file
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology
from testbed.spec.units import UnitError

WORKLOAD_DIR = Path(__file__).resolve().parents[2] / "workloads"
DEFAULT_EXPERIMENT = "default"


def experiment_topology(source: str, value: Any) -> TopologySpec:
    """The topology an experiment file names: a path relative to the file's folder (or absolute),
    else a shipped topology's name. Raises SpecError naming the experiment's ``topology`` field."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(
            source,
            "topology",
            value,
            "is not a topology name or path",
            "give a shipped name such as three_dc, or a path to a topology file",
        )
    path = Path(value)
    if not path.is_absolute() and source != "<memory>":
        path = Path(source).resolve().parent / path
    if path.is_file():
        return load_topology(path)
    if Path(value).parent == Path(".") and (TOPOLOGY_DIR / Path(value).with_suffix(".yaml").name).exists():
        return load_topology(Path(value).name)
    known = ", ".join(sorted(f.stem for f in TOPOLOGY_DIR.glob("*.yaml")))
    where = f" (looked for {path})" if source != "<memory>" else ""
    raise SpecError(
        source,
        "topology",
        value,
        f"is neither a topology file{where} nor a shipped topology",
        f"give a path relative to the experiment file's folder, an absolute path, or one of the shipped names: {known}",
    )


def experiment_data(source: str, value: Any) -> str:
    """The training text an experiment file names (``data:``): a file or folder, relative to the
    experiment file's folder (or absolute). Raises SpecError naming the field when it is not there."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(source, "data", value, "is not a path", "give a text file or a folder of text files")
    path = Path(value)
    if not path.is_absolute() and source != "<memory>":
        path = Path(source).resolve().parent / path
    if not path.exists():
        raise SpecError(
            source,
            "data",
            value,
            f"does not exist (looked for {path})",
            "give a text file or a folder of text files, relative to the experiment file's folder or "
            "absolute; or leave data out for the default corpus (Python's standard library sources)",
        )
    return str(path)


def _num(kind: type, example: object) -> Callable[[Any], Any]:
    """A field reader for a number of ``kind`` (int or float); ``example`` goes into the fix."""

    def parse(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            raise UnitError(f"is not {'a whole number' if kind is int else 'a number'}; write e.g. {example}")
        return kind(v)

    return parse


def parse_experiment(data: Any, source: str = "<memory>") -> Experiment:
    """Validate parsed YAML into an Experiment. Raises SpecError naming field, value and fix."""
    keys = (
        "name",
        "description",
        "topology",
        "schedule",
        "iterations",
        "warmup_iterations",
        "stages",
        "replicas",
        "microbatches",
        "microbatch_size",
        "model",
        "lr",
        "seed",
        "data",
        "compute",
        "policy",
        "wan_connections",
        "wan_connection_share",
        "atlas_floor_share",
        "atlas_borrow",
        "gpu_memory_mb",
        "bubbletea",
    )
    r = FieldReader(source, data, "", keys, ("topology",))
    kw: dict[str, Any] = {
        "name": str(data.get("name") or Path(source).stem),
        "source": source,
        "topology": str(data["topology"]),
        "topology_spec": experiment_topology(source, data["topology"]),
    }
    if "wan_connection_share" in data:
        kw["wan_connection_share"] = r.get("wan_connection_share", _num(float, 0.1), REQUIRED)
    if "atlas_floor_share" in data:
        kw["atlas_floor_share"] = r.get("atlas_floor_share", _num(float, 0.05), REQUIRED)
    if "gpu_memory_mb" in data:
        kw["gpu_memory_mb"] = r.get("gpu_memory_mb", _num(float, 0.001), REQUIRED)
    if "atlas_borrow" in data:
        if not isinstance(data["atlas_borrow"], bool):
            raise r.fail("atlas_borrow", "is not true or false", "write atlas_borrow: true (or false)")
        kw["atlas_borrow"] = data["atlas_borrow"]
    for key in (
        "iterations",
        "warmup_iterations",
        "stages",
        "replicas",
        "microbatches",
        "microbatch_size",
        "seed",
        "wan_connections",
    ):
        if key in data:
            kw[key] = r.get(key, _num(int, 4), REQUIRED)
    if "lr" in data:
        kw["lr"] = r.get("lr", _num(float, 0.0003), REQUIRED)
    if data.get("schedule") is not None:
        kw["schedule"] = str(data["schedule"])
    if data.get("data") is not None:
        kw["data"] = experiment_data(source, data["data"])
    if data.get("policy") is not None:
        kw["policy"] = resolve_policy(source, str(data["policy"]))
    if "model" in data:
        kw["model"] = _parse_model(source, data["model"], "model")
    if "compute" in data:
        c = FieldReader(
            source,
            data["compute"],
            "compute",
            ("mode", "forward_ms", "backward_ms", "optimizer_ms", "device", "reference_forward_tflop"),
        )
        ckw: dict[str, Any] = {
            k: c.get(k, _num(float, 40.0), REQUIRED)
            for k in ("forward_ms", "backward_ms", "optimizer_ms", "reference_forward_tflop")
            if k in c.data
        }
        if "mode" in c.data:
            ckw["mode"] = str(c.data["mode"])
        if "device" in c.data:
            d = FieldReader(
                source,
                c.data["device"],
                "compute.device",
                ("name", "peak_tflops", "efficiency", "source"),
                ("name", "peak_tflops", "efficiency", "source"),
            )
            dev = DeviceModel(
                str(d.data["name"]),
                d.get("peak_tflops", _num(float, 312.0), REQUIRED),
                d.get("efficiency", _num(float, 0.4), REQUIRED),
                str(d.data["source"]),
            )
            if dev.peak_tflops <= 0:
                raise d.fail("peak_tflops", "is not positive", "give the device's dense peak in TFLOP/s, e.g. 312")
            if not 0 < dev.efficiency <= 1:
                raise d.fail("efficiency", "is not in (0, 1]", "give the reached share of peak (MFU), e.g. 0.4")
            ckw["device"] = dev
        kw["compute"] = resolve_compute(source, ComputeModel(**ckw))
    if "bubbletea" in data:
        kw["bubbletea"] = _parse_bubbletea(source, data["bubbletea"], kw.get("model", ModelConfig()))
    exp = Experiment(**kw)
    check_experiment(exp)
    return exp


def _parse_model(source: str, data: Any, where: str, defaults: ModelConfig | None = None) -> ModelConfig:
    """A model section; fields it omits come from ``defaults`` (the training model's otherwise)."""
    m = FieldReader(source, data, where, ("n_layers", "d_model", "n_heads", "seq_len"))
    return replace(defaults or ModelConfig(), **{k: m.get(k, _num(int, 128), REQUIRED) for k in m.data})


def _parse_bubbletea(source: str, data: Any, training: ModelConfig) -> BubbleTeaSpec:
    """The BubbleTea section; a partial ``model`` takes its other fields from the served default,
    the training model's shape (``served_model``)."""
    keys = (
        "model",
        "request_rate",
        "requests",
        "time_scale",
        "rate_factor",
        "max_prompt_tokens",
        "max_output_tokens",
        "max_chunk_tokens",
        "guard_ms",
        "profile_iterations",
        "decode",
        "fill_every_bubble",
        "ttft_slo_s",
        "ttft_slo_scale",
        "max_decode_batch",
    )
    b = FieldReader(source, data, "bubbletea", keys)
    kw: dict[str, Any] = {}
    for key in ("request_rate", "time_scale", "rate_factor", "guard_ms", "ttft_slo_s", "ttft_slo_scale"):
        if key in b.data:
            kw[key] = b.get(key, _num(float, 4.0), REQUIRED)
    for key in ("max_prompt_tokens", "max_output_tokens", "max_chunk_tokens", "profile_iterations", "max_decode_batch"):
        if key == "max_prompt_tokens" and key in b.data and b.data[key] is None:
            kw[key] = None  # written out: prompts are not clipped (the default)
        elif key in b.data:
            kw[key] = b.get(key, _num(int, 128), REQUIRED)
    if b.data.get("requests") is not None:
        req = b.data["requests"]
        path = Path(req) if isinstance(req, str) and req else None
        if path is not None and not path.is_absolute():
            path = Path(source).resolve().parent / path  # relative to the experiment file
        if path is None or not path.is_file():
            raise b.fail(
                "requests",
                "is not a file",
                "give the path (absolute, or relative to the experiment file) of a CSV in the Azure LLM "
                "inference trace format (TIMESTAMP,ContextTokens,GeneratedTokens), or omit it for the "
                "synthetic stream",
            )
        kw["requests"] = str(path)
    for key in ("decode", "fill_every_bubble"):
        if key in b.data:
            if not isinstance(b.data[key], bool):
                raise b.fail(key, "is not true or false", f"write {key}: true or {key}: false")
            kw[key] = b.data[key]
    if "model" in b.data:
        default = served_model(BubbleTeaSpec(**kw), training)
        kw["model"] = _parse_model(source, b.data["model"], "bubbletea.model", default)
    return BubbleTeaSpec(**kw)


def load_experiment(name_or_path: str | Path | None = None) -> Experiment:
    """Load and validate an experiment file (default: the shipped ``default`` experiment) with its
    topology. Raises SpecError."""
    path, data = read_spec_file(name_or_path or DEFAULT_EXPERIMENT, WORKLOAD_DIR, "experiment")
    return parse_experiment(data, str(path))
