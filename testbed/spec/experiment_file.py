"""Reading experiment files into :class:`experiment.Experiment`: every field checked at load time,
every error naming the file, the field, the value and the fix.

A relative ``topology:`` path resolves against the experiment file's own folder (as inventory
paths do), not the working folder; a bare name such as ``three_dc`` that is no file there names a
shipped topology. ``data:`` and ``bubbletea.requests`` resolve against that folder too.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.errors import SpecError
from testbed.spec.bubbletea import BUBBLETEA_FIELDS, BubbleTeaSpec, served_model
from testbed.spec.compute import COMPUTE_FIELDS, DEVICE_FIELDS, ComputeModel, DeviceModel, resolve_compute
from testbed.spec.experiment import Experiment, check_experiment, resolve_policy
from testbed.spec.experiment_fields import EXPERIMENT_FIELDS
from testbed.spec.model import MODEL_FIELDS, ModelConfig
from testbed.spec.specfile import FieldReader, read_spec_file
from testbed.spec.topology import TopologySpec
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology

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


def parse_experiment(data: Any, source: str = "<memory>", topology: TopologySpec | None = None) -> Experiment:
    """Validate parsed YAML into an Experiment, each mapping by its table (``EXPERIMENT_FIELDS``,
    ``COMPUTE_FIELDS``, ``DEVICE_FIELDS``, ``MODEL_FIELDS``, ``BUBBLETEA_FIELDS``); ``topology``:
    the topology ``data["topology"]`` stands for, already loaded (default: loaded from the name or
    path written). Raises SpecError naming field, value and fix."""
    r = FieldReader(source, data, "", EXPERIMENT_FIELDS)
    kw: dict[str, Any] = {
        **{k: v for k, v in r.values().items() if k not in ("name", "description", "policy")},
        "name": r.value("name") or Path(source).stem,
        "source": source,
        "topology": str(data["topology"]),
        "topology_spec": topology or experiment_topology(source, data["topology"]),
    }
    if data.get("data") is not None:
        kw["data"] = experiment_data(source, data["data"])
    if data.get("policy") is not None:
        kw["policy"] = resolve_policy(source, r.value("policy"))
    if "model" in data:
        kw["model"] = _parse_model(source, data["model"], "model")
    if "compute" in data:
        c = FieldReader(source, data["compute"], "compute", COMPUTE_FIELDS)
        ckw = c.values()
        if "device" in c.data:
            d = FieldReader(source, c.data["device"], "compute.device", DEVICE_FIELDS)
            ckw["device"] = DeviceModel(**d.values())
        kw["compute"] = resolve_compute(source, ComputeModel(**ckw))
    if "bubbletea" in data:
        kw["bubbletea"] = _parse_bubbletea(source, data["bubbletea"], kw.get("model", ModelConfig()))
    exp = Experiment(**kw)
    check_experiment(exp)
    return exp


def _parse_model(source: str, data: Any, where: str, defaults: ModelConfig | None = None) -> ModelConfig:
    """A model section; fields it omits come from ``defaults`` (the training model's otherwise)."""
    return replace(defaults or ModelConfig(), **FieldReader(source, data, where, MODEL_FIELDS).values())


def _parse_bubbletea(source: str, data: Any, training: ModelConfig) -> BubbleTeaSpec:
    """The BubbleTea section; a partial ``model`` takes its other fields from the served default,
    the training model's shape (``served_model``)."""
    b = FieldReader(source, data, "bubbletea", BUBBLETEA_FIELDS)
    kw: dict[str, Any] = b.values()
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
    if "model" in b.data:
        default = served_model(BubbleTeaSpec(**kw), training)
        kw["model"] = _parse_model(source, b.data["model"], "bubbletea.model", default)
    return BubbleTeaSpec(**kw)


def shipped_experiments() -> list[str]:
    """The names of the experiments in ``workloads/``."""
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))


def load_experiment(name_or_path: str | Path | None = None) -> Experiment:
    """Load and validate an experiment file (default: the shipped ``default`` experiment) with its
    topology. Raises SpecError."""
    path, data = read_spec_file(name_or_path or DEFAULT_EXPERIMENT, WORKLOAD_DIR, "experiment")
    return parse_experiment(data, str(path))
