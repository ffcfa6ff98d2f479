"""``run_points`` on the local backend: serial and on a process pool, errors as data, order."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pagedkv.errors import ConfigError
from pagedkv.sweep.pool import Outcome, check_backend, run_points


def square(x: int) -> int:
    return x * x


def fail_on_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd point {x}")
    return x


def wait_for_marker(point: tuple[int, str]) -> int:
    """Point 0 blocks until point 1 has written its marker, so point 1 completes first."""
    index, marker = point
    if index == 1:
        Path(marker).write_text("done", encoding="utf-8")
        return index
    deadline = time.monotonic() + 10
    while not Path(marker).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # let point 1's result reach the parent first
    return index


def slow_unless_zero(point: tuple[int, str]) -> int:
    """Point 0 returns at once; the others note their pid, then run for a minute."""
    index, folder = point
    if index:
        part = Path(folder) / f"{index}.part"  # renamed whole: a reader never sees it empty
        part.write_text(str(os.getpid()), encoding="utf-8")
        os.replace(part, part.with_suffix(".pid"))
        time.sleep(60)
    return index


def pid_of(_: int) -> int:
    return os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_every_point_once_with_its_index(workers: int) -> None:
    outcomes = list(run_points(square, list(range(9)), workers=workers))
    assert sorted(o.index for o in outcomes) == list(range(9))
    assert all(o.value == o.index**2 and o.error is None for o in outcomes)


@pytest.mark.parametrize("workers", [1, 2])
def test_errors_are_captured_and_the_rest_goes_on(workers: int) -> None:
    outcomes = {o.index: o for o in run_points(fail_on_odd, list(range(6)), workers=workers)}
    assert len(outcomes) == 6
    assert outcomes[3] == Outcome(3, None, "ValueError: odd point 3")
    assert not outcomes[3].ok
    assert outcomes[4] == Outcome(4, 4, None)


def test_serial_runs_in_process_in_point_order() -> None:
    outcomes = list(run_points(pid_of, [0, 1, 2], workers=1))
    assert [o.index for o in outcomes] == [0, 1, 2]
    assert {o.value for o in outcomes} == {os.getpid()}


def test_pool_runs_in_other_processes() -> None:
    outcomes = list(run_points(pid_of, [0, 1, 2, 3], workers=2))
    assert os.getpid() not in {o.value for o in outcomes}


def test_yields_in_completion_order(tmp_path: Path) -> None:
    marker = str(tmp_path / "marker")
    outcomes = list(run_points(wait_for_marker, [(0, marker), (1, marker)], workers=2))
    assert [o.index for o in outcomes] == [1, 0]
    assert [o.value for o in outcomes] == [1, 0]


def test_early_close_stops_the_rest() -> None:
    it = run_points(square, list(range(100)), workers=2)
    first = next(it)
    it.close()  # shuts the pool down without running all 100 points
    assert first.error is None


def test_early_close_stops_running_points(tmp_path: Path) -> None:
    points = [(i, str(tmp_path)) for i in range(3)]
    it = run_points(slow_unless_zero, points, workers=2)
    assert next(it).index == 0
    deadline = time.monotonic() + 50  # a loaded machine starts workers slowly
    while not list(tmp_path.glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.01)
    it.close()  # must not wait out the minute-long points: their workers are stopped
    pids = [int(p.read_text(encoding="utf-8")) for p in tmp_path.glob("*.pid")]
    assert pids
    gone = time.monotonic() + 10  # well before the points' minute is up
    for pid in pids:
        while _alive(pid) and time.monotonic() < gone:
            time.sleep(0.01)
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"backend": "spark"}, "backend"), ({"workers": 0}, "workers")],
)
def test_bad_arguments_fail_at_the_call(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        run_points(square, [1], **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize("workers", [0, -5, 10**9, True, 2.0])
def test_a_worker_count_out_of_bounds_is_refused(workers: object) -> None:
    with pytest.raises(ConfigError) as err:
        check_backend("local", workers)  # type: ignore[arg-type]
    assert err.value.field == "workers"
