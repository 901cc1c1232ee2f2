"""The configured rate of each WAN link direction over time, as the plots draw it: from the
shaping log's lines (the build's ``add``, ``change``, ``link_down``/``link_up``) or, without them,
the link counters' readback; the window a plot draws; utilization against the rate in force."""

from __future__ import annotations

import pandas as pd
import pytest

from testbed.results import link_counters as L
from testbed.results.plots import plot_links, plot_timeline
from testbed.results.wan_changes import configured_rates, direction, down_spans, rates_drawn
from testbed.trace import schema as T
from testbed.trace.shaping_log import LINK_DOWN, LINK_UP, PROFILE_STEP

MS = 1_000_000
S = 1000 * MS
M = 1_000_000  # bit/s in a Mbit/s
ENDS = {"us-east->eu": ("tb12ab-us-east-r", "w-eu"), "eu->us-east": ("tb12ab-eu-r", "w-us-east")}


def htb(t_ns: int, link: str, bps: int, event: str = "change", classid: str = "1:1") -> dict:
    """A ``shaping.jsonl`` line: HTB class ``classid`` of direction ``link`` added or changed."""
    netns, ifname = ENDS.get(link, (f"tb12ab-{link.split('->')[0]}-r", f"w-{link.split('->')[1]}"))
    return {
        "t_ns": t_ns,
        "event": event,
        "netns": netns,
        "ifname": ifname,
        "classid": classid,
        "rate_bps": bps,
        "ceil_bps": bps,
        "duration_ns": 30_000,
    }


def both(t_ns: int, bps: int, event: str = "change") -> list[dict]:
    return [htb(t_ns, link, bps, event) for link in ENDS]


def outage(t_ns: int, event: str, duration_ns: int) -> dict:
    return {"t_ns": t_ns, "event": event, "link": "us-east:eu", "ends": [], "duration_ns": duration_ns}


def as_rows(rates: pd.DataFrame, link: str) -> list[tuple[int, int]]:
    r = rates[rates[T.LINK] == link]
    return list(zip(r[T.T_NS].astype(int), r[T.RATE_BPS].astype(int)))


def test_a_direction_is_named_from_its_router_namespace_and_wan_interface():
    assert direction("tb12ab-us-east-r", "w-eu") == "us-east->eu"
    assert direction("tb12ab-eu-r", "h0") is None  # a host port
    assert direction("tb12ab-eu-h0", "w-us") is None  # not a router


def test_rates_follow_the_build_the_changes_and_an_outage_both_ways():
    shaping = both(0, 50 * M, "add") + [htb(0, "us-east->eu", 50 * M, "add", "1:10")]
    shaping += both(2 * S, 20 * M)  # a profile step (or testbed link rate)
    shaping += [htb(2 * S + 5, "us-east->eu", 7 * M, classid="1:20")]  # Atlas's class: not the link's rate
    shaping += [outage(4 * S, LINK_DOWN, 3 * MS)]
    shaping += both(6 * S, 50 * M)  # the step's rate is set while the link is still down...
    shaping += [outage(6 * S + 1000, LINK_UP, 2 * MS)]  # ...which carries traffic from t_ns + duration_ns
    shaping += [{"t_ns": 6 * S, "event": PROFILE_STEP, "link": "us-east:eu", "rate_bps": 50 * M}]  # adds nothing
    shaping += both(8 * S, 50 * M)  # the same rate again: no new row
    rates = configured_rates(list(reversed(shaping)))  # lines need not be in time order
    want = [(0, 50 * M), (2 * S, 20 * M), (4 * S, 0), (6 * S + 1000 + 2 * MS, 50 * M)]
    assert as_rows(rates, "us-east->eu") == want
    assert as_rows(rates, "eu->us-east") == want
    assert list(rates.columns) == [T.LINK, T.T_NS, T.RATE_BPS]


def test_a_run_whose_links_kept_their_rates_has_one_row_per_direction_and_draws_nothing():
    rates = configured_rates(both(0, 50 * M, "add"))
    assert as_rows(rates, "us-east->eu") == [(0, 50 * M)] and len(rates) == 2
    assert rates_drawn(rates, 1 * S, 5 * S).empty


