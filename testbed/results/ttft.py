"""Time to first token against an SLO, over the requests a run can judge.

A request's first token is due by its arrival plus its SLO (its deadline). A run stops serving
when its training ends, so a request whose deadline falls after that end cannot be judged: it
might still have met it. Attainment is therefore taken over the requests whose deadline falls
within the run (each either had its first token by then or missed it), not over every request
assigned, which counts the last arrivals as misses however fast the service.

Two SLOs: an absolute one (``ttft_slo_s``), and one relative to each request's TTFT served alone
(``ttft_slo_scale`` x ``ttft_alone``: the prompt prefilled in one pass on an idle emulated GPU),
as serving studies state latency objectives as slowdowns over a request run alone (Splitwise,
Patel et al., ISCA 2024), so that one objective means the same on a slow emulated GPU as on a
real one. Pure functions of the run's request records.
"""

from __future__ import annotations

import pandas as pd


def request_table(assigned: list[dict], first: list[dict], alone_s: pd.Series) -> pd.DataFrame:
    """One row per assigned request: ``rid``, ``arrival_ns``, ``ttft_s`` (arrival to first token
    at its decode host; NaN where none came) and ``alone_s`` (its TTFT served alone, s, in the
    order of ``assigned``; NaN where unknown)."""
    ttft = {r["rid"]: (r["first_token_ns"] - r["arrival_ns"]) / 1e9 for r in first}
    alone = list(alone_s) if len(alone_s) == len(assigned) else [float("nan")] * len(assigned)
    return pd.DataFrame(
        {
            "rid": [a["rid"] for a in assigned],
            "arrival_ns": [a["arrival_ns"] for a in assigned],
            "ttft_s": [ttft.get(a["rid"], float("nan")) for a in assigned],
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
