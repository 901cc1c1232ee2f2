"""Topology loading and validation: every error names the file, the field, the value and a fix."""

import copy

import pytest

from testbed.errors import SpecError
from testbed.spec.addressing import max_hosts_per_dc
from testbed.spec.topology import DEFAULT_QUEUE_PACKETS, IFNAME_MAX, MAX_DELAY_US, WAN_IFNAME_PREFIX
from testbed.spec.topology_file import TOPOLOGY_DIR, load_topology, parse_topology

SOURCE = "x.yaml"


def two_dc(**link_extra):
    """A valid two-DC topology as parsed YAML; ``link_extra`` overrides fields of its one link."""
    link = {"between": ["east", "west"], "rate": "100mbit", "delay": "20ms", **link_extra}
    return {"dcs": [{"name": "east", "hosts": 2}, {"name": "west", "hosts": 2}], "links": [link]}


def matrix_dc(rate, delay):
    return {
        "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "matrix": {"dcs": ["a", "b"], "rate": rate, "delay": delay},
    }


def spec_error(data) -> SpecError:
    with pytest.raises(SpecError) as e:
        parse_topology(data, source=SOURCE)
    return e.value


def assert_names_everything(err: SpecError, field: str, value, fix_words: str):
    msg = str(err)
    assert msg.startswith(f"{SOURCE}: "), msg
    assert f": {field}: " in msg, msg
    assert repr(value) in msg, msg
    assert fix_words in msg.partition("; ")[2], msg  # the fix follows the problem


# ---- shipped files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, dcs, links",
    [
        ("two_dc", ["east", "west"], 1),
        ("three_dc", ["east", "central", "west"], 3),
        ("four_dc_mesh", ["us-east", "us-west", "eu", "asia"], 6),  # full mesh of 4: 4*3/2 links
    ],
)
def test_shipped_topologies_load(name, dcs, links):
    spec = load_topology(name)
    assert spec.name == name
    assert [dc.name for dc in spec.dcs] == dcs
    assert len(spec.links) == links
    assert spec.source == str(TOPOLOGY_DIR / f"{name}.yaml")
    assert all(link.queue_packets == DEFAULT_QUEUE_PACKETS for link in spec.links)


def test_shipped_three_dc_figures():
    spec = load_topology("three_dc")
    assert spec.link_between("west", "east").delay_us == 30 * 1000
    assert spec.link_between("east", "west").rate_bps == 50 * 10**6
    assert spec.host_count == 3 * 3


def test_shipped_matrix_becomes_links():
    spec = load_topology("four_dc_mesh")
    link = spec.link_between("asia", "us-east")
    assert (link.rate_bps, link.delay_us) == (50 * 10**6, 35 * 1000)
    assert spec.link_between("us-west", "eu").rate_bps == 50 * 10**6


