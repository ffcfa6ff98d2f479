"""A run as ``vllm bench serve``'s result file (``--save-result``): its keys, its units.

The definitions follow vLLM 0.33's ``vllm/benchmarks/serve.py`` (``calculate_metrics`` and the
result dict of ``benchmark``), applied to simulated time:

    completed  = requests that finished;  failed = the others (rejected, or stuck in a deadlock)
    duration   = the run's simulated time (s; ticks under the unit clock)
    total_input_tokens  = prompt tokens of the completed requests
    total_output_tokens = output tokens of the completed requests (output_lens: 0 if failed)
    request_throughput = completed / duration;  output_throughput = total_output / duration
    total_token_throughput = (total_input + total_output) / duration
    TTFT  = first token - arrival;  E2EL = finish - arrival            (completed requests)
    TPOT  = (E2EL - TTFT) / (output tokens - 1)        (completed requests with >= 2 tokens)
    ITL   = the gaps between a request's successive output tokens, pooled over the completed
            requests (a request of m tokens gives m - 1; they sum to E2EL - TTFT)
    mean_/median_/std_/pNN_<metric>_ms: numpy mean, median, population std (ddof 0) and
            percentile (linear) of each metric, in milliseconds; 0 for an empty metric (vLLM's
            ``np.mean(x or 0)``). Only the metrics of ``percentile_metrics`` get these keys.
    request_goodput = completed requests within every SLO of ``goodput`` / duration (None
            without one); a request of one output token counts TPOT 0 there, as vLLM does.
    ttfts (s, 0.0 if failed), itls (s, a list per request, [] if failed), input_lens,
    output_lens, errors ("" or the reason it failed): per request, in arrival order.

A simulated run also carries what ``vllm bench serve`` records about the run itself:
``backend`` ("pagedkv"), ``model_id``, ``num_prompts``, ``request_rate`` (a number, "inf"
when every request arrives at t = 0 as vLLM spells it, None when a trace's own times apply),
``burstiness`` and ``max_concurrency`` (None without a cap). vLLM's ``date`` is left out: the
same inputs give byte-identical files.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagedkv.errors import ConfigError

METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"  # vLLM's defaults
DEFAULT_METRIC_PERCENTILES = "99"
MS = 1000.0


@dataclass(frozen=True)
class VllmResultConfig:
    """What ``--percentile-metrics``, ``--metric-percentiles`` and ``--goodput`` choose."""

    percentile_metrics: tuple[str, ...] = tuple(DEFAULT_PERCENTILE_METRICS.split(","))
    metric_percentiles: tuple[float, ...] = (99.0,)
    goodput: tuple[tuple[str, float], ...] = ()  # (metric, SLO in ms)

    def __post_init__(self) -> None:
        for m in self.percentile_metrics:
            if m not in METRICS:
                raise ConfigError("percentile_metrics", m, f"must be among {', '.join(METRICS)}")
        for p in self.metric_percentiles:
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 100:
                raise ConfigError("metric_percentiles", p, "must be numbers from 0 to 100")
        for key, slo in self.goodput:
            if key not in GOODPUT_METRICS:
                raise ConfigError("goodput", key, f"must be among {', '.join(GOODPUT_METRICS)}")
            if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not slo >= 0:
                raise ConfigError("goodput", slo, "an SLO must be a number of ms >= 0")

    @classmethod
    def from_flags(
        cls,
        percentile_metrics: str = DEFAULT_PERCENTILE_METRICS,
        metric_percentiles: str = DEFAULT_METRIC_PERCENTILES,
        goodput: Sequence[str] | None = None,
    ) -> VllmResultConfig:
        """From vLLM's flag syntax: "ttft,tpot", "50,99", ["ttft:200", "tpot:50"] (ms)."""
        metrics = tuple(m.strip() for m in percentile_metrics.split(","))
        percentiles = []
        for text in metric_percentiles.split(","):
            try:
                percentiles.append(float(text))
            except ValueError:
                raise ConfigError(
                    "metric_percentiles", text, "must be numbers from 0 to 100, comma-separated"
                ) from None
        slos = []
        for item in goodput or ():
            key, sep, value = item.partition(":")
            try:
                slo = float(value)
            except ValueError:
                slo = None
            if not sep or slo is None:
                raise ConfigError("goodput", item, "must be KEY:VALUE, e.g. ttft:200 (ms)")
            slos.append((key.strip(), slo))
        return cls(metrics, tuple(percentiles), tuple(slos))


