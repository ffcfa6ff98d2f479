"""A request as a workload describes it: when it arrives and how long it is."""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload. ``output_len`` is known to a simulator, not to a real server."""

    request_id: int
    prompt_len: int
    output_len: int
    arrival_time: float = 0.0

    def __post_init__(self) -> None:
        check_int("request_id", self.request_id, 0)
        check_int("prompt_len", self.prompt_len, 1)
        check_int("output_len", self.output_len, 1)
        if not isinstance(self.arrival_time, (int, float)) or self.arrival_time < 0:
            raise ConfigError("arrival_time", self.arrival_time, "must be a number >= 0")

    @property
    def final_len(self) -> int:
        """prompt_len + output_len: the most tokens the request ever holds."""
        return self.prompt_len + self.output_len
