"""A request as a workload describes it: when it arrives and how long it is."""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int

RESERVED_COLUMNS = ("request_id", "arrival_time", "prompt_len", "output_len")
"""The columns every trace has; an ``extra`` key may not reuse one of these names."""


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload. ``output_len`` is known to a simulator, not to a real server.

    ``extra`` keeps a trace's other columns verbatim, as ``(name, text)`` pairs in the file's
    column order: a tuple of tuples so the spec stays frozen and hashable.
    """

    request_id: int
    prompt_len: int
    output_len: int
    arrival_time: float = 0.0
    extra: tuple[tuple[str, str], ...] = ()
    token_ids: tuple[int, ...] | None = None
    """The prompt's token ids, when known (real executor, prefix caching); ``prompt_len`` long."""

    def __post_init__(self) -> None:
        check_int("request_id", self.request_id, 0)
        check_int("prompt_len", self.prompt_len, 1)
        check_int("output_len", self.output_len, 1)
        if not isinstance(self.arrival_time, (int, float)) or self.arrival_time < 0:
            raise ConfigError("arrival_time", self.arrival_time, "must be a number >= 0")
        _check_extra(self.extra)
        if self.token_ids is not None and (
            not isinstance(self.token_ids, tuple)
            or len(self.token_ids) != self.prompt_len
            or not all(isinstance(t, int) and t >= 0 for t in self.token_ids)
        ):
            raise ConfigError(
                "token_ids",
                self.token_ids,
                f"must be None or a tuple of prompt_len = {self.prompt_len} ints >= 0",
            )

    @property
    def final_len(self) -> int:
        """prompt_len + output_len: the most tokens the request ever holds."""
        return self.prompt_len + self.output_len


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
