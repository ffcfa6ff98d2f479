"""An executor that runs the engine's batches on labels instead of K/V, at simulator speed.

A real model's K/V at position p is a function of tokens 0..p, so each slot here holds the
*label* of that token prefix (a hash chained token by token) and the token id. The executor
performs the batch's memory moves in exactly the real executor's order (``TorchExecutor``:
swap-ins, swap-outs, then copy-on-write copies, all read before any is written), writes every
scheduled token's label, and then checks what a model would read: every slot below each GPU
sequence's length must hold that sequence's own label. A lost copy, a copy applied after a
swap-out of its block, a prefix hit on a block whose K/V was never computed, or two prefixes
in one block all show up as a wrong label, named with the step and the position.

It samples like a real executor (the engine records the ids): a request's planned output id
when the workload has one (so chat turns still find their history), otherwise a hash of the
label, so forked samples diverge as real sampled ones do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pagedkv.engine.clock import TICKS_PER_SECOND
from pagedkv.engine.executor import StepResult
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.memory.interface import BlockCopy, SeqId
from pagedkv.memory.manager import KVCacheManager
from pagedkv.memory.prefix_hash import BlockHash
from pagedkv.workloads.token_ids import SPAN, owner_of

Slot = tuple[int, int]  # (label, token id)
SAMPLED_BASE = (2 * 1_000_003 + 1) * SPAN
"""Sampled ids live in a request range no workload here reaches, so a sampled id is never
mistaken for a shared prefix's."""


def labels(tokens: tuple[int, ...]) -> list[int]:
    """The label of every prefix of ``tokens``: label[p] stands for tokens[0..p]'s K/V."""
    out: list[int] = []
    h = 0
    for t in tokens:
        h = hash((h, t))
        out.append(h)
    return out


