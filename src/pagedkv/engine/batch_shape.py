"""BatchShape: what one step of the serving loop computes, in the four counts its cost depends on.

The executor turns a scheduled batch into a shape (``BatchShape.from_chunks``); cost models
(``cost_model.py``) price shapes, and a window of decode steps is ``base + i * delta``. Kept
apart so that the executor, the fast-forward and the cost models share it without one another.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int

_SHAPE_FIELDS = ("num_tokens", "num_seqs", "attn_pairs", "kv_read_tokens")


@dataclass(frozen=True)
class BatchShape:
    """What one step computes, in the four counts a step's cost depends on."""

    num_tokens: int = 0
    """Tokens computed this step: prefill chunks and decodes together."""
    num_seqs: int = 0
    """Sequences with at least one token computed (each gets logits at its last position)."""
    attn_pairs: int = 0
    """Sum over computed tokens of the positions each attends to, itself included."""
    kv_read_tokens: int = 0
    """K/V tokens read: each sequence reads its whole context (cached + new) once."""

    def __post_init__(self) -> None:
        # One cheap test on the hot path (a shape per step and per window); the named error
        # only when it fails.
        values = (self.num_tokens, self.num_seqs, self.attn_pairs, self.kv_read_tokens)
        if all(type(v) is int and v >= 0 for v in values):
            return
        for field in _SHAPE_FIELDS:
            check_int(field, getattr(self, field), 0)

    @classmethod
    def from_chunks(cls, chunks: Iterable[tuple[int, int]]) -> BatchShape:
        """From (num_new_tokens, num_cached_tokens) per sequence.

        n new tokens after c cached ones attend to n*c + n*(n+1)/2 positions (causal) and read
        c + n K/V tokens; a decode is n = 1. Sequences with n = 0 compute nothing and are skipped.
        """
        tokens = seqs = pairs = reads = 0
        for n, c in chunks:
            if n < 0 or c < 0:
                raise ConfigError("chunk", (n, c), "needs num_new_tokens, num_cached_tokens >= 0")
            if n:
                tokens, seqs = tokens + n, seqs + 1
                pairs += n * c + n * (n + 1) // 2
                reads += c + n
        return cls(tokens, seqs, pairs, reads)

    @classmethod
    def decode(cls, num_seqs: int, context: int) -> BatchShape:
        """``num_seqs`` decodes, each after ``context`` cached tokens."""
        return cls(num_seqs, num_seqs, num_seqs * (context + 1), num_seqs * (context + 1))

    @classmethod
    def decode_growth(cls, num_seqs: int) -> BatchShape:
        """The per-step delta of a decode-only batch: each context grows by one token."""
        return cls(0, 0, num_seqs, num_seqs)

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.num_tokens, self.num_seqs, self.attn_pairs, self.kv_read_tokens)

    def __add__(self, other: BatchShape) -> BatchShape:
        return BatchShape(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def __mul__(self, k: int) -> BatchShape:
        return BatchShape(*(a * k for a in self.as_tuple()))

    __rmul__ = __mul__
