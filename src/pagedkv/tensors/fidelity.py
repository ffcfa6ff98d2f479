"""``pagedkv fidelity``: one workload through the real executor and through the simulator.

The real run is the simulator's Engine and Scheduler driving the ``TorchExecutor`` (each step's
duration measured with the profile's clock); the simulated runs are the same Engine on a
``SimExecutor`` priced by the profile (``ProfiledCost``) and by today's roofline on this device
(``Profile.rates``: achieved rates as peaks, the profile's calibration overhead per step). The
profile comes from its own runs (``pagedkv profile``), never from this workload. The simulated
runs are given the real run's sampled ids as their requests' outputs (``as_sampled``), so both
key the same blocks for prefix caching: where the clock cannot reorder anything (all arrivals
at once) the two runs schedule alike, batch for batch.

Errors, each defined once here (sim = simulated, real = measured):

* step error: |predicted - measured| / measured of every real step, priced on exactly the
  batch that ran (its shape and swaps); ``median`` and ``p90`` over the steps;
* throughput_error, ttft_error, tpot_error, e2e_error: sim / real - 1 of the output-token
  throughput and of mean TTFT, TPOT and end-to-end latency (``pagedkv.engine.metrics``);
* iterations_real, iterations_sim: the runs' iteration counts; iterations_agree: whether the
  two runs computed the same sequence of batch shapes.

``replay`` holds the same errors of a simulation whose every step takes what the real run
measured for a step of its shape (the median; ``Replay``): 0 where the real run repeated no
shape (the simulator then reproduces it step for step, a check of the schedule itself), and
otherwise what one shape's spread of measured times does to the schedule (an arrival landing
on the other side of a step boundary changes the batches after it): an error that no cost
model, which prices one shape one way, removes.

``steps`` lists every real step (its sequences' new and cached tokens, swaps, copies,
preemptions and recomputed prefills, ``profile_runs.step_detail``) with its measured time and
the profile's price: the per-step errors, to group by kind and shape.

``roofline`` holds the same errors for today's roofline and, for a profile with a
``layer_residual``, ``operators`` for the profile without it (the operators' sum alone): what
the whole-step term changes, on the same runs.

Each real step is timed ``repeats`` times, its median its duration (``Repeated``; a step
that swaps or copies blocks runs each time from its cache as it was). With
``noise_floor`` the real workload runs a second time and ``noise`` holds the same errors of
that run against the first (the step error over the steps both ran alike, in order): what the
measurement itself does not repeat, the floor under every figure above.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import numpy as np

from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.cost_model import CostModel
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.metrics import summarize
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.profile import load_profile
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.errors import ConfigError
from pagedkv.memory.config import CacheConfig
from pagedkv.tensors.executor import TorchExecutor, build_real_engine
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_shapes import resolve_model
from pagedkv.tensors.profile_config import FidelityConfig
from pagedkv.tensors.profile_ops import DTYPES
from pagedkv.tensors.profile_runs import Recorder, Repeated, Replay, roofline_of, workload
from pagedkv.tensors.profiler import check_device, device_clock, torch_threads
from pagedkv.workloads.spec import RequestSpec

METRICS = {
    "throughput": ("output_token_throughput",),
    "ttft": ("ttft", "mean"),
    "tpot": ("tpot", "mean"),
    "e2e": ("e2e", "mean"),
}


def _metrics(engine: Engine, sampled: dict[int, tuple[int, ...]] | None = None) -> dict[str, float]:
    """The run's metrics; ``sampled`` (if given) receives each request's sampled ids."""
    run = engine.run()
    if sampled is not None:
        sampled.update({r.request_id: tuple(r.output_token_ids) for r in run.requests})
    s = summarize(run.requests, run.totals, run.sim_time, engine.scheduler.kv.capacity)
    out: dict[str, float] = {}
    for name, path in METRICS.items():
        value: Any = s
        for key in path:
            value = value[key]
        out[name] = float(value)
    out["iterations"] = run.totals.iterations
    out["preemptions"] = float(sum(r.num_preemptions for r in run.requests))
    return out


def _scheduler(cfg: FidelityConfig, max_len: int) -> SchedulerConfig:
    return SchedulerConfig(
        scheduler=cfg.scheduler,
        max_model_len=max_len,
        preemption_mode=cfg.preemption_mode,  # type: ignore[arg-type]
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
    )


def _sim(
    cfg: FidelityConfig,
    sched: SchedulerConfig,
    specs: list[RequestSpec],
    cost: CostModel,
    executor: Any = None,
) -> tuple[Engine, Recorder]:
    cache = CacheConfig(
        num_gpu_blocks=cfg.num_gpu_blocks,
        block_size=cfg.block_size,
        num_cpu_blocks=cfg.num_cpu_blocks,
        enable_prefix_caching=cfg.enable_prefix_caching,
    )
    policy = SCHEDULERS[sched.scheduler]
    # not a SimExecutor: every round is stepped
    recorder = Recorder(SimExecutor(cost) if executor is None else executor)
    engine = Engine(policy(sched, policy.make_allocator(cache, sched)), recorder, specs)
    return engine, recorder


def as_sampled(specs: list[RequestSpec], sampled: dict[int, tuple[int, ...]]) -> list[RequestSpec]:
    """``specs`` with the real run's sampled ids as the tokens a simulated model generates
    (``output_token_ids``; the output length what the real run generated). Without them the
    simulator knows no output id, so with prefix caching a request preempted after its first
    token (its recompute covers prompt and outputs) finds no cached prefix at all, where the
    real run hits its own prompt's blocks and the shared prefix; and freed output blocks stay
    cached (and evictable in LRU order) in the real run only. The ids are the seeded
    draws' (``TorchExecutor``), which do not depend on the schedule, so they are what the
    simulated schedule's real run would sample too."""
    out = []
    for s in specs:
        ids = sampled[s.request_id]
        out.append(dataclasses.replace(s, output_len=len(ids), output_token_ids=ids))
    return out


