"""Time to first token against an SLO, over the requests a run can judge.

A request's first token is due by its arrival plus its SLO (its deadline). A run stops serving
when its training ends, so a request whose deadline falls after that end cannot be judged a
miss. Attainment is taken over the requests whose deadline falls within the run, each of which
either had its first token by then or missed it; one due after the end is left out even where its
first token came in time, since keeping only those would count the fast ones and not the slow.
The requests are every arrival of the stream, assigned to a worker or still waiting for one: a
request the dispatcher could not place (every worker full) misses its deadline like any other.

Two SLOs: an absolute one (``ttft_slo_s``), and one relative to each request's TTFT served alone
(``ttft_slo_scale`` x ``ttft_alone``: the prompt prefilled in one pass on an idle emulated GPU;
its KV transfer to the decode host is not in it, so a scale of 1 cannot be met),
as serving studies state latency objectives as slowdowns over a request run alone (Splitwise,
Patel et al., ISCA 2024), so that one objective means the same on a slow emulated GPU as on a
real one. Pure functions of the run's request records.
"""

from __future__ import annotations

import pandas as pd

from testbed.spec.bubbletea import dispatched_prompt


def arrivals(stream: pd.DataFrame, t0_ns: int, end_ns: int, max_prompt_tokens: int | None) -> list[dict]:
    """The requests of ``stream`` (``request_table.requests_to_frame``'s table) that arrived by
    ``end_ns``, in the dispatcher's form: ``rid``, ``arrival_ns`` (``t0_ns``, the stream's start,
    plus its ``arrival_s``, as ``bubbletea.dispatcher`` counts it) and ``prompt`` (clipped at
    ``max_prompt_tokens`` as dispatched; None: unclipped)."""
    at = t0_ns + (stream["arrival_s"] * 1e9).astype("int64")
    came = at <= end_ns
    return [
        {"rid": int(r), "arrival_ns": int(a), "prompt": dispatched_prompt(int(p), max_prompt_tokens)}
        for r, a, p in zip(stream["rid"][came], at[came], stream["prompt_tokens"][came])
    ]


def request_table(requests: list[dict], first: list[dict], alone_s: pd.Series) -> pd.DataFrame:
    """One row per request of ``requests`` (``arrivals``' form, or the dispatcher's assignments):
    ``rid``, ``arrival_ns``, ``ttft_s`` (arrival to first token at its decode host; NaN where
    none came) and ``alone_s`` (its TTFT served alone, s, in the order of ``requests``; an empty
    ``alone_s``: unknown, NaN). Raises ValueError for an ``alone_s`` of another length."""
    ttft = {r["rid"]: (r["first_token_ns"] - r["arrival_ns"]) / 1e9 for r in first}
    if len(alone_s) not in (0, len(requests)):
        raise ValueError(f"{len(alone_s)} TTFTs alone for {len(requests)} requests")
    alone = list(alone_s) if len(alone_s) else [float("nan")] * len(requests)
    return pd.DataFrame(
        {
            "rid": [a["rid"] for a in requests],
            "arrival_ns": [a["arrival_ns"] for a in requests],
            "ttft_s": [ttft.get(a["rid"], float("nan")) for a in requests],
            "alone_s": alone,
        },
        columns=["rid", "arrival_ns", "ttft_s", "alone_s"],
    )


def slo_attainment(table: pd.DataFrame, slo_s: float | pd.Series, end_ns: int) -> tuple[float | None, int]:
    """(the share of the judged requests whose first token came within ``slo_s``, how many were
    judged): a request is judged when its deadline, arrival + ``slo_s`` (s; a number, or one per
    row of ``table``), is at most ``end_ns``. None where none is judged."""
    slo = pd.Series(slo_s, index=table.index, dtype=float)
    judged = (table["arrival_ns"] + slo * 1e9 <= end_ns) & slo.notna()
    n = int(judged.sum())
    met = (table["ttft_s"] <= slo) & judged  # a NaN TTFT (no first token) never meets it
    return (float(met.sum() / n) if n else None), n
