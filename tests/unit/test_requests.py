"""Inference requests: the Azure trace loader, the fitted synthetic stream, and the request table."""

import csv
import datetime
import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed.bubbletea.azure_trace import fit_trace, load_azure_trace
from testbed.bubbletea.request_table import COLUMNS, Request, requests_from_frame, requests_to_frame
from testbed.bubbletea.requests import (
    AZURE_CONV_2023,
    QUANTILE_PROBS,
    TraceFit,
    synthetic_requests,
    tokens_from_quantiles,
)
from testbed.errors import SpecError

# /work/main/tests/unit/this_file -> /work/shared/data/...; the trace is not part of the repository
AZURE_CONV = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "azure-llm-inference-2023"
    / "AzureLLMInferenceTrace_conv.csv"
)
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def real_trace() -> Path:
    if not AZURE_CONV.is_file():
        pytest.skip(f"the Azure LLM inference trace 2023 is not at {AZURE_CONV} (shared data absent)")
    return AZURE_CONV


def real_rows() -> list[dict[str, str]]:
    """The trace read with the csv module, independently of the loader."""
    with open(real_trace(), newline="") as f:
        return list(csv.DictReader(f))


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(text)
    return p


def quantile_of(fit_q: tuple[float, ...], p: float) -> float:
    return fit_q[QUANTILE_PROBS.index(p)]


def gaps_of(reqs: list[Request]) -> np.ndarray:
    return np.diff([r.arrival_s for r in reqs])


# ---- loader on the real trace ----------------------------------------------------------------


def test_real_trace_loads_every_row_in_order():
    rows = real_rows()
    reqs = load_azure_trace(real_trace())
    assert len(reqs) == len(rows) > 19000
    assert [r.rid for r in reqs] == list(range(len(rows)))
    assert reqs[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    first, last = (datetime.datetime.fromisoformat(rows[i]["TIMESTAMP"]) for i in (0, -1))
    assert reqs[-1].arrival_s == pytest.approx((last - first).total_seconds(), abs=1e-6)
    assert (reqs[0].prompt_tokens, reqs[0].output_tokens) == (
        int(rows[0]["ContextTokens"]),
        int(rows[0]["GeneratedTokens"]),
    )
    assert sum(r.prompt_tokens for r in reqs) == sum(int(r["ContextTokens"]) for r in rows)
    assert sum(r.output_tokens for r in reqs) == sum(int(r["GeneratedTokens"]) for r in rows)


def test_real_trace_time_scale_and_rate_factor():
    base = load_azure_trace(real_trace(), limit=500)
    slow = load_azure_trace(real_trace(), time_scale=2.0, limit=500)
    busy = load_azure_trace(real_trace(), rate_factor=4.0, limit=500)
    both = load_azure_trace(real_trace(), time_scale=3.0, rate_factor=1.5, limit=500)
    for r, s, b, x in zip(base, slow, busy, both):
        assert s.arrival_s == pytest.approx(2 * r.arrival_s)
        assert b.arrival_s == pytest.approx(r.arrival_s / 4)
        assert x.arrival_s == pytest.approx(2 * r.arrival_s)
        assert (s.prompt_tokens, s.output_tokens) == (r.prompt_tokens, r.output_tokens)
    rate = (len(base) - 1) / base[-1].arrival_s
    assert (len(busy) - 1) / busy[-1].arrival_s == pytest.approx(4 * rate)


def test_real_trace_clip_and_limit():
    full = load_azure_trace(real_trace())
    clipped = load_azure_trace(real_trace(), max_prompt_tokens=512)
    assert max(r.prompt_tokens for r in clipped) == 512
    assert [min(r.prompt_tokens, 512) for r in full] == [r.prompt_tokens for r in clipped]
    assert [r.output_tokens for r in clipped] == [r.output_tokens for r in full]
    assert load_azure_trace(real_trace(), limit=100) == full[:100]


def test_embedded_constants_are_the_fit_of_the_real_trace():
    """The numbers in requests.py are what scripts/fit_azure_trace.py prints for the file."""
    fit = fit_trace(load_azure_trace(real_trace()))
    assert fit.prompt_tokens_q == pytest.approx(AZURE_CONV_2023.prompt_tokens_q, abs=0.051)
    assert fit.output_tokens_q == pytest.approx(AZURE_CONV_2023.output_tokens_q, abs=0.051)
    assert fit.rate_per_s == pytest.approx(AZURE_CONV_2023.rate_per_s, abs=1e-4)
    assert fit.interarrival_cv == pytest.approx(AZURE_CONV_2023.interarrival_cv, abs=1e-4)


def test_synthetic_stream_resembles_the_real_trace():
    rows = real_rows()
    real_prompt = [int(r["ContextTokens"]) for r in rows]
    real_output = [int(r["GeneratedTokens"]) for r in rows]
    real_gaps = gaps_of(load_azure_trace(real_trace()))
    synth = synthetic_requests(5.0, 4000.0, seed=1)
    prompt = [r.prompt_tokens for r in synth]
    output = [r.output_tokens for r in synth]
    assert statistics.median(prompt) == pytest.approx(statistics.median(real_prompt), rel=0.15)
    assert statistics.median(output) == pytest.approx(statistics.median(real_output), rel=0.15)
    for p in (0.1, 0.25, 0.75, 0.9):
        assert np.quantile(prompt, p) == pytest.approx(np.quantile(real_prompt, p), rel=0.15)
        assert np.quantile(output, p) == pytest.approx(np.quantile(real_output, p), rel=0.15)
    gaps = gaps_of(synth)
    assert gaps.std() / gaps.mean() == pytest.approx(real_gaps.std() / real_gaps.mean(), rel=0.10)


# ---- loader on small files -------------------------------------------------------------------


def test_small_file_arrivals_sorting_and_scaling(tmp_path):
    p = write(
        tmp_path,
        HEADER + "2023-11-16 18:15:50.0000000,30,3\n"
        "2023-11-16 18:15:46.0000000,10,1\n"
        "2023-11-16 18:15:47.5000000,20,2\n"
        "2023-11-16 18:15:47.5000001,40,4\n",
    )
    reqs = load_azure_trace(p)
    assert [(r.rid, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0, 10, 1), (1, 20, 2), (2, 40, 4), (3, 30, 3)]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.5, 1.5000001, 4.0], abs=1e-9)
    assert reqs[2].arrival_s - reqs[1].arrival_s == pytest.approx(1e-7, abs=1e-9)  # the 7th fractional digit
    assert [r.arrival_s for r in load_azure_trace(p, time_scale=2)] == pytest.approx([0, 3, 3.0000002, 8])
    assert [r.arrival_s for r in load_azure_trace(p, rate_factor=2)] == pytest.approx([0, 0.75, 0.75000005, 2])
    assert [r.prompt_tokens for r in load_azure_trace(p, max_prompt_tokens=15)] == [10, 15, 15, 15]
    assert [r.prompt_tokens for r in load_azure_trace(p, limit=2)] == [10, 20]


