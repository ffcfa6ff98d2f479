"""Test-wide settings.

pytest-xdist runs one worker per core; torch (the tensor tests) would otherwise start one
OpenMP thread per core in every worker, and idle OpenMP threads spin, starving the other
worker. One thread per worker keeps the suite's time predictable on CI's 2 cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