def _percentile_key(p: float) -> str:
    """vLLM's key word of a percentile: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def vllm_result(
    requests: Sequence[Mapping[str, Any]],
    token_times: Mapping[int, Sequence[float]],
    duration: float,
    config: VllmResultConfig | None = None,
) -> dict[str, Any]:
    """The result file of ``vllm bench serve`` for a run: its per-request records (the
    ``requests`` of ``SimulationResult``), each one's output token times (``token_times``)
    and its simulated time. The formulas: the module's docstring."""
    config = config or VllmResultConfig()
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []  # with 0 for a one-token request (goodput's)
    itls: list[float] = []
    e2els: list[float] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    req_ttfts: list[float] = []
    req_itls: list[list[float]] = []
    errors: list[str] = []
    total_input = 0
    for r in requests:
        input_lens.append(r["prompt_len"])
        if r["status"] != "finished":
            output_lens.append(0)
            req_ttfts.append(0.0)
            req_itls.append([])
            errors.append(r["reject_reason"] or f"not finished ({r['status']})")
            continue
        times = token_times[r["request_id"]]
        ttft = r["first_token_time"] - r["arrival_time"]
        e2el = r["finish_time"] - r["arrival_time"]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        out = r["output_len"]
        tpot = (e2el - ttft) / (out - 1) if out > 1 else 0.0
        if out > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        total_input += r["prompt_len"]
        ttfts.append(ttft)
        e2els.append(e2el)
        itls.extend(gaps)
        output_lens.append(out)
        req_ttfts.append(ttft)
        req_itls.append(gaps)
        errors.append("")
    completed = len(ttfts)
    total_output = sum(output_lens)

    def per_second(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    result: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": len(requests) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_second(completed),
        "request_goodput": None,
        "output_throughput": per_second(total_output),
        "total_token_throughput": per_second(total_input + total_output),
        "input_lens": input_lens,
        "output_lens": output_lens,
        "ttfts": req_ttfts,
        "itls": req_itls,
        "errors": errors,
    }
    if config.goodput:
        values = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        slos = [(values[key], slo / MS) for key, slo in config.goodput]
        good = sum(all(v[i] <= slo for v, slo in slos) for i in range(completed))
        result["request_goodput"] = per_second(good)
    samples = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in METRICS:
        if name not in config.percentile_metrics:
            continue
        a = np.asarray(samples[name] or [0.0], dtype=float)
        result[f"mean_{name}_ms"] = float(np.mean(a)) * MS
        result[f"median_{name}_ms"] = float(np.median(a)) * MS
        result[f"std_{name}_ms"] = float(np.std(a)) * MS
        for p in config.metric_percentiles:
            result[f"p{_percentile_key(p)}_{name}_ms"] = float(np.percentile(a, p)) * MS
    return result


def simulation_vllm_result(result: Any, config: VllmResultConfig | None = None) -> dict[str, Any]:
    """``vllm_result`` of a ``SimulationResult`` from ``simulate(..., token_times=True)``."""
    if result.token_times is None:
        raise ConfigError(
            "token_times", None, "the result file needs simulate(config, token_times=True)"
        )
    duration = result.summary["sim_time"]
    out = run_keys(result.config)
    out.update(vllm_result(result.requests, result.token_times, duration, config))
    return out


def run_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys that describe the run (the module's docstring), from a result's flat config."""
    rate = config.get("request_rate")
    from_trace = config.get("workload") == "trace" and config.get("arrival") is None
    return {
        "backend": "pagedkv",
        "model_id": config.get("model"),
        "num_prompts": config.get("num_requests"),
        "request_rate": None if from_trace else "inf" if rate is None else rate,
        "burstiness": config.get("burstiness", 1.0),
        "max_concurrency": config.get("max_concurrency"),
    }