def test_columns_in_any_order_and_padded_fields(tmp_path):
    p = write(tmp_path, "GeneratedTokens,TIMESTAMP,ContextTokens\n7, 2023-11-16 18:15:46.1 ,5\n")
    assert load_azure_trace(p) == [Request(0, 0.0, 5, 7)]


GOOD = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    "text, where, value",
    [
        (
            "TIMESTAMP,ContextTokens\n" + "2023-11-16 18:15:46.6805900,374\n",
            "line 1 (header)",
            "lacks column GeneratedTokens",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n" + GOOD, "line 1 (header)", "has unknown column Extra"),
        ("TIMESTAMP,ContextTokens,ContextTokens\n" + GOOD, "line 1 (header)", "lacks column GeneratedTokens"),
        (HEADER + GOOD + "2023-11-16 18:15:47.0,374,44,9\n", "line 3, column 4", "2023-11-16 18:15:47.0,374,44,9"),
        (HEADER + GOOD + "yesterday,374,44\n", "line 3, column TIMESTAMP", "'yesterday'"),
        (HEADER + GOOD + GOOD + "2023-02-30 18:15:46.6805900,374,44\n", "line 4, column TIMESTAMP", "2023-02-30"),
        (HEADER + "2023-11-16 18:15:46.6805900+01:00,374,44\n", "line 2, column TIMESTAMP", "+01:00"),
        (HEADER + GOOD + "\n" + "yesterday,374,44\n", "line 4, column TIMESTAMP", "'yesterday'"),  # after a blank line
        (HEADER + GOOD + "2023-11-16 18:15:47.0,12.5,44\n", "line 3, column ContextTokens", "'12.5'"),
        (HEADER + GOOD + "2023-11-16 18:15:47.0,many,44\n", "line 3, column ContextTokens", "'many'"),
        (HEADER + GOOD + "2023-11-16 18:15:47.0,374,-3\n", "line 3, column GeneratedTokens", "'-3'"),
        (HEADER + "2023-11-16 18:15:47.0,0,44\n", "line 2, column ContextTokens", "'0'"),
        (HEADER + GOOD + GOOD + "2023-11-16 18:15:47.0,374\n", "line 4, column GeneratedTokens", "''"),
        (HEADER, "(file)", "no requests"),
        ("", "(file)", "is empty"),
    ],
)
def test_bad_files_name_line_column_and_value(tmp_path, text, where, value):
    p = write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        load_azure_trace(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: {where}")
    assert value in msg
    assert "; " in msg and len(msg.split("; ")[-1]) > 10  # a fix follows


def test_blank_lines_and_quoted_column_names_are_read(tmp_path):
    text = '"TIMESTAMP","ContextTokens","GeneratedTokens"\r\n' + GOOD + "\n" + GOOD + "\n\n"
    reqs = load_azure_trace(write(tmp_path, text))
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(374, 44), (374, 44)]


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_azure_trace(tmp_path / "absent.csv")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"time_scale": 0}, "time_scale"),
        ({"time_scale": -1.0}, "time_scale"),
        ({"time_scale": math.nan}, "time_scale"),
        ({"rate_factor": 0.0}, "rate_factor"),
        ({"rate_factor": math.inf}, "rate_factor"),
        ({"rate_factor": "2"}, "rate_factor"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens"),
        ({"max_prompt_tokens": 1.5}, "max_prompt_tokens"),
        ({"limit": 0}, "limit"),
    ],
)
def test_loader_arguments_checked(tmp_path, kwargs, field):
    p = write(tmp_path, HEADER + GOOD)
    with pytest.raises(SpecError, match=f": {field}: "):
        load_azure_trace(p, **kwargs)


