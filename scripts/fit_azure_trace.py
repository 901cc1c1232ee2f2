#!/usr/bin/env python3
"""Fit the synthetic request stream's distributions to an Azure LLM inference trace 2023 CSV.

Prints the ``TraceFit`` constants to paste into ``testbed/requests.py`` (with the date), then how
well they fit: quantiles of the trace against the quantile-table fit and against a log-normal
(mean and standard deviation of log tokens), inter-arrival quantiles against the Gamma renewal fit
and a Poisson process, and the burstiness of 10 s request counts.

Run: .venv/bin/python scripts/fit_azure_trace.py \
    ../shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from statistics import NormalDist

import numpy as np

from testbed.bubbletea.azure_trace import fit_trace, load_azure_trace
from testbed.bubbletea.request_table import requests_to_frame
from testbed.bubbletea.requests import QUANTILE_PROBS, synthetic_requests, tokens_from_quantiles

CHECK_PROBS = (0.025, 0.075, 0.10, 0.25, 0.375, 0.425, 0.50, 0.625, 0.75, 0.875, 0.90, 0.975, 0.99, 0.997)
SAMPLES = 1_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, help="trace file (TIMESTAMP,ContextTokens,GeneratedTokens)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the samples drawn to check the fit (default 0)")
    args = ap.parse_args()
    reqs = load_azure_trace(args.csv)
    fit = fit_trace(reqs)
    frame = requests_to_frame(reqs)
    span_s = float(frame["arrival_s"].iloc[-1])
    rng = np.random.default_rng(args.seed)

    print(f"# Fitted by `scripts/fit_azure_trace.py {args.csv}`")
    print(f"# on {datetime.date.today()} ({len(reqs)} requests over {span_s:.0f} s).")
    print(f"AZURE_CONV_2023 = {fit!r}\n")

    norm = NormalDist()
    for column, table in (("prompt_tokens", fit.prompt_tokens_q), ("output_tokens", fit.output_tokens_q)):
        real = frame[column].to_numpy()
        mu, sigma = float(np.log(real).mean()), float(np.log(real).std())
        table_q = np.quantile(tokens_from_quantiles(rng.random(SAMPLES), table), CHECK_PROBS)
        print(f"{column}: log-normal mu={mu:.4f} sigma={sigma:.4f}; mean real {real.mean():.1f}")
        print(f"  {'p':>6} {'real':>9} {'table':>9} {'lognorm':>9}")
        for p, r, t in zip(CHECK_PROBS, np.quantile(real, CHECK_PROBS), table_q):
            print(f"  {p:6.3f} {r:9.1f} {t:9.1f} {np.exp(mu + sigma * norm.inv_cdf(p)):9.1f}")
    rank = frame[["prompt_tokens", "output_tokens"]].rank().corr().iloc[0, 1]
    print(f"rank correlation of prompt and output length: {rank:.3f} (the synthetic stream draws them independently)\n")

    gaps = np.diff(frame["arrival_s"].to_numpy())
    shape = 1.0 / fit.interarrival_cv**2
    gamma = rng.gamma(shape, 1.0 / (fit.rate_per_s * shape), SAMPLES)
    poisson = rng.exponential(1.0 / fit.rate_per_s, SAMPLES)
    print(f"inter-arrival s: rate {fit.rate_per_s} /s, CV {fit.interarrival_cv} (Gamma shape {shape:.4f})")
    print(f"  {'p':>6} {'real':>9} {'gamma':>9} {'poisson':>9}")
    for p, r, g, e in zip(CHECK_PROBS, *(np.quantile(x, CHECK_PROBS) for x in (gaps, gamma, poisson))):
        print(f"  {p:6.3f} {r:9.4f} {g:9.4f} {e:9.4f}")

    synth = requests_to_frame(synthetic_requests(fit.rate_per_s, span_s, args.seed, fit=fit))
    for name, times in (("real", frame["arrival_s"]), ("gamma", synth["arrival_s"])):
        counts = np.histogram(times, bins=np.arange(0.0, span_s, 10.0))[0]
        print(f"10 s counts, {name:>5}: mean {counts.mean():.1f}, variance/mean {counts.var() / counts.mean():.2f}")
    five_min = np.histogram(frame["arrival_s"], bins=np.arange(0.0, span_s + 1, 300.0))[0]
    print(f"5 min counts, real: {' '.join(map(str, five_min))}")
    print(f"(quantile table at probabilities {QUANTILE_PROBS})")


if __name__ == "__main__":
    main()
