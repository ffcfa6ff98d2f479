"""``pagedkv.simulate(config) -> SimulationResult``: one simulated serving run, end to end.

A ``SimulationConfig`` holds one frozen, validated config per concern (hardware and memory,
scheduling, workload). Its flat view, one key per option, is what ``pagedkv simulate`` takes as
flags (``--block-size``) and ``--config FILE.yaml`` takes as keys (``block_size``); an unknown
key or a bad value is one ``ConfigError`` naming it, before any work starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv.engine.capacity import kv_capacity, swap_space_blocks
from pagedkv.engine.config import SchedulerConfig
from pagedkv.engine.cost_model import CostModel, RooflineConfig, RooflineCost, UnitCost
from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import SimExecutor
from pagedkv.engine.metrics import request_record, summarize
from pagedkv.engine.pinned_prefixes import (
    account_prefill,
    check_policy,
    pinned_setup,
    pinned_summary,
    register_workload_prefixes,
)
from pagedkv.engine.policies import SCHEDULERS
from pagedkv.engine.profile import load_profile
from pagedkv.engine.profiled_cost import ProfiledCost
from pagedkv.engine.request import Request
from pagedkv.engine.sliding import WindowedExecutor, needs_window_pricing
from pagedkv.errors import ConfigError
from pagedkv.footprint import BYTES_PER_BLOCK, BYTES_PER_REQUEST, check_memory, run_bytes
from pagedkv.memory.config import MAX_BLOCK_SIZE, MAX_BLOCKS, CacheConfig, EvictionPolicy
from pagedkv.memory.interface import KVAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.models.dtypes import KVCacheDType, ModelDType, serving_model
from pagedkv.models.gpus import GiB, get_gpu
from pagedkv.models.models import get_model
from pagedkv.profiles import builtin_for
from pagedkv.validation import (
    check_bool,
    check_bounds,
    check_choice,
    check_fraction,
    check_int,
    float_field,
    help_field,
    int_field,
    read_yaml,
)
from pagedkv.workloads.arrivals import Arrival
from pagedkv.workloads.config import WorkloadConfig, WorkloadKind
from pagedkv.workloads.factory import make_workload
from pagedkv.workloads.spec import RequestSpec


class CostModelKind(enum.Enum):
    UNIT = "unit"
    """One tick per iteration (the course lesson's steps)."""
    ROOFLINE = "roofline"
    """Seconds from GPU x model: max(FLOPs / peak, bytes / bandwidth) + overhead."""
    PROFILED = "profiled"
    """Seconds from an operator profile of the model (``pagedkv profile``; needs ``profile``)."""


@dataclass(frozen=True)
class HardwareConfig:
    """The model, the GPU, the KV memory carved out of it, and how iterations are timed."""

    model: str = help_field(
        "OPT-13B",
        "Model preset name, or a Hugging Face config.json (or its directory): Llama, Mistral, "
        "Qwen, GPT-2, OPT, Gemma, Mixtral, DeepSeek and other decoders (docs/models.md).",
    )
    gpu: str = help_field(
        "A100-40GB", "GPU preset name, or a GPU .yaml file of datasheet peaks (docs/models.md)."
    )
    dtype: ModelDType = help_field(
        ModelDType.AUTO,
        "Weights' data type, vLLM's --dtype: 'auto' (the checkpoint's 16-bit type; float16 for "
        "a float32 one), 'half'/'float16', 'bfloat16' (2 bytes), 'float'/'float32' (4 bytes).",
    )
    kv_cache_dtype: KVCacheDType = help_field(
        KVCacheDType.AUTO,
        "K/V cache data type, vLLM's --kv-cache-dtype: 'auto' (the model's dtype) or "
        "'fp8'/'fp8_e4m3'/'fp8_e5m2' (1 byte: half the K/V bytes per token of 16 bits).",
    )
    tensor_parallel_size: int = int_field(1, "GPUs the model is split over.", 1, 1024)
    gpu_memory_utilization: float = float_field(
        0.9,
        "Fraction of GPU memory for weights, activations and the KV cache.",
        0.01,
        1.0,
        hi_open=True,
    )
    num_gpu_blocks: int | None = int_field(
        None,
        "Usable KV blocks per GPU, overriding what the memory left after the weights holds "
        "(vllm-v1's null block not counted: vLLM's --num-gpu-blocks-override counts it).",
        1,
        MAX_BLOCKS,
    )
    num_gpu_blocks_override: int | None = int_field(
        None,
        "vLLM's --num-gpu-blocks-override: KV blocks per GPU in all, vLLM v1's null block "
        "included, so vllm-v1 uses N - 1 and the other policies (no null block) N. Given with "
        "num_gpu_blocks, the two must agree.",
        1,
        MAX_BLOCKS,
    )
    swap_space: float = float_field(
        4.0, "CPU swap space per GPU in GiB (vLLM's default 4).", 0.0, 1024.0
    )
    block_size: int = int_field(16, "Token slots per KV block.", 1, MAX_BLOCK_SIZE)
    watermark: float | None = float_field(
        None,
        "Fraction of GPU blocks admission keeps free; default 0.01 (vLLM v0's), 0 for the "
        "vllm-v1 policy (vLLM v1's).",
        0.0,
        1.0,
        hi_open=True,
    )
    enable_prefix_caching: bool = help_field(False, "Reuse cached full blocks of equal prefixes.")
    enable_pinned_prefixes: bool = help_field(
        False,
        "Explicit prefix sharing: pin the workload's shared prefixes (prefix_id) once, computed "
        "at t = 0; a request starting with one shares all its blocks (copy-on-write). Paged "
        "policies only; excludes enable_prefix_caching.",
    )
    eviction_policy: EvictionPolicy = help_field(
        EvictionPolicy.LRU,
        "Which free cached block prefix caching evicts first: 'lru' (least recently freed) or "
        "'lfu' (fewest uses, ties least recently freed); no effect without prefix caching.",
    )
    cost_model: CostModelKind = help_field(
        CostModelKind.ROOFLINE,
        "Iteration timing: 'unit' (1 tick each), 'roofline' (seconds) or 'profiled' (seconds "
        "from an operator profile, --profile).",
    )
    profile: str | None = help_field(
        None,
        "Operator profile JSON (`pagedkv profile`) of this model at this block size, or a "
        "built-in one's name (gpu/model, e.g. a100-80gb/opt-13b), read by cost_model "
        "'profiled'; default: the built-in of --gpu and --model, if any.",
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        get_model(self.model)
        get_gpu(self.gpu)
        object.__setattr__(self, "dtype", check_choice("dtype", self.dtype, ModelDType))
        object.__setattr__(
            self,
            "kv_cache_dtype",
            check_choice("kv_cache_dtype", self.kv_cache_dtype, KVCacheDType),
        )
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        check_fraction("gpu_memory_utilization", self.gpu_memory_utilization, lo=0.01)
        for name in ("num_gpu_blocks", "num_gpu_blocks_override"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        check_int("block_size", self.block_size, 1)
        if self.watermark is not None:
            check_fraction("watermark", self.watermark)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        check_bool("enable_pinned_prefixes", self.enable_pinned_prefixes)
        if self.enable_pinned_prefixes and self.enable_prefix_caching:
            raise ConfigError(
                "enable_pinned_prefixes",
                True,
                "excludes enable_prefix_caching: choose one sharing mechanism",
            )
        object.__setattr__(
            self, "cost_model", check_choice("cost_model", self.cost_model, CostModelKind)
        )
        self._check_profile()
        object.__setattr__(
            self,
            "eviction_policy",
            check_choice("eviction_policy", self.eviction_policy, EvictionPolicy),
        )

    def _check_profile(self) -> None:
        """A profile goes with cost_model 'profiled', and must be of this model and block size."""
        profiled = self.cost_model is CostModelKind.PROFILED
        if profiled and self.profile is None:
            builtin = builtin_for(get_gpu(self.gpu).name, get_model(self.model).name)
            if builtin is None:
                raise ConfigError(
                    "profile",
                    None,
                    "cost_model 'profiled' needs a profile file or a built-in one's name "
                    f"({self.gpu} x {self.model} has none built in)",
                )
            object.__setattr__(self, "profile", builtin)
        if not profiled and self.profile is not None:
            raise ConfigError("profile", self.profile, "is read only with cost_model 'profiled'")
        if self.profile is not None:
            if not isinstance(self.profile, str):
                raise ConfigError("profile", self.profile, "must be a path to a profile JSON")
            profile = load_profile(self.profile)
            profile.check_model(get_model(self.model))
            profile.check_block_size(self.block_size)


# Flat keys that are not the field's own name in its section.
_RENAMED = {"workload": ("workload", "kind")}
_SECTIONS: dict[str, type] = {
    "hardware": HardwareConfig,
    "scheduler": SchedulerConfig,
    "workload": WorkloadConfig,
}
_RUN_KEYS = ("reference", "trace_steps")
FLAT_ALIASES = {
    "dataset_name": "workload",
    "dataset_path": "trace_path",
    "num_prompts": "num_requests",
}
"""vllm bench serve's names of our flat keys (alias -> key): the same option, either name
(docs/vllm-flags.md); both given and different is an error, ``to_flat`` writes the key."""


def _flat_keys() -> dict[str, list[tuple[str, str]]]:
    """Flat key -> [(section, field)]; max_model_len feeds both scheduler and workload; an
    alias has its key's targets."""
    keys: dict[str, list[tuple[str, str]]] = {}
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            flat = next((k for k, v in _RENAMED.items() if v == (section, f.name)), f.name)
            keys.setdefault(flat, []).append((section, f.name))
    for alias, key in FLAT_ALIASES.items():
        keys[alias] = keys[key]
    return keys


FLAT_KEYS = _flat_keys()


def flat_help() -> dict[str, str]:
    """Help text of every flat key (the CLI's flags)."""
    out = {}
    for key, targets in FLAT_KEYS.items():
        if key in FLAT_ALIASES:
            out[key] = f"vllm bench serve's name of --{FLAT_ALIASES[key].replace('_', '-')}."
            continue
        section, name = targets[0]
        f = next(f for f in dataclasses.fields(_SECTIONS[section]) if f.name == name)
        out[key] = str(f.metadata.get("help", ""))
    out["reference"] = "Step every iteration instead of fast-forwarding decode rounds."
    out["trace_steps"] = "Record every iteration (and step one at a time)."
    return out


@dataclass(frozen=True)
class SimulationConfig:
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    reference: bool = False
    trace_steps: bool = False

    def __post_init__(self) -> None:
        if self.hardware.watermark is None:  # the policy's default
            default = SCHEDULERS[self.scheduler.scheduler].default_watermark
            hardware = dataclasses.replace(self.hardware, watermark=default)
            object.__setattr__(self, "hardware", hardware)
        if self.hardware.enable_pinned_prefixes:
            check_policy(self.scheduler.scheduler)  # contiguous memory cannot share blocks
        allocated_gpu_blocks(self.hardware, self.scheduler.scheduler)  # a conflicting pair

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> SimulationConfig:
        """Build from flat keys (CLI flags, YAML); unknown keys are one clear error."""
        if not isinstance(values, Mapping):
            raise ConfigError(
                "config", values, "must be a mapping of option names to values (flat keys)"
            )
        values = _infinite_rate(_resolve_aliases(values))
        parts: dict[str, dict[str, Any]] = {s: {} for s in _SECTIONS}
        run: dict[str, Any] = {}
        for key, value in values.items():
            if key in _RUN_KEYS:
                run[key] = check_bool(key, value)
            elif key in FLAT_KEYS:
                for section, name in FLAT_KEYS[key]:
                    parts[section][name] = value
            else:
                raise ConfigError(key, value, "is not an option; see `pagedkv simulate --help`")
        hardware = HardwareConfig(**parts["hardware"])
        if "max_model_len" not in values:  # the model's own limit, as vLLM derives it
            max_len = get_model(hardware.model).max_model_len
            parts["scheduler"]["max_model_len"] = parts["workload"]["max_model_len"] = max_len
        rate = parts["workload"].get("request_rate")
        if rate is not None and "arrival" not in values and not _infinite(rate):
            # a rate alone means Poisson arrivals, gamma ones with a burstiness (as in vLLM)
            bursty = values.get("burstiness", 1.0) != 1.0
            parts["workload"]["arrival"] = "gamma" if bursty else "poisson"
        return cls(
            hardware,
            SchedulerConfig(**parts["scheduler"]),
            WorkloadConfig(**parts["workload"]),
            **run,
        )

    @classmethod
    def from_yaml(
        cls, path: str | Path, overrides: Mapping[str, Any] | None = None
    ) -> SimulationConfig:
        """Flat keys from a YAML file (safe loader), then ``overrides`` on top."""
        data = read_yaml("config", path) or {}  # not UTF-8, bad YAML: one error naming the file
        if not isinstance(data, dict):
            raise ConfigError("config", str(path), "must be a YAML mapping of option: value")
        return cls.from_flat({**data, **(overrides or {})})

    def to_flat(self) -> dict[str, Any]:
        """Every flat key with its value (enums as their names): the JSON's ``config``."""
        out: dict[str, Any] = {}
        for key, targets in FLAT_KEYS.items():
            if key in FLAT_ALIASES:
                continue
            section, name = targets[0]
            value = getattr(getattr(self, section), name)
            out[key] = value.value if isinstance(value, enum.Enum) else value
        out["reference"] = self.reference
        out["trace_steps"] = self.trace_steps
        return out


def _infinite(rate: object) -> bool:
    """vLLM's --request-rate inf (the string too, as YAML has no bare inf)."""
    return rate == "inf" or (isinstance(rate, float) and math.isinf(rate) and rate > 0)


def _infinite_rate(values: dict[str, Any]) -> dict[str, Any]:
    """vLLM's --request-rate inf (its default) sends every request at once: ``values`` with
    it as no rate, which is arrival 'all-at-once' (set for a trace, whose default is its own
    times, as any arrival process replaces them). With another arrival it is an error."""
    rate = values.get("request_rate")
    if not _infinite(rate):
        return values
    arrival = values.get("arrival")
    name = str(getattr(arrival, "value", arrival))
    if arrival is not None and name != Arrival.ALL_AT_ONCE.value:
        raise ConfigError(
            "request_rate", rate, f"inf means all at once: arrival {name!r} needs a finite rate"
        )
    out = {k: v for k, v in values.items() if k != "request_rate"}
    kind = values.get("workload")
    if str(getattr(kind, "value", kind)) == WorkloadKind.TRACE.value:
        out["arrival"] = Arrival.ALL_AT_ONCE.value
    return out


def _resolve_aliases(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every alias (``FLAT_ALIASES``) replaced by its key."""
    out = {k: v for k, v in values.items() if k not in FLAT_ALIASES}
    for alias, key in FLAT_ALIASES.items():
        if alias not in values:
            continue
        if key in values and values[key] != values[alias]:
            raise ConfigError(
                alias, values[alias], f"is another name of {key}, given as {values[key]!r}"
            )
        out[key] = values[alias]
    return out


@dataclass
class SimulationResult:
    """A run's summary, per-request records and (with trace_steps) per-iteration records."""

    config: dict[str, Any]
    summary: dict[str, Any]
    requests: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    token_times: dict[int, list[float]] | None = None
    """With ``simulate(..., token_times=True)``: request id -> each output token's time
    (``pagedkv.report.vllm_result`` reads it); not part of ``to_dict``."""

    def to_dict(self) -> dict[str, Any]:
        out = {"config": self.config, "summary": self.summary, "requests": self.requests}
        if self.steps:
            out["steps"] = self.steps
        return out

    def requests_df(self) -> Any:
        """Per-request records as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.requests)

    def steps_df(self) -> Any:
        """Per-iteration records as a pandas DataFrame (needs pandas and trace_steps)."""
        import pandas as pd

        return pd.DataFrame(self.steps)


def allocated_gpu_blocks(hw: HardwareConfig, scheduler: str) -> int | None:
    """The GPU blocks the policy's allocator is given, its null blocks included (vllm-v1 keeps
    one, vLLM's null block; the other policies none): num_gpu_blocks + null blocks, or
    num_gpu_blocks_override (vLLM's meaning: all blocks), or None (what the memory holds).
    Both given and disagreeing, or an override with no usable block, is a ``ConfigError``."""
    null = SCHEDULERS[scheduler].null_blocks
    usable, total = hw.num_gpu_blocks, hw.num_gpu_blocks_override
    if total is not None and total <= null:
        raise ConfigError(
            "num_gpu_blocks_override",
            total,
            f"must be >= {null + 1} for {scheduler} (vLLM keeps {null} block as its null block)",
        )
    if usable is not None and total is not None and total != usable + null:
        raise ConfigError(
            "num_gpu_blocks_override",
            total,
            f"counts all blocks, {null} null block(s) of {scheduler} included: with "
            f"num_gpu_blocks {usable} it must be {usable + null} (or give only one of them)",
        )
    if usable is not None:
        return usable + null
    return total


def engine_parts(config: SimulationConfig) -> tuple[CacheConfig, CostModel]:
    """The memory and the clock ``build_engine`` gives the policy, with every check it makes
    before the workload: the pools' footprint (``pagedkv.footprint``), the policy's memory
    (``check_memory``: a contiguous space must hold max_model_len), the cost model. Cheap:
    nothing is allocated, so a sweep runs it on every point first (``check_buildable``)."""
    hw, sched = config.hardware, config.scheduler
    model = serving_model(get_model(hw.model), hw.dtype, hw.kv_cache_dtype)
    gpu = get_gpu(hw.gpu)
    tp = hw.tensor_parallel_size
    given = allocated_gpu_blocks(hw, sched.scheduler)
    if given is not None:
        num_blocks = given
    else:
        num_blocks = kv_capacity(
            gpu,
            model,
            tensor_parallel_size=tp,
            gpu_memory_utilization=hw.gpu_memory_utilization,
            block_size=hw.block_size,
        ).num_gpu_blocks
    cpu_blocks = swap_space_blocks(
        int(hw.swap_space * GiB), model, tensor_parallel_size=tp, block_size=hw.block_size
    )
    requests = config.workload.planned_requests or 0
    field = "num_gpu_blocks" if num_blocks >= cpu_blocks else "swap_space"
    if field == "num_gpu_blocks" and hw.num_gpu_blocks is None and given is not None:
        field = "num_gpu_blocks_override"
    check_memory(
        field,
        getattr(hw, field),
        f"{num_blocks} GPU + {cpu_blocks} CPU blocks x {BYTES_PER_BLOCK} B and {requests} "
        f"requests x {BYTES_PER_REQUEST} B",
        run_bytes(num_blocks + cpu_blocks, requests),
    )
    cache = CacheConfig(
        num_gpu_blocks=num_blocks,
        block_size=hw.block_size,
        num_cpu_blocks=cpu_blocks,
        watermark=(
            hw.watermark
            if hw.watermark is not None
            else SCHEDULERS[sched.scheduler].default_watermark
        ),
        enable_prefix_caching=hw.enable_prefix_caching,
        enable_pinned_prefixes=hw.enable_pinned_prefixes,
        eviction_policy=hw.eviction_policy,
    )
    SCHEDULERS[sched.scheduler].check_memory(cache, sched)
    cost: CostModel
    if hw.cost_model is CostModelKind.UNIT:
        cost = UnitCost()
    elif hw.cost_model is CostModelKind.PROFILED:
        assert hw.profile is not None  # HardwareConfig checks it
        cost = ProfiledCost(load_profile(hw.profile), model, hw.block_size, tp, gpu)
    else:
        cost = RooflineCost(gpu, model, tp, RooflineConfig(block_size=hw.block_size))
    return cache, cost


def check_buildable(config: SimulationConfig, checked: set[WorkloadConfig] | None = None) -> None:
    """Raise the ``ConfigError`` that ``build_engine(config)`` would raise, with its own code:
    ``engine_parts``, then the workload made once per distinct workload config (``checked``
    remembers them: a trace read, token ids within their cap), and with pinned prefixes the
    engine built (the prefixes must fit in the pool)."""
    engine_parts(config)
    if config.hardware.enable_pinned_prefixes:
        build_engine(config)
    elif checked is None or config.workload not in checked:
        make_workload(config.workload)
    if checked is not None:
        checked.add(config.workload)


def build_engine(
    config: SimulationConfig, *, check_integrity: bool = False, token_times: bool = False
) -> Engine:
    with _collector_paused():
        return _build_engine(config, check_integrity, token_times)


def _build_engine(config: SimulationConfig, check_integrity: bool, token_times: bool) -> Engine:
    hw, sched = config.hardware, config.scheduler
    cache, cost = engine_parts(config)
    policy = SCHEDULERS[sched.scheduler]
    kv = policy.make_allocator(cache, sched)
    specs = make_workload(config.workload)
    executor = SimExecutor(cost)
    windowed = False
    if isinstance(cost, RooflineCost) and needs_window_pricing(cost.model, sched.max_model_len):
        window = cost.model.sliding_window  # steps priced with the window: not linear,
        assert window is not None
        executor = WindowedExecutor(cost, window)  # so no fast-forward
        windowed = True
    cap = config.workload.max_concurrency
    engine = Engine(
        policy(sched, kv),
        executor,
        specs if hw.enable_pinned_prefixes else _drained(specs),  # the prefixes read them after
        check_integrity=check_integrity,
        reference=config.reference or windowed or cap is not None,  # the cap: step by step
        trace_steps=config.trace_steps,
        token_times=token_times,
        max_concurrency=cap,
    )
    if hw.enable_pinned_prefixes:  # explicit sharing: pin the prefixes, prefill them at t = 0
        check_policy(sched.scheduler, kv)
        assert isinstance(kv, KVCacheManager)
        register_workload_prefixes(kv, specs)
        account_prefill(engine, pinned_setup(kv, cost))
    return engine


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a run's 10^5-10^6 objects are made: each full
    collection would walk every one made so far (half the time of building a large workload),
    and they form no cycle worth collecting; reference counting still frees them. The
    collector's state is restored after, even on an error (as ``Engine.run`` does)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _drained(specs: list[RequestSpec]) -> Iterator[RequestSpec]:
    """``specs`` in order, each let go as it is handed over: the engine turns each into its
    ``Request`` and the spec is freed then, so a large workload is never held twice."""
    specs.reverse()
    while specs:
        yield specs.pop()


def prefix_cache_summary(kv: KVAllocator) -> dict[str, float]:
    """Prefix caching's counters, in tokens: query_tokens (prompt tokens looked up at
    admission), hit_tokens (of those, found cached), hit_rate = hit / query (0 without a
    query), evictions (cached blocks reused for other data). Zero for contiguous memory."""
    stats = kv.stats if isinstance(kv, KVCacheManager) else None
    if stats is None:
        return {"query_tokens": 0, "hit_tokens": 0, "hit_rate": 0.0, "evictions": 0}
    return {
        "query_tokens": stats.prefix_query_tokens,
        "hit_tokens": stats.prefix_hit_tokens,
        "hit_rate": stats.prefix_hit_rate,
        "evictions": stats.evictions,
    }


def sharing_summary(
    saved_integral: float, busy: float, summary: Mapping[str, Any], block_size: int
) -> dict[str, float]:
    """What block sharing (forks, parallel samples, prefix hits) saves, time-averaged over
    busy time: saved_blocks = mean of (block references - blocks in use); saved_fraction =
    saved / (saved + allocated), the vLLM paper's "memory saving" (blocks saved by sharing /
    blocks needed without it)."""
    saved = saved_integral / busy if busy else 0.0
    capacity = summary["num_gpu_blocks"] * block_size
    allocated = summary["memory"]["pool_occupancy"] * capacity / block_size  # mean blocks
    need = saved + allocated
    return {"saved_blocks": saved, "saved_fraction": saved / need if need else 0.0}


def simulate(
    config: SimulationConfig,
    *,
    check_integrity: bool = False,
    progress: Callable[[int, int], None] | None = None,
    token_times: bool = False,
) -> SimulationResult:
    """Run one simulation. ``progress(done, total)`` is called as requests end.
    ``token_times``: also record when each output token is sampled (``result.token_times``,
    for inter-token latencies; it costs work per token, see docs/vllm-results.md)."""
    with _collector_paused():
        return _simulate(config, check_integrity, progress, token_times)


def _simulate(
    config: SimulationConfig,
    check_integrity: bool,
    progress: Callable[[int, int], None] | None,
    token_times: bool,
) -> SimulationResult:
    engine = build_engine(config, check_integrity=check_integrity, token_times=token_times)
    engine.progress = progress
    run = engine.run()
    summary = summarize(run.requests, run.totals, run.sim_time, engine.scheduler.kv.capacity)
    summary["deadlocked"] = run.deadlocked
    summary["stuck_requests"] = run.stuck
    summary["num_gpu_blocks"] = engine.scheduler.kv.capacity // config.hardware.block_size
    summary["prefix_cache"] = prefix_cache_summary(engine.scheduler.kv)
    summary["sharing"] = sharing_summary(
        run.totals.weighted_saved_blocks, run.totals.busy_time, summary, config.hardware.block_size
    )
    if config.hardware.enable_pinned_prefixes:
        summary["pinned"] = pinned_summary(engine)
    return SimulationResult(
        config=config.to_flat(),
        summary=summary,
        steps=[dataclasses.asdict(s) for s in run.steps],
        token_times=engine.token_times,
        requests=_records(run.requests),  # last: it empties the run's list
    )


def _records(requests: list[Request]) -> list[dict[str, Any]]:
    """Each request's record, in order, each ``Request`` let go (taken out of ``requests``,
    which ends empty) as its record is made: a finished run holds its requests or their
    records, never both whole."""
    requests.reverse()
    out = []
    while requests:
        out.append(request_record(requests.pop()))
    return out
