"""A request as a workload describes it: when it arrives and how long it is."""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.memory.token_runs import TokenIds, TokenRuns
from pagedkv.validation import check_int

RESERVED_COLUMNS = ("request_id", "arrival_time", "prompt_len", "output_len")
"""The columns every trace has; an ``extra`` key may not reuse one of these names."""
MAX_TOKEN_ID = 2**63 - 1
"""Token ids are packed as int64 (the prefix cache's block hash, a tensor of ids)."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. ``output_len`` is known to a simulator, not to a real server.
    Slotted: a workload may hold 10^6 of them.

    ``extra`` keeps a trace's other columns verbatim, as ``(name, text)`` pairs in the file's
    column order: a tuple of tuples so the spec stays frozen and hashable.
    """

    request_id: int
    prompt_len: int
    output_len: int
    arrival_time: float = 0.0
    extra: tuple[tuple[str, str], ...] = ()
    token_ids: TokenIds | None = None
    """The prompt's token ids, when known (real executor, prefix caching); ``prompt_len`` long:
    a tuple, or runs of consecutive ids (``TokenRuns``, a simulated workload's)."""
    output_token_ids: TokenIds | None = None
    """The ids a simulated model will generate (``output_len`` long), so that with prefix caching
    a later request (the next chat turn) can hit the blocks of this one's output too."""
    parent_id: int | None = None
    """A closed-loop follow-up (a chat turn): the request arrives ``think_time`` seconds after
    request ``parent_id`` finishes, and ``arrival_time`` is ignored. The parent must come earlier
    in the workload; if it is rejected, so is this request."""
    think_time: float = 0.0
    """Seconds between the parent's finish and this request's arrival (with ``parent_id``)."""
    n: int = 1
    """Parallel samples: n sequences share the prompt's K/V and fork after the prefill, each
    generating ``output_len`` tokens (they advance in lockstep)."""
    beam_width: int = 1
    """Beam search of width k (> 1): k beams share the prompt's K/V, and after every token each
    new beam picks a parent among the current ones (``pagedkv.engine.beam``); exclusive with
    ``n``."""
    beam_seed: int = 0
    """The run's seed for the simulated beam choices (with the request id: one stream each)."""
    priority: int = 0
    """The vllm-v1 policy's ``scheduling_policy=priority``: lower runs first (vLLM's rule); a
    trace's ``priority`` column. Other policies ignore it."""

    def __post_init__(self) -> None:
        # One cheap test for the usual spec (a workload makes 10^5 of them, twice): plain
        # lengths, no ids, extras, group, parent; the named checks below only otherwise.
        if (
            type(self.request_id) is int
            and type(self.prompt_len) is int
            and type(self.output_len) is int
            and type(self.arrival_time) is float
            and self.request_id >= 0
            and self.prompt_len >= 1
            and self.output_len >= 1
            and self.arrival_time >= 0
            and self.extra == ()
            and self.token_ids is None
            and self.output_token_ids is None
            and self.parent_id is None
            and type(self.n) is int
            and self.n == 1
            and type(self.beam_width) is int
            and self.beam_width == 1
            and type(self.beam_seed) is int
            and self.beam_seed == 0
            and type(self.priority) is int
            and type(self.think_time) is float
            and self.think_time == 0.0
        ):
            return
        check_int("request_id", self.request_id, 0)
        check_int("prompt_len", self.prompt_len, 1)
        check_int("output_len", self.output_len, 1)
        if not isinstance(self.arrival_time, (int, float)) or self.arrival_time < 0:
            raise ConfigError("arrival_time", self.arrival_time, "must be a number >= 0")
        _check_extra(self.extra)
        check_int("n", self.n, 1)
        check_int("beam_width", self.beam_width, 1)
        check_int("beam_seed", self.beam_seed, 0)
        check_int("priority", self.priority)
        if self.n > 1 and self.beam_width > 1:
            raise ConfigError(
                "beam_width",
                self.beam_width,
                f"must be 1 when n = {self.n} (parallel sampling and beam search are exclusive)",
            )
        _check_ids("token_ids", self.token_ids, self.prompt_len, "prompt_len")
        _check_ids("output_token_ids", self.output_token_ids, self.output_len, "output_len")
        if self.parent_id is not None:
            check_int("parent_id", self.parent_id, 0)
            if self.parent_id == self.request_id:
                raise ConfigError("parent_id", self.parent_id, "must not be the request's own id")
        if (
            isinstance(self.think_time, bool)
            or not isinstance(self.think_time, (int, float))
            or not self.think_time >= 0
            or self.think_time == float("inf")
        ):
            raise ConfigError("think_time", self.think_time, "must be a finite number >= 0")

    @classmethod
    def checked_already(
        cls,
        request_id: int,
        prompt_len: int,
        output_len: int,
        arrival_time: float,
        extra: tuple[tuple[str, str], ...] = (),
        priority: int = 0,
        token_ids: TokenIds | None = None,
        output_token_ids: TokenIds | None = None,
    ) -> RequestSpec:
        """The spec of these fields (the others at their defaults) without checking them
        again: only for values that provably pass ``__post_init__`` (``columns_pass``; ids
        made to the lengths by ``workloads.token_ids``), or that come from a spec that did
        (its ``extra`` and ``priority``), so each request of a workload is checked once.
        Equal to ``RequestSpec(...)`` of the same values."""
        spec = object.__new__(cls)
        _set(spec, "request_id", request_id)
        _set(spec, "prompt_len", prompt_len)
        _set(spec, "output_len", output_len)
        _set(spec, "arrival_time", arrival_time)
        _set(spec, "extra", extra)
        _set(spec, "token_ids", token_ids)
        _set(spec, "output_token_ids", output_token_ids)
        _set(spec, "parent_id", None)
        _set(spec, "think_time", 0.0)
        _set(spec, "n", 1)
        _set(spec, "beam_width", 1)
        _set(spec, "beam_seed", 0)
        _set(spec, "priority", priority)
        return spec

    @property
    def final_len(self) -> int:
        """prompt_len + output_len: the most tokens the request ever holds."""
        return self.prompt_len + self.output_len


