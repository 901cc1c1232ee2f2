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
from testbed.spec.addressing import max_hosts_per_dc
from testbed.spec.bubbletea import MAX_REQUEST_RATE, BubbleTeaSpec, check_model_size
from testbed.spec.devices import DEVICES
from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.model import ModelConfig
from testbed.spec.model_presets import MODELS
from testbed.spec.pipeline_schedules import (
    MAX_VIRTUAL_STAGES,
    SCHEDULES,
    chunks_per_worker,
    microbatches_near,
    schedule_problem,
    stages_fitting,
)
from testbed.spec.scenario import SCENARIO_DC_POOL, SCENARIO_DC_PREFIX, Scenario
from testbed.spec.specfile import FieldReader, read_spec_file
from testbed.spec.topology_fields import LINK_FIELDS, MATRIX_FIELDS
from testbed.spec.topology_file import parse_topology

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "workloads" / "scenarios"
#: a scenario's model given as a mapping (16-bit values): every field required, the emulator's
#: defaults being tiny
SCENARIO_MODEL_FIELDS = FieldTable(
    "scenario: model",
    "model",
    "A model given by its shape instead of a name (16-bit values).",
    tuple(
        Field(name, "int", doc, unit, REQUIRED, low=low)
        for name, doc, unit, low in (
            ("n_layers", "transformer blocks", "blocks", 1),
            ("d_model", "width of the residual stream", "", 1),
            ("n_heads", "attention heads", "", 1),
            ("seq_len", "context length", "tokens", 2),
            ("vocab", "vocabulary", "tokens", 1),
        )
    ),
)
SCENARIO_DC_FIELDS = FieldTable(
    "scenario: dcs[i]",
    "dcs[i]",
    "One datacenter of the scenario and its GPUs.",
    (
        Field("name", "text", "the DC's name (as a topology's DC name)", default=REQUIRED),
        Field("gpus", "int", "its GPUs", "GPUs", REQUIRED, low=1, rule="a multiple of `tensor_parallel`"),
    ),
)
SCENARIO_FIELDS = FieldTable(
    "scenario",
    "",
    "A scenario file (`workloads/scenarios/*.yaml`, told from an experiment by its `device` key): a "
    "real-scale job for the simulator, from which the emulated experiment is derived.",
    (
        Field("name", "text", "the scenario's name", default_text="the file's name"),
        Field("description", "text", "a sentence on what it models", default="", default_text="none"),
        Field(
            "model",
            "model",
            f"a named shape ({', '.join(f'`{m}`' for m in MODELS)}) or a mapping",
            default=REQUIRED,
            table=SCENARIO_MODEL_FIELDS.name,
        ),
        Field("device", "choice", "the GPU", default=REQUIRED, choices=tuple(DEVICES)),
        Field(
            "tensor_parallel",
            "int",
            "GPUs of a stage replica, inside a node",
            "GPUs",
            REQUIRED,
            low=1,
            rule="divides the model's heads",
        ),
        Field(
            "stages",
            "int",
            "pipeline stages",
            default=REQUIRED,
            low=1,
            rule="at most the model's blocks; divides the devices (GPUs / `tensor_parallel`)",
        ),
        Field(
            "global_batch",
            "int",
            "sequences per iteration",
            "sequences",
            REQUIRED,
            low=1,
            rule="a multiple of replicas x `microbatch_size`",
        ),
        Field("microbatch_size", "int", "sequences per microbatch", "sequences", 1, low=1),
        Field("schedule", "choice", "the pipeline schedule", default="1f1b", choices=SCHEDULES),
        Field(
            "virtual_stages",
            "int",
            "model chunks (virtual stages) each GPU holds under interleaved-1f1b",
            default_text="2 under interleaved-1f1b",
            low=1,
            high=MAX_VIRTUAL_STAGES,
            rule="interleaved-1f1b only; the model's blocks a multiple of `stages` x it",
        ),
        Field("recompute", "bool", "full activation recomputation", default=False),
        Field("gpu_memory", "size", "each GPU's memory", "bytes", default_text="the device's", low=0, low_open=True),
        Field(
            "gpu_nic_rate",
            "rate",
            "each GPU's link to its DC's fabric",
            "bit/s",
            200 * 10**9,
            low=0,
            low_open=True,
        ),
        Field(
            "tcp_window",
            "size",
            "one TCP connection's most bytes in flight on the WAN",
            "bytes",
            default_text="no per-connection limit",
            low=1,
        ),
        Field(
            "inference_model",
            "model",
            "what BubbleTea serves in the bubbles (a name or a mapping, as `model`)",
            default="gpt-7b",
            rule="`tensor_parallel` divides its heads",
            table=SCENARIO_MODEL_FIELDS.name,
        ),
        Field(
            "request_rate",
            "number",
            "BubbleTea's requests per second",
            "requests/s",
            100.0,
            low=0,
            low_open=True,
            high=MAX_REQUEST_RATE,
        ),
        Field("dcs", "list", "the datacenters", default=REQUIRED, table=SCENARIO_DC_FIELDS.name),
        Field("links", "list", "the WAN links, as in a topology file", table=LINK_FIELDS.name),
        Field("matrix", "section", "the WAN links as a matrix, as in a topology file", table=MATRIX_FIELDS.name),
    ),
)


