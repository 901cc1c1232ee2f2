"""Atlas's control channel across machines (net/remote/control_relay.py) without machines: the
relay's forwarding, its answers by id (repeated requests answered from memory, a late copy of an
older grant never applied), the client's resends, the token, and the deliberate faults. The
kernel call of ``apply`` is replaced by a recorder here; tests/integration/test_remote.py applies
real grants through relays on stand-in machines."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from testbed.atlas.rendezvous import Rendezvous
from testbed.errors import RemoteError
from testbed.net.remote import control_relay as CR
from testbed.net.remote import relay_client as RC
from testbed.results.analysis import grant_figures
from testbed.results.summary import machine_stats
from testbed.trace import metrics as M
from testbed.trace.jsonl import read_jsonl

TOKEN = bytes(range(RC.TOKEN_BYTES))


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2)
    return s


@pytest.fixture
def relay(tmp_path):
    controller = _udp()
    r = CR.Relay(
        {
            "token": TOKEN.hex(),
            "offset_ns": 5_000,
            "log": str(tmp_path / "relay.jsonl"),
            "machine": "m1",
            "forward": [{"path": str(tmp_path / "run.sock"), "to": ["127.0.0.1", controller.getsockname()[1]]}],
        }
    )
    r.controller_sock = controller  # type: ignore[attr-defined]
    r.run_sock = next(iter(r.forwards))  # type: ignore[attr-defined]
    yield r
    r.close()
    controller.close()


def test_faults_are_read_with_their_errors_named():
    assert RC.parse_faults(None) == {"drop": 0.0, "duplicate": 0.0, "seed": 0.0}
    assert RC.parse_faults("drop=0.1, duplicate=0.2,seed=3") == {"drop": 0.1, "duplicate": 0.2, "seed": 3.0}
    with pytest.raises(ValueError, match="unknown part 'loss'"):
        RC.parse_faults("loss=0.1")
    with pytest.raises(ValueError, match="drop=2 is not a share"):
        RC.parse_faults("drop=2")


def test_a_datagram_without_the_token_is_not_read():
    assert RC.unframed(TOKEN, RC.framed(TOKEN, {"a": 1})) == b'{"a": 1}'
    assert RC.unframed(TOKEN, b"x" * 40) is None


def test_a_workers_message_is_forwarded_as_it_came_with_the_token(relay):
    msg = b'{"ev": "ready", "src": 0, "dst": 1, "it": 0, "mb": 0, "t": 123}'
    relay.on_local(relay.run_sock, msg)
    assert relay.controller_sock.recv(1000) == TOKEN + msg
    assert relay.counts["forwarded"] == 1


def _ask(relay, client: socket.socket, req: dict) -> dict:
    relay.on_udp(RC.framed(TOKEN, req), client.getsockname())
    return json.loads(RC.unframed(TOKEN, client.recv(65536)))


def test_a_repeated_request_is_answered_from_memory_and_an_older_grant_never_applied(relay, monkeypatch):
    sent = []
    monkeypatch.setattr(CR.rtnl_raw, "send_batch", lambda sock, data, n: sent.append((data, n)))
    monkeypatch.setattr(relay, "_sock", lambda netns: None)
    client = _udp()
    apply = {"op": "apply", "netns": "x-east-r", "ifindex": 3, "data": "abcd", "count": 2}
    first = _ask(relay, client, {**apply, "id": 200})
    assert sent == [(b"\xab\xcd", 2)] and not first.get("stale")
    assert _ask(relay, client, {**apply, "id": 200}) == first  # the reply came late: asked again
    assert len(sent) == 1 and relay.counts["repeated"] == 1
    late = _ask(relay, client, {**apply, "id": 100, "data": "ef"})  # a copy of an older grant, arriving late
    assert late["stale"] and len(sent) == 1 and relay.counts["stale"] == 1
    other_link = _ask(relay, client, {**apply, "id": 150, "ifindex": 4, "data": "ef"})
    assert not other_link.get("stale") and sent[-1] == (b"\xef", 2)
    relay.log.flush()
    log = read_jsonl(Path(relay.log.name))
    assert [r["event"] for r in log] == ["applied", "stale", "applied"]
    # times in the runner's clock: this machine's minus its offset
    assert all(r["t_applied_ns"] >= r["t_received_ns"] for r in log if r["event"] == "applied")
    relay.on_udp(b"not the token" + b"x" * 10, client.getsockname())
    assert relay.counts["foreign"] == 1
    error = _ask(relay, client, {"op": "reboot", "id": 300})
    assert "unknown request 'reboot'" in error["error"]
    client.close()


def test_deliberate_faults_drop_or_double_what_the_relay_sends(relay):
    relay.faults = {"drop": 1.0}
    relay.on_local(relay.run_sock, b"{}")
    assert relay.counts["forwards_dropped"] == 1
    relay.faults = {"duplicate": 1.0}
    relay.on_local(relay.run_sock, b"{}")
    assert relay.controller_sock.recv(100) == relay.controller_sock.recv(100) == TOKEN + b"{}"
    assert relay.counts["forwards_duplicated"] == 1


def test_a_path_is_bridged_to_the_same_path_on_the_other_side_and_only_to_paths_named(tmp_path):
    """A hub here binds a worker's inbox path and forwards to the relay there, which delivers to the
    same path (its worker's socket); a delivery to a path not named is dropped and counted."""
    (tmp_path / "there").mkdir()  # one machine here: "the same path" there is another folder
    inbox = str(tmp_path / "there" / "w3.sock")
    there = CR.Relay({"token": TOKEN.hex(), "log": str(tmp_path / "there.jsonl"), "deliver_to": [inbox]})
    (tmp_path / "here").mkdir()
    mirror = str(tmp_path / "here" / "w3.sock")
    hub = CR.Relay(
        {
            "token": TOKEN.hex(),
            "log": str(tmp_path / "hub.jsonl"),
            "forward": [{"path": mirror, "to": ["127.0.0.1", there.port], "deliver": True}],
        }
    )
    worker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    worker.bind(inbox)  # the worker's own inbox, on its machine
    worker.settimeout(2)
    # the hub's forward carries the path it came in on; the relay there delivers it at the same path
    hub.on_local(next(iter(hub.forwards)), b'{"rid": 1}')
    data, addr = there.requests.recvfrom(65536)
    assert data == TOKEN + RC.DELIVER + mirror.encode() + b"\0" + b'{"rid": 1}'
    there.on_udp(TOKEN + RC.DELIVER + inbox.encode() + b"\0" + b'{"rid": 1}', addr)
    assert worker.recv(100) == b'{"rid": 1}' and there.counts["delivered"] == 1
    there.on_udp(TOKEN + RC.DELIVER + b"/etc/elsewhere.sock\0x", addr)
    assert there.counts["foreign"] == 1
    worker.close()
    for r in (hub, there):
        r.close()
    assert not (tmp_path / "here" / "w3.sock").exists()  # the hub's bound path removed at its end


def _responder(sock: socket.socket, ignore: int, answered: list) -> None:
    """Answer pings on ``sock`` after ignoring the first ``ignore`` datagrams."""
    seen = 0
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except OSError:
            return
        seen += 1
        if seen <= ignore:
            continue
        req = json.loads(RC.unframed(TOKEN, data))
        answered.append(req["id"])
        sock.sendto(RC.framed(TOKEN, {"id": req["id"], "t_ns": 7}), addr)
        return


def test_the_client_sends_again_with_the_same_id_until_answered():
    server = _udp()
    answered: list[int] = []
    t = threading.Thread(target=_responder, args=(server, 2, answered))
    t.start()
    client = RC.RelayClient("m1", server.getsockname(), TOKEN)
    reply = client.request("ping")
    t.join()
    assert reply["t_ns"] == 7 and reply["id"] == answered[0] and client.resent == 2
    client.close()
    server.close()


def test_a_relay_that_never_answers_is_named(monkeypatch):
    monkeypatch.setattr(RC, "RETRY_S", 0.001)
    server = _udp()
    client = RC.RelayClient("m7", server.getsockname(), TOKEN)
    with pytest.raises(RemoteError, match="machine m7: the control relay at 127.0.0.1:.* did not answer 'ping'"):
        client.request("ping")
    assert client.resent == RC.ATTEMPTS - 1
    client.close()
    server.close()


def test_a_report_repeated_after_its_transfer_was_paired_is_ignored():
    r = Rendezvous()
    key = (0, 2, 0, 1, 0)
    assert r.report(key, "ready", 10) is None
    assert r.report(key, "ready", 10) is None  # the same report twice before the other: nothing new
    assert r.report(key, "recv", 20) == (10, 20)
    assert r.report(key, "ready", 10) is None and r.report(key, "recv", 20) is None
    assert r.repeated == 2 and not r.half  # no half-report left to expire into a second grant
    assert r.expire(10**12, lambda k: 1) == []


def test_grant_figures_split_decision_applied_and_the_relays_answer():
    grant = {"event": "grant", "link": "east->west", "replica": 0, "t_ready_ns": 0}
    log = [
        {**grant, "t_decided_ns": 1_000_000, "t_applied_ns": 1_100_000, "t_acked_ns": 1_300_000, "machine": "m0"},
        {**grant, "t_decided_ns": 5_000_000, "t_applied_ns": 5_300_000, "t_acked_ns": 5_500_000, "machine": "m0"},
        {**grant, "t_applied_ns": 6_000_000, "kept": True},
    ]
    f = grant_figures(log)
    assert f[M.GRANT_APPLY_P50_MS] == pytest.approx(0.2) and f[M.GRANT_ROUND_TRIP_P50_MS] == pytest.approx(0.4)
    assert (
        grant_figures([{k: v for k, v in log[0].items() if k not in ("t_acked_ns", "machine")}])[
            M.GRANT_ROUND_TRIP_P50_MS
        ]
        is None
    )  # one machine: no round trip to a relay


def test_machine_stats_name_the_machines_and_the_worst_offset_uncertainty(tmp_path):
    assert machine_stats(tmp_path) == {}
    inventory = {"machines": [{"name": "m0", "dcs": ["east"]}, {"name": "m1", "dcs": ["west", "central"]}]}
    (tmp_path / "topology.json").write_text(json.dumps({"inventory": inventory}))
    est = {"offset_ns": 0, "uncertainty_ns": 50_000}
    clock = {"m0": {"before": est, "after": {**est, "uncertainty_ns": 80_000}}, "m1": {"before": est}}
    (tmp_path / "clock_offsets.json").write_text(json.dumps({"machines": clock}))
    assert machine_stats(tmp_path) == {
        M.MACHINES: {"m0": ["east"], "m1": ["west", "central"]},
        M.CLOCK_OFFSET_UNCERTAINTY_MS: 0.08,
    }


def test_a_relay_whose_last_line_was_lost_still_reports_its_latest_counts(tmp_path):
    """The relays log their counts every second and at their end; the summary takes each relay's
    latest line, so one cut short (killed, its teardown interrupted) still reports."""
    from testbed.results.summary import grant_stats

    (tmp_path / "controller.jsonl").write_text(
        json.dumps({"event": "grant", "link": "a->b", "replica": 0, "t_ready_ns": 0, "t_applied_ns": 1}) + "\n"
    )
    rows = [
        {"event": "relay_counts", "machine": "m0", "t_ns": 1, "forwarded": 3},
        {"event": "relay_counts", "machine": "m0", "t_ns": 2, "forwarded": 7},
        {"event": "applied", "machine": "m1", "t_ns": 3},
        {"event": "relay_end", "machine": "m1", "t_ns": 4, "forwarded": 9},
    ]
    (tmp_path / "relay.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert grant_stats(tmp_path)[M.CONTROL_RELAYS] == {"m0": {"forwarded": 7}, "m1": {"forwarded": 9}}
