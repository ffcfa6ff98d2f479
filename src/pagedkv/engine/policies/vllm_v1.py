"""``vllm-v1``: vLLM 0.33's v1 scheduler at its defaults, on pagedkv's paged memory.

One token budget per step (``max_num_batched_tokens``, default 2048, or a smaller
``max_num_scheduled_tokens``); prefill is always chunked.

1. Running requests, in the order they were admitted: each gets min(pending tokens,
   ``long_prefill_token_threshold`` if set and more than one request runs or waits, budget)
   new slots. Without a free block the victim (FCFS: the last admitted running request;
   priority: the highest (priority, arrival)) is preempted by recompute (its blocks freed, back
   to the front of the waiting queue) until the request fits or is the victim itself; then
   the running pass stops (priority: it goes on with the next request).
2. Only if nobody was preempted: waiting requests, head first, while the budget lasts and fewer
   than ``max_num_active_seqs`` (default ``max_num_seqs``) run. Prefix caching looks up the
   whole known sequence (its last token excluded) first, then schedules min(rest, budget)
   tokens. With ``scheduler_reserve_full_isl`` (default) the whole current sequence must fit
   in the free blocks; the chunk itself must fit in any case. The watermark (default 0: vLLM
   v1's) keeps ``int(watermark * num_gpu_blocks)`` blocks free, and applies only to these
   admissions and only while some request runs. The first head that does not fit ends admission.
3. The null block: vLLM keeps block 0 out of the pool, so ``num_gpu_blocks`` N gives N - 1
   usable blocks. vLLM's free queue: of the blocks a request frees, the uncached ones go to
   the head (last block first), the cached ones to the tail (``eviction.v1_pool``).
4. ``async_scheduling`` (vLLM's default): a step is scheduled before the previous step's
   outputs are known, so a request that sampled its last token holds its blocks and its
   running slot through the next schedule (it computes nothing there) and is freed after it,
   and a block that a just-sampled token fills is keyed when that output arrives.

Preemption is always by recompute (vLLM v1 has no swap); groups (n > 1) are rejected: vLLM's
front end splits them into independent requests.

The event fast path (``decides_at_events``): the decode cohort asks ``plan_round`` at every
event (``plans_every_event``: the budget caps decodes, and an async finish frees its blocks
in the round after it), runs the prompts' chunks, admissions and async frees of a round
through ``fill`` and its preemptions through ``growth_victim`` (vllm_v1_plan.py: each
promise, and the states in which it is None).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from pagedkv.engine.config import SchedulerConfig, SchedulingPolicy
from pagedkv.engine.policies.vllm_v1_plan import MIRRORED, V1PlanMixin
from pagedkv.engine.policies.vllm_v1_queue import PriorityQueueMixin
from pagedkv.engine.request import Request, RequestStatus
from pagedkv.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput, keeps_rounds
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig, EvictionPolicy
from pagedkv.memory.eviction import v1_pool
from pagedkv.memory.interface import KVAllocator
from pagedkv.memory.manager import NO_HIT, KVCacheManager, PrefixHit


class VllmV1Scheduler(V1PlanMixin, PriorityQueueMixin, Scheduler):
    name = "vllm-v1"
    preempts = True
    supports_groups = False
    always_chunked: ClassVar[bool] = True
    default_watermark: ClassVar[float] = 0.0
    null_blocks: ClassVar[int] = 1
    decides_at_events = True  # tested fast against reference (tests/engine/test_vllm_v1_fast.py)
    plans_every_event = True  # (the budget caps decodes; async frees land a round late)

    @classmethod
    def make_allocator(cls, cache: CacheConfig, config: SchedulerConfig) -> KVCacheManager:
        """N - 1 usable blocks (vLLM's null block) in vLLM's block pool; the policy applies the
        watermark itself."""
        cls.check_memory(cache, config)
        usable = dataclasses.replace(cache, num_gpu_blocks=cache.num_gpu_blocks - cls.null_blocks)
        gpu = v1_pool(usable.num_gpu_blocks, enable_caching=usable.enable_prefix_caching)
        return KVCacheManager(usable, gpu)

    @classmethod
    def check_memory(cls, cache: CacheConfig, config: SchedulerConfig) -> None:
        """vLLM's free queue only (lru), at least one block beside the null block, and no
        pinned prefixes (vLLM has no such thing: its sharing is prefix caching)."""
        if cache.enable_pinned_prefixes:
            raise ConfigError(
                "enable_pinned_prefixes",
                True,
                "vllm-v1 shares prefixes as vLLM does, by prefix caching (--enable-prefix-caching)",
            )
        if cache.enable_prefix_caching and cache.eviction_policy is not EvictionPolicy.LRU:
            raise ConfigError(
                "eviction_policy",
                cache.eviction_policy.value,
                "vllm-v1 runs vLLM's own free queue (lru)",
            )
        if cache.num_gpu_blocks < 2:
            raise ConfigError(
                "num_gpu_blocks",
                cache.num_gpu_blocks,
                "must be >= 2 for vllm-v1 (vLLM keeps one block as its null block)",
            )

    def __init__(self, config: SchedulerConfig, kv: KVAllocator) -> None:
        super().__init__(config, kv)
        assert isinstance(kv, KVCacheManager), "the vllm-v1 policy runs on paged memory"
        self.paged: KVCacheManager = kv
        # vLLM's watermark counts the null block: int(watermark x all blocks)
        self._watermark = int(kv.config.watermark * (kv.config.num_gpu_blocks + 1))
        # vLLM's two budgets both shrink by every scheduled token: the smaller binds
        scheduled = config.max_num_scheduled_tokens
        self._budget = min(config.token_budget, scheduled or config.token_budget)
        self._max_active = config.max_num_active_seqs or config.max_num_seqs
        self._priority = config.scheduling_policy is SchedulingPolicy.PRIORITY
        # async: requests whose last token is in flight, freed after the next schedule
        self._draining: list[Request] = []
        # async: requests that sampled in the last step, in its order (vLLM's scheduler has
        # not seen those tokens yet)
        self._sampled: dict[Request, None] = {}
        # async, prefix caching: the decode cohort runs rounds whose blocks it keys as they
        # fill; the last round's keys are taken back at its end (``cohort_ends``)
        self._window = False
        # each running request's admission, counted (its place in the running order)
        self._serial: dict[Request, int] = {}
        self._admissions = 0
        # Are the rounds this class's own, which the promises restate? (A subclass that
        # changes how a round is built, and states the promise itself, gets no plan.)
        cls = type(self)
        self._rounds_mirrored = keeps_rounds(cls, VllmV1Scheduler, MIRRORED)

    # ----- arrivals and completions -------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        if req.n > 1:
            return self._reject(req, f"{req.n} sequences: the vllm-v1 policy runs one each")
        if req.final_len > self.config.max_model_len:
            return self._reject(
                req,
                f"prompt + output = {req.final_len} > max_model_len {self.config.max_model_len}",
            )
        self.has_token_ids |= req.token_ids is not None
        blocks = self.paged.blocks_for(req.max_kv_tokens)
        if blocks > self.paged.gpu.num_blocks:
            return self._reject(
                req,
                f"needs {blocks} blocks; the KV cache holds {self.paged.gpu.num_blocks} "
                "(the null block excluded)",
            )
        self._enqueue(req)
        return True

    def finish(self, req: Request) -> list[Request]:
        if not self.config.async_scheduling:
            return super().finish(req)
        # Its output reaches the scheduler one step late: until then it keeps its blocks and
        # its place among the running (it counts against max_num_seqs and can be a victim).
        req.status = RequestStatus.FINISHED
        self._draining.append(req)
        return [req]

    def _start_running(self, req: Request) -> None:
        req.status = RequestStatus.RUNNING
        self.running.append(req)  # vLLM's running list is in admission order
        self._admissions += 1
        self._serial[req] = self._admissions

    def _free_group(self, req: Request) -> None:
        self._serial.pop(req, None)  # (it leaves the running list)
        super()._free_group(req)

    # ----- one step -----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self._window = False
        out = self._schedule_once()
        if not self.config.async_scheduling:
            return out
        released = list(self._draining)
        self._outputs_arrive()
        if released and not out.chunks:
            # nothing ran: vLLM's engine schedules again at once, the outputs in
            again = self._schedule_once()
            again.preempted[:0] = out.preempted
            out = again
        out.released = released
        self._sampled = {
            c.request: None for c in out.chunks if c.request.num_pending_tokens == c.num_new_tokens
        }
        return out

    def _outputs_arrive(self) -> None:
        """The last step's outputs reach the scheduler (async, after this step was scheduled):
        the blocks they complete are keyed, for each request that sampled and was not just
        preempted; then finished requests free their blocks and slots."""
        self._key_sampled()
        self._release()

    def _key_sampled(self) -> None:
        """The last step's outputs are known: the blocks they complete are keyed."""
        kv = self.paged
        for req in self._sampled:
            if req.status is not RequestStatus.WAITING and kv.has_seq(req.seq_id):
                kv.cache_known_blocks(req.seq_id, req.num_computed_tokens)
        self._sampled = {}

    def _release(self) -> None:
        """Finished requests (async: held through this step's schedule) free their blocks
        and running slots."""
        for req in self._draining:
            self.running.remove(req)
            self._free_group(req)
        self._draining.clear()

    def _schedule_once(self) -> SchedulerOutput:
        out = SchedulerOutput()
        num_eligible = len(self.running) + len(self.waiting)
        threshold = self.config.long_prefill_token_threshold if num_eligible > 1 else 0
        budget = self._schedule_running(out, self._budget, threshold)
        if not out.preempted:
            self._schedule_waiting(out, budget, threshold)
        return out

    def has_unfinished(self) -> bool:
        """Does any request wait or compute? When none does, the late outputs of the last
        step are in (async), so finished requests free their blocks now."""
        if self.waiting or any(r.status is RequestStatus.RUNNING for r in self.running):
            return True
        if self._draining:
            self._outputs_arrive()
        return False

    def _schedule_running(self, out: SchedulerOutput, budget: int, threshold: int) -> int:
        running, kv = self.running, self.paged
        max_len = self.config.max_model_len
        scheduled: dict[Request, int] = {}
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.status is not RequestStatus.RUNNING:
                i += 1  # finished, its last output in flight (async): nothing to compute
                continue
            n = req.num_pending_tokens
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, max_len - req.num_computed_tokens - 1)
            if n <= 0:
                i += 1
                continue
            start = req.num_computed_tokens
            ids = req.token_slice(start, start + n) if self.has_token_ids else None
            # async: the token sampled last step is not known to the scheduler yet, so the
            # block it fills is keyed one step later (vLLM caches up to its known tokens)
            limit = req.num_tokens - 1 if req in self._sampled else None
            fits = False
            while True:
                copies = kv.append_slots(req.seq_id, n, token_ids=ids, cache_limit=limit)
                if copies is not None:
                    out.copies.extend(copies)
                    fits = True
                    break
                victim = self._pick_victim()
                at = running.index(victim)
                del running[at]
                if at < i:
                    i -= 1
                if victim in scheduled:  # (priority only) its chunk and budget come back
                    budget += scheduled.pop(victim)
                    out.chunks = [c for c in out.chunks if c.request is not victim]
                self._preempt(victim, out)
                if victim is req:
                    break
            if not fits:  # it preempted itself
                if self._priority:
                    continue  # the ones after it may still fit (i is theirs now)
                break
            scheduled[req] = n
            out.chunks.append(ScheduledChunk(req, n, start))
            budget -= n
            i += 1
        return budget

    def _pick_victim(self) -> Request:
        if self._priority:
            # vLLM's key is (priority, arrival time), a tie going to the first running: two
            # requests that arrived together (a burst, a trace's whole seconds) and cannot both
            # fit then preempt each other for ever. vLLM's arrival times are its wall clock and
            # never tie; the request id, which orders them as that clock would, breaks the tie.
            return max(self.running, key=lambda r: (r.priority, r.arrival_time, r.request_id))
        return self.running[-1]

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int) -> None:
        kv = self.paged
        max_len = self.config.max_model_len
        while budget > 0 and self.waiting and len(self.running) < self._max_active:
            req = self._head()
            ids = req.known_token_ids
            hit: PrefixHit = NO_HIT if ids is None else kv.lookup_prefix(ids)
            cached = hit.num_computed_tokens
            n = req.num_tokens - cached
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            free = kv.num_free_blocks - (self._watermark if self.running else 0)
            if self.config.scheduler_reserve_full_isl:
                whole = min(req.num_tokens, max_len)
                if kv.free_blocks_taken(max(whole, cached), hit) > free:
                    break
            if kv.free_blocks_taken(cached + n, hit) > free:
                break
            computed = kv.allocate(
                req.seq_id, cached + n, token_ids=ids, final_len=req.max_kv_tokens
            )
            assert computed == cached, "the allocator found another prefix hit"
            self._pop_head()
            req.num_computed_tokens = cached
            self._start_running(req)
            out.chunks.append(ScheduledChunk(req, n, cached))
            budget -= n

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Recompute: free the blocks, back to the waiting queue's front (FCFS) or its place
        (priority). A finished request awaiting its free (async) just frees."""
        out.preempted.append(victim)
        self._free_group(victim)
        if victim.status is RequestStatus.FINISHED:
            self._draining.remove(victim)
            return
        victim.num_preemptions += 1
        victim.num_recomputed_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self._requeue(victim)
