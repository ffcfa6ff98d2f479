"""Token ids as runs of consecutive ids: a sequence of ints held in O(runs), not O(tokens).

A simulated workload's ids are labels laid out in ranges (``workloads/token_ids``): a shared
prefix is one range, a request's own tokens another, a chat turn the runs of the turns before
it and one more. Held as a tuple of Python ints, 20k requests of ~600 tokens take ~0.4 GB (an
8-byte pointer and, above 256, a 28-byte int per id); held as runs, a few hundred bytes each.

``TokenRuns`` is an immutable ``Sequence[int]``: ``len``, indexing, slicing (a slice is runs
again, O(runs)), iteration, ``+`` with another ``TokenRuns`` (adjacent runs merge, so a
request's prompt and its outputs, consecutive in its own range, stay one run). It equals a
tuple of the same ids and hashes like one, so it can stand wherever the tuple stood; ``+`` with
any other sequence gives that tuple. The prefix cache keys a block that lies in one run from
the run's bounds (``prefix_hash.keys_of``), without a Python int per id.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class TokenRuns(Sequence[int]):
    """Consecutive runs of ids, each a ``range`` of step 1 (see the module docstring)."""

    __slots__ = ("_ends", "_hash", "_len", "_runs")

    def __init__(self, runs: Iterable[range] = ()) -> None:
        merged: list[range] = []
        for r in runs:
            if not isinstance(r, range) or r.step != 1:
                raise ValueError(f"a run must be a range of step 1, got {r!r}")
            if not r:
                continue
            if merged and merged[-1].stop == r.start:
                merged[-1] = range(merged[-1].start, r.stop)
            else:
                merged.append(r)
        self._set(tuple(merged), sum(len(r) for r in merged))

    def _set(self, runs: tuple[range, ...], length: int) -> None:
        """Runs already merged: non-empty, step 1, no run starting where the one before ends.
        The cumulative ends are made on the first index or slice of more than one run (most
        sequences here are one run, and most slices of a slice)."""
        self._runs = runs
        self._len = length
        self._ends: list[int] | None = None
        self._hash: int | None = None

    @classmethod
    def _of(cls, runs: tuple[range, ...], length: int) -> TokenRuns:
        out = cls.__new__(cls)
        out._runs = runs  # ``_set``, inlined: every slice and append makes one
        out._len = length
        out._ends = None
        out._hash = None
        return out

    @property
    def runs(self) -> tuple[range, ...]:
        return self._runs

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> TokenRuns: ...
    def __getitem__(self, index: int | slice) -> int | TokenRuns:
        runs = self._runs
        if isinstance(index, slice):
            if len(runs) == 1:  # the usual case: slicing the range is all (in C)
                r = runs[0][index]
                if r.step != 1:
                    raise ValueError("TokenRuns slices take step 1 only")
                return TokenRuns._of((r,), len(r)) if r else _EMPTY
            start, stop, step = index.indices(self._len)
            if step != 1:
                raise ValueError("TokenRuns slices take step 1 only")
            return self._slice(start, stop)
        n = self._len
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("TokenRuns index out of range")
        ends = self._cumulative()
        k = bisect.bisect_right(ends, i)
        return runs[k][i - (ends[k - 1] if k else 0)]

    def _cumulative(self) -> list[int]:
        if self._ends is None:
            self._ends = list(itertools.accumulate(len(r) for r in self._runs))
        return self._ends

    def _slice(self, start: int, stop: int) -> TokenRuns:
        if stop <= start:
            return _EMPTY
        if start == 0 and stop == self._len:  # all of it (a prompt's known ids): immutable
            return self
        runs = self._runs
        last = runs[-1]
        if start >= self._len - len(last):  # within the last run (a table's newest ids)
            offset = self._len - len(last)
            return TokenRuns._of((last[start - offset : stop - offset],), stop - start)
        ends = self._cumulative()
        k = bisect.bisect_right(ends, start)
        out: list[range] = []
        while k < len(runs) and (ends[k - 1] if k else 0) < stop:
            offset = ends[k - 1] if k else 0
            r = runs[k]
            out.append(r[max(0, start - offset) : min(len(r), stop - offset)])
            k += 1
        return TokenRuns._of(tuple(out), stop - start)

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self._runs)

    def __contains__(self, value: object) -> bool:
        return any(value in r for r in self._runs)

    @overload
    def __add__(self, other: TokenRuns) -> TokenRuns: ...
    @overload
    def __add__(self, other: tuple[int, ...] | list[int]) -> tuple[int, ...]: ...
    def __add__(self, other: object) -> Any:
        if isinstance(other, TokenRuns):
            mine, theirs = self._runs, other._runs
            if not theirs:
                return self
            if not mine:
                return other
            last, first = mine[-1], theirs[0]
            if last.stop == first.start:  # continues the last run (an append, the usual case)
                runs = (*mine[:-1], range(last.start, first.stop), *theirs[1:])
            else:
                runs = mine + theirs
            return TokenRuns._of(runs, self._len + other._len)
        if isinstance(other, (tuple, list)):
            return tuple(self) + tuple(other)
        return NotImplemented

    def __radd__(self, other: tuple[int, ...] | list[int]) -> tuple[int, ...]:
        if isinstance(other, (tuple, list)):
            return tuple(other) + tuple(self)
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRuns):
            return self._runs == other._runs
        if isinstance(other, tuple):
            return len(other) == self._len and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self))  # equal to a tuple of the same ids, so hashed alike
        return self._hash

    def __repr__(self) -> str:
        return f"TokenRuns({', '.join(repr(r) for r in self._runs)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenRuns, (self._runs,))

    def bounds(self) -> tuple[int, int] | None:
        """(smallest id, largest id), or None when empty: O(runs)."""
        runs = self._runs
        if len(runs) == 1:
            return runs[0].start, runs[0].stop - 1
        if not runs:
            return None
        return min(r.start for r in runs), max(r.stop - 1 for r in runs)


_EMPTY = TokenRuns()
TokenIds = tuple[int, ...] | TokenRuns
"""What a workload's token ids may be: a tuple (a real tokenizer's) or runs (a simulated one)."""
