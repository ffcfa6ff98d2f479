"""The real executor: the engine's batches run on a ``Decoder`` over a ``PagedKVCache``.

It plugs into the same ``Engine`` and ``Scheduler`` as the simulator, through the executor
interface (``execute(batch) -> StepResult``). One iteration:

1. the memory moves the scheduler asked for, in the order the scheduler made them (vLLM's
   order too): swap-ins, then swap-outs, then copies (copy-on-write ``BlockCopy``; ``SlotCopy``
   from the contiguous baselines). The vllm policy resumes swapped requests only in a step that
   preempted nobody before, and a resumed request that finds no room for its next token is
   swapped straight back out, so when a step has both lists the ins came first: the outs may
   read the very blocks just swapped in (found by the schedule-invariance test). Copies come
   last: their sources may be blocks just swapped in.
2. one flattened model input from ``batch.chunks``: each chunk's ``num_new_tokens`` tokens after
   its ``num_cached_tokens``, with slots from the sequence's block table in the allocator;
3. one forward pass, then one sampled token for each chunk that catches up with its request
   (greedy, or a draw seeded per request and token, ``pagedkv.tensors.sampling``: the
   tokens do not depend on the schedule); a single-sequence request that samples a stop
   token is reported in ``StepResult.stopped``, and the engine finishes it; a beam search
   group's k best
   (beam, token) candidates go to its request (``beam_step``), for the scheduler to fork and
   free the beams before the group's next step (``pagedkv.engine.beam``).

The duration is measured wall time (``time.perf_counter``) of all of it; the sampled tokens
come back keyed by ``seq_id`` and the engine appends them to ``output_token_ids``.

Contiguous allocators address one linear space of slots; run them on a cache with
``block_size = 1`` (``build_real_engine`` does): a region ``(start, held)`` is then the block
table ``start .. start + held - 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from pagedkv.engine.beam import Candidate
from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import StepResult
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.request import Request
from pagedkv.engine.scheduler import ScheduledChunk, SchedulerOutput
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig, EvictionPolicy
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.interface import BlockCopy, KVAllocator, SeqId, SlotCopy
from pagedkv.memory.manager import KVCacheManager
from pagedkv.tensors.kv_cache import PagedKVCache
from pagedkv.tensors.model import Decoder, ModelInput
from pagedkv.tensors.sampling import SamplingConfig, draw_seed, request_seed, sample_rows
from pagedkv.validation import check_choice
from pagedkv.workloads.spec import RequestSpec

__all__ = [
    "SamplingConfig",  # its home is pagedkv.tensors.sampling; imported from here too
    "TorchExecutor",
    "block_table",
    "build_real_engine",
    "copy_slots",
]


def block_table(kv: KVAllocator, seq_id: SeqId, cache: PagedKVCache) -> list[int]:
    """The physical blocks of ``seq_id`` in ``cache``'s addressing."""
    if isinstance(kv, KVCacheManager):
        return kv.block_ids(seq_id)
    if isinstance(kv, ContiguousAllocator):
        if cache.block_size != 1:
            raise ConfigError(
                "block_size",
                cache.block_size,
                "a contiguous allocator needs a cache of block_size 1",
            )
        start, held = kv.region(seq_id)
        return list(range(start, start + held))
    raise ConfigError("kv", type(kv).__name__, "must be a KVCacheManager or ContiguousAllocator")


def copy_slots(cache: PagedKVCache, copies: Sequence[SlotCopy]) -> None:
    """Copy runs of token slots (``SlotCopy``: src, dst, length) in every layer's flat view."""
    if not copies:
        return
    src = torch.cat([torch.arange(c.src, c.src + c.length) for c in copies])
    dst = torch.cat([torch.arange(c.dst, c.dst + c.length) for c in copies])
    src, dst = src.to(cache.device), dst.to(cache.device)
    flat = (cache.num_slots, cache.num_kv_heads, cache.head_dim)
    for t in (*cache.k_caches, *cache.v_caches):
        view = t.view(flat)
        view.index_copy_(0, dst, view.index_select(0, src))


