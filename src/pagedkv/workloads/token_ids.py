"""Token ids for the sharing workloads: equal prefixes get equal ids, everything else does not.

Prefix caching keys a block by its tokens and by every token before it (``memory/prefix_hash``),
so the simulator needs ids, not just lengths, to find what requests share. A simulated model
has no vocabulary, so the ids here are labels, not words, built from two disjoint ranges:

* shared prefix ``k`` (a system prompt, a few-shot example): ``(2 k) * SPAN + j`` for its token
  j = 0, 1, ...; every request that starts with prefix k starts with these same ids;
* request ``r``'s own tokens (its private prefix, its text after the prefix, the output a
  simulated model will generate, in that order): ``(2 r + 1) * SPAN + j``.

Owners are even for prefixes and odd for requests, and a position j < SPAN never reaches the
next owner's range, so no id of one owner is an id of another. A block that holds a token a
request owns therefore never hashes like a block of another request, and two different shared
prefixes never share a block (block keys are chained, so this holds from the first differing
token on, whatever the block size, 1 included). What is drawn from the seed is the structure
(which prefix a request starts with, how long each part is), not the ids.

A trace with ``prefix_id`` and ``prefix_len`` columns gets the same ids (``with_prefix_ids``;
``make_workload`` applies it to kind 'trace'), so a recorded workload can be replayed with
prefix caching.

A chat turn's prompt is the previous turn's prompt, then the previous turn's output ids, then
its own new message: the whole previous conversation, id for id (``chat.py``). A trace with a
``session_id`` column gets the same chaining (``chain_sessions``): its turns become closed-loop
follow-ups whose ids start with the conversation before them.

Ids fit an int64 (the block hash packs them as such): the largest is about (2 n + 2) * 2^24,
under 2^63 for any n below 2^37 requests; an owner beyond that (a trace's ``prefix_id`` above
``MAX_PREFIX_ID``) is a ``ConfigError``.

Ids are held as runs (``memory/token_runs.TokenRuns``): a range per owner's stretch, so a
request's ids take a few hundred bytes whatever its length, and a chat turn's as many runs as
the turns before it. Ids cost memory (``pagedkv.footprint``): every workload that makes them
checks their total, from the lengths alone, before it makes any (``check_ids``). A chat turn
repeats the whole conversation before it, so a session's ids grow with the square of its turns
(counted as ids, though runs hold them in far less).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from pagedkv.errors import ConfigError
from pagedkv.footprint import (
    BYTES_PER_REPEATED_ID,
    BYTES_PER_TOKEN_ID,
    check_memory,
    token_id_bytes,
)
from pagedkv.memory.token_runs import TokenIds, TokenRuns
from pagedkv.workloads.spec import MAX_TOKEN_ID, RequestSpec

SPAN = 1 << 24
"""Ids per owner: more tokens than any one prompt or output (16.7M)."""
MAX_OWNER = MAX_TOKEN_ID // SPAN - 1
MAX_PREFIX_ID = MAX_OWNER // 2
"""The largest shared prefix number whose ids fit an int64 (2^38 - 1)."""


def check_ids(field: str, value: object, new_ids: int, repeated_ids: int = 0) -> None:
    """Refuse a workload whose token ids (``new_ids`` made, ``repeated_ids`` referenced again
    by a later tuple) would hold more than the footprint cap; checked before any is made."""
    check_memory(
        field,
        value,
        f"{new_ids} token ids x {BYTES_PER_TOKEN_ID} B"
        + (f" + {repeated_ids} repeated x {BYTES_PER_REPEATED_ID} B" if repeated_ids else ""),
        token_id_bytes(new_ids, repeated_ids),
    )


def _range(owner: int, start: int, length: int) -> TokenRuns:
    if not 0 <= start <= start + length <= SPAN:
        raise ConfigError("token position", start + length, f"must be <= {SPAN} per owner")
    if not 0 <= owner <= MAX_OWNER:
        raise ConfigError("token id owner", owner, f"must be in [0, {MAX_OWNER}] (ids fit int64)")
    base = owner * SPAN
    return TokenRuns((range(base + start, base + start + length),))


def prefix_ids(prefix: int, length: int) -> TokenRuns:
    """The ids of shared prefix number ``prefix`` (0, 1, ...), ``length`` tokens."""
    return _range(2 * prefix, 0, length)


def own_ids(request_id: int, start: int, length: int) -> TokenRuns:
    """Tokens ``start .. start + length - 1`` of request ``request_id``'s own range."""
    return _range(2 * request_id + 1, start, length)


