"""Shared-prefix workloads: system prompts and few-shot examples that many requests start with.

Kind 'shared-prefix' (``WorkloadConfig`` fields ``prefix_len``, ``num_prefixes`` K,
``share_ratio``, ``prefix_zipf``, ``lengths``), in this order, every draw from the seed:

1. Lengths: n suffixes (the text after the prefix) and n outputs from the ``lengths`` model
   (``synthetic.py``: the PROMPT and OUTPUT streams, so with ``lengths`` 'sharegpt-like' the
   suffixes are the 'sharegpt-like' kind's prompts).
2. Who shares: exactly round(share_ratio x n) requests, the first ones of a seeded permutation
   (stream ``SHARE_STREAM``), so the sharers at a lower ratio are among those at a higher one.
   The other requests start with a *private* prefix of the same length, ids of their own:
   every request's prompt is prefix_len + suffix tokens whatever the ratio, so a sweep of the
   ratio changes what is shared, not the load.
3. Which prefix: prefix k with probability proportional to 1 / (k + 1)^a (Zipf, a =
   ``prefix_zipf``; a = 0 is uniform), drawn for every request on stream ``PREFIX_STREAM``.
4. Arrivals: all at t = 0 unless ``arrival`` is set (the ARRIVALS stream, as every kind).
5. Capping: prompt <= max_model_len - 1 by cutting the suffix (the config keeps prefix_len <=
   max_model_len - 2), then the output to what is left.
6. Ids (``token_ids.py``): shared prefix k's ids, then the request's own; outputs continue the
   request's own range. ``extra`` carries ``prefix_id`` (k, or ``private``) and ``prefix_len``.

Kind 'translation' is the vLLM paper's shared-prefix case (Kwon et al., SOSP'23, §6.3): one
translation prompt of ``shots`` examples, 80 tokens for 1-shot and 341 for 5-shot, before every
request (``share_ratio`` default 1), with WMT16-like sentence lengths (``TRANSLATION_LIKE``).
"""

from __future__ import annotations

import math

import numpy as np

from pagedkv.workloads.arrivals import arrival_times
from pagedkv.workloads.config import (
    DEFAULT_NUM_REQUESTS,
    TRANSLATION_PREFIX_LENS,
    SuffixLengths,
    WorkloadConfig,
    WorkloadKind,
)
from pagedkv.workloads.spec import RequestSpec, columns_pass
from pagedkv.workloads.synthetic import (
    ALPACA_LIKE,
    SHAREGPT_LIKE,
    Fixed,
    LengthModel,
    Lognormal,
    Stream,
    Uniform,
    child_rng,
)
from pagedkv.workloads.token_ids import check_ids, own_ids, prefix_ids

SHARE_STREAM = 10
"""Spawn key of the stream that picks who shares (after ``synthetic.Stream``'s 0..2)."""
PREFIX_STREAM = 11
"""Spawn key of the stream that picks each request's prefix."""
PRIVATE = "private"
"""``prefix_id`` of a request whose prefix is its own."""

TRANSLATION_LIKE = LengthModel(prompt=Lognormal(30.0, 0.5), output=Lognormal(30.0, 0.5))
"""One sentence in, its translation out. The paper gives no sentence lengths for WMT16
English-German; ~30 tokens per sentence (about 23 words at ~1.3 subword tokens per word) with
sigma 0.5 is our modelling choice, not a measurement."""


