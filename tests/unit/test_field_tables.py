"""The description files' field tables (``spec/fields.py``): every value a user may write wrong, in
every field of every file format, is refused with a SpecError naming the field written (never a
traceback, never another field); the tables' defaults are the descriptions' own."""

from __future__ import annotations

import copy
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.errors import SpecError
from testbed.net.remote.inventory import INVENTORY_FIELDS, parse_inventory
from testbed.net.remote.machine import MACHINE_FIELDS, Machine
from testbed.spec.bubbletea import BUBBLETEA_FIELDS, BubbleTeaSpec
from testbed.spec.compute import COMPUTE_FIELDS, DEVICE_FIELDS, ComputeModel
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_fields import EXPERIMENT_FIELDS
from testbed.spec.experiment_file import WORKLOAD_DIR, parse_experiment
from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.model import MODEL_FIELDS, ModelConfig
from testbed.spec.scenario import Scenario
from testbed.spec.scenario_file import SCENARIO_DC_FIELDS, SCENARIO_FIELDS, SCENARIO_MODEL_FIELDS, parse_scenario
from testbed.spec.topology import DCSpec, LinkSpec, TopologySpec
from testbed.spec.topology_fields import ADDRESSING_FIELDS, DC_FIELDS, LINK_FIELDS, TOPOLOGY_FIELDS
from testbed.spec.topology_file import TOPOLOGY_DIR, parse_topology

