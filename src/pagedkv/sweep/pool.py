"""Run one function over many points, on local processes or on Ray, yielding as points finish.

``run_points(fn, points)`` is the one path every fan-out in pagedkv takes (sweeps, the capacity
planner, experiments): the backend only decides where ``fn(point)`` runs. A point that raises is
not a failed run: its ``Outcome`` carries ``"ExcType: message"`` and the other points go on.
Outcomes come in completion order; ``Outcome.index`` says which point each one is.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import sys
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pagedkv.errors import ConfigError

P = TypeVar("P")
R = TypeVar("R")

BACKENDS = ("local", "ray")
IN_FLIGHT_PER_WORKER = 4
"""Points queued per worker: keeps every worker busy between results, yet a Ctrl-C has little
to cancel and a huge sweep never pickles all its points at once."""


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """The result of one point: ``value`` when ``fn`` returned, ``error`` when it raised."""

    index: int
    value: R | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def describe_error(exc: BaseException) -> str:
    """``"ExcType: message"``, the form an ``Outcome.error`` takes."""
    return f"{type(exc).__name__}: {exc}"


def _call(fn: Callable[[Any], Any], point: Any) -> tuple[Any, str | None]:
    """Run one point where the worker lives; an exception becomes data, so the pool survives it
    and the message (not a possibly unpicklable exception object) travels back."""
    try:
        return fn(point), None
    except Exception as exc:  # a point's failure is a result; KeyboardInterrupt still stops all
        return None, describe_error(exc)


MAX_WORKERS = 4096
"""Processes or Ray tasks in flight: each local worker is a process of its own."""


def check_backend(backend: str, workers: int | None) -> None:
    """Bad backend or worker count: one ``ConfigError`` before any point runs."""
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, "must be one of " + ", ".join(map(repr, BACKENDS)))
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS
    ):
        raise ConfigError(
            "workers", workers, f"must be an integer in [1, {MAX_WORKERS}] (or unset: all cores)"
        )


def run_points(
    fn: Callable[[P], R],
    points: Sequence[P],
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: str | None = None,
) -> Generator[Outcome[R], None, None]:
    """Yield an ``Outcome`` per point of ``points``, in completion order.

    ``backend="local"``: a ``ProcessPoolExecutor`` of ``workers`` processes (default: every
    core); ``workers=1`` runs in this process, serially, in point order, without a pool.
    ``backend="ray"``: Ray tasks; ``address`` goes to ``ray.init`` (``"auto"``,
    ``"ray://host:10001"``; default: a local instance, or the one already initialized), and
    ``workers`` bounds the tasks in flight. ``fn`` must be a picklable module-level function.
    ``progress``: a label for a progress bar with ETA on stderr (drawn only on a terminal).
    Closing the iterator early (or Ctrl-C, or an exception in the caller's loop) stops the
    rest at once: points not started are dropped, running pool workers are terminated and
    running Ray tasks cancelled; outcomes already yielded are the caller's to keep.
    """
    check_backend(backend, workers)  # here, not in the generator: bad input fails at the call
    return _outcomes(fn, list(points), backend, workers, address, progress)


def _outcomes(
    fn: Callable[[P], R],
    points: list[P],
    backend: str,
    workers: int | None,
    address: str | None,
    progress: str | None,
) -> Generator[Outcome[R], None, None]:
    bar = _Progress(progress, len(points))
    try:
        if backend == "ray":
            source = _run_ray(fn, points, workers, address)
        elif workers == 1 or len(points) <= 1:
            source = _run_serial(fn, points)
        else:
            source = _run_processes(fn, points, workers or os.cpu_count() or 1)
        try:
            for outcome in source:
                bar.advance()
                yield outcome
        finally:
            source.close()  # now, not at garbage collection: stops the pool or the Ray tasks
    finally:
        bar.close()


def _run_serial(fn: Callable[[P], R], points: list[P]) -> Generator[Outcome[R], None, None]:
    for index, point in enumerate(points):
        value, error = _call(fn, point)
        yield Outcome(index, value, error)


def _run_processes(
    fn: Callable[[P], R], points: list[P], workers: int
) -> Generator[Outcome[R], None, None]:
    workers = min(workers, len(points))
    pool = cf.ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)
    pending: dict[cf.Future[tuple[Any, str | None]], int] = {}
    todo = iter(enumerate(points))
    limit = workers * IN_FLIGHT_PER_WORKER
    finished = False
    try:
        while True:
            for index, point in todo:
                pending[pool.submit(_call, fn, point)] = index
                if len(pending) >= limit:
                    break
            if not pending:
                finished = True
                return
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                index = pending.pop(future)
                try:
                    value, error = future.result()
                except Exception as exc:  # the worker died (BrokenProcessPool) or fn unpicklable
                    value, error = None, describe_error(exc)
                yield Outcome(index, value, error)
    finally:
        if not finished:
            # Early close or Ctrl-C: stop now. Points already yielded are the caller's; the ones
            # running would only be thrown away (a long point could hold Ctrl-C for minutes).
            _terminate_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def _ignore_sigint() -> None:
    """Pool workers ignore SIGINT: Ctrl-C reaches the whole process group, and the parent alone
    decides what it means (stop the sweep, keep what finished), instead of every worker turning
    the signal into a failed point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _terminate_workers(pool: cf.ProcessPoolExecutor) -> None:
    # ProcessPoolExecutor has no public way to stop running calls before Python 3.14
    # (terminate_workers); its process table has been ``_processes`` since Python 3.2.
    processes: dict[int, Any] = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        if process.is_alive():
            process.terminate()


def _run_ray(
    fn: Callable[[P], R], points: list[P], workers: int | None, address: str | None
) -> Generator[Outcome[R], None, None]:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "backend", "ray", "needs Ray installed: pip install 'pagedkv[ray]'"
        ) from exc
    if not ray.is_initialized():
        # A local instance sized by workers; on a cluster (address given) Ray knows its CPUs.
        local = address is None
        ray.init(
            address=address,
            num_cpus=workers if local else None,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )
    remote = ray.remote(num_cpus=1)(_call)
    fn_ref = ray.put(fn)  # shipped once, not once per task
    cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
    limit = (workers or max(1, int(cpus))) * IN_FLIGHT_PER_WORKER
    pending: dict[Any, int] = {}
    todo = iter(enumerate(points))
    try:
        while True:
            for index, point in todo:
                pending[remote.remote(fn_ref, point)] = index
                if len(pending) >= limit:
                    break
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    value, error = ray.get(ref)
                except Exception as exc:  # the task's worker died or the cluster went away
                    value, error = None, describe_error(exc)
                yield Outcome(index, value, error)
    finally:
        for ref in pending:  # early close or Ctrl-C: stop what has not finished
            ray.cancel(ref)


class _Progress:
    """A rich progress bar with ETA on stderr, or nothing when off or stderr is not a terminal."""

    def __init__(self, label: str | None, total: int) -> None:
        self._bar: Any = None
        if label is None or not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task = self._bar.add_task(label, total=total)
        self._bar.start()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