def stream_rng(seed: int, key: int) -> np.random.Generator:
    """A generator on spawn key ``key`` of ``seed``, independent of ``synthetic.Stream``'s."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


def suffix_model(config: WorkloadConfig) -> LengthModel:
    """The length model after the prefix (``config.suffix_lengths``; 'translation': its own)."""
    if config.kind is WorkloadKind.TRANSLATION:
        return TRANSLATION_LIKE
    kind = config.suffix_lengths
    if kind is SuffixLengths.SHAREGPT_LIKE:
        return SHAREGPT_LIKE
    if kind is SuffixLengths.ALPACA_LIKE:
        return ALPACA_LIKE
    c = config  # WorkloadConfig has checked that the fields of 'fixed' and 'uniform' are set
    if kind is SuffixLengths.FIXED and c.prompt_len is not None and c.output_len is not None:
        return LengthModel(Fixed(c.prompt_len), Fixed(c.output_len))
    lo_p, hi_p, lo_o, hi_o = c.min_prompt_len, c.max_prompt_len, c.min_output_len, c.max_output_len
    if lo_p is None or hi_p is None or lo_o is None or hi_o is None:
        raise ValueError(f"lengths {kind.value!r} without its fields")
    return LengthModel(Uniform(lo_p, hi_p), Uniform(lo_o, hi_o))


def start_times(config: WorkloadConfig, n: int) -> list[float]:
    """n non-decreasing start times: t = 0, or the configured process (ARRIVALS stream)."""
    if config.arrival is None:
        return [0.0] * n
    return arrival_times(
        n,
        config.arrival,
        rng=child_rng(config.seed, Stream.ARRIVALS),
        rate=config.request_rate,
        burstiness=config.burstiness,
    )


def zipf_probabilities(k: int, exponent: float) -> list[float]:
    """P(prefix i) = (i + 1)^-a / sum over j of (j + 1)^-a, for i in 0..k-1."""
    weights = [(i + 1) ** -exponent for i in range(k)]
    total = math.fsum(weights)
    return [w / total for w in weights]


def shared_prefix_workload(config: WorkloadConfig) -> list[RequestSpec]:
    """The requests of kind 'shared-prefix' or 'translation' (see the module docstring)."""
    n = config.num_requests if config.num_requests is not None else DEFAULT_NUM_REQUESTS
    if config.kind is WorkloadKind.TRANSLATION:
        prefix_len, num_prefixes, zipf = TRANSLATION_PREFIX_LENS[config.shots or 1], 1, 0.0
    else:
        prefix_len = int(config.prefix_len or 0)  # checked: set for 'shared-prefix'
        num_prefixes = config.num_prefixes or 1
        zipf = 1.0 if config.prefix_zipf is None else float(config.prefix_zipf)
    ratio = 1.0 if config.share_ratio is None else float(config.share_ratio)
    suffixes, outputs = suffix_model(config).sample(n, config.seed)
    sharers = math.floor(ratio * n + 0.5)
    shares = np.zeros(n, dtype=bool)
    shares[stream_rng(config.seed, SHARE_STREAM).permutation(n)[:sharers]] = True
    probs = zipf_probabilities(num_prefixes, zipf)
    chosen = stream_rng(config.seed, PREFIX_STREAM).choice(num_prefixes, size=n, p=probs)
    times = start_times(config, n)
    max_len = config.max_model_len
    prompts = prefix_len + np.minimum(np.asarray(suffixes), max_len - 1 - prefix_len)
    finals = prompts + np.minimum(np.asarray(outputs), max_len - prompts)
    check_ids("num_requests", n, int(finals.sum()))  # before any id is made
    prompt_lens: list[int] = prompts.tolist()
    output_lens: list[int] = (finals - prompts).tolist()
    # Lengths and times checked in bulk, ids made to the lengths: each spec checked once.
    make = (
        RequestSpec.checked_already
        if columns_pass(prompt_lens, output_lens, times)
        else RequestSpec
    )
    extras: dict[str, tuple[tuple[str, str], ...]] = {}  # one tuple per label, shared
    specs = []
    for r in range(n):
        prompt, output = prompt_lens[r], output_lens[r]
        if shares[r]:
            k = int(chosen[r])
            suffix = prompt - prefix_len
            ids = prefix_ids(k, prefix_len) + own_ids(r, 0, suffix)
            out_ids = own_ids(r, suffix, output)
            label = str(k)
        else:
            ids = own_ids(r, 0, prompt)
            out_ids = own_ids(r, prompt, output)
            label = PRIVATE
        extra = extras.get(label)
        if extra is None:
            extra = extras[label] = (("prefix_id", label), ("prefix_len", str(prefix_len)))
        specs.append(
            make(
                request_id=r,
                prompt_len=prompt,
                output_len=output,
                arrival_time=times[r],
                extra=extra,
                token_ids=ids,
                output_token_ids=out_ids,
            )
        )
    return specs
