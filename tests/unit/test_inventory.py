"""Inventory files of --backend remote: every field validated at load time, naming field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.errors import SpecError
from testbed.net.remote.inventory import DEFAULT_PYTHON, check_against, load_inventory, parse_inventory
from testbed.spec.topology_file import load_topology


def _inv(tmp_path: Path, **machine) -> dict:
    key = tmp_path / "id_ed25519"
    key.write_text("not read by validation\n")
    base = {"name": "m0", "address": "192.0.2.10", "user": "root", "key": str(key), "dcs": ["east"]}
    base.update(machine)
    return {
        "known_hosts": str(tmp_path / "known_hosts"),
        "machines": [base, {"name": "m1", "address": "192.0.2.11", "user": "root", "dcs": ["west"]}],
    }


def test_a_good_inventory_loads_with_defaults(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(_inv(tmp_path)))
    inv = load_inventory(path)
    m0, m1 = inv.machines
    assert (m0.name, m0.port, m0.python, m0.tunnel_address, m0.key) == (
        "m0",
        22,
        DEFAULT_PYTHON,
        "192.0.2.10",
        tmp_path / "id_ed25519",
    )
    assert m1.key is None and not inv.accept_unknown_host_keys
    assert inv.machine_of("west") is m1
    check_against(inv, load_topology("two_dc"))
    assert "not read" not in str(inv.to_dict())  # the key's contents never enter records


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("name", "m 0", "machines[0].name"),
        ("address", "192.0.2.10; rm -rf /", "machines[0].address"),
        ("address", "-oProxyCommand=x", "machines[0].address"),
        ("port", 0, "machines[0].port"),
        ("port", "22", "machines[0].port"),
        ("port", True, "machines[0].port"),
        ("user", "root; id", "machines[0].user"),
        ("user", "", "machines[0].user"),
        ("dcs", [], "machines[0].dcs"),
        ("dcs", [1], "machines[0].dcs"),
        ("python", "python3 -c 'import os'", "machines[0].python"),
        ("python", "$(id)", "machines[0].python"),
        ("tunnel_address", "2001:db8::1", "machines[0].tunnel_address"),
        ("workdir", "relative/dir", "machines[0].workdir"),
        ("workdir", "/", "machines[0].workdir"),
        ("workdir", "/var/../etc", "machines[0].workdir"),
        ("workdir", "/tmp/a b", "machines[0].workdir"),
        ("key", "/nonexistent/key", "machines[0].key"),
        ("key", "~nosuchuser-xyz/id", "machines[0].key"),
        ("key", "/tmp", "machines[0].key"),
        ("tunnel_address", "127.0.0.1", "machines[0].tunnel_address"),
        ("tunnel_address", "224.0.0.1", "machines[0].tunnel_address"),
        ("tunnel_address", "0.0.0.0", "machines[0].tunnel_address"),
        ("address", "127.0.0.1", "machines[0].address"),
        ("colour", "blue", "machines[0].colour"),
    ],
)
def test_bad_machine_fields_are_named(tmp_path, field, value, needle):
    with pytest.raises(SpecError) as e:
        parse_inventory(_inv(tmp_path, **{field: value}), "inv.yaml")
    assert e.value.field == needle and e.value.fix


def test_relative_paths_start_at_the_inventorys_folder(tmp_path, monkeypatch):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("k\n")
    (tmp_path / "inv.yaml").write_text(
        yaml.safe_dump(
            {
                "known_hosts": "kh",
                "machines": [
                    {"name": "m0", "address": "192.0.2.10", "user": "root", "key": "keys/id", "dcs": ["east"]}
                ],
            }
        )
    )
    monkeypatch.chdir("/")
    inv = load_inventory(tmp_path / "inv.yaml")
    assert inv.machines[0].key == tmp_path / "keys" / "id" and inv.known_hosts == tmp_path / "kh"


def test_a_host_name_needs_a_tunnel_address(tmp_path):
    with pytest.raises(SpecError, match="tunnel_address"):
        parse_inventory(_inv(tmp_path, address="gpu-east.example.org"), "inv.yaml")
    inv = parse_inventory(_inv(tmp_path, address="gpu-east.example.org", tunnel_address="192.0.2.10"), "inv.yaml")
    assert inv.machines[0].tunnel_address == "192.0.2.10"


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda d: d["machines"][1].update(name="m0"), "machines[1].name"),
        (lambda d: d["machines"][1].update(address="192.0.2.10"), "machines[1].address"),
        (lambda d: d["machines"][1].update(dcs=["east"]), "machines[1].dcs"),
        (
            lambda d: d["machines"][1].update(address="::ffff:192.0.2.10", tunnel_address="192.0.2.10"),
            "machines[1].tunnel_address",
        ),
        (lambda d: d.update(known_hosts="~nosuchuser-xyz/kh"), "known_hosts"),
        (lambda d: d.update(accept_unknown_host_keys="yes"), "accept_unknown_host_keys"),
        (lambda d: d.update(machines=[]), "machines"),
        (lambda d: d.update(hosts=[]), "hosts"),
    ],
)
def test_bad_inventories_are_refused(tmp_path, change, needle):
    data = _inv(tmp_path)
    change(data)
    with pytest.raises(SpecError) as e:
        parse_inventory(data, "inv.yaml")
    assert e.value.field == needle


def test_inventory_must_fit_the_topology(tmp_path):
    inv = parse_inventory(_inv(tmp_path, dcs=["eats"]), "inv.yaml")
    with pytest.raises(SpecError, match="did you mean 'east'"):
        check_against(inv, load_topology("two_dc"))
    inv = parse_inventory(_inv(tmp_path), "inv.yaml")
    with pytest.raises(SpecError, match="central.*on no machine"):
        check_against(inv, load_topology("three_dc"))


def test_profiles_and_failover_over_several_machines_are_refused_before_building(tmp_path):
    """Each machine builds its own DCs on its own clock: a link's profile or failover is not
    replayed across them yet, and the refusal names the link and the field."""
    inv = parse_inventory(_inv(tmp_path), "inv.yaml")
    with pytest.raises(SpecError, match=r"links\[0\]\.profile.*east:west.*several machines") as e:
        check_against(inv, load_topology("two_dc_shared_burst"))
    assert "remove the links' profile and failover fields" in e.value.fix
    three = _inv(tmp_path)
    three["machines"][1]["dcs"] = ["west", "central"]
    with pytest.raises(SpecError, match=r"\.(profile|failover)"):
        check_against(parse_inventory(three, "inv.yaml"), load_topology("three_dc_day"))
    one = {**three, "machines": [{**three["machines"][0], "dcs": ["east", "west", "central"]}]}
    check_against(parse_inventory(one, "inv.yaml"), load_topology("three_dc_day"))  # one machine builds it all


def test_hosts_placed_apart_from_their_dc_are_refused_not_moved(tmp_path):
    """MaxiNet#45 moved hosts silently: here a host runs with its DC's router, and an inventory
    that places hosts is refused, saying how to spread them."""
    data = _inv(tmp_path)
    data["machines"][1]["hosts"] = ["east-h1"]
    with pytest.raises(SpecError, match=r"machines\[1\]\.hosts.*runs on the machine of its DC") as e:
        parse_inventory(data, "inv.yaml")
    assert "split the DC into several DCs" in e.value.fix
    data = _inv(tmp_path, dcs=["east-h1"])
    with pytest.raises(SpecError, match="is not a DC of topology two_dc"):
        check_against(parse_inventory(data, "inv.yaml"), load_topology("two_dc"))


def test_a_missing_or_broken_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="is not a file.*Several machines"):
        load_inventory(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is not a file"):
        load_inventory(tmp_path)
    (tmp_path / "huge.yaml").write_text("#" * (2 << 20))
    with pytest.raises(SpecError, match="bytes long"):
        load_inventory(tmp_path / "huge.yaml")
    (tmp_path / "bad.yaml").write_text("machines: [\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_inventory(tmp_path / "bad.yaml")
