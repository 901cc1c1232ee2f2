"""Experiment files: loading, validation messages (field, value, fix), placement on a topology."""

import copy
import json

import pytest

from testbed.errors import SpecError
from testbed.plan.placement import place
from testbed.spec.compute import ComputeModel, compute_from_dict
from testbed.spec.experiment import Experiment
from testbed.spec.experiment_file import WORKLOAD_DIR, load_experiment, parse_experiment
from testbed.spec.model import ModelConfig
from testbed.spec.topology_file import load_topology, parse_topology

SOURCE = "x.yaml"
BASE = {
    "name": "t",
    "topology": "two_dc",
    "schedule": "gpipe",
    "iterations": 4,
    "warmup_iterations": 1,
    "stages": 2,
    "replicas": 1,
    "microbatches": 2,
    "microbatch_size": 2,
    "model": {"n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 16},
}


def data(**over):
    d = copy.deepcopy(BASE)
    d.update(over)
    return d


def spec_error(d) -> SpecError:
    with pytest.raises(SpecError) as e:
        parse_experiment(d, SOURCE)
    return e.value


def assert_names(err: SpecError, field: str, value, fix_words: str):
    msg = str(err)
    assert msg.startswith(f"{SOURCE}: "), msg
    assert f": {field}: " in msg, msg
    assert err.field == field and err.value == value, msg
    assert repr(value) in msg, msg
    assert fix_words in msg.partition("; ")[2], msg


def topo(*hosts):
    """DCs d0, d1, ... with the given host counts, joined in a chain."""
    names = [f"d{i}" for i in range(len(hosts))]
    return parse_topology(
        {
            "name": "t",
            "dcs": [{"name": n, "hosts": h} for n, h in zip(names, hosts)],
            "links": [{"between": [a, b], "rate": "100mbit", "delay": "5ms"} for a, b in zip(names, names[1:])],
        }
    )


# ---- shipped and valid files -----------------------------------------------------------------


def test_shipped_default_loads():
    exp = load_experiment()
    assert exp.source == str(WORKLOAD_DIR / "default.yaml")
    assert (exp.name, exp.topology, exp.schedule) == ("default", "three_dc", "1f1b")
    assert (exp.stages, exp.replicas, exp.microbatches, exp.microbatch_size) == (3, 2, 4, 2)
    assert (exp.iterations, exp.warmup_iterations) == (8, 2)
    assert exp.model == ModelConfig(n_layers=6, d_model=128, n_heads=4, seq_len=64)
    assert exp.compute == ComputeModel(mode="padded", forward_ms=40.0, backward_ms=80.0)
    assert exp.wan_connection_share == 0.2
    assert exp.global_batch == 2 * 4 * 2 and exp.tokens_per_iteration == 16 * 64
    assert load_experiment("default") == exp
    # and it fits its topology
    workers = place(exp, load_topology(exp.topology))
    assert [w.dc for w in workers] == ["east", "east", "central", "central", "west", "west"]


def test_parse_valid_and_defaults(tmp_path):
    exp = parse_experiment({"topology": "two_dc"}, "some/dir/myexp.yaml")
    assert exp.name == "myexp"  # from the file name
    assert exp == Experiment(name="myexp", topology="two_dc", source="some/dir/myexp.yaml")
    (tmp_path / "x.txt").write_text("text")
    exp = parse_experiment(data(lr=0.01, seed=3, data=str(tmp_path / "x.txt"), policy="dp-wan"), SOURCE)
    assert (exp.lr, exp.seed, exp.data, exp.policy.name) == (0.01, 3, str(tmp_path / "x.txt"), "dp-wan")
    assert exp.policy.placement == "replica-per-dc" and not exp.policy.striping and not exp.policy.grants


def test_missing_shipped_name_lists_choices():
    with pytest.raises(SpecError) as e:
        load_experiment("no_such_experiment")
    assert "default" in str(e.value).partition("; ")[2]


# ---- validation ------------------------------------------------------------------------------


def test_unknown_schedule():
    assert_names(spec_error(data(schedule="zigzag")), "schedule", "zigzag", "use one of gpipe, 1f1b")


def test_stages_more_than_layers():
    err = spec_error(data(stages=5, model={"n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 16}))
    assert_names(err, "stages", 5, "at most one stage per block")
    assert "n_layers (4)" in str(err)


def test_heads_must_divide_d_model():
    err = spec_error(data(model={"n_layers": 4, "d_model": 30, "n_heads": 4, "seq_len": 16}))
    assert_names(err, "model.n_heads", 4, "divide d_model")
    assert "(30)" in str(err)


@pytest.mark.parametrize("key", ["microbatches", "iterations", "stages", "replicas", "microbatch_size"])
def test_counts_must_be_positive(key):
    assert_names(spec_error(data(**{key: 0})), key, 0, "use 1 or more")


@pytest.mark.parametrize("warmup", [4, 5, -1])
def test_warmup_below_iterations(warmup):
    assert_names(
        spec_error(data(warmup_iterations=warmup)), "warmup_iterations", warmup, "at least one iteration after warm-up"
    )
    parse_experiment(data(warmup_iterations=3), SOURCE)  # iterations - 1 is fine


@pytest.mark.parametrize(
    "where, key, suggestion",
    [
        ((), "microbatch", "microbatches"),
        ((), "schedul", "schedule"),
        (("model",), "n_layer", "n_layers"),
        (("compute",), "forward", "forward_ms"),
    ],
)
def test_unknown_key_suggests_the_close_one(where, key, suggestion):
    d = data(compute={"mode": "padded"})
    target = d
    for w in where:
        target = target[w]
    target[key] = 3
    field = ".".join(where + (key,))
    assert_names(spec_error(d), field, key, f"did you mean {suggestion!r}?")


def test_unknown_key_without_close_one_lists_allowed():
    err = spec_error(data(zzzz=1))
    assert_names(err, "zzzz", "zzzz", "allowed keys are")
    assert "microbatches" in str(err)


def test_missing_topology():
    d = data()
    del d["topology"]
    err = spec_error(d)
    assert err.field == "topology" and "is missing" in str(err)


def test_wrong_types_name_the_field():
    for value in (2.5, True, "2"):
        err = spec_error(data(stages=value))
        assert_names(err, "stages", value, "write a count such as 4")
        assert "is not a whole number" in str(err)
    err = spec_error(data(lr="fast"))
    assert_names(err, "lr", "fast", "write e.g. 0.0003")
    assert "is not a number" in str(err)
    assert_names(spec_error(data(lr=2.0)), "lr", 2.0, "0.0003")
    assert_names(spec_error(data(compute={"mode": "gpu"})), "compute.mode", "gpu", "padded")
    assert_names(spec_error(data(compute={"forward_ms": 0})), "compute.forward_ms", 0, "above 0 ms")
    assert_names(spec_error(data(compute={"optimizer_ms": -1})), "compute.optimizer_ms", -1, "above 0 ms")
    assert_names(spec_error(data(compute={"optimizer_ms": float("inf")})), "compute.optimizer_ms", float("inf"), "0 ms")
    assert_names(spec_error(data(compute={"backward_ms": float("inf")})), "compute.backward_ms", float("inf"), "0 ms")


def test_the_optimizer_target_defaults_to_one_forward_and_survives_the_record():
    exp = parse_experiment(data(compute={"forward_ms": 30, "backward_ms": 60}), SOURCE)
    assert exp.compute.optimizer_ms is None and exp.compute.optimizer_target_ms == 30
    exp = parse_experiment(data(compute={"forward_ms": 30, "backward_ms": 60, "optimizer_ms": 12}), SOURCE)
    assert exp.compute.optimizer_target_ms == 12
    assert Experiment.from_dict(json.loads(json.dumps(exp.to_dict()))).compute == exp.compute
    old = {k: v for k, v in exp.to_dict()["compute"].items() if k != "optimizer_ms"}  # a record from before
    assert compute_from_dict(old).optimizer_target_ms == 30


DEVICE = {"name": "H100 SXM", "peak_tflops": 989.0, "efficiency": 0.4, "source": "datasheet"}


def test_device_without_reference_flops():
    err = spec_error(data(compute={"device": DEVICE}))
    assert err.field == "compute.reference_forward_tflop" and "is missing or not positive while compute.device" in str(
        err
    )
    assert "TFLOP" in str(err).partition("; ")[2]


@pytest.mark.parametrize("missing", ["peak_tflops", "efficiency", "source", "name"])
def test_device_fields_required(missing):
    device = {k: v for k, v in DEVICE.items() if k != missing}
    err = spec_error(data(compute={"device": device, "reference_forward_tflop": 1.0}))
    assert err.field == f"compute.device.{missing}"


@pytest.mark.parametrize("tflop, peak, eff", [(0.5, 989.0, 0.4), (2.0, 312.0, 0.5), (0.04, 100.0, 1.0)])
def test_device_derived_targets(tflop, peak, eff):
    exp = parse_experiment(
        data(
            compute={
                "device": {**DEVICE, "peak_tflops": peak, "efficiency": eff},
                "reference_forward_tflop": tflop,
                "forward_ms": 1.0,
            }
        ),
        SOURCE,
    )
    fwd_ms = tflop / (peak * eff) * 1000  # TFLOP over TFLOP/s, in ms
    assert exp.compute.forward_ms == pytest.approx(fwd_ms)
    assert exp.compute.backward_ms == pytest.approx(2 * fwd_ms)
    assert exp.compute.device.peak_tflops == peak and exp.compute.reference_forward_tflop == tflop


# ---- with_overrides --------------------------------------------------------------------------


def test_with_overrides_replaces_and_revalidates():
    exp = parse_experiment(data(), SOURCE)
    new = exp.with_overrides(schedule="1f1b", iterations=None, microbatches=8)
    assert (new.schedule, new.iterations, new.microbatches) == ("1f1b", exp.iterations, 8)
    assert exp.schedule == "gpipe"  # the original is unchanged
    with pytest.raises(SpecError) as e:
        exp.with_overrides(schedule="zigzag")
    assert e.value.field == "schedule"
    with pytest.raises(SpecError) as e:
        exp.with_overrides(stages=9)
    assert e.value.field == "stages"
    with pytest.raises(SpecError) as e:
        exp.with_overrides(iterations=1)  # warm-up 1 no longer below iterations
    assert e.value.field == "warmup_iterations"


# ---- placement -------------------------------------------------------------------------------


def check_layout(exp, t, workers):
    assert len(workers) == exp.stages * exp.replicas
    assert [w.rank for w in workers] == list(range(len(workers)))
    dc_order = [dc.name for dc in t.dcs]
    for w in workers:
        assert w.rank == w.stage * exp.replicas + w.replica
        assert w.host.startswith(f"{w.dc}-h")
        assert int(w.host.rsplit("-h", 1)[1]) < t.dc(w.dc).hosts  # a host that exists
    assert len({w.host for w in workers}) == len(workers)  # one worker per host
    stage_dc = {}
    for w in workers:
        stage_dc.setdefault(w.stage, set()).add(w.dc)
    assert all(len(d) == 1 for d in stage_dc.values()), "a stage's replicas span DCs"
    order = [dc_order.index(stage_dc[s].pop()) for s in range(exp.stages)]
    assert order == sorted(order), "stages are not on DCs in file order"


@pytest.mark.parametrize(
    "hosts, stages, replicas, expect_dcs",
    [
        ((4, 2), 3, 2, ["d0", "d0", "d1"]),
        ((2, 2, 2), 3, 2, ["d0", "d1", "d2"]),
        ((1, 2), 1, 2, ["d1"]),  # d0 cannot hold a stage of two replicas
        ((3, 3), 4, 1, ["d0", "d0", "d0", "d1"]),
        ((5, 4), 4, 2, ["d0", "d0", "d1", "d1"]),  # d0's fifth host stays unused
        ((8,), 2, 3, ["d0", "d0"]),
    ],
)
def test_place_consecutive_stages_on_dcs_in_order(hosts, stages, replicas, expect_dcs):
    t = topo(*hosts)
    exp = parse_experiment(
        data(stages=stages, replicas=replicas, model={"n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 16}),
        SOURCE,
    )
    workers = place(exp, t)
    check_layout(exp, t, workers)
    assert [next(w.dc for w in workers if w.stage == s) for s in range(stages)] == expect_dcs


def test_place_hosts_by_hand():
    exp = parse_experiment(data(stages=3, replicas=2), SOURCE)
    got = [(w.rank, w.stage, w.replica, w.host) for w in place(exp, topo(4, 2))]
    assert got == [
        (0, 0, 0, "d0-h0"),
        (1, 0, 1, "d0-h1"),
        (2, 1, 0, "d0-h2"),
        (3, 1, 1, "d0-h3"),
        (4, 2, 0, "d1-h0"),
        (5, 2, 1, "d1-h1"),
    ]


@pytest.mark.parametrize(
    "hosts, stages, replicas, held",
    [
        ((2, 2), 3, 2, 2),
        ((3, 3), 3, 2, 2),  # 3 hosts hold one stage of 2 replicas each
        ((1, 1), 1, 2, 0),
    ],
)
def test_place_refuses_what_does_not_fit(hosts, stages, replicas, held):
    exp = parse_experiment(data(stages=stages, replicas=replicas), SOURCE)
    with pytest.raises(SpecError) as e:
        place(exp, topo(*hosts))
    msg = str(e.value)
    assert e.value.field == "stages" and f"only {held} stages" in msg
    assert "fewer stages or replicas" in msg.partition("; ")[2]


@pytest.mark.parametrize(
    "compute, field",
    [
        ({"forward_ms": None}, "compute.forward_ms"),
        ({"device": {**DEVICE, "efficiency": 0}, "reference_forward_tflop": 1.0}, "compute.device.efficiency"),
        ({"device": {**DEVICE, "peak_tflops": 0}, "reference_forward_tflop": 1.0}, "compute.device.peak_tflops"),
    ],
)
def test_bad_compute_values_name_their_field(compute, field):
    assert spec_error(data(compute=compute)).field == field


@pytest.mark.parametrize(
    "model, field",
    [
        ({"n_heads": 0}, "model.n_heads"),
        ({"seq_len": 0}, "model.seq_len"),
        ({"n_layers": None}, "model.n_layers"),
        ({"d_model": 0}, "model.d_model"),
    ],
)
def test_bad_model_sizes_name_their_field(model, field):
    assert spec_error(data(model=model)).field == field


def test_null_iterations_is_an_error():
    assert spec_error(data(iterations=None)).field == "iterations"


def test_a_relative_topology_path_is_taken_from_the_experiment_files_folder(tmp_path, monkeypatch):
    """An experiment beside its own topology file loads from any working folder; a shipped name
    still names a shipped topology; a path that is not there is refused, naming the field."""
    folder = tmp_path / "study"
    (folder / "nets").mkdir(parents=True)
    (folder / "nets" / "mine.yaml").write_text(
        "name: mine\ndcs: [{name: a, hosts: 4}, {name: b, hosts: 4}]\n"
        "links: [{between: [a, b], rate: 50mbit, delay: 7ms}]\n"
    )
    (folder / "corpus.txt").write_text("some text to train on")
    (folder / "exp.yaml").write_text("topology: nets/mine.yaml\nstages: 2\ndata: corpus.txt\n")
    (folder / "shipped.yaml").write_text("topology: two_dc\nstages: 2\n")
    (folder / "missing.yaml").write_text("topology: nets/none.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    exp = load_experiment(folder / "exp.yaml")
    assert exp.topology == "nets/mine.yaml" and exp.topology_spec.name == "mine"
    assert exp.topology_spec.links[0].delay_us == 7000 and exp.data == str(folder / "corpus.txt")
    assert exp.to_dict()["topology_spec"]["source"] == str(folder / "nets" / "mine.yaml")
    assert load_experiment(folder / "shipped.yaml").topology_spec.name == "two_dc"
    with pytest.raises(SpecError) as e:
        load_experiment(folder / "missing.yaml")
    assert e.value.field == "topology" and str(folder / "nets" / "none.yaml") in str(e.value)
    assert "relative to the experiment file's folder" in e.value.fix
    (folder / "nodata.yaml").write_text("topology: two_dc\ndata: nowhere.txt\n")
    with pytest.raises(SpecError, match=r"data: 'nowhere.txt' does not exist \(looked for .*study/nowhere.txt\)"):
        load_experiment(folder / "nodata.yaml")