@dataclass
class ShadowExecutor:
    kv: KVCacheManager
    requests: dict[int, Request] = field(default_factory=dict)
    gpu: dict[int, Slot] = field(default_factory=dict)  # flat GPU slot -> content
    cpu: dict[int, Slot] = field(default_factory=dict)
    key_labels: dict[BlockHash, list[int]] = field(default_factory=dict)
    steps: int = 0
    copies: int = 0
    checked_slots: int = 0

    def execute(self, batch: SchedulerOutput) -> StepResult:
        bs = self.kv.block_size
        self.move_memory(batch)
        sampled: dict[object, int] = {}
        written: dict[int, Slot] = {}
        for chunk in batch.chunks:
            req, n, cached = chunk
            self.requests[req.request_id] = req
            end = cached + n
            for seq_id in req.seq_ids:
                known = self._known(req, seq_id)
                assert end <= len(known), f"step {self.steps}: {seq_id!r} computes unknown ids"
                lab = labels(known[:end])
                table = self.kv.block_ids(seq_id)
                for p in range(cached, end):
                    slot = table[p // bs] * bs + p % bs
                    content = (lab[p], known[p])
                    assert written.setdefault(slot, content) == content, (
                        f"step {self.steps}: two sequences write slot {slot} differently"
                    )
                if end == req.num_tokens:
                    sampled[seq_id] = self._sample(req, seq_id, lab[-1])
        self.gpu.update(written)  # a layer writes every new token before any attends
        self.check_tables(batch)
        self.check_memory()
        self.steps += 1
        return StepResult(TICKS_PER_SECOND, sampled)  # the unit clock's step

    def move_memory(self, batch: SchedulerOutput) -> None:
        """The real executor's order: swap-ins, swap-outs, then copy-on-write copies."""
        self.swap_in(batch)
        self.swap_out(batch)
        self.copy_blocks(batch)

    def swap_in(self, batch: SchedulerOutput) -> None:
        for m in batch.swap_in:
            self._move(self.cpu, m.src, self.gpu, m.dst)

    def swap_out(self, batch: SchedulerOutput) -> None:
        for m in batch.swap_out:
            self._move(self.gpu, m.src, self.cpu, m.dst)

    def copy_blocks(self, batch: SchedulerOutput) -> None:
        bs = self.kv.block_size
        block_copies = [c for c in batch.copies if isinstance(c, BlockCopy)]
        assert len(block_copies) == len(batch.copies), "the shadow runs paged memory only"
        sources = {c.src: [self.gpu.get(c.src * bs + i) for i in range(bs)] for c in block_copies}
        for c in block_copies:  # every copy reads the blocks as they were (a gather first)
            for i, content in enumerate(sources[c.src]):
                self._put(self.gpu, c.dst * bs + i, content)
        self.copies += len(block_copies)

    def check_tables(self, batch: SchedulerOutput) -> None:
        """Every table holds exactly the tokens its request has computed, or computes in this
        step: never slots for a chunk that was dropped (a preempted request's)."""
        ends = {
            s: c.num_cached_tokens + c.num_new_tokens
            for c in batch.chunks
            for s in c.request.seq_ids
        }
        for req in self.requests.values():
            for seq_id in req.seq_ids:
                if self.kv.has_seq(seq_id) or self.kv.is_swapped(seq_id):
                    want = ends.get(seq_id, req.num_computed_tokens)
                    assert self.kv.num_tokens(seq_id) == want, (
                        f"step {self.steps}: {seq_id!r} has {self.kv.num_tokens(seq_id)} "
                        f"slots for {want} computed tokens"
                    )

    def check_memory(self) -> None:
        """Every slot a GPU sequence holds has that sequence's label; every cached block holds
        what its key stands for; no block holds two shared prefixes."""
        kv, bs = self.kv, self.kv.block_size
        for seq_id in kv.seq_ids():
            req = self._request_of(seq_id)
            known = self._known(req, seq_id)
            n = kv.num_tokens(seq_id)
            lab = labels(known[:n])
            blocks = kv.block_ids(seq_id)
            for p in range(n):
                got = self.gpu.get(blocks[p // bs] * bs + p % bs)
                assert got == (lab[p], known[p]), (
                    f"step {self.steps}: sequence {seq_id!r} position {p} (block "
                    f"{blocks[p // bs]}) holds {got}, not its own K/V"
                )
            self.checked_slots += n
            hashes = kv._tables[seq_id].block_hashes  # the keys its full blocks stand for
            for j, key in enumerate(hashes[: n // bs]):
                self.key_labels.setdefault(key, lab[j * bs : (j + 1) * bs])
        for b, cached in enumerate(kv.gpu.block_hash):
            want = self.key_labels.get(cached) if cached is not None else None
            if want is not None:
                held = [self.gpu.get(b * bs + i) for i in range(bs)]
                assert [h[0] if h else None for h in held] == want, (
                    f"step {self.steps}: block {b} is cached under a key whose K/V it does not hold"
                )
        self.check_isolation()

    def check_isolation(self) -> None:
        """No physical block a sequence holds has tokens of two different shared prefixes in
        its filled slots (read from what the slots hold, not from the requests)."""
        bs = self.kv.block_size
        for seq_id in self.kv.seq_ids():
            n = self.kv.num_tokens(seq_id)
            for j, b in enumerate(self.kv.block_ids(seq_id)):
                held = {owner_of(self.gpu[b * bs + i][1]) for i in range(min(bs, n - j * bs))}
                prefixes = {k for kind, k in held if kind == "prefix"}
                assert len(prefixes) <= 1, f"block {b} holds prefixes {sorted(prefixes)}"

    def _request_of(self, seq_id: SeqId) -> Request:
        """A sequence's request: seq id r, or (r, j) for sample j of a forked group."""
        rid = seq_id[0] if isinstance(seq_id, tuple) else seq_id
        assert isinstance(rid, int)
        return self.requests[rid]

    def _known(self, req: Request, seq_id: SeqId) -> tuple[int, ...]:
        assert req.token_ids is not None
        return req.token_ids + tuple(req.outputs_of(seq_id))

    def _sample(self, req: Request, seq_id: SeqId, label: int) -> int:
        planned = req.planned_output_ids
        if seq_id == req.seq_ids[0] and planned is not None:
            return planned[req.num_output_tokens]
        # a digest, not hash(): a beam's seq id holds a str, whose hash varies by process
        digest = hashlib.blake2b(repr((label, seq_id)).encode(), digest_size=8).digest()
        return SAMPLED_BASE + int.from_bytes(digest, "big") % SPAN

    def _move(self, src: dict[int, Slot], s: int, dst: dict[int, Slot], d: int) -> None:
        bs = self.kv.block_size
        for i in range(bs):
            self._put(dst, d * bs + i, src.get(s * bs + i))

    @staticmethod
    def _put(pool: dict[int, Slot], slot: int, content: Slot | None) -> None:
        if content is None:
            pool.pop(slot, None)
        else:
            pool[slot] = content