def is_scenario(data: Any) -> bool:
    """Whether parsed YAML is a scenario (it names a ``device``) rather than an experiment."""
    return isinstance(data, dict) and "device" in data


def _model(source: str, raw: Any, where: str = "model") -> tuple[ModelConfig, str]:
    """A model named (``model_presets.MODELS``) or given as a mapping (16-bit values), and its name."""
    if not isinstance(raw, dict):
        if not isinstance(raw, str) or raw not in MODELS:
            raise SpecError(source, where, raw, "is not a known model", f"use one of {', '.join(MODELS)} or a mapping")
        return MODELS[raw][0], raw
    cfg = ModelConfig(**FieldReader(source, raw, where, SCENARIO_MODEL_FIELDS).values(), value_bytes=2)
    check_model_size(source, where, cfg)
    return cfg, "custom"


def parse_scenario(data: Any, source: str = "<memory>") -> Scenario:
    """Validate parsed YAML ``data`` into a Scenario. Raises SpecError naming field, value and fix."""
    r = FieldReader(source, data, "", SCENARIO_FIELDS)
    model, model_name = _model(source, data["model"])
    device = r.value("device")
    count = {k: r.value(k) for k in ("tensor_parallel", "stages", "global_batch", "microbatch_size")}
    t, stages = count["tensor_parallel"], count["stages"]
    if model.n_heads % t:
        raise r.fail(
            "tensor_parallel",
            f"does not divide the model's {model.n_heads} heads",
            "split the heads evenly: use a divisor of n_heads, such as 8",
        )
    if stages > model.n_layers:
        raise r.fail("stages", f"exceeds the model's {model.n_layers} blocks", "use at most one stage per block")
    schedule, recompute, virtual_stages = r.value("schedule"), r.value("recompute"), r.value("virtual_stages")
    raw_dcs = data["dcs"]
    if not isinstance(raw_dcs, list) or not raw_dcs:
        raise r.fail("dcs", "is not a non-empty list", "list the DCs: - {name: east, gpus: 512}")
    dcs = []
    for i, raw in enumerate(raw_dcs):
        d = FieldReader(source, raw, f"dcs[{i}]", SCENARIO_DC_FIELDS)
        gpus = d.value("gpus")
        if gpus // t > max_hosts_per_dc(SCENARIO_DC_PREFIX):
            raise d.fail(
                "gpus",
                f"makes {gpus // t} devices (tensor_parallel {t} GPUs each), more than one DC's "
                f"/{SCENARIO_DC_PREFIX} subnet holds",
                f"use at most {max_hosts_per_dc(SCENARIO_DC_PREFIX) * t} GPUs per DC",
            )
        if gpus % t:
            raise d.fail(
                "gpus", f"is not a positive multiple of tensor_parallel ({t})", f"give each DC a multiple of {t} GPUs"
            )
        dcs.append((raw["name"], gpus))
    # the DCs and the WAN are checked as a topology file's (names, links or matrix, connectivity)
    topo_data = {"name": r.value("name") or Path(source).stem, "dcs": [{"name": n, "hosts": g // t} for n, g in dcs]}
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
    if count["microbatch_size"] > 1 and per_step > count["global_batch"]:
        raise r.fail(
            "microbatch_size",
            f"times replicas {replicas} exceeds global_batch {count['global_batch']}",
            f"use at most {max(1, count['global_batch'] // replicas)} sequences per microbatch",
        )
    if count["global_batch"] % per_step:
        raise r.fail(
            "global_batch",
            f"is not a multiple of replicas {replicas} x microbatch_size {count['microbatch_size']} ({per_step})",
            f"use a multiple of {per_step}, such as {per_step * max(1, count['global_batch'] // per_step)}",
        )
    memory, nic, window = (r.value(k) for k in ("gpu_memory", "gpu_nic_rate", "tcp_window"))
    inference, inference_name = _model(source, data.get("inference_model", "gpt-7b"), "inference_model")
    if inference.n_heads % t:
        raise r.fail(
            "inference_model",
            f"has {inference.n_heads} heads, which tensor_parallel {t} does not divide",
            "serve a model whose heads tensor_parallel divides",
        )
    output = BubbleTeaSpec.max_output_tokens  # the served context holds a clipped prompt and the output
    if inference.seq_len <= output:
        raise SpecError(
            source,
            "inference_model.seq_len" if isinstance(data.get("inference_model"), dict) else "inference_model",
            inference.seq_len,
            f"leaves no room for a prompt beside the {output} output tokens BubbleTea decodes",
            f"serve a model whose context (seq_len) is above {output}",
        )
    rate = r.value("request_rate")
    sc = Scenario(
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
        virtual_stages=virtual_stages,
        recompute=recompute,
        gpu_memory_gb=memory / 1e9 if memory is not None else DEVICES[device].memory_gb,
        gpu_nic_rate_bps=nic,
        tcp_window_bytes=window,
        inference_model=inference,
        inference_model_name=inference_name,
        request_rate=float(rate),
        description=r.value("description"),
        source=source,
    )
    return _check_schedule(r, sc)


def _check_schedule(r: FieldReader, sc: Scenario) -> Scenario:
    """``sc``, or SpecError where its schedule breaks a rule of its layout (``schedule_problem``),
    named as a scenario gives it: the microbatches through ``global_batch``, the blocks through its
    ``stages`` (a named model's blocks are fixed)."""
    problem = schedule_problem(sc.schedule, sc.stages, sc.microbatches, sc.virtual_stages, sc.model.n_layers)
    if problem is None:
        return sc
    field, _, text, fix = problem
    if field == "microbatches":
        per = sc.replicas * sc.microbatch_size
        batches = [f"{m * per} ({m} microbatches)" for m in microbatches_near(sc.stages, sc.microbatches) if m]
        raise r.fail(
            "global_batch",
            f"gives {sc.microbatches} microbatches per replica, which {text}",
            f"use a global_batch of {' or '.join(batches)}, or another schedule",
        )
    if field == "model.n_layers":
        chunks = chunks_per_worker(sc.schedule, sc.virtual_stages)
        fits = stages_fitting(sc.model.n_layers, chunks)
        raise r.fail(
            "stages",
            f"x {chunks} virtual stages do not split the model's {sc.model.n_layers} blocks evenly under {sc.schedule}",
            f"use {' or '.join(map(str, fits[-3:]))} stages, or another schedule",
        )
    raise r.fail(field, text, fix)


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
