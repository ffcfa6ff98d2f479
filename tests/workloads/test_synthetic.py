"""Synthetic lengths: the paper's means, heavy tails, determinism, independent streams, caps."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.workloads.synthetic import (
    ALPACA_LIKE,
    SHAREGPT_LIKE,
    Fixed,
    LengthModel,
    Lognormal,
    Stream,
    Uniform,
    cap_lengths,
    capped_means,
    child_rng,
)

N = 200_000
PRESETS = {"sharegpt": SHAREGPT_LIKE, "alpaca": ALPACA_LIKE}
PAPER_MEANS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}
"""arXiv 2309.06180, §6.1: mean input and output tokens of each data set."""


def _lognormal_cv(sigma: float) -> float:
    return math.sqrt(math.exp(sigma**2) - 1)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_carry_the_papers_means(name: str) -> None:
    model = PRESETS[name]
    assert (model.prompt.mean, model.output.mean) == PAPER_MEANS[name]


@pytest.mark.parametrize("name", PRESETS)
def test_uncapped_empirical_means_match_the_paper(name: str) -> None:
    # Tolerance: 5 standard errors of the mean of N draws, CV / sqrt(N) relative
    # (1.5% for sigma 1.0, 0.9% for sigma 0.7). A wrong mu (say, ln(mean) without the
    # -sigma^2/2 term) is off by 65% or 28%.
    model = PRESETS[name]
    prompts, outputs = model.sample(N, seed=0)
    for dist, drawn in ((model.prompt, prompts), (model.output, outputs)):
        assert isinstance(dist, Lognormal)
        tolerance = 5 * _lognormal_cv(dist.sigma) / math.sqrt(N)
        assert np.mean(drawn) == pytest.approx(dist.mean, rel=tolerance)


@pytest.mark.parametrize("name", PRESETS)
def test_capped_empirical_means_match_the_exact_capped_means(name: str) -> None:
    model = PRESETS[name]
    prompts, outputs = cap_lengths(*model.sample(N, seed=1), 2048)
    exact = capped_means(model, 2048)
    for drawn, mean in zip((prompts, outputs), exact, strict=True):
        standard_error = float(np.std(drawn)) / math.sqrt(N)
        assert abs(np.mean(drawn) - mean) < 5 * standard_error


def test_capping_lowers_sharegpt_but_not_alpaca() -> None:
    s_prompt, s_output = capped_means(SHAREGPT_LIKE, 2048)
    assert s_prompt < SHAREGPT_LIKE.prompt.mean
    assert s_output < 0.97 * SHAREGPT_LIKE.output.mean  # the long tail: more than 3% of it
    a_prompt, a_output = capped_means(ALPACA_LIKE, 2048)
    assert a_prompt == pytest.approx(ALPACA_LIKE.prompt.mean, abs=1e-3)
    assert a_output == pytest.approx(ALPACA_LIKE.output.mean, abs=1e-3)


@pytest.mark.parametrize("name", PRESETS)
def test_rounding_keeps_the_mean(name: str) -> None:
    # A cap far in the tail cuts (almost) nothing: the exact mean of the rounded lengths.
    prompt, output = capped_means(PRESETS[name], 100_000)
    assert prompt == pytest.approx(PRESETS[name].prompt.mean, rel=1e-6)
    assert output == pytest.approx(PRESETS[name].output.mean, rel=1e-6)


@pytest.mark.parametrize(
    "model",
    [
        LengthModel(Uniform(1, 9), Uniform(3, 12)),
        LengthModel(Fixed(7), Uniform(1, 10)),
        LengthModel(Uniform(2, 6), Fixed(9)),
    ],
)
def test_capped_means_equal_enumeration(model: LengthModel) -> None:
    # Enumerate every (prompt, output) pair of two small uniform/fixed laws, cap, average.
    def support(d: Fixed | Uniform | Lognormal) -> list[int]:
        if isinstance(d, Fixed):
            return [d.value]
        assert isinstance(d, Uniform)
        return list(range(d.low, d.high + 1))

    pairs = list(itertools.product(support(model.prompt), support(model.output)))
    prompts, outputs = cap_lengths([p for p, _ in pairs], [o for _, o in pairs], 12)
    exact = capped_means(model, 12)
    assert exact[0] == pytest.approx(np.mean(prompts))
    assert exact[1] == pytest.approx(np.mean(outputs))


def test_heavy_tails() -> None:
    prompts, outputs = SHAREGPT_LIKE.sample(N, seed=2)
    for drawn in (prompts, outputs):
        # Right skew: the median is below the mean, the 99th percentile far above it.
        assert np.median(drawn) < 0.7 * np.mean(drawn)
        assert np.percentile(drawn, 99) > 5 * np.mean(drawn)


def test_same_seed_same_lengths_different_seed_different() -> None:
    assert SHAREGPT_LIKE.sample(1000, seed=3) == SHAREGPT_LIKE.sample(1000, seed=3)
    assert SHAREGPT_LIKE.sample(1000, seed=3) != SHAREGPT_LIKE.sample(1000, seed=4)


def test_prompts_do_not_depend_on_the_output_model() -> None:
    a = LengthModel(SHAREGPT_LIKE.prompt, Fixed(5)).sample(500, seed=5)
    b = LengthModel(SHAREGPT_LIKE.prompt, Uniform(1, 100)).sample(500, seed=5)
    assert a[0] == b[0]
    assert a[1] != b[1]


def test_first_k_of_n_are_the_workload_of_k() -> None:
    prompts, outputs = ALPACA_LIKE.sample(300, seed=6)
    assert ALPACA_LIKE.sample(100, seed=6) == (prompts[:100], outputs[:100])


def test_streams_are_the_children_of_the_seed() -> None:
    children = np.random.SeedSequence(7).spawn(len(Stream))
    for stream in Stream:
        expected = np.random.default_rng(children[stream]).random(4)
        assert list(child_rng(7, stream).random(4)) == list(expected)
    assert list(child_rng(7, Stream.PROMPT).random(4)) != list(
        child_rng(7, Stream.OUTPUT).random(4)
    )


def test_lengths_are_integers_at_least_one() -> None:
    tiny = Lognormal(1.0, 2.0)  # most of its mass is below 0.5 tokens
    drawn = tiny.sample(10_000, child_rng(0, Stream.PROMPT))
    assert drawn.dtype == np.int64
    assert drawn.min() == 1


def test_uniform_covers_both_ends_and_nothing_else() -> None:
    drawn = Uniform(3, 6).sample(10_000, child_rng(0, Stream.PROMPT))
    assert set(drawn.tolist()) == {3, 4, 5, 6}


def test_fixed_is_constant() -> None:
    assert Fixed(9).sample(4, child_rng(0, Stream.PROMPT)).tolist() == [9, 9, 9, 9]


@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), max_size=50),
    st.integers(2, 4096),
)
def test_caps_hold(pairs: list[tuple[int, int]], max_model_len: int) -> None:
    prompts = [p for p, _ in pairs]
    outputs = [o for _, o in pairs]
    capped_p, capped_o = cap_lengths(prompts, outputs, max_model_len)
    for p, o, cp, co in zip(prompts, outputs, capped_p, capped_o, strict=True):
        assert 1 <= cp <= p
        assert 1 <= co <= o
        assert cp + co <= max_model_len
        if p + o <= max_model_len:
            assert (cp, co) == (p, o)  # only what is too long is cut
        elif p < max_model_len:
            assert cp == p  # the output gives way first
            assert cp + co == max_model_len


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Lognormal(0.0, 1.0), "mean"),
        (lambda: Lognormal(10.0, -1.0), "sigma"),
        (lambda: Lognormal(math.inf, 1.0), "mean"),
        (lambda: Fixed(0), "value"),
        (lambda: Uniform(0, 3), "low"),
        (lambda: Uniform(5, 4), "high"),
        (lambda: cap_lengths([1], [1], 1), "max_model_len"),
        (lambda: child_rng(-1, Stream.PROMPT), "seed"),
    ],
)
def test_bad_parameters_name_the_field(build: Callable[[], object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field
