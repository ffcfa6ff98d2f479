"""The block map: who owns each physical KV block at every iteration, paged beside contiguous.

A small run is simulated once per scheduler at equal memory, stepping every iteration (no
fast-forward), and the memory is photographed at each iteration: the executor is wrapped by one
that reads the allocator before delegating (``execute`` is called once per iteration, after the
scheduler has taken the room the batch needs). Nothing in the engine changes.

Rows are physical blocks; for a contiguous allocator, rows of ``block_size`` slots of its linear
address space, so both sides have the same rows. A row shows its highest state::

    tokens (the owner's colour) > reserved, to be filled (pale) > never filled (dark grey)
    > free while a request waits (light grey: external fragmentation) > free, idle (white)

The run is deterministic (the lesson's fixed lengths; a seeded ShareGPT-like load): one run per
variant, so the summary's intervals are empty (``n = 1``).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pagedkv.engine.engine import Engine
from pagedkv.engine.executor import Executor, StepResult
from pagedkv.engine.metrics import summarize
from pagedkv.engine.scheduler import SchedulerOutput
from pagedkv.io import atomic_write_bytes, atomic_write_json, atomic_write_text, output_set
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.manager import KVCacheManager

FREE, WAITING_FREE, INTERNAL, RESERVED, TOKENS = range(5)
"""Cell states, in the priority order a row shows (a row of contiguous slots can mix them)."""
SCHEDULERS = ("vllm", "orca-max", "orca-pow2", "orca-oracle")
MAX_COLUMNS = 600
"""Wider runs are drawn every k-th iteration: a figure has only so many pixels."""
METRICS = (
    "iterations",
    "max_running",
    "mean_running",
    "token_utilization",
    "pool_occupancy",
    "reservation",
    "internal_fragmentation",
    "external_fragmentation",
)

IntGrid = npt.NDArray[np.int64]


@dataclass(frozen=True)
class MapRun:
    """One workload's setting: flat ``SimulationConfig`` keys shared by every scheduler."""

    name: str
    label: str
    flat: dict[str, Any]


def runs(quick: bool) -> list[MapRun]:
    """The lesson (20 requests at t = 0, 100 blocks of 16: most wait at first); and, unless
    quick, 40 ShareGPT-like requests on OPT-13B / A100-40GB squeezed into 128 blocks."""
    lesson = MapRun(
        "lesson",
        "the course lesson's 20 requests, 100 blocks of 16 slots, unit clock",
        {"workload": "lesson", "cost_model": "unit", "num_gpu_blocks": 100, "max_model_len": 256},
    )
    sharegpt = MapRun(
        "sharegpt-like",
        "40 ShareGPT-like requests at 2/s (seed 0), OPT-13B on A100-40GB, 128 blocks of 16",
        {
            "workload": "sharegpt-like",
            "num_requests": 40,
            "request_rate": 2.0,
            "seed": 0,
            "num_gpu_blocks": 128,
            "max_model_len": 1024,
        },
    )
    return [lesson] if quick else [lesson, sharegpt]


@dataclass
class Recorder:
    """An executor that photographs the KV memory, then lets the real one run the batch."""

    inner: Executor
    engine: Engine
    owners: list[IntGrid] = field(default_factory=list)
    states: list[IntGrid] = field(default_factory=list)

    def execute(self, batch: SchedulerOutput) -> StepResult:
        sched = self.engine.scheduler
        owner, state = snapshot(sched.kv, sched.has_queued())
        self.owners.append(owner)
        self.states.append(state)
        return self.inner.execute(batch)


