"""Beam search groups: after every sampled token, the k beams of a request pick their parents.

Beam search keeps the k best (beam, next token) candidates each step. In paged memory a
candidate is a *parent* sequence plus one token, so one step reorganises the group:

    before   beam 0  beam 1  beam 2  beam 3         (ranked by score)
    parents     0       0       1       2           (new beams, best first)
    after    beam 0  fork(0)  beam 1  beam 2        beam 3 had no child: freed

A beam with no child is freed; a beam with c > 1 children is forked c - 1 times (``kv.fork``:
the children share every block of the history, the shared partial last block copied on its
first write). The memory manager stays the only bookkeeper: this module only decides who
descends from whom, and asks it to fork and free.

The parents come from a real executor's beam search (its ``Candidate``s, the request's
``pending``, applied when the group next runs) or, in a simulation, from ``BeamModel``, a
seeded survival model (docs/sharing.md: the model, and the statistics ``survival_stats``
measures of it). One ``numpy.random.Generator`` per request, seeded from the run's seed and
the request id, so a run is byte-identical whatever else runs beside it.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.validation import check_int

if TYPE_CHECKING:
    import numpy as np

    from pagedkv.engine.request import Request
    from pagedkv.memory.interface import KVAllocator


class Candidate(NamedTuple):
    """A new beam: the index of its parent in the group's ``seq_ids``, the token it appends
    (None in a simulation: no ids) and its cumulative log-prob (0 in a simulation)."""

    parent: int
    token: int | None
    score: float


@dataclass(frozen=True)
class BeamModel:
    """The simulator's survival model: with probability ``stay`` a beam continues its own
    lineage, otherwise its parent is drawn among the current beams with probability
    proportional to ``decay ** rank`` (rank 0 the best), so good beams fork and bad ones die.
    Defaults: our choice, not fitted to any trace (docs/sharing.md: what they produce)."""

    stay: float = 0.5
    decay: float = 0.5

    def __post_init__(self) -> None:
        for name, value in (("stay", self.stay), ("decay", self.decay)):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not 0.0 <= value <= 1.0 or (name == "decay" and value == 0.0):
                raise ConfigError(name, value, "must be a number in [0, 1] (decay: in (0, 1])")

    def parents(self, rng: np.random.Generator, current: int, width: int) -> list[int]:
        """Parent ranks of the ``width`` new beams among ``current`` beams, sorted (so the
        children of the best beam rank first). One draw of 2 x width uniforms per step (this
        runs once per beam group per simulated iteration: kept to plain floats)."""
        u = rng.random(2 * width).tolist()
        cdf = _rank_cdf(self.decay, current)
        stay = self.stay
        out = [
            j if j < current and u[j] < stay else bisect.bisect_right(cdf, u[width + j])
            for j in range(width)
        ]
        out.sort()
        return out


@functools.cache
def _rank_cdf(decay: float, current: int) -> tuple[float, ...]:
    """The cumulative rank probabilities but the last (P(rank) ~ decay ** rank), so that
    ``bisect_right(cdf, u)`` is the rank drawn by a uniform u in [0, 1)."""
    weights = [decay**r for r in range(current)]
    total = sum(weights)
    cdf, acc = [], 0.0
    for w in weights[:-1]:
        acc += w / total
        cdf.append(acc)
    return tuple(cdf)


DEFAULT_MODEL = BeamModel()


@dataclass
class BeamState:
    """A beam request's search state; ``Request.beam`` holds one (None: not a beam search)."""

    width: int
    seed: int = 0
    request_id: int = 0
    applied: int = 0  # output tokens sampled when the group was last reorganised
    next_id: int = 1  # the next fresh sequence id suffix
    pending: list[Candidate] | None = None  # a real executor's choice, applied next round
    scores: list[float] = field(default_factory=lambda: [0.0])  # per beam, in seq_ids order
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_int("beam_width", self.width, 2)
        import numpy as np  # imported when a beam is made: the scheduler's import stays light

        self.rng = np.random.default_rng([self.seed, self.request_id])

    def restart(self) -> None:
        """The group starts again from its prompt (preempted by recompute)."""
        self.applied = 0
        self.pending = None
        self.scores = [0.0]


