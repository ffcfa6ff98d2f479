"""Findings name a winner only when intervals allow (pagedkv.report.compare), and the
block-size experiment's findings use that rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.experiments import block_size
from pagedkv.experiments.framework import ExperimentResult
from pagedkv.report.compare import Candidate, best, overlap
from pagedkv.report.stats import MeanCI


def cand(name: str, mean: float, half: float | None, n: int = 5) -> Candidate:
    if half is None:
        return Candidate(name, MeanCI(mean, None, None, n))
    return Candidate(name, MeanCI(mean, mean - half, mean + half, n))


def test_overlapping_intervals_name_no_winner() -> None:
    text = best(
        [cand("A", 2.0, 0.5), cand("B", 1.8, 0.5), cand("C", 0.5, 0.1)],
        higher=True,
        what="throughput",
        unit="requests/s",
    )
    assert "A and B overlap: no winner at n=5" in text
    assert "C" not in text  # clear of the best: not among those that could be it
    assert "highest" not in text


def test_clear_intervals_name_the_winner() -> None:
    text = best([cand("A", 2.0, 0.1), cand("B", 1.0, 0.1)], higher=True, what="throughput")
    assert text.startswith("throughput: highest at A (2 [1.9, 2.1])")
    assert "clear of every other's at n=5" in text
    assert "no winner" not in text


def test_lower_is_better_picks_the_least_mean() -> None:
    text = best([cand("A", 2.0, 0.1), cand("B", 1.0, 0.1)], higher=False, what="latency")
    assert text.startswith("latency: lowest at B")
    overlapping = best([cand("A", 1.1, 0.2), cand("B", 1.0, 0.2)], higher=False, what="latency")
    assert "B and A overlap: no winner" in overlapping


def test_no_interval_means_no_winner_whatever_the_means() -> None:
    text = best([cand("A", 9.0, None, 2), cand("B", 1.0, None, 2)], higher=True, what="throughput")
    assert "n=2 too small for an interval (needs 3): no winner" in text
    assert "highest" not in text


def test_different_seed_counts_are_shown_as_a_range() -> None:
    text = best([cand("A", 1.0, 0.5, 3), cand("B", 1.2, 0.5, 5)], higher=True, what="x")
    assert "no winner at n=3-5" in text


def test_one_or_no_measured_candidate() -> None:
    none = Candidate("A", MeanCI(None, None, None, 0))
    assert best([none], higher=True, what="x") == "x: not measured."
    assert "only B measured" in best([none, cand("B", 1.0, 0.1)], higher=True, what="x")


interval = st.tuples(st.floats(0, 100), st.floats(0, 10))


@given(st.lists(interval, min_size=2, max_size=6), st.booleans())
def test_a_named_winner_never_overlaps_another(spec: list[tuple[float, float]], hi: bool) -> None:
    cands = [cand(f"c{i}", m, h) for i, (m, h) in enumerate(spec)]
    text = best(cands, higher=hi, what="m")
    named = "highest at " in text or "lowest at " in text
    assert named != ("no winner" in text)
    if named:
        winner = next(c for c in cands if f" at {c.name} (" in text)
        assert all(not overlap(winner.ci, c.ci) for c in cands if c is not winner)
        means = [c.ci.mean for c in cands if c.ci.mean is not None]
        assert winner.ci.mean == (max(means) if hi else min(means))


def result(summary: list[dict[str, object]]) -> ExperimentResult:
    return ExperimentResult(
        experiment="block-size",
        title="Block size",
        question="",
        setup={},
        config_keys=("workload", "block_size"),
        metrics=("request_throughput", "norm_latency_p99"),
        rows=[],
        summary=summary,
    )


def row(
    wl: str, bs: int, thr: tuple[float, float, float], lat: tuple[float, float, float]
) -> dict[str, object]:
    return {
        "workload": wl,
        "block_size": bs,
        "request_throughput_mean": thr[0],
        "request_throughput_ci_low": thr[1],
        "request_throughput_ci_high": thr[2],
        "norm_latency_p99_mean": lat[0],
        "norm_latency_p99_ci_low": lat[1],
        "norm_latency_p99_ci_high": lat[2],
        "n": 5,
    }


def test_block_size_findings_follow_the_overlap_rule() -> None:
    summary = [
        # sharegpt-like: 16 and 32 overlap on throughput; 16 clear on latency
        row("sharegpt-like", 16, (1.70, 1.65, 1.75), (0.10, 0.09, 0.11)),
        row("sharegpt-like", 32, (1.68, 1.60, 1.72), (0.20, 0.18, 0.22)),
        row("sharegpt-like", 256, (0.90, 0.85, 0.95), (0.90, 0.80, 1.00)),
        # alpaca-like: 16 clear on throughput; all overlap on latency
        row("alpaca-like", 16, (16.0, 15.5, 16.5), (0.05, 0.04, 0.07)),
        row("alpaca-like", 32, (12.0, 11.5, 12.5), (0.05, 0.04, 0.06)),
    ]
    out = block_size.findings(result(summary))
    assert len(out) == 4
    thr_share, lat_share, thr_alpaca, lat_alpaca = out
    assert "block size 16 and block size 32 overlap: no winner at n=5" in thr_share
    assert "lowest at block size 16" in lat_share
    assert "highest at block size 16" in thr_alpaca
    assert "overlap: no winner at n=5" in lat_alpaca


def test_many_overlapping_candidates_show_the_best_interval_only() -> None:
    text = best([cand(f"c{i}", 1.0 + i / 100, 0.5) for i in range(5)], higher=True, what="x")
    assert (
        "c4, c3, c2, c1 and c0 overlap: no winner at n=5 (the best mean: c4 1.04 [0.54, 1.54])"
        in text
    )
