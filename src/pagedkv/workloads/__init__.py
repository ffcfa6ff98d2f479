"""Workloads: request lengths and arrivals (presets, synthetic distributions, trace files)."""

from pagedkv.workloads.lesson import LESSON, lesson_workload
from pagedkv.workloads.spec import RequestSpec

__all__ = ["LESSON", "RequestSpec", "lesson_workload"]
