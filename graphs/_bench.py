"""Helpers shared by the benchmark scripts in graphs/ (run as scripts from this folder)."""
from __future__ import annotations

import time

import numpy as np


def memory_bandwidth(nbytes=1 << 30, repeat=5):
    """Bytes read + written per second by numpy's copy of a large array (best of ``repeat``)."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best