def _errors(
    real: dict[str, float],
    sim: dict[str, float],
    real_steps: list[Any],
    sim_steps: list[Any],
    cost: CostModel | None,
) -> dict[str, Any]:
    """The errors of ``sim`` against ``real``; per step, the cost model's price of each real
    step, or (``cost`` None: ``sim`` is a second real run) the other run's time of the same
    step, over the leading steps both runs ran alike."""
    step = []
    if cost is None:
        for (shape, swapped, measured), (shape2, swapped2, other) in zip(real_steps, sim_steps):  # noqa: B905
            if (shape, swapped) != (shape2, swapped2):
                break
            step.append(abs(other - measured) / measured)
    else:
        for shape, swapped, measured in real_steps:
            predicted = cost.step_time(shape) + (cost.swap_time(swapped) if swapped else 0.0)
            step.append(abs(predicted - measured) / measured)
    out: dict[str, Any] = {
        "step_error": {  # None: no step to compare (a second run that differed at once)
            "median": statistics.median(step) if step else None,
            "p90": float(np.percentile(step, 90)) if step else None,
            "steps": len(step),
        },
        "iterations_real": int(real["iterations"]),
        "iterations_sim": int(sim["iterations"]),
        "iterations_agree": [s[:2] for s in real_steps] == [s[:2] for s in sim_steps],
    }
    for name in METRICS:
        out[f"{name}_error"] = sim[name] / real[name] - 1 if real[name] else 0.0
    return out