#: what a user may write wrong in any field: negative, zero, a word, absurdly large, a list, a
#: mapping, a truth value, nothing
BAD_VALUES = (-1, 0, "x y!", 10**12, [1], {"a": 1}, True, None, 1e300)


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _set(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(data)
    here = out
    for step in path[:-1]:
        here = here[step]
    here[path[-1]] = value
    return out


def _dotted(path: tuple[Any, ...]) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


#: (file format, parser, a valid file, the mappings in it: (path to the mapping, its table))
FORMATS = [
    (
        "experiment",
        lambda d: parse_experiment(d, "x.yaml"),
        {
            "topology": "three_dc",
            "policy": "atlas+bubbletea",
            "model": {"n_layers": 6},
            "compute": {
                "forward_ms": 40,
                "reference_forward_tflop": 0.02,
                "device": {"name": "a", "peak_tflops": 1, "efficiency": 0.5, "source": "s"},
            },
            "bubbletea": {"request_rate": 2, "model": {"n_layers": 2}},
        },
        [
            ((), EXPERIMENT_FIELDS),
            (("model",), MODEL_FIELDS),
            (("compute",), COMPUTE_FIELDS),
            (("compute", "device"), DEVICE_FIELDS),
            (("bubbletea",), BUBBLETEA_FIELDS),
            (("bubbletea", "model"), MODEL_FIELDS),
        ],
    ),
    (
        "topology",
        lambda d: parse_topology(d, "x.yaml"),
        {**_yaml(TOPOLOGY_DIR / "three_dc.yaml"), "addressing": {"dc_prefix_len": 24}},
        [
            ((), TOPOLOGY_FIELDS),
            (("dcs", 0), DC_FIELDS),
            (("links", 0), LINK_FIELDS),
            (("addressing",), ADDRESSING_FIELDS),
        ],
    ),
    (
        "scenario",
        lambda d: parse_scenario(d, "x.yaml"),
        {
            **_yaml(WORKLOAD_DIR / "scenarios" / "gpt3_175b_2dc.yaml"),
            "model": {"n_layers": 96, "d_model": 12288, "n_heads": 96, "seq_len": 2048, "vocab": 51200},
        },
        [((), SCENARIO_FIELDS), (("dcs", 0), SCENARIO_DC_FIELDS), (("model",), SCENARIO_MODEL_FIELDS)],
    ),
    (
        "inventory",
        lambda d: parse_inventory(d, "x.yaml", Path("/")),
        {"machines": [{"name": "m0", "address": "192.0.2.10", "user": "root", "dcs": ["east"]}]},
        [((), INVENTORY_FIELDS), (("machines", 0), MACHINE_FIELDS)],
    ),
]

CASES = [
    pytest.param(parse, base, (*where, f.name), value, id=f"{name}:{_dotted((*where, f.name))}={value!r}"[:90])
    for name, parse, base, mappings in FORMATS
    for where, table in mappings
    for f in table.fields
    for value in BAD_VALUES
]


@pytest.mark.parametrize("parse, base, path, value", CASES)
def test_a_wrong_value_is_refused_naming_the_field_written(parse, base, path, value):
    parse(base)  # the file itself is valid
    try:
        parse(_set(base, path, value))
    except SpecError as e:
        written = _dotted(path)
        # the field written is named; or, for a rule between fields, the message names it beside
        # the other; or the value was empty (null), which leaves the field to its default
        names = e.field == written or e.field.startswith((written + ".", written + "["))
        assert names or path[-1] in e.problem or value is None, str(e)
        assert e.fix and e.problem, str(e)


@pytest.mark.parametrize("value", [[1], {"a": 1}, 10**12, "x"])
def test_a_scenario_names_the_device_and_the_batch_the_user_wrote(value):
    # tried as a new user would: device: [a100] ended in a TypeError traceback
    base = _yaml(WORKLOAD_DIR / "scenarios" / "gpt3_175b_2dc.yaml")
    with pytest.raises(SpecError) as e:
        parse_scenario({**base, "device": value}, "x.yaml")
    assert e.value.field == "device" and "a100" in e.value.fix


def test_a_scenario_of_many_replicas_keeps_a_floor_below_one_over_replicas():
    # 20 replicas met the experiments' 5% floor (1/20): every policy of a large batch was
    # reported infeasible with atlas_floor_share, a field no scenario has
    from testbed.sim.scenario import simulate_scenario

    base = _yaml(WORKLOAD_DIR / "scenarios" / "gpt_7b_5dc.yaml")
    sc = parse_scenario({**base, "global_batch": 20 * 10**6}, "x.yaml")
    assert sc.replicas == 20 and sc.atlas_floor_share < 1 / sc.replicas
    assert simulate_scenario(sc, "pp-fair").iteration_time_s > 0


def _class_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


#: (table, the description it fills, the attribute each field becomes where the names differ)
DESCRIBED = [
    (EXPERIMENT_FIELDS, Experiment, {}),
    (MODEL_FIELDS, ModelConfig, {}),
    (COMPUTE_FIELDS, ComputeModel, {}),
    (BUBBLETEA_FIELDS, BubbleTeaSpec, {}),
    (DC_FIELDS, DCSpec, {"intra_rate": "intra_rate_bps", "intra_delay": "intra_delay_us"}),
    (LINK_FIELDS, LinkSpec, {"rate": "rate_bps", "delay": "delay_us", "jitter": "jitter_us", "loss": "loss_pct"}),
    (LINK_FIELDS, LinkSpec, {"queue": "queue_packets"}),
    (TOPOLOGY_FIELDS, TopologySpec, {}),
    (ADDRESSING_FIELDS, TopologySpec, {}),
    (SCENARIO_FIELDS, Scenario, {"gpu_nic_rate": "gpu_nic_rate_bps", "tcp_window": "tcp_window_bytes"}),
    (MACHINE_FIELDS, Machine, {}),
]


@pytest.mark.parametrize("table, cls, renamed", DESCRIBED, ids=lambda x: getattr(x, "name", None))
def test_each_tables_defaults_are_its_descriptions_own(table: FieldTable, cls: type, renamed: dict[str, str]):
    defaults = _class_defaults(cls)
    checked = 0
    for f in table.fields:
        attr = renamed.get(f.name, f.name)
        if f.required or attr not in defaults or f.kind in ("section", "list", "model"):
            continue
        if attr == "policy":
            defaults[attr] = defaults[attr].name
        if f.default is None and f.default_text:  # unset, in words ("unclipped", "no cap")
            assert defaults[attr] is None, (table.name, f.name, defaults[attr])
        else:
            assert f.default == defaults[attr], (table.name, f.name, f.default, defaults[attr])
        checked += 1
    assert checked > 0


def test_a_field_is_checked_against_its_kind_and_range():
    share = Field("share", "number", "a share", low=0, low_open=True, high=1)
    assert share.problem(0.5) == "" and share.problem(1) == ""
    assert share.problem(0) == "is not in (0, 1]" and share.problem(float("nan")) == "is not a finite number"
    assert share.problem("0.5") == "is not a number" and share.problem(True) == "is not a number"
    count = Field("count", "int", "a count", default=REQUIRED, low=1)
    assert count.required and count.problem(0) == "is below 1" and count.problem(2.0) == "is not a whole number"
    delay = Field("delay", "duration", "a delay", high=10_000_000)
    assert delay.range_text() == "at most 10s" and delay.problem(11_000_000) == "is above 10s"
    with pytest.raises(ValueError, match="unknown kind"):
        Field("x", "colour", "no such kind")
    with pytest.raises(ValueError, match="listed twice"):
        FieldTable("t", "", "", (count, count))