def snapshot(kv: object, waiting: bool) -> tuple[IntGrid, IntGrid]:
    """(owner, state) per physical block row; owner -1 where free."""
    if isinstance(kv, KVCacheManager):
        owner = np.full(kv.config.num_gpu_blocks, -1, dtype=np.int64)
        state = np.full(kv.config.num_gpu_blocks, WAITING_FREE if waiting else FREE, np.int64)
        for seq in kv.seq_ids():
            blocks = kv.block_ids(seq)  # a paged block is taken only for a token it holds
            owner[blocks] = int(seq)  # type: ignore[call-overload]
            state[blocks] = TOKENS
        return owner, state
    if not isinstance(kv, ContiguousAllocator):
        raise TypeError(f"no block map for {type(kv).__name__}")
    bs = kv.config.block_size
    slot_owner = np.full(kv.capacity, -1, dtype=np.int64)
    slot_state = np.full(kv.capacity, WAITING_FREE if waiting else FREE, dtype=np.int64)
    for seq in kv.seq_ids():
        start, held = kv.region(seq)
        tokens, reserved, _ = kv.region_books(seq)
        slot_owner[start : start + held] = int(seq)  # type: ignore[call-overload]
        slot_state[start : start + held] = INTERNAL
        slot_state[start + tokens : start + tokens + reserved] = RESERVED
        slot_state[start : start + tokens] = TOKENS
    rows = -(-kv.capacity // bs)
    pad = rows * bs - kv.capacity  # a capacity that is not whole blocks: pad the last row
    row_state = np.pad(slot_state, (0, pad), constant_values=FREE).reshape(rows, bs)
    row_owner = np.pad(slot_owner, (0, pad), constant_values=-1).reshape(rows, bs)
    top = row_state.argmax(axis=1)  # the first slot of the row's highest state
    picked = np.arange(rows)
    return row_owner[picked, top], row_state[picked, top]


def simulate_map(run: MapRun, scheduler: str) -> tuple[IntGrid, IntGrid, dict[str, Any]]:
    """(owners, states) as [blocks, iterations] grids, and the run's summary row."""
    from pagedkv.simulation import SimulationConfig, build_engine

    config = SimulationConfig.from_flat({**run.flat, "scheduler": scheduler, "reference": True})
    engine = build_engine(config, check_integrity=True)
    recorder = Recorder(engine.executor, engine)
    engine.executor = recorder
    done = engine.run()
    kv = engine.scheduler.kv
    summary = summarize(done.requests, done.totals, done.sim_time, kv.capacity)
    memory = summary["memory"]
    row: dict[str, Any] = {
        "workload": run.name,
        "scheduler": scheduler,
        "memory": "paged" if isinstance(kv, KVCacheManager) else "contiguous",
        "finished": summary["finished"],
        "deadlocked": done.deadlocked,
        **{k: summary[k] for k in ("iterations", "max_running", "mean_running")},
        **{k: memory[k] for k in METRICS[3:]},
    }
    return np.stack(recorder.owners, axis=1), np.stack(recorder.states, axis=1), row


def _palette(owner: IntGrid) -> npt.NDArray[np.float64]:
    """One colour per request: tab20 with its light/dark pairs split, so neighbours differ."""
    from matplotlib import colormaps

    tab = colormaps["tab20"]
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    colours = np.array([tab(i)[:3] for i in order], dtype=np.float64)
    picked: npt.NDArray[np.float64] = colours[np.maximum(owner, 0) % len(colours)]
    return picked


def to_rgb(owner: IntGrid, state: IntGrid) -> npt.NDArray[np.float64]:
    """The picture of (owner, state) grids: an RGB array of the same shape plus 3."""
    rgb = _palette(owner)
    pale = rgb + (1.0 - rgb) * 0.6  # reserved: the owner's colour, faded toward white
    rgb = np.where((state == RESERVED)[..., None], pale, rgb)
    for code, grey in ((FREE, 1.0), (WAITING_FREE, 0.82), (INTERNAL, 0.3)):
        rgb[state == code] = grey
    return rgb


def draw(
    path: Path, run: MapRun, panels: list[tuple[dict[str, Any], IntGrid, IntGrid]], dpi: int
) -> None:
    """One PNG: the run's schedulers side by side, blocks down, iterations across."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    # At most three panels a row, all on one iteration axis: the run that finishes first
    # visibly does (its panel ends at a dashed line, the axis runs to the longest run).
    rows_ = -(-len(panels) // 3)
    cols = -(-len(panels) // rows_)
    fig, axes = plt.subplots(
        rows_,
        cols,
        figsize=(3.6 * cols, 4.0 * rows_ + 0.6),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    longest = max(owner.shape[1] for _, owner, _ in panels)
    flat_axes = [ax for line in axes for ax in line]
    for ax, (row, owner, state) in zip(flat_axes, panels, strict=False):
        iters = owner.shape[1]
        step = -(-iters // MAX_COLUMNS)
        ax.imshow(
            to_rgb(owner[:, ::step], state[:, ::step]),
            aspect="auto",
            interpolation="nearest",
            extent=(0.5, iters + 0.5, owner.shape[0] - 0.5, -0.5),
        )
        ax.set_xlim(0.5, longest + 0.5)
        ax.axvline(iters + 0.5, linestyle="--", linewidth=0.8, color="0.35")
        ax.set_title(
            f"{row['scheduler']} ({row['memory']}): done at {iters}\n"
            f"max {row['max_running']} running, token util. {row['token_utilization']:.0%}",
            fontsize=9,
        )
        ax.set_xlabel("iteration" + (f" (1 in {step} drawn)" if step > 1 else ""))
        ax.tick_params(labelbottom=True)
    for ax in flat_axes[len(panels) :]:
        ax.set_visible(False)
    for line in axes:
        line[0].set_ylabel(f"physical block ({run.flat.get('block_size', 16)} slots each)")
    legend = [
        Patch(facecolor="tab:blue", label="tokens (colour: owning request)"),
        Patch(facecolor=(0.68, 0.78, 0.88), label="reserved, filled later"),
        Patch(facecolor="0.3", label="held, never filled (internal frag.)"),
        Patch(facecolor="0.82", edgecolor="0.6", label="free while requests wait (external)"),
        Patch(facecolor="white", edgecolor="0.6", label="free, nothing waits"),
    ]
    fig.legend(handles=legend, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"Block map: {run.label}", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _findings(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        paged = next(r for r in mine if r["memory"] == "paged")
        worst = min((r for r in mine if r["memory"] == "contiguous"), key=_util)
        out.append(
            f"On {name}, paged memory ({paged['scheduler']}) held up to {paged['max_running']} "
            f"requests at once and filled {_util(paged):.1%} of the slots it allocated with "
            f"tokens; {worst['scheduler']} held up to {worst['max_running']} and filled "
            f"{_util(worst):.1%}, the rest reserved or never used."
        )
    return out


def _util(row: dict[str, Any]) -> float:
    return float(row["token_utilization"])


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The schema's summary: one deterministic run per configuration, so no interval."""
    out = []
    for r in rows:
        s: dict[str, Any] = {"workload": r["workload"], "scheduler": r["scheduler"], "n": 1}
        for m in METRICS:
            s |= {f"{m}_mean": r[m], f"{m}_ci_low": None, f"{m}_ci_high": None}
        out.append(s)
    return out


def _csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


@output_set()  # the drawings and the results appear together, or none
def run_block_map(out_dir: Path, *, quick: bool = False) -> Path:
    """Simulate, draw ``block-map-<workload>.png`` and write results.json / .csv in ``out_dir``."""
    out_dir = Path(out_dir)
    rows: list[dict[str, Any]] = []
    plots = []
    for run in runs(quick):
        panels = []
        for scheduler in SCHEDULERS:
            owner, state, row = simulate_map(run, scheduler)
            rows.append(row)
            panels.append((row, owner, state))
        name = f"block-map-{run.name}.png"
        draw(out_dir / name, run, panels, dpi=80 if quick else 110)
        plots.append(
            {
                "file": name,
                "caption": f"Physical KV blocks (rows) over iterations (columns), {run.label}: "
                "paged (vllm) beside the Orca baselines' buddy-allocated regions at equal memory.",
            }
        )
    columns = list(rows[0])
    summary = _summary(rows)
    results = {
        "experiment": "block-map",
        "title": "Block map",
        "question": "Where does KV memory go, block by block, as a run proceeds: how much of "
        "what paged and contiguous allocators hold is tokens, reservation or waste?",
        "setup": {
            "runs": {r.name: r.label for r in runs(quick)},
            "schedulers": list(SCHEDULERS),
            "equal_memory": True,
            "seeds": [0],
            "quick": quick,
            "drawn": "one column per iteration, at most "
            f"{MAX_COLUMNS} (wider runs every k-th iteration)",
        },
        "columns": columns,
        "rows": rows,
        "summary_columns": list(summary[0]),
        "summary": summary,
        "plots": plots,
        "findings": _findings(rows),
    }
    atomic_write_text(out_dir / "results.csv", _csv(columns, rows))
    atomic_write_json(out_dir / "results.json", results)
    return out_dir