def fidelity(cfg: FidelityConfig) -> dict[str, Any]:
    """Run the workload for real and simulated; the errors (module docstring) and the runs."""
    profile = load_profile(cfg.profile)
    device = check_device(cfg.device)
    if profile.source.get("device") != cfg.device:
        raise ConfigError(
            "device", cfg.device, f"the profile was measured on {profile.source.get('device')}"
        )
    config, spec = resolve_model(cfg.model, profile.dtype)
    profile.check_model(spec)
    profile.check_block_size(cfg.block_size)
    threads_text = profile.source.get("threads", "1")
    if not threads_text.isdigit() or int(threads_text) < 1:
        raise ConfigError("profile.source.threads", threads_text, "must be a thread count >= 1")
    threads = int(threads_text)
    max_len = config.max_position
    sched = _scheduler(cfg, max_len)
    top = max_len - cfg.max_output_len
    if cfg.max_prompt_len > top:
        raise ConfigError(
            "max_prompt_len", cfg.max_prompt_len, f"prompt + output must fit {max_len} positions"
        )
    specs = workload(
        cfg.num_requests,
        config.vocab_size,
        (cfg.min_prompt_len, cfg.max_prompt_len),
        (cfg.min_output_len, cfg.max_output_len),
        cfg.request_rate,
        cfg.seed,
        cfg.shared_prefix_len,
    )
    with torch_threads(threads):
        clock, _ = device_clock(cfg.device, threads)
        model = Decoder.random(config, seed=cfg.seed, dtype=DTYPES[profile.dtype], device=device)
        runs = []
        sampled: dict[int, tuple[int, ...]] = {}
        # a warm-up run first: first calls allocate and build
        for warm in (True, False, *([False] if cfg.noise_floor else [])):
            engine = build_real_engine(
                model,
                specs[:4] if warm else specs,
                num_gpu_blocks=cfg.num_gpu_blocks,
                block_size=cfg.block_size,
                num_cpu_blocks=cfg.num_cpu_blocks,
                scheduler=sched,
                enable_prefix_caching=cfg.enable_prefix_caching,
            )
            assert isinstance(engine.executor, TorchExecutor)
            engine.executor.clock = clock
            recorder = Recorder(Repeated(engine.executor, cfg.repeats))
            engine.executor = recorder
            runs.append((_metrics(engine, None if warm else sampled), recorder))
    real, real_recorder = runs[1]
    real_steps = real_recorder.steps
    costs: dict[str, CostModel] = {
        "profiled": ProfiledCost(profile, spec, cfg.block_size),
        "roofline": roofline_of(
            {
                "matmul_flops": profile.rates.matmul_flops,
                "read_bandwidth": profile.rates.read_bandwidth,
                "copy_bandwidth": profile.rates.copy_bandwidth,
            },
            spec,
            cfg.block_size,
            profile.rates.roofline_overhead_s,
        ),
    }
    if profile.layer_residual is not None:  # the same profile without its whole-step term
        bare = dataclasses.replace(profile, layer_residual=None)
        costs["operators"] = ProfiledCost(bare, spec, cfg.block_size)
    out: dict[str, Any] = {"real": real, "profile_source": dict(profile.source)}
    if cfg.noise_floor:
        again, again_recorder = runs[2]
        out["real_again"] = again
        out["noise"] = _errors(real, again, real_steps, again_recorder.steps, None)
    for name, cost in costs.items():
        engine, recorder = _sim(cfg, sched, as_sampled(specs, sampled), cost)
        sim = _metrics(engine)
        out[f"{name}_sim"] = sim
        errors = _errors(real, sim, real_steps, recorder.steps, cost)
        out["summary" if name == "profiled" else name] = errors
    # the real run's own step times on the simulated schedule (``Replay``): the schedule's share
    replay = Replay(real_recorder, costs["profiled"])
    engine, recorder = _sim(cfg, sched, as_sampled(specs, sampled), costs["profiled"], replay)
    out["replay_sim"] = _metrics(engine)
    out["replay"] = _errors(real, out["replay_sim"], real_steps, recorder.steps, None)
    out["replay"]["replayed_steps"] = replay.replayed
    again_steps = runs[2][1].steps if cfg.noise_floor else []
    out["steps"] = _step_records(real_recorder, costs["profiled"], again_steps)
    return out


def _step_records(recorded: Recorder, cost: CostModel, again: list[Any]) -> list[dict[str, Any]]:
    """Each real step: its ``step_detail``, measured seconds and the profile's price (swaps
    included), so its signed error can be grouped by kind and shape; and, over the leading
    steps the second real run (``again``) ran alike, that run's time (``measured_again_s``:
    the floor of the same grouping)."""
    out = []
    alike = True
    for i, ((shape, swapped, measured), detail) in enumerate(
        zip(recorded.steps, recorded.detail, strict=True)
    ):
        predicted = cost.step_time(shape) + (cost.swap_time(swapped) if swapped else 0.0)
        record = {**detail, "measured_s": measured, "profiled_s": predicted}
        alike = alike and i < len(again) and again[i][:2] == (shape, swapped)
        if alike:
            record["measured_again_s"] = again[i][2]
        out.append(record)
    return out