def test_load_by_path(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(
        "dcs: [{name: a, hosts: 1}, {name: b, hosts: 3}]\n"
        "links: [{between: [a, b], rate: 10mbit, delay: 5ms, loss: 0.5%, jitter: 1ms, queue: 50}]\n"
    )
    spec = load_topology(f)
    assert spec.name == "mine"  # no 'name:': the file's stem
    link = spec.links[0]
    assert (link.loss_pct, link.jitter_us, link.queue_packets) == (0.5, 1000, 50)


def test_missing_file():
    with pytest.raises(SpecError) as e:
        load_topology("no_such_topology")
    msg = str(e.value)
    assert "'no_such_topology'" in msg and "does not exist" in msg
    for shipped in ("two_dc", "three_dc", "four_dc_mesh"):
        assert shipped in msg  # the fix lists the shipped names


# ---- validation of links --------------------------------------------------------------------


def test_unknown_dc_in_link():
    err = spec_error(two_dc(between=["east", "wesst"]))
    assert_names_everything(err, "links[0].between", ["east", "wesst"], "did you mean 'west'?")
    assert "'wesst'" in err.problem


@pytest.mark.parametrize("second", [["east", "west"], ["west", "east"]])
def test_duplicate_link_either_order(second):
    data = two_dc()
    data["links"].append({"between": second, "rate": "10mbit", "delay": "5ms"})
    err = spec_error(data)
    assert_names_everything(err, "links[1].between", second, "one link per DC pair")
    assert "links[0]" in err.problem


@pytest.mark.parametrize(
    "key, value, fix",
    [
        ("rate", "0mbit", "above 0"),
        ("rate", "-10mbit", "zero or more"),
        ("delay", "11s", "between 0ms and 10s"),
        ("delay", "-5ms", "zero or more"),
        ("loss", "100%", "up to (not including) 100%"),
        ("loss", "150%", "up to (not including) 100%"),
        ("loss", "-1%", "such as 0.1%"),
        ("rate", "100mbps", "write 'mbit' for megabits"),
        ("rate", "100", "100mbit"),
        ("queue", 0, "number of packets"),
    ],
)
def test_bad_link_field(key, value, fix):
    err = spec_error(two_dc(**{key: value}))
    assert_names_everything(err, f"links[0].{key}", value, fix)


def test_delay_limit_is_inclusive():
    assert MAX_DELAY_US == 10 * 10**6
    assert parse_topology(two_dc(delay="10s")).links[0].delay_us == MAX_DELAY_US


def test_jitter_above_delay():
    err = spec_error(two_dc(delay="2ms", jitter="3ms"))
    assert_names_everything(err, "links[0].jitter", "3ms", "no larger than the delay")
    # equal is allowed: the delay then ranges from 0 to twice its value
    assert parse_topology(two_dc(delay="2ms", jitter="2ms")).links[0].jitter_us == 2000


def test_unknown_key_suggests_the_close_one():
    err = spec_error(two_dc(dealy="5ms"))
    assert_names_everything(err, "links[0].dealy", "dealy", "did you mean 'delay'?")
    data = two_dc()
    data["lnks"] = data.pop("links")
    assert_names_everything(spec_error(data), "lnks", "lnks", "did you mean 'links'?")


# ---- validation of DCs and the address plan -------------------------------------------------


def test_more_hosts_than_the_subnet_holds():
    cap = 2 ** (32 - 24) - 3  # a /24 less network, broadcast and the router's address
    assert max_hosts_per_dc(24) == cap
    data = two_dc()
    data["dcs"][1]["hosts"] = 300
    err = spec_error(data)
    assert_names_everything(err, "dcs[1].hosts", 300, f"use at most {cap} hosts")
    data["dcs"][1]["hosts"] = cap
    assert parse_topology(data).dc("west").hosts == cap


def test_dc_name_too_long_for_an_interface():
    longest = IFNAME_MAX - len(WAN_IFNAME_PREFIX)  # 'w-' + name must fit in 15 characters
    name = "d" * (longest + 1)
    data = two_dc(between=["east", name])
    data["dcs"][1]["name"] = name
    err = spec_error(data)
    assert_names_everything(err, "dcs[1].name", name, f"at most {longest} characters")
    assert f"'w-{name}'" in err.problem
    ok = "d" * longest
    data = two_dc(between=["east", ok])
    data["dcs"][1]["name"] = ok
    assert parse_topology(data).dcs[1].name == ok


def test_disconnected_dc():
    data = two_dc()
    data["dcs"].append({"name": "island", "hosts": 1})
    err = spec_error(data)
    assert_names_everything(err, "dcs[2].name", "island", "add a link")


def test_duplicate_dc_name():
    data = two_dc()
    data["dcs"][1]["name"] = "east"
    assert_names_everything(spec_error(data), "dcs[1].name", "east", "its own name")


# ---- matrix -----------------------------------------------------------------------------------


def test_matrix_not_symmetric():
    err = spec_error(matrix_dc(rate=[[None, "100mbit"], ["50mbit", None]], delay=[[None, "5ms"], ["5ms", None]]))
    assert_names_everything(err, "matrix.rate[0][1]", "100mbit", "make the matrix symmetric")
    assert "'50mbit'" in err.problem


def test_matrix_rate_without_delay():
    err = spec_error(matrix_dc(rate=[[None, "100mbit"], ["100mbit", None]], delay=[[None, None], [None, None]]))
    assert_names_everything(err, "matrix.rate[0][1]", "100mbit", "give both")


def test_matrix_cell_errors_name_the_cell():
    err = spec_error(matrix_dc(rate=[[None, "100mbps"], ["100mbps", None]], delay=[[None, "5ms"], ["5ms", None]]))
    assert_names_everything(err, "matrix.rate[0][1]", "100mbps", "mbit")
    err = spec_error(matrix_dc(rate=[[None, "0mbit"], ["0mbit", None]], delay=[[None, "5ms"], ["5ms", None]]))
    assert_names_everything(err, "matrix.rate[0][1]", "0mbit", "above 0")


def test_matrix_diagonal_must_be_null():
    err = spec_error(matrix_dc(rate=[["5mbit", "1mbit"], ["1mbit", None]], delay=[[None, "5ms"], ["5ms", None]]))
    assert_names_everything(err, "matrix.rate[0][0]", "5mbit", "null on the diagonal")


def test_matrix_symmetry_compares_values_not_text():
    spec = parse_topology(
        matrix_dc(rate=[[None, "100mbit"], ["0.1gbit", None]], delay=[[None, "1ms"], ["1000us", None]]), SOURCE
    )
    assert spec.links[0].rate_bps == 100_000_000 and spec.links[0].delay_us == 1000


def test_sub_resolution_values_are_refused():
    data = {
        "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"between": ["a", "b"], "rate": "1mbit", "delay": "0.4us"}],
    }
    err = spec_error(data)
    assert_names_everything(err, "links[0].delay", "0.4us", "1us")


def test_links_and_matrix_together():
    data = matrix_dc(rate=[[None, "1mbit"], ["1mbit", None]], delay=[[None, "1ms"], ["1ms", None]])
    data["links"] = [{"between": ["a", "b"], "rate": "1mbit", "delay": "1ms"}]
    err = spec_error(data)
    assert_names_everything(err, "matrix", data["matrix"], "either links or matrix")


def test_spec_is_not_changed_by_parsing():
    data = two_dc(loss="1%")
    before = copy.deepcopy(data)
    parse_topology(data)
    assert data == before


def test_invalid_yaml_is_one_line_with_position(tmp_path):
    from testbed.spec.topology_file import load_topology

    bad = tmp_path / "bad.yaml"
    bad.write_text("dcs: [\n  {name: a\n")
    with pytest.raises(SpecError) as info:
        load_topology(bad)
    msg = str(info.value)
    assert "\n" not in msg and "bad.yaml" in msg and "line " in msg and "fix the YAML syntax" in msg


@pytest.mark.parametrize(
    "text, words",
    [
        ("a: &x [1]\ndcs: *x\n", "aliases"),
        ("dcs: []\ndcs: []\n", "duplicate key 'dcs'"),
        ("? [a, b]\n: 1\n", "plain word"),
    ],
)
def test_yaml_traps_are_refused_with_position(tmp_path, text, words):
    from testbed.spec.topology_file import load_topology

    bad = tmp_path / "t.yaml"
    bad.write_text(text)
    with pytest.raises(SpecError) as info:
        load_topology(bad)
    assert words in str(info.value) and "line " in str(info.value)


def test_null_required_values_are_missing_not_crashes():
    data = {"dcs": [{"name": "a", "hosts": None}, {"name": "b", "hosts": 1}], "links": []}
    err = spec_error(data)
    assert err.field == "dcs[0].hosts" and "is empty" in str(err)


def test_non_utf8_file(tmp_path):
    from testbed.spec.topology_file import load_topology

    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError, match="is not UTF-8 text"):
        load_topology(bad)
