"""Synthetic request lengths: heavy-tailed data-set look-alikes, fixed and uniform lengths.

The vLLM paper gives the means of the two data sets it serves (arXiv 2309.06180, §6.1):
ShareGPT, input 161.31 and output 337.99 tokens; Alpaca, input 19.31 and output 58.45 tokens.
It shows their histograms (Fig. 11) but no other moment, so the shapes below are our modelling
choice, not measurements:

* Each side (prompt, output) is lognormal, rounded to the nearest integer and at least 1.
  Lognormal because lengths of text are positive and right-skewed with a long tail, as the
  paper's histograms are. With log-scale sigma s, the mean is exp(mu + s²/2), so
  ``mu = ln(mean) - s²/2`` makes the *uncapped* mean the paper's.
* ShareGPT: s = 1.0 on both sides (coefficient of variation sqrt(e^{s²} - 1) = 1.31): user
  conversations range from one line to pasted documents and long answers.
* Alpaca: s = 0.7 on both sides (CV 0.80): single instructions and their answers, with the
  paper's remark that ShareGPT's lengths have the higher variance.

Capping (see ``cap_lengths``) cuts the tail above max_model_len and so lowers the means. The
exact means after capping at 2048 tokens (``capped_means``; the paper's maximum length) are, for
ShareGPT, prompt 161.31 -> 160.40 and output 337.99 -> 324.33 (4% less: about 1.6% of the
outputs and 0.1% of the prompts are cut); for Alpaca, unchanged to 0.001 token (a cut needs
about 5.4 sigma on the output side). Rounding keeps the means: ``capped_means`` at a cap far in
the tail gives back the paper's values to 1e-5.

Randomness: one ``seed`` feeds independent streams (children of ``SeedSequence(seed)``, see
``Stream``): prompts, outputs and arrivals never share numbers, so changing the arrival process
or the output model leaves the prompts as they were, and the first k requests of a workload of n
are those of a workload of k.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int

IntArray = npt.NDArray[np.int64]


class Stream(enum.IntEnum):
    """The independent random streams of one seed: the spawn key of each child."""

    PROMPT = 0
    OUTPUT = 1
    ARRIVALS = 2


def child_rng(seed: int, stream: Stream) -> np.random.Generator:
    """A generator on stream ``stream`` of ``seed``: the same numbers as
    ``default_rng(SeedSequence(seed).spawn(3)[stream])``, without mutating any object."""
    check_int("seed", seed, 0)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(stream),)))


def capped_means(model: LengthModel, max_model_len: int) -> tuple[float, float]:
    """The exact means of prompt and output lengths after ``cap_lengths`` (no sampling).

    E[min(L, c)] = sum over j in [0, c) of P(L > j). The capped prompt is P' = min(P, M - 1);
    given P' = k the output is min(O, M - k), and P and O are independent.
    """
    check_int("max_model_len", max_model_len, 2)
    m = max_model_len
    p_surv = [model.prompt.survival(j) for j in range(m)]
    o_surv = np.array([model.output.survival(j) for j in range(m)])
    o_capped = np.concatenate(([0.0], np.cumsum(o_surv)))  # o_capped[c] = E[min(O, c)]
    prompt_mean = float(sum(p_surv[: m - 1]))
    # P(P' = k) = S(k - 1) - S(k) for k < M - 1; P(P' = M - 1) = S(M - 2).
    output_mean = sum((p_surv[k - 1] - p_surv[k]) * o_capped[m - k] for k in range(1, m - 1))
    output_mean += p_surv[m - 2] * o_capped[1]
    return prompt_mean, float(output_mean)


def _check_positive(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a finite number > 0")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(field, value, "must be a finite number > 0")


@dataclass(frozen=True)
class Lognormal:
    """Lengths round(X), at least 1, where ln X ~ Normal(mu, sigma) and E[X] = ``mean``."""

    mean: float
    sigma: float

    def __post_init__(self) -> None:
        _check_positive("mean", self.mean)
        _check_positive("sigma", self.sigma)

    @property
    def mu(self) -> float:
        """ln(mean) - sigma²/2: the log-scale location that gives the uncapped mean."""
        return math.log(self.mean) - self.sigma**2 / 2

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        check_int("num_requests", n, 0)
        x = rng.lognormal(self.mu, self.sigma, size=n)
        # Rounding to the nearest integer keeps the mean (floor would lower it by ~0.5);
        # the floor of 1 matters only below 0.5 tokens, far in the left tail of every preset.
        return np.maximum(np.rint(x), 1).astype(np.int64)

    def survival(self, k: int) -> float:
        """P(length > k): for k >= 1, P(X >= k + 1/2) = 1 - Phi((ln(k + 1/2) - mu) / sigma)."""
        if k < 1:
            return 1.0
        z = (math.log(k + 0.5) - self.mu) / self.sigma
        return 0.5 * math.erfc(z / math.sqrt(2))  # erfc keeps precision far in the tail


@dataclass(frozen=True)
class Fixed:
    """Every length is ``value``."""

    value: int

    def __post_init__(self) -> None:
        check_int("value", self.value, 1)

    @property
    def mean(self) -> float:
        return float(self.value)

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        check_int("num_requests", n, 0)
        return np.full(n, self.value, dtype=np.int64)

    def survival(self, k: int) -> float:
        """P(length > k)."""
        return 1.0 if k < self.value else 0.0


@dataclass(frozen=True)
class Uniform:
    """Lengths uniform over the integers ``low..high``, both included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        check_int("low", self.low, 1)
        check_int("high", self.high, self.low)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        check_int("num_requests", n, 0)
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    def survival(self, k: int) -> float:
        """P(length > k): the share of low..high above k."""
        above = self.high - max(k, self.low - 1)
        return min(max(above, 0), self.high - self.low + 1) / (self.high - self.low + 1)