def counters(rows: list[tuple[int, str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [(t, link, "1:1", tx, bps) for t, link, tx, bps in rows],
        columns=[T.T_NS, T.LINK, T.CLASSID, T.TX_BYTES, T.RATE_BPS],
    )


def test_without_shaping_lines_the_counters_readback_gives_the_rate_where_it_changed():
    c = counters([(t * 100 * MS, "a->b", 0, 50 * M if t < 3 else 20 * M) for t in range(6)])
    assert as_rows(configured_rates([], c), "a->b") == [(0, 50 * M), (300 * MS, 20 * M)]
    # the log's lines win over the readback for a direction they cover; an outage applies to both
    c = counters([(t * S, "us-east->eu", 0, 10 * M) for t in range(3)])
    rates = configured_rates(both(0, 50 * M, "add") + [outage(S, LINK_DOWN, 0), outage(2 * S, LINK_UP, 0)], c)
    assert as_rows(rates, "us-east->eu") == [(0, 50 * M), (S, 0), (2 * S, 50 * M)]


def test_an_outage_of_a_direction_without_a_known_rate_draws_nothing():
    assert configured_rates([outage(S, LINK_DOWN, 0), outage(2 * S, LINK_UP, 0)]).empty


def test_the_drawn_window_starts_with_the_rate_in_force_and_closes_the_last_step():
    shaping = both(0, 50 * M, "add") + both(2 * S, 20 * M) + [outage(4 * S, LINK_DOWN, 0), outage(5 * S, LINK_UP, 0)]
    shaping += [htb(0, "a->b", 9 * M, "add")]  # never changed
    rates = configured_rates(shaping)
    drawn = rates_drawn(rates, 3 * S, 10 * S)
    assert sorted(drawn[T.LINK].unique()) == ["eu->us-east", "us-east->eu"]  # only the directions that changed
    assert as_rows(drawn, "us-east->eu") == [(3 * S, 20 * M), (4 * S, 0), (5 * S, 20 * M), (10 * S, 20 * M)]
    # a window before any change: the rate in force, closed at the end
    assert as_rows(rates_drawn(rates, 0, S), "us-east->eu") == [(0, 50 * M), (S, 50 * M)]
    # a window before a direction's first known rate: it starts there
    late = configured_rates([], counters([(5 * S, "x->y", 0, M), (6 * S, "x->y", 0, 2 * M)]))
    assert as_rows(rates_drawn(late, 0, 10 * S), "x->y") == [(5 * S, M), (6 * S, 2 * M), (10 * S, 2 * M)]
    assert rates_drawn(late, 0, 4 * S).empty
    assert down_spans(drawn) == [(4 * S, 5 * S)]  # once for the link's two directions


def test_utilization_is_against_the_rate_in_force_over_each_interval():
    c = counters(
        [
            (0, "a->b", 0, 50 * M),
            (100 * MS, "a->b", 500_000, 50 * M),  # 40 Mbit/s of 50: 0.8
            (200 * MS, "a->b", 850_000, 20 * M),  # 28 Mbit/s while the rate went from 50 to 20: 0.8 of 35
            (300 * MS, "a->b", 1_050_000, 20 * M),  # 16 of 20
        ]
    )
    lu = L.link_utilization(c)
    assert list(lu["utilization"]) == pytest.approx([0.8, 0.8, 0.8])


def test_the_plots_draw_with_and_without_changed_rates(tmp_path):
    from eventrows import event_row

    shaping = both(0, 50 * M, "add") + both(S, 20 * M) + [outage(2 * S, LINK_DOWN, 0), outage(3 * S, LINK_UP, 0)]
    c = counters([(t * 100 * MS, link, t * 1000, 50 * M) for t in range(40) for link in ENDS])
    rates = configured_rates(shaping, c)
    lu = L.link_utilization(c)
    who = ("us-east-h0", "us-east", 0, 0)
    ev = pd.DataFrame(
        [event_row(0, *who, T.FORWARD, it, 0, it * 1000, it * 1000 + 400) for it in range(4)]
        + [event_row(0, *who, T.OPTIMIZER, it, -1, it * 1000 + 400, it * 1000 + 450) for it in range(4)]
    )
    earlier = configured_rates(both(0, 50 * M, "add") + both(S, 20 * M), c)  # before the iterations drawn
    for name, r in (("plain", None), ("rates", rates), ("earlier", earlier)):
        plot_links(lu, tmp_path / f"wan_{name}.png", r)
        plot_timeline(ev, tmp_path / f"timeline_{name}.png", 1, r)
        assert (tmp_path / f"wan_{name}.png").stat().st_size > 0
        assert (tmp_path / f"timeline_{name}.png").stat().st_size > 0