class TorchExecutor:
    """Runs scheduled batches on ``model`` with K/V in ``cache``; ``kv`` is the scheduler's
    allocator (``scheduler.kv``), read for block tables. ``seeds`` gives requests their own
    sampling seed (by request id; the others derive theirs from ``sampling.seed``)."""

    def __init__(
        self,
        model: Decoder,
        cache: PagedKVCache,
        kv: KVAllocator,
        sampling: SamplingConfig | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        seeds: Mapping[int, int] | None = None,
    ) -> None:
        self.model = model
        self.cache = cache
        self.kv = kv
        self.sampling = sampling or SamplingConfig()
        self.seeds = dict(seeds or {})
        self.stop_token_ids = frozenset(self.sampling.stop_token_ids)
        self.clock = clock
        self.num_steps = 0
        self.num_tokens = 0  # tokens computed (prefill and decode)

    def execute(self, batch: SchedulerOutput) -> StepResult:
        start = self.clock()
        cache = self.cache
        cache.swap_in(batch.swap_in)
        cache.swap_out(batch.swap_out)
        cache.copy_blocks([c for c in batch.copies if isinstance(c, BlockCopy)])
        copy_slots(cache, [c for c in batch.copies if isinstance(c, SlotCopy)])
        sampled: dict[object, int] = {}
        stopped: set[int] = set()
        if batch.chunks:
            inp, samplers = self.prepare(batch.chunks)
            logits = self.model(inp, cache)
            owners = {seq: c.request for c in batch.chunks for seq in c.request.seq_ids}
            tokens = self.sample(logits, [self.draw_seed(owners[s], s) for s in samplers])
            sampled = {seq: int(t) for seq, t in zip(samplers, tokens.tolist(), strict=True)}
            if any(c.request.beam is not None for c in batch.chunks):
                self.beam_step(batch.chunks, samplers, logits)
            if self.stop_token_ids:
                stopped = {
                    owners[seq].request_id
                    for seq, t in sampled.items()
                    if t in self.stop_token_ids
                    and len(owners[seq].seq_ids) == 1
                    and owners[seq].n == 1
                    and owners[seq].beam is None
                }
            self.num_tokens += int(inp.token_ids.numel())
        self.num_steps += 1
        return StepResult.measured(self.clock() - start, sampled, frozenset(stopped))

    def draw_seed(self, req: Request, seq_id: object) -> int:
        """The seed of ``seq_id``'s next draw: its request's seed, its index in the group, the
        index of the output token it samples (``pagedkv.tensors.sampling``)."""
        seed = self.seeds.get(req.request_id)
        if seed is None:
            seed = request_seed(self.sampling.seed, req.request_id)
        return draw_seed(seed, req.seq_ids.index(seq_id), len(req.outputs_of(seq_id)))

    def prepare(self, chunks: Iterable[ScheduledChunk]) -> tuple[ModelInput, list[object]]:
        """The flattened model input of ``chunks``, and the seq ids that sample (in the order
        of ``logits_indices``)."""
        bs = self.cache.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        ctx_lens: list[int] = []
        q_lens: list[int] = []
        prompt_lens: list[int] = []
        logit_rows: list[int] = []
        samplers: list[object] = []
        for req, n, cached in chunks:
            if req.token_ids is None:
                raise ConfigError(
                    "token_ids", None, f"request {req.request_id} needs token ids to run for real"
                )
            end = cached + n
            # a forked group (parallel sampling) runs each of its sequences on its own tokens
            for seq_id in req.seq_ids:
                known = req.token_ids + tuple(req.outputs_of(seq_id))
                if end > len(known):
                    raise ConfigError("num_new_tokens", n, f"only {len(known)} tokens are known")
                table = block_table(self.kv, seq_id, self.cache)
                ids.extend(known[cached:end])
                positions.extend(range(cached, end))
                # slot = block * block_size + offset (as kv_cache.slot_mapping), in plain ints:
                # one small tensor per sequence per step costs more than the tiny model's math
                slots.extend(table[p // bs] * bs + p % bs for p in range(cached, end))
                tables.append(table)
                ctx_lens.append(end)
                q_lens.append(n)
                prompt_lens.append(req.prompt_len)
                if end == req.num_tokens:  # caught up: this chunk's last token samples
                    logit_rows.append(len(ids) - 1)
                    samplers.append(seq_id)
        device = self.model.device
        inp = ModelInput(
            token_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=tables,
            context_lens=ctx_lens,
            query_lens=q_lens,
            logits_indices=torch.tensor(logit_rows, dtype=torch.long, device=device),
            prompt_lens=prompt_lens,
        )
        return inp, samplers

    def beam_step(
        self, chunks: Iterable[ScheduledChunk], samplers: list[object], logits: torch.Tensor
    ) -> None:
        """Beam search for every beam group that sampled: the k best (beam, token) candidates
        by cumulative log-prob, handed to the request (``beam.pending``) for the scheduler to
        apply when the group next runs (it forks and frees; the memory manager keeps the
        books). The first step has one beam, the prompt: its k best tokens start the k beams.
        Each beam's ``sampled`` token is a placeholder the reorganisation replaces."""
        rows = {seq: i for i, seq in enumerate(samplers)}
        for chunk in chunks:
            req, state = chunk.request, chunk.request.beam
            if state is None or req.seq_ids[0] not in rows:
                continue
            index = torch.tensor([rows[s] for s in req.seq_ids], device=logits.device)
            logp = torch.log_softmax(logits.index_select(0, index), dim=-1)
            scores = torch.tensor(state.scores, dtype=logp.dtype, device=logp.device)
            total = (logp + scores[:, None]).flatten()
            best = torch.topk(total, state.width)  # sorted, best first
            vocab = logp.shape[1]
            state.pending = [
                Candidate(i // vocab, i % vocab, v)
                for i, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)
            ]

    def sample(self, logits: torch.Tensor, seeds: Sequence[int]) -> torch.Tensor:
        """One token per row: argmax, or a draw from softmax(logits / temperature) with the
        row's seed."""
        return sample_rows(logits, self.sampling.temperature, seeds)


def build_real_engine(
    model: Decoder,
    workload: Iterable[RequestSpec],
    *,
    num_gpu_blocks: int,
    block_size: int = 16,
    num_cpu_blocks: int = 0,
    scheduler: SchedulerConfig | None = None,
    sampling: SamplingConfig | None = None,
    watermark: float = 0.01,
    check_integrity: bool = False,
    cache_factory: Callable[..., PagedKVCache] = PagedKVCache,
    enable_prefix_caching: bool = False,
    eviction_policy: EvictionPolicy | str = EvictionPolicy.LRU,
    seeds: Mapping[int, int] | None = None,
) -> Engine:
    """The simulator's Engine and Scheduler, driving ``model`` on a real paged cache.

    As ``pagedkv.simulation.build_engine``: a ``CacheConfig``, the policy's own allocator, the
    policy; then a cache shaped to match (contiguous policies: block_size 1, one block per slot).
    ``cache_factory`` builds the cache (``PagedKVCache``'s signature), e.g. a checking subclass.
    ``seeds``: per-request sampling seeds (``TorchExecutor``).
    """
    sched = scheduler or SchedulerConfig(max_model_len=model.config.max_position)
    cache_cfg = CacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        num_cpu_blocks=num_cpu_blocks,
        watermark=watermark,
        enable_prefix_caching=enable_prefix_caching,
        eviction_policy=check_choice("eviction_policy", eviction_policy, EvictionPolicy),
    )
    policy = SCHEDULERS[sched.scheduler]
    kv = policy.make_allocator(cache_cfg, sched)
    paged = isinstance(kv, KVCacheManager)
    c = model.config
    cache = cache_factory(
        c.num_layers,
        num_gpu_blocks if paged else cache_cfg.capacity,
        block_size if paged else 1,
        c.num_kv_heads,
        c.head_dim,
        dtype=model.dtype,
        device=model.device,
        num_cpu_blocks=num_cpu_blocks if paged else 0,
    )
    executor = TorchExecutor(model, cache, kv, sampling, seeds=seeds)
    return Engine(policy(sched, kv), executor, workload, check_integrity=check_integrity)