LengthDistribution = Lognormal | Fixed | Uniform


@dataclass(frozen=True)
class LengthModel:
    """A prompt length and an output length distribution, drawn independently."""

    prompt: LengthDistribution
    output: LengthDistribution

    def sample(self, n: int, seed: int) -> tuple[list[int], list[int]]:
        """n prompt and n output lengths, uncapped, from the PROMPT and OUTPUT streams of seed."""
        prompts = self.prompt.sample(n, child_rng(seed, Stream.PROMPT))
        outputs = self.output.sample(n, child_rng(seed, Stream.OUTPUT))
        return [int(p) for p in prompts], [int(o) for o in outputs]


SHAREGPT_LIKE = LengthModel(prompt=Lognormal(161.31, 1.0), output=Lognormal(337.99, 1.0))
"""ShareGPT's means (arXiv 2309.06180, §6.1) with sigma 1.0 per side (our choice, see above)."""

ALPACA_LIKE = LengthModel(prompt=Lognormal(19.31, 0.7), output=Lognormal(58.45, 0.7))
"""Alpaca's means (arXiv 2309.06180, §6.1) with sigma 0.7 per side (our choice, see above)."""


def cap_lengths(
    prompts: Sequence[int] | IntArray, outputs: Sequence[int] | IntArray, max_model_len: int
) -> tuple[list[int], list[int]]:
    """Cut each request to prompt + output <= max_model_len, keeping both >= 1.

    The prompt is cut first, to at most max_model_len - 1 (a request must produce a token),
    then the output to what is left: a server stops generating at the model's maximum length,
    so it is the output that runs out of room (vLLM caps max_tokens the same way).
    """
    check_int("max_model_len", max_model_len, 2)
    p = np.minimum(np.asarray(prompts, dtype=np.int64), max_model_len - 1)
    o = np.minimum(np.asarray(outputs, dtype=np.int64), max_model_len - p)
    if p.shape != o.shape:
        raise ConfigError("outputs", len(o), f"must have one length per prompt ({len(p)})")
    return [int(x) for x in p], [int(x) for x in o]
