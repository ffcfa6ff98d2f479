"""Decode attention on the CPU: paged (compiled kernel, torch gather path) against contiguous SDPA.

    python benchmarks/bench_attention.py [--out results/bench_attention.json] [--repeats 5]

Per case (batch, context, kv heads, dtype, threads; 32 query heads of dimension 128, blocks of
16 tokens scattered over the pool): the median time per call of

* ``fast``: ``paged_attention`` on a decode batch, i.e. the compiled kernel (``fast_attention``);
* ``gather``: ``paged_attention_gather``, the plain torch path (gather the blocks, then SDPA);
* ``sdpa``: ``scaled_dot_product_attention`` on the same K/V laid out contiguously;
* ``stream``: a streaming read of as many bytes (a float32 ``sum`` over the contiguous K and V),
  this machine's read bandwidth measured in the same run;

the effective bandwidth of each (K and V bytes read / time), the ratios paged / contiguous and
the fast path's fraction of the streaming read bandwidth beside SDPA's. Decode attention is
memory-bound, so that fraction is the figure that matters. The four are timed in interleaved
rounds and each ratio is the median of its per-round ratios, so a change of machine load during
the run moves the absolute times more than the ratios; compare ratios, not absolute times across
machines.

Then mixed batches (``--mixed``, on by default): one sequence's prefill chunk of ``--chunk``
tokens among ``MIXED_BATCH - 1`` decodes, all at the longest context, through the kernel and
through the torch gather path (which copies every needed block on each call, and pads every
sequence's queries to the chunk), with the size of that copy. Last, the per-call cost of small
decode calls: ``paged_attention``, the bare kernel call, and the Python side alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from pagedkv.io import atomic_write_json
from pagedkv.tensors import fast_attention
from pagedkv.tensors.attention import paged_attention, paged_attention_gather

HEADS = 32
HEAD_DIM = 128
BLOCK_SIZE = 16
# the targets: at batch 32, context 2048, all kv heads, float32 and bfloat16, the kernel takes at
# most SDPA's time and reads at least half the streaming read bandwidth
TARGET = {"batch": 32, "context": 2048, "kv_heads": 32}
TARGET_RATIO = 1.0
TARGET_FRACTION = 0.5
MIXED_BATCH = 8  # the gather path computes MIXED_BATCH * chunk query rows: keep it small


@dataclass(frozen=True)
class Case:
    batch: int
    context: int
    kv_heads: int
    dtype: str
    threads: int


def all_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cases(
    batches: list[int], contexts: list[int], dtypes: list[str], threads: list[int], gqa: bool
) -> list[Case]:
    out = [
        Case(b, c, HEADS, d, t) for t in threads for d in dtypes for b in batches for c in contexts
    ]
    if gqa:  # one grouped-query case: 8 kv heads, 4 query heads each, the largest batch/context
        out += [Case(max(batches), max(contexts), 8, d, t) for t in threads for d in dtypes]
    return out


def timed_rounds(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """``repeats`` rounds, each timing every function once, in an order rotated per round: a
    machine whose load changes during the run slows all of them alike, so the per-round ratios
    stay meaningful even when absolute times drift."""
    for fn in fns.values():
        fn()  # warm-up: first-touch page faults, the kernel's first load
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def measure(case: Case, repeats: int, seed: int, with_gather: bool) -> dict[str, Any]:
    torch.set_num_threads(case.threads)
    dtype = getattr(torch, case.dtype)
    g = torch.Generator().manual_seed(seed)
    per_seq = case.context // BLOCK_SIZE
    num_blocks = case.batch * per_seq
    # the contiguous K/V first; the paged cache holds the same tokens, blocks in random order
    shape = (case.batch, case.kv_heads, case.context, HEAD_DIM)
    k = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(case.batch, HEADS, HEAD_DIM, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm.view(case.batch, per_seq).tolist()
    paged_shape = (num_blocks, BLOCK_SIZE, case.kv_heads, HEAD_DIM)
    cache_k = torch.empty(paged_shape, dtype=dtype)
    cache_v = torch.empty(paged_shape, dtype=dtype)
    # [B, KVH, L, D] -> [B, blocks, 16, KVH, D] -> pool order given by the block tables
    cache_k[perm] = k.permute(0, 2, 1, 3).reshape(paged_shape)
    cache_v[perm] = v.permute(0, 2, 1, 3).reshape(paged_shape)
    lens, qlens = [case.context] * case.batch, [1] * case.batch
    q4 = q[:, :, None, :]  # [B, H, 1, D]
    gqa = case.kv_heads != HEADS

    def fast() -> torch.Tensor:
        return paged_attention(q, cache_k, cache_v, tables, lens, qlens)

    def gather() -> torch.Tensor:
        return paged_attention_gather(q, cache_k, cache_v, tables, lens, qlens)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q4, k, v, enable_gqa=gqa)

    # the same bytes as float32 words: a plain streaming read at the machine's speed
    k_words, v_words = k.view(-1).view(torch.float32), v.view(-1).view(torch.float32)

    def stream() -> float:
        return float(k_words.sum()) + float(v_words.sum())

    expected = sdpa()[:, :, 0, :]
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4  # a wrong kernel must not look fast
    torch.testing.assert_close(fast(), expected, atol=tol, rtol=tol)

    kv_bytes = 2 * k.numel() * k.element_size()
    fns: dict[str, Callable[[], object]] = {"fast": fast, "sdpa": sdpa, "stream": stream}
    if with_gather:
        fns["gather"] = gather
    rounds = timed_rounds(fns, repeats)
    row: dict[str, Any] = {**asdict(case), "kv_bytes": kv_bytes}
    for name, times in rounds.items():
        row[f"{name}_s"] = statistics.median(times)
        row[f"{name}_gbps"] = kv_bytes / row[f"{name}_s"] / 1e9
    # ratios: medians of the per-round ratios (see timed_rounds)
    row["fast_over_sdpa"] = median_ratio(rounds["fast"], rounds["sdpa"])
    if with_gather:
        row["gather_over_sdpa"] = median_ratio(rounds["gather"], rounds["sdpa"])
    row["fast_fraction_of_read_bw"] = median_ratio(rounds["stream"], rounds["fast"])
    row["sdpa_fraction_of_read_bw"] = median_ratio(rounds["stream"], rounds["sdpa"])
    return row


def measure_mixed(
    batch: int, context: int, chunk: int, dtype_name: str, threads: int, repeats: int, seed: int
) -> dict[str, Any]:
    """One prefill chunk (the last ``chunk`` tokens of sequence 0) among ``batch - 1`` decodes,
    every context ``context``: the kernel against the gather path, checked equal first."""
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(seed)
    per_seq = context // BLOCK_SIZE
    num_blocks = batch * per_seq
    shape = (num_blocks, BLOCK_SIZE, HEADS, HEAD_DIM)
    cache_k = torch.randn(shape, generator=g).to(dtype)
    cache_v = torch.randn(shape, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g).view(batch, per_seq).tolist()
    lens, qlens = [context] * batch, [chunk] + [1] * (batch - 1)
    q = torch.randn(sum(qlens), HEADS, HEAD_DIM, generator=g).to(dtype)

    def fast() -> torch.Tensor:
        return paged_attention(q, cache_k, cache_v, tables, lens, qlens)

    def gather() -> torch.Tensor:
        return paged_attention_gather(q, cache_k, cache_v, tables, lens, qlens)

    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(fast(), gather(), atol=tol, rtol=tol)
    rounds = timed_rounds({"fast": fast, "gather": gather}, repeats)
    return {
        "batch": batch,
        "context": context,
        "chunk": chunk,
        "dtype": dtype_name,
        "threads": threads,
        "kv_bytes": 2 * cache_k.numel() * cache_k.element_size(),
        "gather_copy_bytes": 2 * cache_k.numel() * cache_k.element_size(),  # every block, once
        "fast_s": statistics.median(rounds["fast"]),
        "gather_s": statistics.median(rounds["gather"]),
        "fast_over_gather": median_ratio(rounds["fast"], rounds["gather"]),
    }


def render_mixed(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="mixed batches: one prefill chunk among decodes (kernel vs gather path)")
    columns = ["dtype", "thr", "batch", "ctx", "chunk", "KV MiB", "gather copies MiB",
               "fast ms", "gather ms", "fast/gather"]  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "dtype" else "right")
    for r in rows:
        table.add_row(
            r["dtype"],
            str(r["threads"]),
            str(r["batch"]),
            str(r["context"]),
            str(r["chunk"]),
            f"{r['kv_bytes'] / 2**20:,.0f}",
            f"{r['gather_copy_bytes'] / 2**20:,.0f}",
            f"{r['fast_s'] * 1e3:.1f}",
            f"{r['gather_s'] * 1e3:.1f}",
            f"{r['fast_over_gather']:.2f}",
        )
    return table


class _NoKernel:
    """Stands in for the kernel library: its entry points return at once, so a call through it
    times the Python side alone."""

    @staticmethod
    def pagedkv_attention_f32(*args: object) -> int:
        return 0


def measure_overhead(batch: int, context: int, calls: int = 2000) -> dict[str, Any]:
    """The per-call cost of ``paged_attention`` on a small decode batch (8 heads x 64, two kv
    heads, float32, one thread): the whole call, the bare kernel call (``fast_attention.prepare``:
    arguments converted once), and the Python side alone (the call with the kernel replaced by
    a no-op: validation, the int32 arrays, the output)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    per_seq = -(-context // BLOCK_SIZE)
    k = torch.randn(batch * per_seq, BLOCK_SIZE, 2, 64, generator=g)
    v = torch.randn(k.shape, generator=g)
    q = torch.randn(batch, 8, 64, generator=g)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    lens, qlens = [context] * batch, [1] * batch
    bare = fast_attention.prepare(q, k, v, tables, lens, qlens, 0.125)

    def call() -> object:
        return paged_attention(q, k, v, tables, lens, qlens)

    rounds = timed_rounds({"call": call, "bare": bare}, calls)
    real = fast_attention.kernel
    setattr(fast_attention, "kernel", _NoKernel)  # noqa: B010 (the module's global, for a while)
    try:
        python = timed_rounds({"python": call}, calls)["python"]
    finally:
        setattr(fast_attention, "kernel", real)  # noqa: B010
    return {
        "batch": batch,
        "context": context,
        "call_us": statistics.median(rounds["call"]) * 1e6,
        "kernel_us": statistics.median(rounds["bare"]) * 1e6,
        "python_us": statistics.median(python) * 1e6,
    }


def is_target(row: dict[str, Any]) -> bool:
    return all(row[key] == value for key, value in TARGET.items())


def render(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"decode attention, {HEADS} heads x {HEAD_DIM}, blocks of {BLOCK_SIZE}")
    columns = [
        "dtype", "thr", "batch", "ctx", "kvh", "KV MiB", "fast ms", "gather ms", "sdpa ms",
        "fast GB/s", "read GB/s", "fast/sdpa", "gather/sdpa", "fast % read", "sdpa % read",
    ]  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col == "dtype" else "right")
    for r in rows:
        gather_ms = f"{r['gather_s'] * 1e3:.1f}" if "gather_s" in r else "-"
        gather_ratio = f"{r['gather_over_sdpa']:.2f}" if "gather_over_sdpa" in r else "-"
        table.add_row(
            r["dtype"],
            str(r["threads"]),
            str(r["batch"]),
            str(r["context"]),
            str(r["kv_heads"]),
            f"{r['kv_bytes'] / 2**20:,.0f}",
            f"{r['fast_s'] * 1e3:.2f}",
            gather_ms,
            f"{r['sdpa_s'] * 1e3:.2f}",
            f"{r['fast_gbps']:.1f}",
            f"{r['stream_gbps']:.1f}",
            f"{r['fast_over_sdpa']:.2f}",
            gather_ratio,
            f"{100 * r['fast_fraction_of_read_bw']:.0f}%",
            f"{100 * r['sdpa_fraction_of_read_bw']:.0f}%",
            style="bold" if is_target(r) else None,
        )
    return table


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default="results/bench_attention.json", metavar="PATH")
    parser.add_argument("--batches", type=ints, default=[1, 8, 32])
    parser.add_argument("--contexts", type=ints, default=[512, 2048])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument(
        "--threads", type=ints, default=None, help="thread counts (default: 1 and all)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement")
    parser.add_argument("--no-gqa", action="store_true", help="skip the grouped-query case")
    parser.add_argument("--no-gather", action="store_true", help="skip the torch gather path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mixed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time mixed prefill + decode batches (kernel against the gather path)",
    )
    parser.add_argument(
        "--chunk", type=int, default=32, help="prefill chunk of the mixed batches (tokens)"
    )
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in ("float32", "bfloat16"):
            parser.error(f"--dtypes: {d!r} is not one of float32, bfloat16")
    threads = args.threads or sorted({1, all_threads()})
    if args.repeats < 1 or any(c % BLOCK_SIZE for c in args.contexts):
        parser.error(f"--repeats must be >= 1 and contexts multiples of {BLOCK_SIZE}")
    if args.mixed and not 1 <= args.chunk <= max(args.contexts):
        parser.error(f"--chunk must lie in [1, {max(args.contexts)}] (the longest context)")
    if fast_attention.kernel() is None:
        parser.error("the fast attention kernel could not be built (see the warning above)")

    console = Console()
    if not console.is_terminal:  # a log file: the whole table, not 80 columns of ellipses
        console = Console(width=150)
    rows = []
    todo = cases(args.batches, args.contexts, dtypes, threads, not args.no_gqa)
    for i, case in enumerate(todo):
        console.print(f"[{i + 1}/{len(todo)}] {case}", style="dim")
        rows.append(measure(case, args.repeats, args.seed, not args.no_gather))
    console.print(render(rows))
    for r in rows:
        if is_target(r):
            fast_enough = r["fast_over_sdpa"] <= TARGET_RATIO
            enough = r["fast_fraction_of_read_bw"] >= TARGET_FRACTION
            console.print(
                f"target (batch 32, context 2048, {r['dtype']}, {r['threads']} thread(s)): "
                f"kernel / SDPA time {r['fast_over_sdpa']:.2f} "
                f"({'meets' if fast_enough else 'MISSES'} <= {TARGET_RATIO:.1f}); "
                f"{100 * r['fast_fraction_of_read_bw']:.0f}% of the read bandwidth, SDPA "
                f"{100 * r['sdpa_fraction_of_read_bw']:.0f}% "
                f"({'meets' if enough else 'misses'} the {100 * TARGET_FRACTION:.0f}% target)"
            )
    mixed_rows = []
    if args.mixed:
        todo_mixed = [(d, t) for t in threads for d in dtypes]
        for dtype, thr in todo_mixed:
            console.print(f"mixed {dtype}, {thr} thread(s)", style="dim")
            mixed_rows.append(
                measure_mixed(
                    MIXED_BATCH, max(args.contexts), args.chunk, dtype, thr, args.repeats, args.seed
                )
            )  # fmt: skip
        console.print(render_mixed(mixed_rows))
    overheads = [measure_overhead(b, c) for b, c in ((1, 16), (8, 256), (32, 512))]
    for o in overheads:
        console.print(
            f"per call, batch {o['batch']}, context {o['context']}: paged_attention "
            f"{o['call_us']:.1f} us, the bare kernel {o['kernel_us']:.1f} us, the Python side "
            f"{o['python_us']:.1f} us (target < 50)"
        )
    meta = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": all_threads(),
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "block_size": BLOCK_SIZE,
        "repeats": args.repeats,
        "seed": args.seed,
    }
    path = atomic_write_json(
        args.out, {"meta": meta, "rows": rows, "mixed": mixed_rows, "overhead": overheads}
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
