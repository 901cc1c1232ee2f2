"""The hosts' TCP congestion control: named in a topology file, set in every namespace, refused
before building where the kernel would not let a namespace choose it."""

from __future__ import annotations

import pytest

from testbed.errors import FeatureError, SpecError
from testbed.net import features
from testbed.net.netns import namespace_sysctls
from testbed.spec.topology_file import parse_topology

TOPO = {
    "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
    "links": [{"between": ["a", "b"], "rate": "10mbit", "delay": "1ms"}],
}


def test_the_file_names_it_or_leaves_the_machine_default():
    assert parse_topology(TOPO).tcp_congestion is None
    spec = parse_topology({**TOPO, "tcp_congestion": "cubic"})
    assert spec.tcp_congestion == "cubic"
    assert parse_topology(spec.to_file_dict(), spec.source).tcp_congestion == "cubic"
    assert "tcp_congestion" not in parse_topology(TOPO).to_file_dict()


@pytest.mark.parametrize("bad", ["Cubic", "cubic; rm -rf /", 3, "a" * 40])
def test_a_name_that_is_no_congestion_control_is_refused(bad):
    with pytest.raises(SpecError, match="tcp_congestion.*tcp_available_congestion_control"):
        parse_topology({**TOPO, "tcp_congestion": bad})


def test_every_namespace_gets_it_only_when_stated():
    base, _, _ = namespace_sysctls(1 << 20)
    assert "net.ipv4.tcp_congestion_control" not in base
    base, _, _ = namespace_sysctls(1 << 20, "reno")
    assert base["net.ipv4.tcp_congestion_control"] == "reno"


def _kernel(tmp_path, monkeypatch, available: str, allowed: str) -> None:
    (tmp_path / "available").write_text(available + "\n")
    (tmp_path / "allowed").write_text(allowed + "\n")
    monkeypatch.setattr(features, "AVAILABLE_CONGESTION", tmp_path / "available")
    monkeypatch.setattr(features, "ALLOWED_CONGESTION", tmp_path / "allowed")
    monkeypatch.setattr(features.shutil, "which", lambda _: None)  # no modprobe: nothing is loaded


def test_an_allowed_one_passes_and_none_is_the_default(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, "reno bbr cubic", "reno bbr")
    features.require_congestion("bbr")
    features.require_congestion(None)


def test_one_not_allowed_in_namespaces_is_refused_with_the_sysctl(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, "reno bbr cubic", "reno bbr")
    with pytest.raises(FeatureError, match="tcp_allowed_congestion_control='reno bbr cubic'"):
        features.require_congestion("cubic")


def test_one_the_kernel_lacks_is_refused_naming_what_it_has(tmp_path, monkeypatch):
    _kernel(tmp_path, monkeypatch, "reno cubic", "reno cubic")
    with pytest.raises(FeatureError, match="no TCP congestion control 'vegas'.*reno, cubic.*no modprobe"):
        features.require_congestion("vegas")
