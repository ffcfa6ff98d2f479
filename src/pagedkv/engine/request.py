"""A request as counters (vLLM v1): no prefill/decode phase is stored, every phase is derived.

    tokens:  0 ............. prompt_len ............ num_tokens
             |    prompt     |  generated outputs    |
             |<--------- num_computed_tokens -->|    (K/V held in memory)

Each step computes some of the tokens not yet computed; when ``num_computed_tokens`` catches up
with ``num_tokens`` the step also samples one new output token. Prefill, chunked prefill, prefix
hits and recompute after preemption are then one rule: computed catches up with total.

The last output token is sampled but never fed back, so a request holds at most
``prompt_len + output_len - 1`` token states (``max_kv_tokens``): the final length the memory
layer is told about.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagedkv.engine.beam import BeamState
from pagedkv.errors import IntegrityError
from pagedkv.memory.token_runs import TokenIds, TokenRuns
from pagedkv.workloads.spec import RequestSpec


class RequestStatus(enum.Enum):
    """Where a request is in its life (which queue holds it), not what it computes."""

    WAITING = "waiting"  # arrived, not admitted (or preempted by recompute: admitted again later)
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted by swap: blocks in the CPU pool
    FINISHED = "finished"
    REJECTED = "rejected"  # can never fit; never admitted


@dataclass(eq=False, slots=True)
class Request:
    """One request's counters and timestamps. Identity is the object (``eq=False``). Slotted:
    a run holds 10^6 of them, and a field not declared here cannot be set by mistake."""

    request_id: int
    arrival_time: float
    prompt_len: int
    output_len: int
    token_ids: TokenIds | None = None
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # timestamps (simulated time) and counts, for the metrics
    admitted_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    num_swaps: int = 0
    num_recomputed_tokens: int = 0
    reject_reason: str | None = None
    seq_ids: list[object] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)  # filled by a real executor
    planned_output_ids: TokenIds | None = None  # what a simulated model will generate
    parent_id: int | None = None  # a closed-loop follow-up of this request (a chat turn)
    think_time: float = 0.0
    n: int = 1  # parallel samples: sequences in the group once it forks after the prefill
    # The forked samples' own ids (``child_output_ids``); None until a group first uses them
    # (most requests never fork: a run of 10^6 would hold 10^6 empty dicts).
    _children: dict[object, list[int]] | None = field(default=None, repr=False)
    # Beam search (``pagedkv.engine.beam``): the group's n = beam width sequences are beams
    # that pick their parents after every token. None: independent samples (or one sequence).
    beam: BeamState | None = None
    priority: int = 0  # the vllm-v1 policy's priority scheduling: lower runs first
    # The engine clock's view of arrival_time (``clock.to_ticks``, set by the engine): arrivals
    # are compared with the clock in ticks, so a tie with a round's end is exact.
    arrival_tick: int = 0

    @classmethod
    def from_spec(cls, spec: RequestSpec) -> Request:
        return cls(
            spec.request_id,
            spec.arrival_time,
            spec.prompt_len,
            spec.output_len,
            token_ids=spec.token_ids,
            planned_output_ids=spec.output_token_ids,
            parent_id=spec.parent_id,
            think_time=float(spec.think_time),
            n=spec.beam_width if spec.beam_width > 1 else spec.n,
            beam=(
                BeamState(spec.beam_width, spec.beam_seed, spec.request_id)
                if spec.beam_width > 1
                else None
            ),
            priority=spec.priority,
        )

    def __post_init__(self) -> None:
        if not self.seq_ids:
            self.seq_ids = [self.request_id]  # a group of one; parallel sampling adds more

    @property
    def child_output_ids(self) -> dict[object, list[int]]:
        """A forked sample's own sampled ids (a real executor's), keyed by its seq id;
        seq_ids[0]'s are output_token_ids. A child starts with the parent's (the first
        token, shared). Made empty on first use."""
        if self._children is None:
            self._children = {}
        return self._children

    @child_output_ids.setter
    def child_output_ids(self, ids: dict[object, list[int]]) -> None:
        self._children = ids

    @property
    def sampled_unforked(self) -> bool:
        """Parallel samples whose first token is sampled but which have not forked yet (the
        fork comes with the group's next append): the token is every sample's, so the group
        already stands for n sequences."""
        return self.beam is None and 0 < len(self.seq_ids) < self.n and self.num_output_tokens > 0

    def complete_samples(self) -> None:
        """At the finish of a group that never forked (one output token: the prompt's, shared
        by every sample), add the samples it would have forked: each holds that same token.
        Memory is not involved: the group has freed everything by then. Unforked after more
        tokens than that, its samples would share more than their first token: a bug."""
        if self.sampled_unforked and self.num_output_tokens != 1:
            raise IntegrityError(
                f"request {self.request_id}: {self.n} samples finished unforked after "
                f"{self.num_output_tokens} tokens"
            )
        while self.sampled_unforked:
            child = (self.request_id, len(self.seq_ids))  # as the scheduler names a fork
            self.seq_ids.append(child)
            self.child_output_ids[child] = list(self.output_token_ids)

    def outputs_of(self, seq_id: object) -> list[int]:
        """The sampled ids of one sequence of the group (a real executor's)."""
        return self.output_token_ids if seq_id == self.seq_ids[0] else self.child_output_ids[seq_id]

    @property
    def seq_id(self) -> object:
        """The memory manager key of the request's (first) sequence."""
        return self.seq_ids[0]

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: the prompt and every output sampled."""
        return self.prompt_len + self.num_output_tokens

    @property
    def known_token_ids(self) -> TokenIds | None:
        """Every token id so far (prompt, then outputs), or None unless all are known: the
        prompt's ids come with the workload, the outputs' from a real executor (sampled) or
        from the workload (planned, for a simulation with prefix caching)."""
        if self.token_ids is None:  # the usual simulation: no ids at all
            return None
        return self.token_slice(0, self.num_tokens)

    def token_slice(self, start: int, end: int) -> TokenIds | None:
        """The ids of tokens [start, end) (end <= num_tokens), or None if any is unknown.

        0 ........ prompt_len ......... num_tokens
        | prompt ids | output ids (sampled or planned) |

        Runs (``TokenRuns``, O(runs), no Python int per id) where the ids are held as runs, as a
        simulated workload's prompt and planned outputs are; otherwise a tuple.
        """
        prompt = self.token_ids
        if prompt is None:
            return None
        p = self.prompt_len
        if end <= p:
            head = prompt[start:end]
            return head if type(head) is TokenRuns else tuple(head)
        n = self.num_output_tokens
        if len(self.output_token_ids) == n:
            outs: TokenIds | list[int] = self.output_token_ids
        elif self.planned_output_ids is not None:
            outs = self.planned_output_ids
        else:
            return None
        ids: TokenIds
        if start >= p:
            tail = outs[start - p : end - p]
            ids = tail if type(tail) is TokenRuns else tuple(tail)
        elif type(prompt) is TokenRuns and type(outs) is TokenRuns:
            ids = prompt[start:] + outs[: end - p]
        else:
            ids = (*prompt[start:], *outs[: end - p])
        return ids if len(ids) == end - start else None

    def stop_early(self) -> None:
        """A real model sampled a stop token (EOS) before ``output_len``: the request ends
        here, and its output length becomes what it generated (so every metric that counts
        output tokens counts these)."""
        self.output_len = self.num_output_tokens

    @property
    def max_kv_tokens(self) -> int:
        """The most token states the request ever holds: prompt + output - 1."""
        return self.prompt_len + self.output_len - 1

    @property
    def final_len(self) -> int:
        """prompt + output tokens (the DESIGN's 'final length')."""
        return self.prompt_len + self.output_len

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to compute before the next output can be sampled."""
        return self.prompt_len + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)
