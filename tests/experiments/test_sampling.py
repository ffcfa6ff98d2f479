"""The ``sampling`` experiment in --quick mode, its no-sharing baseline workload, and its
claims: facts that must hold whatever the numbers."""

from __future__ import annotations

import pytest

from pagedkv.errors import ConfigError
from pagedkv.experiments import framework, sampling
from pagedkv.experiments.framework import ExperimentResult
from pagedkv.experiments.paper_claims import FIG15, sampling_claims
from pagedkv.experiments.registry import EXPERIMENTS
from pagedkv.experiments.verdict import Measurement, judge
from pagedkv.workloads import WorkloadConfig, make_workload
from pagedkv.workloads.config import WorkloadKind


@pytest.fixture(scope="module")
def result() -> ExperimentResult:
    return framework.run_experiment(sampling, quick=True, workers=1)


def test_registered_for_reproduce_and_the_report() -> None:
    assert EXPERIMENTS["sampling"] is sampling


def test_the_baseline_runs_each_group_as_independent_requests() -> None:
    base = make_workload(WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, num_requests=5, seed=3))
    flat = make_workload(
        WorkloadConfig(kind=WorkloadKind.ALPACA_LIKE, num_requests=5, seed=3, beam_width=3,
                       samples_as_requests=True)
    )  # fmt: skip
    assert [r.request_id for r in flat] == list(range(15))
    assert all(r.n == 1 and r.beam_width == 1 for r in flat)
    for i, r in enumerate(flat):
        b = base[i // 3]
        assert (r.prompt_len, r.output_len, r.arrival_time) == (
            b.prompt_len,
            b.output_len,
            b.arrival_time,
        )
    with pytest.raises(ConfigError) as err:
        WorkloadConfig(kind=WorkloadKind.CHAT, samples_as_requests=True)
    assert err.value.field == "samples_as_requests"


def test_every_run_finishes_and_only_sharing_saves(result: ExperimentResult) -> None:
    for row in result.rows:
        if row["setting"] == "orca-oracle":
            assert row["saved_fraction"] == 0.0
        else:
            assert row["saved_fraction"] > 0.0
        assert row["request_throughput"] > 0.0


def test_beams_save_more_than_samples_and_wider_saves_more(result: ExperimentResult) -> None:
    def saved(workload: str, search: str, width: int) -> float:
        s = result.summary_for(workload=workload, search=search, width=width, setting="vllm")
        return float(s["saved_fraction_mean"])

    for wl in ("alpaca-like", "sharegpt-like"):
        for w in sampling.WIDTHS:
            assert saved(wl, "beam", w) > saved(wl, "parallel", w)
        assert saved(wl, "beam", 2) < saved(wl, "beam", 4) < saved(wl, "beam", 6)


def test_gain_is_paired_per_seed_and_findings_cite_the_paper(result: ExperimentResult) -> None:
    gain = sampling.group_gain(result, "alpaca-like", "beam", 6)
    assert gain.n == framework.QUICK_SEEDS
    assert gain.mean is not None
    assert gain.mean > 0
    text = " ".join(result.findings)
    assert "37.6%-55.2%" in text
    assert "6.1%-9.8%" in text


def test_claims_are_judged_per_width_from_the_numbers(result: ExperimentResult) -> None:
    """Each width is judged against its own figure's range (Fig. 15 on Alpaca), and the
    claim's verdict is the least favourable of its widths'."""
    claims = sampling_claims(result)
    assert [c.id for c in claims] == [
        "parallel-sampling-saves-6-10pct",
        "parallel-sampling-saves-6-10pct-sharegpt",
        "beam-search-saves-38-55pct",
        "beam-search-saves-38-55pct-sharegpt",
    ]
    for claim in claims:
        search = claim.id.split("-")[0]
        wl = "sharegpt-like" if claim.id.endswith("sharegpt") else "alpaca-like"
        assert [m["condition"] for m in claim.measurements] == [
            f"{wl}, width {w}" for w in sampling.WIDTHS
        ]
        for w, rec in zip(sampling.WIDTHS, claim.measurements, strict=True):
            s = result.summary_for(workload=wl, search=search, width=w, setting="vllm")
            assert rec["mean"] == s["saved_fraction_mean"]
            if wl == "alpaca-like":
                assert rec["low"] < FIG15[search][w] < rec["high"]
            m = Measurement("", rec["mean"], rec["ci_low"], rec["ci_high"], rec["n"])
            assert judge(m, rec["low"], rec["high"], "higher").verdict == rec["verdict"]
        assert claim.verdict in {rec["verdict"] for rec in claim.measurements}