_set = object.__setattr__  # a frozen dataclass's own way of setting its fields


def columns_pass(prompts: list[int], outputs: list[int], times: list[float]) -> bool:
    """Do specs of these lengths and arrival times (ids from 0, no other field set) pass
    ``RequestSpec``'s checks? In bulk: plain ints >= 1, plain floats >= 0 (O(n) in C)."""
    return (
        set(map(type, prompts)) <= {int}
        and set(map(type, outputs)) <= {int}
        and set(map(type, times)) <= {float}
        and (not prompts or min(prompts) >= 1)
        and (not outputs or min(outputs) >= 1)
        and (not times or min(times) >= 0)  # (a NaN may hide from min: the checks pass it too)
    )


def _check_ids(field: str, ids: object, length: int, length_field: str) -> None:
    if ids is None:
        return
    if isinstance(ids, TokenRuns):  # O(runs): from the runs' bounds
        bounds = ids.bounds()
        if len(ids) == length and (bounds is None or 0 <= bounds[0] <= bounds[1] <= MAX_TOKEN_ID):
            return
    elif (
        isinstance(ids, tuple)
        and len(ids) == length
        and set(map(type, ids)) <= {int}  # plain ints (no bools), then their range: in C
        and (not ids or 0 <= min(ids) <= max(ids) <= MAX_TOKEN_ID)
    ):
        return
    shown = ids if not isinstance(ids, (tuple, TokenRuns)) or len(ids) <= 8 else f"{len(ids)} ids"
    raise ConfigError(
        field,
        shown,
        f"must be None or a tuple (or TokenRuns) of {length_field} = {length} ints in "
        "[0, 2^63 - 1]",
    )


def _check_extra(extra: object) -> None:
    allowed = (
        "must be a tuple of (name, value) string pairs with distinct names, none of "
        + ", ".join(RESERVED_COLUMNS)
    )
    if not isinstance(extra, tuple):
        raise ConfigError("extra", extra, allowed)
    seen: set[str] = set()
    for pair in extra:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], str)
        ):
            raise ConfigError("extra", extra, allowed)
        name = pair[0]
        if name in seen or name in RESERVED_COLUMNS or not name:
            raise ConfigError("extra", extra, allowed)
        seen.add(name)