# ---- synthetic stream ------------------------------------------------------------------------


def test_synthetic_is_deterministic_for_a_seed_and_a_prefix_of_longer_streams():
    a = synthetic_requests(10.0, 100.0, seed=7)
    assert a == synthetic_requests(10.0, 100.0, seed=7)
    assert a != synthetic_requests(10.0, 100.0, seed=8)
    longer = synthetic_requests(10.0, 300.0, seed=7)
    assert longer[: len(a)] == a and len(longer) > len(a)


def test_synthetic_stream_shape():
    reqs = synthetic_requests(3.0, 200.0, seed=0)
    assert [r.rid for r in reqs] == list(range(len(reqs)))
    times = [r.arrival_s for r in reqs]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 200.0
    assert all(isinstance(r.prompt_tokens, int) and r.prompt_tokens >= 1 for r in reqs)
    assert all(isinstance(r.output_tokens, int) and r.output_tokens >= 1 for r in reqs)


@pytest.mark.parametrize("rate_per_s", [0.5, 5.0, 40.0])
def test_synthetic_mean_rate_and_cv(rate_per_s):
    duration_s = 20_000 / rate_per_s  # about 20000 requests: the count's relative sd is about 1%
    reqs = synthetic_requests(rate_per_s, duration_s, seed=3)
    assert len(reqs) / duration_s == pytest.approx(rate_per_s, rel=0.10)
    gaps = gaps_of(reqs)
    assert gaps.std() / gaps.mean() == pytest.approx(AZURE_CONV_2023.interarrival_cv, rel=0.10)


def test_synthetic_lengths_follow_the_fitted_tables():
    reqs = synthetic_requests(10.0, 2000.0, seed=5)
    prompt = [r.prompt_tokens for r in reqs]
    output = [r.output_tokens for r in reqs]
    for p in (0.1, 0.5, 0.9):
        assert np.quantile(prompt, p) == pytest.approx(quantile_of(AZURE_CONV_2023.prompt_tokens_q, p), rel=0.15)
        assert np.quantile(output, p) == pytest.approx(quantile_of(AZURE_CONV_2023.output_tokens_q, p), rel=0.15)
    assert max(prompt) <= AZURE_CONV_2023.prompt_tokens_q[-1] and min(prompt) >= AZURE_CONV_2023.prompt_tokens_q[0]


def test_synthetic_uses_the_given_fit():
    fixed = TraceFit(
        prompt_tokens_q=(100.0,) * len(QUANTILE_PROBS),
        output_tokens_q=(7.0,) * len(QUANTILE_PROBS),
        rate_per_s=1.0,
        interarrival_cv=1.0,
    )
    reqs = synthetic_requests(2.0, 50.0, seed=0, fit=fixed)
    assert {(r.prompt_tokens, r.output_tokens) for r in reqs} == {(100, 7)}


def test_synthetic_max_prompt_tokens():
    cap = 500
    free = synthetic_requests(5.0, 500.0, seed=2)
    capped = synthetic_requests(5.0, 500.0, seed=2, max_prompt_tokens=cap)
    assert max(r.prompt_tokens for r in capped) == cap
    assert [min(r.prompt_tokens, cap) for r in free] == [r.prompt_tokens for r in capped]
    assert [(r.arrival_s, r.output_tokens) for r in free] == [(r.arrival_s, r.output_tokens) for r in capped]


