"""``pagedkv profile``: measure a model's operators on this device and write a ``Profile``.

One layer at the model's real shapes (layers are identical), random weights, in the run's
dtype, on ``cpu`` or ``cuda`` (``torch.cuda.synchronize`` around every timing there):

1. ``linear``: the layer without attention (``_NoAttention``: the K/V write kept) against the
   batched tokens; ``embedding``: a whole one-layer forward without attention, less the layer;
   ``lm_head``: ``Decoder.logits`` against the rows;
2. ``decode_attention`` at each block size: ``paged_attention`` (the paged kernel) on decode
   batches over blocks scattered in the pool, at 8 sequences against their total context (the
   curve) and at 2 and ``max_seqs`` (the per-sequence term, a least-squares fit);
3. ``prefill_attention``: single prefills (query x cached context) and prefills mixed with
   decodes, a nonnegative least-squares fit of per call, sequence, pair and K/V token;
4. ``swap`` at each block size: ``PagedKVCache.swap_out`` of 1..64 blocks of one layer;
5. ``rates``: a matmul at the MLP's shape, a streaming read and a copy (for a roofline of this
   machine);
6. ``layer_residual``: whole forwards of the profiling model (``OperatorBench.whole_steps``:
   decode batches and single prefills, the layers, embedding and lm head run as one step runs
   them), less what the operators above price them at, per layer held, against the tokens
   (``residual_curve``). Operators timed one by one after a flush find their inputs, buffers
   and the allocator's free lists cold; run in sequence they cost less (llama-110m's decode of
   one sequence: 2.2 ms a layer alone, 1.8 ms in a whole forward), so without it a step is
   priced above what it measures;
7. ``per_iteration_s`` / ``per_sequence_s`` / ``per_token_s``: two short runs of the real executor
   on the one-layer model (its own workloads, seeded), the part of each step the operators above
   do not explain, fitted (nonnegative, relative to each step's time) to 1, sequences and
   tokens; the roofline's per-step
   overhead is the mean of measured - roofline on the same steps.

Points 1-4 and 6 are timed together (``profile_ops.Timer``; the rates, whose streaming would
leave the next point cold, in passes of their own after them): a warm-up pass over all of them,
then round-robin passes (3 to 25, as many as ``budget_s`` holds), each timing after an untimed
lead run of its point, each point's median over the
passes; so a minute in which the machine runs slow slows every point a little instead of a
few points by all of it. Each point's spread over the passes is recorded (``timing``). On a
CPU with one thread the clock is this thread's CPU time (other processes on a shared machine
do not count); otherwise wall time.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

import pagedkv
from pagedkv.engine.profile import SHAPE_FIELDS, Profile
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.errors import ConfigError
from pagedkv.tensors.model_shapes import spec_of
from pagedkv.tensors.profile_config import ProfileConfig
from pagedkv.tensors.profile_fit import nonnegative_lstsq, residual_curve
from pagedkv.tensors.profile_ops import OperatorBench
from pagedkv.tensors.profile_runs import calibration_steps, roofline_of


def device_clock(device: str, threads: int) -> tuple[Callable[[], float], str]:
    """(clock, its name): this thread's CPU time on a one-thread CPU run, else wall time (after
    ``torch.cuda.synchronize`` on cuda, so that a timing covers the kernels it launched)."""
    if device == "cuda":

        def synced() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        return synced, "perf_counter after cuda synchronize"
    if threads == 1:
        return time.thread_time, "thread_time"
    return time.perf_counter, "perf_counter"


def check_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "torch sees no CUDA device here; use cpu")
    return torch.device(device)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's thread count for the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _source(cfg: ProfileConfig, device: torch.device, clock: str) -> dict[str, str]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "device": device.type,
        "device_name": name or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "numpy": np.__version__,
        "pagedkv": pagedkv.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "threads": str(cfg.threads),
        "clock": clock,
        "budget_s": str(cfg.budget_s),
    }


def profile(cfg: ProfileConfig, tick: Callable[[int], None] | None = None) -> Profile:
    """Measure, fit and validate a profile; ``tick(total)`` is called after every timing, with
    the number of timings known so far (it grows once, after the warm-up pass)."""
    device = check_device(cfg.device)
    with torch_threads(cfg.threads):
        clock, clock_name = device_clock(cfg.device, cfg.threads)
        bench = OperatorBench(cfg, device, clock, tick or (lambda total: None))
        # every term registers its points, all are timed in the same passes, then fitted
        fit_linear = bench.linear_and_embedding()
        fit_lm_head = bench.lm_head()
        fit_prefill = bench.prefill_attention()
        fit_decode = {bs: bench.decode_attention(bs) for bs in cfg.block_sizes}
        fit_swap = {bs: bench.swap(bs) for bs in cfg.block_sizes}
        fit_rates = bench.rates()
        fit_whole = bench.whole_steps()
        passes = bench.timer.run()
        linear, embedding = fit_linear()
        data: dict[str, Any] = {
            "format": "pagedkv-profile",
            "version": 1,
            "source": _source(cfg, device, clock_name),
            "model": {
                "name": bench.spec.name,
                "arch": bench.config.arch,
                **{k: getattr(bench.spec, k) for k in SHAPE_FIELDS},
            },
            "dtype": cfg.dtype,
            "block_sizes": list(cfg.block_sizes),
            "per_iteration_s": 1e-9,
            "per_sequence_s": 0.0,
            "per_token_s": 0.0,
            "embedding": embedding,
            "linear": linear,
            "lm_head": fit_lm_head(),
            "prefill_attention": fit_prefill(),
            "decode_attention": {str(bs): f() for bs, f in fit_decode.items()},
            "swap": {str(bs): f() for bs, f in fit_swap.items()},
            "rates": {**fit_rates(), "roofline_overhead_s": 0.0},
            "timing": {"passes": passes, "points": bench.timer.spreads()},
        }
        bs = cfg.block_sizes[0]
        one = spec_of(bench.config, bench.spec.name, cfg.dtype)
        held = bench.config.num_layers
        held_model = {**data["model"], "num_layers": held}
        # whole forwards less their operators' sum, per layer held
        ops = ProfiledCost(Profile.from_dict({**data, "model": held_model}), one, bs)
        whole = fit_whole()
        data["layer_residual"] = residual_curve(
            [s.num_tokens for s, _ in whole],
            [(m - (ops.step_time(s) - 1e-9)) / held for s, m in whole],
            data["linear"],
        )
        # the executor's own work: what the operators leave unexplained in real steps
        layer = Profile.from_dict({**data, "model": held_model})
        ops = ProfiledCost(layer, one, bs)
        steps = calibration_steps(bench.model, bs, clock, cfg.seed)
        shapes = [s for s, _ in steps]
        measured = [m for _, m in steps]
        # each step weighted by 1 / its time: the fit minimises relative errors, so that a
        # few large prefills do not decide what every small decode step pays
        rows = [[1 / m, s.num_seqs / m, s.num_tokens / m] for s, m in steps]
        rest = [(m - (ops.step_time(s) - 1e-9)) / m for s, m in steps]
        per_iter, per_seq, per_token = nonnegative_lstsq(rows, rest)
        data["per_iteration_s"] = max(per_iter, 1e-9)
        data["per_sequence_s"] = per_seq
        data["per_token_s"] = per_token
        roof = roofline_of(data["rates"], one, bs, 0.0)
        data["rates"]["roofline_overhead_s"] = max(
            statistics.fmean(m - roof.step_time(s) for s, m in zip(shapes, measured, strict=True)),
            0.0,
        )
        return Profile.from_dict(data)


def progress_bar(total: int, label: str) -> Any:
    """A rich progress bar on stderr (drawn only on a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    bar.add_task(label, total=total)
    return bar
