"""Workloads: request lengths and arrivals (presets, synthetic distributions, trace files)."""

from pagedkv.workloads.arrivals import Arrival, arrival_times
from pagedkv.workloads.config import WorkloadConfig, WorkloadKind
from pagedkv.workloads.factory import make_workload
from pagedkv.workloads.lesson import LESSON, lesson_workload
from pagedkv.workloads.sharegpt import import_sharegpt, load_sharegpt
from pagedkv.workloads.spec import RequestSpec
from pagedkv.workloads.synthetic import ALPACA_LIKE, SHAREGPT_LIKE, LengthModel, cap_lengths
from pagedkv.workloads.trace import TraceError, read_trace, write_trace

__all__ = [
    "ALPACA_LIKE",
    "LESSON",
    "SHAREGPT_LIKE",
    "Arrival",
    "LengthModel",
    "RequestSpec",
    "TraceError",
    "WorkloadConfig",
    "WorkloadKind",
    "arrival_times",
    "cap_lengths",
    "import_sharegpt",
    "lesson_workload",
    "load_sharegpt",
    "make_workload",
    "read_trace",
    "write_trace",
]