def owner_of(token_id: int) -> tuple[str, int]:
    """('prefix', k) or ('request', r): whose range ``token_id`` is in (tests, debugging)."""
    owner = token_id // SPAN
    return ("prefix", owner // 2) if owner % 2 == 0 else ("request", owner // 2)


def with_prefix_ids(specs: Sequence[RequestSpec], source: str = "trace") -> list[RequestSpec]:
    """Token ids for a trace's requests from its ``prefix_id`` and ``prefix_len`` columns, then
    its sessions chained (``chain_sessions``, when it has a ``session_id`` column).

    A request whose ``prefix_id`` is an integer k >= 0 starts with shared prefix k's first
    min(prefix_len, prompt_len - 1) ids (a prompt cut shorter than its prefix keeps the part that
    fits); one whose ``prefix_id`` is ``private`` or absent has ids of its own only. Outputs
    continue each request's own range. Requests without the columns are returned unchanged
    when no request has them.
    """
    return chain_sessions(_prefix_columns(specs, source), source)


def _prefix_columns(specs: Sequence[RequestSpec], source: str) -> list[RequestSpec]:
    if not any(name == "prefix_id" for r in specs for name, _ in r.extra):
        return list(specs)
    total = sum(r.final_len for r in specs)
    check_ids(f"{source}: prefix_id", f"{len(specs)} requests of {total} tokens", total)
    out = []
    for r in specs:
        extra = dict(r.extra)
        label = extra.get("prefix_id", "private")
        shared = 0
        ids: TokenRuns = TokenRuns()
        if label != "private":
            k = _column_int(r, "prefix_id", label)
            shared = min(_column_int(r, "prefix_len", extra.get("prefix_len")), r.prompt_len - 1)
            ids = prefix_ids(k, shared)
        ids += own_ids(r.request_id, 0, r.prompt_len - shared)
        outputs = own_ids(r.request_id, r.prompt_len - shared, r.output_len)
        out.append(dataclasses.replace(r, token_ids=ids, output_token_ids=outputs))
    return out


def _column_int(r: RequestSpec, column: str, text: str | None) -> int:
    top = MAX_PREFIX_ID if column == "prefix_id" else SPAN
    value = int(text) if text is not None and re.fullmatch(r"[0-9]{1,20}", text) else -1
    if not 0 <= value <= top:
        raise ConfigError(
            f"request {r.request_id}: {column}",
            text,
            f"must be an integer in [0, {top}] (prefix_id may also be 'private')",
        )
    return value


DEFAULT_TRACE_THINK_TIME = 0.0
"""Think time of a trace's follow-up turn without a ``think_time`` cell: it arrives as soon as
the previous turn finishes (a trace's own arrival times include the server's answer, so they
cannot tell the user's think time)."""


def session_id_counts(specs: Sequence[RequestSpec]) -> tuple[int, dict[str, int]]:
    """What ``chain_sessions`` would hold, from the lengths alone: (ids it makes, the ids each
    session repeats). A turn makes its message's and its output's ids and repeats the
    conversation before it (the previous turn's prompt and output), so a session's repeats
    grow with the square of its turns."""
    previous: dict[str, int] = {}  # session -> its conversation so far, in tokens
    repeated: dict[str, int] = {}
    new = 0
    for r in specs:
        session = dict(r.extra).get("session_id")
        if session is None:
            continue
        before = previous.get(session, 0)
        repeated[session] = repeated.get(session, 0) + before
        new += r.final_len - min(before, r.prompt_len)
        previous[session] = r.final_len
    return new, repeated


def _check_sessions(specs: Sequence[RequestSpec], source: str) -> None:
    """Refuse chaining over the footprint cap before any id is made, naming the file and the
    session that repeats the most."""
    new, repeated = session_id_counts(specs)
    worst = max(repeated, key=repeated.__getitem__)  # a session_id column: one at least
    field = f"{source}: session {worst!r}"
    check_ids(field, f"{repeated[worst]} repeated token ids", new, sum(repeated.values()))


def chain_sessions(specs: Sequence[RequestSpec], source: str = "trace") -> list[RequestSpec]:
    """A trace's ``session_id`` column made closed-loop chat, as kind 'chat' builds it.

    Requests with the same ``session_id`` are one conversation, its turns in list order (a
    ``turn`` column, if any, has been checked to increase along it by ``read_trace``). Every
    turn after the first is a follow-up of the turn before (``parent_id``), arriving
    ``think_time`` seconds (its column, default ``DEFAULT_TRACE_THINK_TIME``) after that turn
    finishes; its prompt ids are the previous prompt's, the previous output's, then its own
    ``prompt_len - (previous prompt + output)`` new ids, so with prefix caching it can reuse the
    whole conversation. A first turn keeps the ids it has (a shared prefix from its
    ``prefix_id``) or gets ids of its own; a later turn's prefix columns are not used (its
    conversation decides). Requests without a session are returned unchanged, and so is
    every request when no request has a ``session_id``. A prompt shorter than the conversation
    before it is a ``ConfigError`` naming the request.
    """
    if not any(name == "session_id" for r in specs for name, _ in r.extra):
        return list(specs)
    _check_sessions(specs, source)
    last: dict[str, RequestSpec] = {}  # session -> its latest turn (ids set)
    out = []
    for r in specs:
        extra = dict(r.extra)
        session = extra.get("session_id")
        if session is None:
            out.append(r)
            continue
        previous = last.get(session)
        if previous is None:
            turn = r
            if r.token_ids is None or r.output_token_ids is None:
                ids = own_ids(r.request_id, 0, r.prompt_len)
                outputs = own_ids(r.request_id, r.prompt_len, r.output_len)
                turn = dataclasses.replace(r, token_ids=ids, output_token_ids=outputs)
        else:
            history: TokenIds = (previous.token_ids or TokenRuns()) + (
                previous.output_token_ids or TokenRuns()
            )
            message = r.prompt_len - len(history)
            if message < 0:
                raise ConfigError(
                    f"request {r.request_id}: prompt_len",
                    r.prompt_len,
                    f"must be >= {len(history)}, the prompt + output of request "
                    f"{previous.request_id}, the turn before it in session {session!r} (a "
                    "turn's prompt holds the conversation so far; a prompt cut to fit "
                    "max_model_len breaks its session)",
                )
            turn = dataclasses.replace(
                r,
                token_ids=history + own_ids(r.request_id, 0, message),
                output_token_ids=own_ids(r.request_id, message, r.output_len),
                parent_id=previous.request_id,
                think_time=_think_time(r, extra.get("think_time")),
            )
        last[session] = turn
        out.append(turn)
    return out


def _think_time(r: RequestSpec, text: str | None) -> float:
    if text is None:
        return DEFAULT_TRACE_THINK_TIME
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(
            f"request {r.request_id}: think_time", text, "must be a finite number >= 0 (seconds)"
        )
    return value