def reorganise(req: Request, kv: KVAllocator, model: BeamModel = DEFAULT_MODEL) -> None:
    """Apply one beam step to ``req``'s group: fork the parents of several new beams, free the
    beams without a child, and rebuild ``seq_ids`` and the per-beam outputs, best first.

    The parents come from ``req.beam.pending`` (a real executor's candidates) or, without
    them, from ``model``. Forks never need room (paged memory shares blocks), so this cannot
    fail; the copies happen on the next append (copy-on-write)."""
    state = req.beam
    assert state is not None, "reorganise needs a beam request"
    old = list(req.seq_ids)
    if state.pending is not None:
        cands = state.pending
    else:
        ranks = model.parents(state.rng, len(old), state.width)
        cands = [Candidate(p, None, 0.0) for p in ranks]
    outputs = [list(req.outputs_of(s)) for s in old]
    used: set[int] = set()
    new_ids: list[object] = []
    new_outputs: list[list[int]] = []
    for cand in cands:
        parent = old[cand.parent]
        if cand.parent in used:
            child: object = (req.request_id, "beam", state.next_id)
            state.next_id += 1
            kv.fork(parent, child, final_len=req.max_kv_tokens)
        else:
            child = parent
            used.add(cand.parent)
        new_ids.append(child)
        outs = outputs[cand.parent]
        # A real executor reported one token per old beam; the new beam's last token is its
        # candidate's (the history before it is the parent's).
        new_outputs.append(outs if cand.token is None else [*outs[:-1], cand.token])
    for i, seq_id in enumerate(old):
        if i not in used:
            kv.free(seq_id)
    req.seq_ids[:] = new_ids
    req.output_token_ids[:] = new_outputs[0]
    req.child_output_ids = dict(zip(new_ids[1:], new_outputs[1:], strict=True))
    state.scores = [c.score for c in cands]
    state.pending = None
    state.applied = req.num_output_tokens


@dataclass(frozen=True)
class SurvivalStats:
    """What ``model`` does to a group of ``width`` beams, measured over many steps."""

    width: int
    distinct_parents: float  # mean beams with at least one child per step
    forks: float  # mean forks per step (new beams - distinct parents)
    split_age: float  # mean steps since two beams last shared a sequence (pairs, steady state)


def survival_stats(
    model: BeamModel, width: int, *, steps: int = 200, groups: int = 200, seed: int = 0
) -> SurvivalStats:
    """Measure ``model`` alone (no memory): ``groups`` groups of ``width`` beams for ``steps``
    steps each. A pair's split age is the number of steps since their lineages parted (their
    outputs since then are their own; before it they share blocks). Averages skip the first
    ``steps // 4`` steps, where every pair is still young (all beams start from the prompt)."""
    check_int("width", width, 2)
    check_int("steps", steps, 4)
    import numpy as np

    rng = np.random.default_rng(seed)
    parents_total = 0.0
    age_total = 0.0
    counted = 0
    warm = steps // 4
    for _ in range(groups):
        split = np.zeros((width, width), dtype=np.int64)  # step at which i and j parted
        current = 1
        for step in range(1, steps + 1):
            ranks = model.parents(rng, current, width)
            idx = np.asarray(ranks)
            # Children of one parent part now; others inherit their parents' split step.
            split = np.where(idx[:, None] == idx[None, :], step, split[np.ix_(idx, idx)])
            current = width
            if step > warm:
                parents_total += len(set(ranks))
                off = ~np.eye(width, dtype=bool)
                age_total += float((step - split[off]).mean())
                counted += 1
    parents = parents_total / counted
    return SurvivalStats(width, parents, width - parents, age_total / counted)