@pytest.mark.parametrize(
    "args, kwargs, field",
    [
        ((0.0, 10.0, 0), {}, "rate_per_s"),
        ((-1.0, 10.0, 0), {}, "rate_per_s"),
        ((math.nan, 10.0, 0), {}, "rate_per_s"),
        ((1.0, 0.0, 0), {}, "duration_s"),
        ((1.0, math.inf, 0), {}, "duration_s"),
        ((1.0, -5, 0), {}, "duration_s"),
        ((1.0, 10.0, -1), {}, "seed"),
        ((1.0, 10.0, 1.5), {}, "seed"),
        ((1.0, 10.0, True), {}, "seed"),
        ((1e6, 1e6, 0), {}, r"rate_per_s \* duration_s"),
        ((1.0, 10.0, 0), {"max_prompt_tokens": 0}, "max_prompt_tokens"),
    ],
)
def test_synthetic_arguments_checked(args, kwargs, field):
    with pytest.raises(SpecError, match=f"^synthetic_requests: {field}: "):
        synthetic_requests(*args, **kwargs)


# ---- quantile tables and fitting -------------------------------------------------------------


def test_tokens_from_quantiles_interpolates_in_log_space():
    table = tuple(float(2**i) for i in range(len(QUANTILE_PROBS)))  # doubles at every knot
    u = np.array(QUANTILE_PROBS)
    assert tokens_from_quantiles(u, table).tolist() == [2**i for i in range(len(QUANTILE_PROBS))]
    mid = (QUANTILE_PROBS[10] + QUANTILE_PROBS[11]) / 2  # halfway between 1024 and 2048
    assert tokens_from_quantiles(np.array([mid]), table).tolist() == [round(1024 * math.sqrt(2))]
    with pytest.raises(SpecError, match="quantile table"):
        tokens_from_quantiles(u, table[::-1])
    with pytest.raises(SpecError, match="quantile table"):
        tokens_from_quantiles(u, table[:-1])


def test_fit_trace_on_a_hand_built_stream():
    gaps = [1.0, 3.0] * 50  # mean 2 s, sd 1 s
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    reqs = [Request(i, float(t), i + 1, 2 * (i + 1)) for i, t in enumerate(times)]  # prompts 1..101
    fit = fit_trace(reqs)
    assert fit.rate_per_s == pytest.approx(0.5)
    assert fit.interarrival_cv == pytest.approx(0.5)
    assert quantile_of(fit.prompt_tokens_q, 0.5) == 51.0
    assert quantile_of(fit.output_tokens_q, 0.5) == 102.0
    assert fit.prompt_tokens_q[0] == 1.0 and fit.prompt_tokens_q[-1] == 101.0
    with pytest.raises(SpecError, match="too few"):
        fit_trace(reqs[:2])


# ---- request table ---------------------------------------------------------------------------


def test_frame_round_trip_through_parquet(tmp_path):
    reqs = synthetic_requests(5.0, 20.0, seed=4)
    df = requests_to_frame(reqs)
    assert tuple(df.columns) == COLUMNS
    assert [str(t) for t in df.dtypes] == ["int64", "float64", "int64", "int64"]
    assert len(df) == len(reqs) and df["prompt_tokens"].tolist() == [r.prompt_tokens for r in reqs]
    df.to_parquet(tmp_path / "requests.parquet")
    assert requests_from_frame(pd.read_parquet(tmp_path / "requests.parquet")) == reqs
    assert requests_to_frame([]).shape == (0, 4)


@pytest.mark.parametrize(
    "column, value, where",
    [
        ("prompt_tokens", 0, "row 1, column prompt_tokens"),
        ("output_tokens", 2.5, "row 1, column output_tokens"),
        ("arrival_s", -1.0, "row 1, column arrival_s"),
        ("arrival_s", math.nan, "row 1, column arrival_s"),
        ("rid", -1, "row 1, column rid"),
    ],
)
def test_frame_bad_values_named(column, value, where):
    df = requests_to_frame([Request(0, 0.0, 5, 5), Request(1, 1.0, 5, 5)])
    df[column] = df[column].astype(object)
    df.loc[1, column] = value
    with pytest.raises(SpecError, match=f"^runs/x/requests.parquet: {where}: "):
        requests_from_frame(df, "runs/x/requests.parquet")


def test_frame_missing_column():
    df = requests_to_frame([Request(0, 0.0, 5, 5)]).drop(columns=["output_tokens"])
    with pytest.raises(SpecError, match="lack output_tokens"):
        requests_from_frame(df)


def test_a_timestamp_beyond_nanosecond_range_is_refused(tmp_path):
    """pandas parses year 3023 but converting it to nanoseconds overflows silently."""
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n3023-11-16 18:15:48,10,5\n")
    with pytest.raises(SpecError, match=r"line 3, column TIMESTAMP: '3023-11-16 18:15:48' is outside"):
        load_azure_trace(p)
