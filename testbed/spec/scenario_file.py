"""Reading scenario files (``workloads/scenarios/*.yaml``) into :class:`scenario.Scenario`: every
field checked at load time, every error naming the file, the field, the value and the fix.

File format (YAML)::

    name: gpt3_175b_2dc
    description: ...
    model: gpt3-175b          # a shape of model_presets.MODELS, or {n_layers, d_model, n_heads, seq_len, vocab}
    device: a100              # one of devices.DEVICES
    tensor_parallel: 8        # GPUs of a stage replica, inside a node
    stages: 16
    global_batch: 1536        # sequences per iteration
    microbatch_size: 1        # optional (1)
    schedule: 1f1b            # optional (1f1b)
    recompute: true           # optional (false): full activation recomputation
    gpu_memory: 80GB          # optional (the device's memory)
    gpu_nic_rate: 200gbit     # optional (200gbit): each GPU's link to its DC's fabric
    tcp_window: 64MiB         # optional (none): one TCP connection's most bytes in flight
    inference_model: gpt-7b   # optional (gpt-7b): what BubbleTea serves in the bubbles
    request_rate: 100         # optional (100): BubbleTea's requests per second
    dcs:
      - {name: east, gpus: 768}
    links:                    # or a matrix, as in topology files
      - {between: [east, west], rate: 400gbit, delay: 20ms}

A scenario file is told from an experiment file by its ``device`` key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.spec.bubbletea import MAX_REQUEST_RATE, check_model_size
from testbed.spec.devices import DEVICES
from testbed.spec.experiment import SCHEDULES
from testbed.spec.model import ModelConfig
from testbed.spec.model_presets import MODELS
from testbed.spec.scenario import SCENARIO_DC_POOL, SCENARIO_DC_PREFIX, Scenario
from testbed.spec.specfile import REQUIRED, FieldReader, read_spec_file
from testbed.spec.topology_file import parse_topology
from testbed.spec.topology_links import positive_int
from testbed.spec.units import parse_bytes, parse_rate_bps

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "workloads" / "scenarios"
KEYS = (
    "name",
    "description",
    "model",
    "device",
    "tensor_parallel",
    "stages",
    "global_batch",
    "microbatch_size",
    "schedule",
    "recompute",
    "gpu_memory",
    "gpu_nic_rate",
    "tcp_window",
    "inference_model",
    "request_rate",
    "dcs",
    "links",
    "matrix",
)


def is_scenario(data: Any) -> bool:
    """Whether parsed YAML is a scenario (it names a ``device``) rather than an experiment."""
    return isinstance(data, dict) and "device" in data


def _model(source: str, raw: Any, where: str = "model") -> tuple[ModelConfig, str]:
    """A model named (``model_presets.MODELS``) or given as a mapping (16-bit values), and its name."""
    if isinstance(raw, str):
        if raw not in MODELS:
            raise SpecError(source, where, raw, "is not a known model", f"use one of {', '.join(MODELS)} or a mapping")
        return MODELS[raw][0], raw
    keys = ("n_layers", "d_model", "n_heads", "seq_len", "vocab")
    m = FieldReader(source, raw, where, keys, keys)  # every one: the emulator's defaults are tiny
    cfg = ModelConfig(**{k: m.get(k, positive_int, REQUIRED) for k in m.data}, value_bytes=2)
    check_model_size(source, where, cfg)
    return cfg, "custom"


def parse_scenario(data: Any, source: str = "<memory>") -> Scenario:
    """Validate parsed YAML ``data`` into a Scenario. Raises SpecError naming field, value and fix."""
    r = FieldReader(source, data, "", KEYS, ("model", "device", "tensor_parallel", "stages", "global_batch", "dcs"))
    model, model_name = _model(source, data["model"])
    device = data["device"]
    if device not in DEVICES:
        raise r.fail("device", "is not a known device", f"use one of {', '.join(DEVICES)}")
    count = {
        k: r.get(k, positive_int, REQUIRED if k != "microbatch_size" else 1)
        for k in ("tensor_parallel", "stages", "global_batch", "microbatch_size")
    }
    for k, v in count.items():
        if v < 1:
            raise r.fail(k, "is not positive", "use 1 or more")
    t, stages = count["tensor_parallel"], count["stages"]
    if model.n_heads % t:
        raise r.fail(
            "tensor_parallel",
            f"does not divide the model's {model.n_heads} heads",
            "split the heads evenly: use a divisor of n_heads, such as 8",
        )
    if stages > model.n_layers:
        raise r.fail("stages", f"exceeds the model's {model.n_layers} blocks", "use at most one stage per block")
    schedule = data.get("schedule", "1f1b")
    if schedule not in SCHEDULES:
        raise r.fail("schedule", "is not a known schedule", f"use one of {', '.join(SCHEDULES)}")
    recompute = data.get("recompute", False)
    if not isinstance(recompute, bool):
        raise r.fail("recompute", "is not true or false", "write recompute: true for full activation recomputation")
    raw_dcs = data["dcs"]
    if not isinstance(raw_dcs, list) or not raw_dcs:
        raise r.fail("dcs", "is not a non-empty list", "list the DCs: - {name: east, gpus: 512}")
    dcs = []
    for i, raw in enumerate(raw_dcs):
        d = FieldReader(source, raw, f"dcs[{i}]", ("name", "gpus"), ("name", "gpus"))
        gpus = d.get("gpus", positive_int, REQUIRED)
        if gpus < 1 or gpus % t:
            raise d.fail(
                "gpus", f"is not a positive multiple of tensor_parallel ({t})", f"give each DC a multiple of {t} GPUs"
            )
        dcs.append((raw["name"], gpus))
    # the DCs and the WAN are checked as a topology file's (names, links or matrix, connectivity)
    topo_data = {"name": data.get("name", Path(source).stem), "dcs": [{"name": n, "hosts": g // t} for n, g in dcs]}
    for key in ("links", "matrix"):
        if key in data:
            topo_data[key] = data[key]
    topo_data["addressing"] = {"dc_pool": SCENARIO_DC_POOL, "dc_prefix_len": SCENARIO_DC_PREFIX}
    topo = parse_topology(topo_data, source)
    devices = sum(g for _, g in dcs) // t
    if devices % stages:
        raise r.fail(
            "stages",
            f"does not divide the {devices} devices ({sum(g for _, g in dcs)} GPUs / tensor_parallel {t})",
            "use a number of stages that divides them, so that every stage has the same replicas",
        )
    replicas = devices // stages
    per_step = replicas * count["microbatch_size"]
    if count["global_batch"] % per_step:
        raise r.fail(
            "global_batch",
            f"is not a multiple of replicas {replicas} x microbatch_size {count['microbatch_size']} ({per_step})",
            f"use a multiple of {per_step}, such as {per_step * max(1, count['global_batch'] // per_step)}",
        )
    memory = r.get("gpu_memory", parse_bytes)
    nic = r.get("gpu_nic_rate", parse_rate_bps, 200 * 10**9)
    if nic <= 0:
        raise r.fail("gpu_nic_rate", "is not a positive rate", "write e.g. 200gbit")
    window = r.get("tcp_window", parse_bytes)
    if window is not None and window < 1:
        raise r.fail("tcp_window", "is not a positive size", "write e.g. 64MiB, or omit it for no per-connection limit")
    inference, inference_name = _model(source, data.get("inference_model", "gpt-7b"), "inference_model")
    if inference.n_heads % t:
        raise r.fail(
            "inference_model",
            f"has {inference.n_heads} heads, which tensor_parallel {t} does not divide",
            "serve a model whose heads tensor_parallel divides",
        )
    rate = data.get("request_rate", 100.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= MAX_REQUEST_RATE:
        raise r.fail(
            "request_rate",
            f"is not a rate in (0, {MAX_REQUEST_RATE:g}] requests per second",
            "give e.g. request_rate: 100",
        )
    if memory is not None and memory <= 0:
        raise r.fail("gpu_memory", "is not a positive size", "write e.g. 80GB")
    return Scenario(
        name=str(topo_data["name"]),
        model=model,
        model_name=model_name,
        device_name=device,
        dcs=tuple(dcs),
        links=topo.links,
        tensor_parallel=t,
        stages=stages,
        global_batch=count["global_batch"],
        microbatch_size=count["microbatch_size"],
        schedule=schedule,
        recompute=recompute,
        gpu_memory_gb=memory / 1e9 if memory is not None else DEVICES[device].memory_gb,
        gpu_nic_rate_bps=nic,
        tcp_window_bytes=window,
        inference_model=inference,
        inference_model_name=inference_name,
        request_rate=float(rate),
        description=str(data.get("description") or ""),
        source=source,
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load and validate a scenario (a file, or a shipped scenario by name). Raises SpecError."""
    path, data = read_spec_file(name_or_path, SCENARIO_DIR, "scenario")
    return parse_scenario(data, str(path))


def shipped_scenarios() -> list[str]:
    """The names of the scenarios in ``workloads/scenarios``."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def names_scenario(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` is a scenario: a shipped scenario's name, or a file whose top level
    names a ``device`` (an unreadable file is left to the experiment reader's errors)."""
    p = Path(name_or_path)
    if not p.exists():
        return p.parent == Path(".") and (SCENARIO_DIR / (p.name if p.suffix else f"{p.name}.yaml")).exists()
    try:
        _, data = read_spec_file(p, SCENARIO_DIR, "scenario")
    except SpecError:
        return False
    return is_scenario(data)
