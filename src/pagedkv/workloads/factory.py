"""make_workload: a WorkloadConfig in, the requests of a run out.

The steps, in order:

1. Lengths from the kind: the lesson's requests; a synthetic model's draws (``synthetic.py``,
   the PROMPT and OUTPUT streams of the seed); a trace's lines (``trace.py``: its first
   num_requests lines) or, for a ``.json`` trace, a ShareGPT import (``sharegpt.py``:
   ``num_requests`` pairs drawn with the seed; all of them if unset). Asking a file for more
   requests than it has is a ConfigError, not a shorter run. Kind 'sharegpt' reads its .json
   file as vLLM's benchmark does (``sharegpt.load_sharegpt_vllm``: one request per
   conversation, repeated at random if the file has too few).
2. Arrival times: with ``arrival`` unset, the kind's own: t = 0 for the lesson and the
   synthetic kinds, the file's times for a trace (0 for ShareGPT, which has none). With
   ``arrival`` set, the process's times (``arrivals.py``, the ARRIVALS stream of the seed)
   replace them, for every kind, the trace's times included.
3. Capping: prompt + output <= max_model_len (``synthetic.cap_lengths``: the prompt is cut to
   max_model_len - 1, then the output to what is left).
4. Order: sorted by arrival time, stable (ties keep their order), and renumbered 0..n-1 in
   that order. A trace's own request ids are not kept (``read_trace`` has them); its extra
   columns are.

The sharing kinds ('shared-prefix', 'translation': ``shared_prefix.py``; 'chat': ``chat.py``;
'random': ``random_dataset.py``) build their requests whole, token ids included, and do these
steps themselves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pagedkv.errors import ConfigError
from pagedkv.workloads.arrivals import arrival_times
from pagedkv.workloads.chat import chat_workload
from pagedkv.workloads.config import DEFAULT_NUM_REQUESTS, WorkloadConfig, WorkloadKind
from pagedkv.workloads.lesson import LESSON, lesson_workload
from pagedkv.workloads.random_dataset import random_workload
from pagedkv.workloads.shared_prefix import shared_prefix_workload
from pagedkv.workloads.sharegpt import (
    counting_note,
    import_sharegpt,
    load_sharegpt_vllm,
    load_tokenizer,
)
from pagedkv.workloads.spec import RequestSpec, columns_pass
from pagedkv.workloads.synthetic import (
    ALPACA_LIKE,
    SHAREGPT_LIKE,
    Fixed,
    LengthModel,
    Stream,
    Uniform,
    cap_lengths,
    child_rng,
)
from pagedkv.workloads.token_ids import with_prefix_ids
from pagedkv.workloads.trace import read_trace


def length_model(config: WorkloadConfig) -> LengthModel:
    """The length distributions of a synthetic kind ('sharegpt-like', 'alpaca-like', 'fixed',
    'uniform'); ValueError for the others, whose lengths come from elsewhere."""
    kind = config.kind
    if kind is WorkloadKind.SHAREGPT_LIKE:
        return SHAREGPT_LIKE
    if kind is WorkloadKind.ALPACA_LIKE:
        return ALPACA_LIKE
    # WorkloadConfig has checked that the fields of 'fixed' and 'uniform' are set.
    c = config
    if kind is WorkloadKind.FIXED and c.prompt_len is not None and c.output_len is not None:
        return LengthModel(Fixed(c.prompt_len), Fixed(c.output_len))
    if kind is WorkloadKind.UNIFORM:
        lo_p, hi_p = c.min_prompt_len, c.max_prompt_len
        lo_o, hi_o = c.min_output_len, c.max_output_len
        if lo_p is not None and hi_p is not None and lo_o is not None and hi_o is not None:
            return LengthModel(Uniform(lo_p, hi_p), Uniform(lo_o, hi_o))
    raise ValueError(f"kind {kind.value!r} has no length model")


def make_workload(config: WorkloadConfig) -> list[RequestSpec]:
    """The requests of ``config``: sorted by arrival time, ids 0..n-1 (see the module docstring).

    Deterministic: the same config gives the same list, and the lengths do not depend on the
    arrival process. Each request asks for ``num_samples`` parallel samples, or a beam search
    of ``beam_width`` beams (its simulated choices seeded from ``seed`` and the request id).
    """
    requests = _make_requests(config)
    if config.samples_as_requests:
        return as_requests(requests, max(config.num_samples, config.beam_width))
    if config.beam_width > 1:
        return [
            dataclasses.replace(r, beam_width=config.beam_width, beam_seed=config.seed)
            for r in requests
        ]
    if config.num_samples == 1:
        return requests
    return [dataclasses.replace(r, n=config.num_samples) for r in requests]


def _make_requests(config: WorkloadConfig) -> list[RequestSpec]:
    if config.kind is WorkloadKind.CHAT:
        return chat_workload(config)
    if config.kind in (WorkloadKind.SHARED_PREFIX, WorkloadKind.TRANSLATION):
        return shared_prefix_workload(config)
    if config.kind is WorkloadKind.RANDOM:
        return random_workload(config)
    base = _base_requests(config)
    if isinstance(base, tuple):  # a synthetic kind's lengths: each spec is made once, below
        lengths, count = base, len(base[0])
    else:
        lengths, count = ([r.prompt_len for r in base], [r.output_len for r in base]), len(base)
    if config.arrival is None:
        times = [0.0] * count if isinstance(base, tuple) else [r.arrival_time for r in base]
        times = [float(t) for t in times]
    else:
        times = arrival_times(
            count,
            config.arrival,
            rng=child_rng(config.seed, Stream.ARRIVALS),
            rate=config.request_rate,
            burstiness=config.burstiness,
        )
    prompts, outputs = cap_lengths(*lengths, config.max_model_len)
    order = sorted(range(count), key=times.__getitem__)  # sorted() is stable
    # Checked once: the columns in bulk (a base spec's extra and priority were checked when
    # it was made); columns that fail go through RequestSpec's own checks and their error.
    make = RequestSpec.checked_already if columns_pass(prompts, outputs, times) else RequestSpec
    if isinstance(base, tuple):
        requests = [
            make(new_id, prompts[i], outputs[i], times[i]) for new_id, i in enumerate(order)
        ]
    else:
        requests = [
            make(new_id, prompts[i], outputs[i], times[i], base[i].extra, priority=base[i].priority)
            for new_id, i in enumerate(order)
        ]
    if config.kind is WorkloadKind.TRACE:
        # ids from prefix_id / prefix_len columns, if any
        return with_prefix_ids(requests, str(config.trace_path))
    return requests


def _base_requests(config: WorkloadConfig) -> list[RequestSpec] | tuple[list[int], list[int]]:
    """The kind's requests before re-timing, capping and renumbering; a synthetic kind's as
    its prompt and output lengths only (its specs are made once, after re-timing)."""
    n = config.num_requests
    if config.kind is WorkloadKind.LESSON:
        return lesson_workload(LESSON.num_requests if n is None else n)
    count = None if config.tokenizer is None else load_tokenizer(config.tokenizer)
    if config.kind is WorkloadKind.SHAREGPT:
        assert n is not None  # the config fills vLLM's default
        found = load_sharegpt_vllm(
            str(config.trace_path), num_requests=n, tokenizer=count, seed=config.seed
        )
        return list(found.requests)
    if config.kind is WorkloadKind.TRACE:
        path = Path(str(config.trace_path))
        if path.suffix == ".json":
            return import_sharegpt(
                path,
                tokenizer=count,
                max_model_len=config.max_model_len,
                seed=config.seed,
                num_requests=n,
            )
        requests = read_trace(path)
        if n is not None and n > len(requests):
            raise ConfigError(
                "num_requests", n, f"must be <= the {len(requests)} requests of {path}"
            )
        return requests[:n]
    prompts, outputs = length_model(config).sample(
        DEFAULT_NUM_REQUESTS if n is None else n, config.seed
    )
    return list(prompts), list(outputs)


def workload_notes(config: WorkloadConfig) -> list[str]:
    """What the run's output should say about how its workload was read (one line each)."""
    json_trace = config.kind is WorkloadKind.TRACE and str(config.trace_path).endswith(".json")
    if config.kind is WorkloadKind.SHAREGPT or json_trace:
        return [counting_note(config.tokenizer)]
    return []


def as_requests(requests: list[RequestSpec], width: int) -> list[RequestSpec]:
    """Each request as ``width`` independent requests with the same prompt, output length and
    arrival (the no-sharing baseline of a group), renumbered in order: request i becomes
    ``i * width .. i * width + width - 1``."""
    return [
        dataclasses.replace(r, request_id=r.request_id * width + j)
        for r in requests
        for j in range(width)
    ]
