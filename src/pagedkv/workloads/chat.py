"""Multi-turn chat sessions: each turn's prompt is the whole conversation so far.

Kind 'chat' (``WorkloadConfig`` fields ``num_sessions`` S, ``chat_turns`` T,
``think_time_mean``, ``lengths``, optional ``prefix_len`` for a system prompt), every draw from
the seed:

1. Lengths: S x T new user messages and S x T outputs from the ``lengths`` model (default
   'alpaca-like'; the PROMPT and OUTPUT streams), message and output t of session s at index
   s x T + t.
2. Sessions start at t = 0, or at the times of the configured arrival process (one arrival per
   session, the ARRIVALS stream); they are numbered in start order.
3. Turn 0's prompt is the system prompt (if any; the same for every session: shared prefix 0)
   and the first message. Turn t's prompt is turn t-1's prompt, turn t-1's output and message
   t, id for id (``token_ids.py``), so with prefix caching a turn can reuse every full block of
   the conversation before it.
4. Turn t > 0 is a closed-loop follow-up: ``parent_id`` is turn t-1 and it arrives
   ``think_time`` seconds after turn t-1 finishes, exponential with mean ``think_time_mean``
   (stream ``THINK_STREAM``; 0 means at once). Its ``arrival_time`` (ignored by the engine) is
   its session's start, so the list stays sorted and parents come first.
5. Length cap: a turn whose prompt would exceed max_model_len - 1 tokens is not sent and the
   session ends there (a chat UI would open a new conversation); a turn's output is cut to
   max_model_len - prompt. Sessions can therefore have fewer than T turns.

Requests are numbered in order, session by session and turn by turn; ``extra`` carries
``session_id`` and ``turn``, with a system prompt ``prefix_id`` 0 and its ``prefix_len``, and
for a follow-up its ``think_time``: written as a trace (``write_trace``) and read back as kind
'trace', the sessions rebuild the same requests (``token_ids.chain_sessions``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.workloads.config import (
    DEFAULT_CHAT_TURNS,
    DEFAULT_NUM_SESSIONS,
    DEFAULT_THINK_TIME,
    WorkloadConfig,
)
from pagedkv.workloads.shared_prefix import start_times, stream_rng, suffix_model
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.token_ids import check_ids, own_ids, prefix_ids

THINK_STREAM = 12
"""Spawn key of the think-time stream (after ``shared_prefix``'s 10 and 11)."""


def chat_workload(config: WorkloadConfig) -> list[RequestSpec]:
    """The requests of kind 'chat' (see the module docstring)."""
    sessions = config.num_sessions or DEFAULT_NUM_SESSIONS
    turns = config.chat_turns or DEFAULT_CHAT_TURNS
    mean = DEFAULT_THINK_TIME if config.think_time_mean is None else config.think_time_mean
    messages, outputs = suffix_model(config).sample(sessions * turns, config.seed)
    rng = stream_rng(config.seed, THINK_STREAM)
    thinks = (
        rng.exponential(mean, size=sessions * turns) if mean > 0 else [0.0] * (sessions * turns)
    )
    starts = start_times(config, sessions)
    system = prefix_ids(0, config.prefix_len or 0)
    system_columns = (("prefix_id", "0"), ("prefix_len", str(len(system)))) if system else ()
    max_len = config.max_model_len
    new, repeated = chat_id_counts(sessions, turns, len(system), messages, outputs, max_len)
    check_ids("num_sessions", sessions, new, repeated)
    specs: list[RequestSpec] = []
    for s in range(sessions):
        history = system  # the conversation so far, prompt and output ids
        parent: int | None = None
        for t in range(turns):
            i = s * turns + t
            r = len(specs)
            message = messages[i]
            prompt = len(history) + message
            if prompt > max_len - 1:
                break  # the conversation no longer fits: the session ends
            output = min(outputs[i], max_len - prompt)
            ids = history + own_ids(r, 0, message)
            out_ids = own_ids(r, message, output)
            think = float(thinks[i]) if parent is not None else 0.0
            # the trace columns that rebuild this request (token_ids.chain_sessions)
            extra = (("session_id", str(s)), ("turn", str(t)), *system_columns)
            if parent is not None:
                extra += (("think_time", repr(think)),)
            specs.append(
                RequestSpec(
                    request_id=r,
                    prompt_len=prompt,
                    output_len=output,
                    arrival_time=starts[s],
                    extra=extra,
                    token_ids=ids,
                    output_token_ids=out_ids,
                    parent_id=parent,
                    think_time=think,
                )
            )
            history = ids + out_ids
            parent = r
    return specs


def chat_id_counts(
    sessions: int,
    turns: int,
    system: int,
    messages: Sequence[int],
    outputs: Sequence[int],
    max_len: int,
) -> tuple[int, int]:
    """The ids ``chat_workload`` makes and repeats, from the lengths alone (the same walk: a
    turn repeats the conversation so far, the system prompt included, and makes its message's
    and its output's ids), so they are checked against the footprint cap before any is made."""
    new, repeated = system, 0
    for s in range(sessions):
        history = system
        for t in range(turns):
            i = s * turns + t
            prompt = history + int(messages[i])
            if prompt > max_len - 1:
                break
            output = min(int(outputs[i]), max_len - prompt)
            repeated += history
            new += prompt - history + output
            history = prompt + output
    return new, repeated
