"""The block map: its snapshots agree with the allocators' books, and its results follow the
schema the report reads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.memory.config import CacheConfig, ContiguousConfig, Placement, Reservation
from pagedkv.memory.contiguous import ContiguousAllocator
from pagedkv.memory.manager import KVCacheManager
from pagedkv.report.block_map import (
    FREE,
    INTERNAL,
    RESERVED,
    TOKENS,
    WAITING_FREE,
    MapRun,
    draw,
    run_block_map,
    runs,
    simulate_map,
    snapshot,
    to_rgb,
)
from pagedkv.report.html import build_report
from tests.report.fixtures import decode_png, parse, png_size

HELD = (TOKENS, RESERVED, INTERNAL)


def test_a_contiguous_region_shows_tokens_then_reservation_then_waste() -> None:
    # 64 slots in rows of 16; a buddy region for a final length of 40 is rounded to 64.
    kv = ContiguousAllocator(
        ContiguousConfig(
            capacity=64,
            max_model_len=64,
            placement=Placement.BUDDY,
            reservation=Reservation.ORACLE,
            block_size=16,
        )
    )
    kv.allocate(7, 10, final_len=40)
    owner, state = snapshot(kv, waiting=False)
    # slots [0, 10) tokens, [10, 40) reserved, [40, 64) never filled
    assert state.tolist() == [TOKENS, RESERVED, RESERVED, INTERNAL]
    assert owner.tolist() == [7, 7, 7, 7]
    kv.free(7)
    owner, state = snapshot(kv, waiting=True)
    assert state.tolist() == [WAITING_FREE] * 4
    assert owner.tolist() == [-1] * 4


ops = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40), st.integers(0, 30)), max_size=30)


@settings(max_examples=40, deadline=None)
@given(ops=ops, waiting=st.booleans())
def test_snapshots_agree_with_the_books(ops: list[tuple[int, int, int]], waiting: bool) -> None:
    """Random admissions, growth and frees: paged rows are exactly the used blocks; contiguous
    rows cover every token and every held row names a live owner."""
    paged = KVCacheManager(CacheConfig(num_gpu_blocks=24, block_size=8))
    contiguous = ContiguousAllocator(
        ContiguousConfig(
            capacity=192,
            max_model_len=64,
            placement=Placement.FIRST_FIT,
            reservation=Reservation.ORACLE,
            block_size=8,
        )
    )
    for seq, tokens, extra in ops:
        for kv in (paged, contiguous):
            if kv.has_seq(seq):
                if extra % 3 == 0:
                    kv.free(seq)
                else:
                    kv.append_slots(seq, 1)
            elif kv.can_allocate(seq, tokens, final_len=tokens + extra).name == "OK":
                kv.allocate(seq, tokens, final_len=tokens + extra)
    owner, state = snapshot(paged, waiting)
    assert (state == TOKENS).sum() == 24 - paged.num_free_blocks
    assert set(owner[owner >= 0].tolist()) == set(paged.seq_ids())
    assert ((owner >= 0) == np.isin(state, HELD)).all()
    owner, state = snapshot(contiguous, waiting)
    tokens = contiguous.usage().token_states
    assert -(-tokens // 8) <= (state == TOKENS).sum() <= tokens
    assert ((owner >= 0) == np.isin(state, HELD)).all()
    # Every held row names a live owner; regions smaller than a row may share one, which then
    # shows one of them, so not every owner need appear.
    assert set(owner[owner >= 0].tolist()) <= set(contiguous.seq_ids())
    assert not (state == (FREE if waiting else WAITING_FREE)).any()  # free rows say if any wait


def test_one_column_per_iteration_and_paged_fills_what_it_holds() -> None:
    lesson = runs(quick=True)[0]
    owner, state, row = simulate_map(lesson, "vllm")
    assert owner.shape == state.shape == (100, row["iterations"])
    assert row["finished"] == 20
    assert not row["deadlocked"]
    # every request owns blocks at some point; at the first iteration requests already wait
    assert set(owner[owner >= 0].tolist()) == set(range(20))
    _, c_state, c_row = simulate_map(lesson, "orca-max")
    assert c_state.shape[1] == c_row["iterations"]
    assert (c_state == INTERNAL).any()
    assert not (state == INTERNAL).any()


def test_to_rgb_colours_states() -> None:
    owner = np.array([[-1, -1, 3, 3, 3]])
    state = np.array([[FREE, WAITING_FREE, TOKENS, RESERVED, INTERNAL]])
    rgb = to_rgb(owner, state)
    assert rgb.shape == (1, 5, 3)
    assert rgb[0, 0].tolist() == [1.0, 1.0, 1.0]
    assert len(set(rgb[0, 1].tolist())) == 1
    assert rgb[0, 1, 0] < 1.0
    assert (rgb[0, 3] > rgb[0, 2]).all()  # reserved: the owner's colour, paler


def test_quick_block_map_writes_the_schema_and_reports(tmp_path: Path) -> None:
    out = run_block_map(tmp_path / "block-map", quick=True)
    data = json.loads((out / "results.json").read_text())
    for key in (
        "experiment",
        "title",
        "question",
        "setup",
        "columns",
        "rows",
        "summary_columns",
        "summary",
        "plots",
        "findings",
    ):
        assert key in data
    assert data["experiment"] == "block-map"
    assert data["setup"]["quick"] is True
    assert {r["scheduler"] for r in data["rows"]} == {
        "vllm",
        "orca-max",
        "orca-pow2",
        "orca-oracle",
    }
    assert (out / "results.csv").read_text().splitlines()[0].split(",") == data["columns"]
    paged = next(r for r in data["rows"] if r["memory"] == "paged")
    # at equal memory paging uses its slots at least as well as every contiguous variant
    assert all(paged["token_utilization"] >= r["token_utilization"] for r in data["rows"])
    assert all(paged["max_running"] >= r["max_running"] for r in data["rows"])
    for plot in data["plots"]:
        png = (out / plot["file"]).read_bytes()
        assert decode_png(png) == png_size(png)
    page = parse(build_report(tmp_path).read_text(encoding="utf-8"))
    assert len(page.images) == len(data["plots"])
    assert "exp-block-map" in page.ids
    first = (out / "results.json").read_bytes()
    run_block_map(out, quick=True)
    assert (out / "results.json").read_bytes() == first  # deterministic


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_panels_share_one_iteration_axis_at_most_three_a_row(
    n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run that finishes first visibly does: every panel's axis runs to the longest run."""
    from matplotlib import pyplot as plt

    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    lengths = [10 * (i + 1) for i in range(n)]
    row = {"scheduler": "s", "memory": "paged", "max_running": 1, "token_utilization": 0.5}
    panels = [
        (row, np.zeros((8, k), dtype=np.int64), np.full((8, k), FREE, dtype=np.int64))
        for k in lengths
    ]
    draw(tmp_path / "map.png", MapRun("r", "a run", {"block_size": 16}), panels, dpi=40)
    (fig,) = figures
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == n
    assert {ax.get_xlim() for ax in shown} == {(0.5, max(lengths) + 0.5)}
    per_row = Counter(round(ax.get_position().y0, 3) for ax in shown)
    assert max(per_row.values()) <= 3
    plt.close(fig)
