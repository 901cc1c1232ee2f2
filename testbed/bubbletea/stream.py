"""The request stream of a BubbleTea run or simulation: the trace file an experiment names
(``bubbletea.requests``, the Azure LLM inference trace's CSV format) or the synthetic stream fitted
to that trace, with the check that the served model holds the trace's prompts."""

from __future__ import annotations

from testbed.bubbletea.azure_trace import load_azure_trace
from testbed.bubbletea.request_table import Request
from testbed.bubbletea.requests import synthetic_requests
from testbed.errors import SpecError
from testbed.spec.bubbletea import BubbleTeaSpec
from testbed.spec.experiment import Experiment

#: how long a synthetic request stream lasts (s); a run stops reading it when it ends
SYNTHETIC_STREAM_S = 3600.0


def request_stream(exp: Experiment, duration_s: float = SYNTHETIC_STREAM_S) -> list[Request]:
    """The run's requests, sorted by arrival: the trace file's (``bubbletea.requests``, all of it)
    or the synthetic stream fitted to the Azure 2023 trace (``duration_s`` seconds of it). Raises
    SpecError for a trace that cannot be read or whose longest prompt the served model cannot hold
    (``check_prompts_fit``): the runner calls it before building anything."""
    bt = exp.bubbletea
    if not bt.requests:
        return synthetic_requests(bt.request_rate, duration_s, exp.seed)
    reqs = load_azure_trace(bt.requests, time_scale=bt.time_scale, rate_factor=bt.rate_factor)
    check_prompts_fit(bt, reqs)
    return reqs


def check_prompts_fit(bt: BubbleTeaSpec, requests: list[Request]) -> None:
    """Raise SpecError if a request of a trace needs more positions than the served model holds
    with prompts unclipped (``bt.max_prompt_tokens`` None), naming the request and the fixes."""
    if bt.max_prompt_tokens is not None or bt.model is None or not requests:
        return
    longest = max(requests, key=lambda r: r.prompt_tokens)
    need = longest.prompt_tokens + bt.max_output_tokens
    if need > bt.model.seq_len:
        clip = bt.model.seq_len - bt.max_output_tokens
        raise SpecError(
            str(bt.requests),
            "ContextTokens",
            longest.prompt_tokens,
            f"(the {ordinal(longest.rid + 1)} request in arrival order) plus max_output_tokens "
            f"({bt.max_output_tokens}) exceeds the served model's context ({bt.model.seq_len} positions)",
            f"give bubbletea.model.seq_len >= {need} in the experiment"
            + (f", or clip prompts with bubbletea.max_prompt_tokens <= {clip}" if clip >= 1 else ""),
        )


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
