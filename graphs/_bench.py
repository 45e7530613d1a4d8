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


def write_result(here, name, result, plot):
    """Save ``result`` as ``name``.json beside the script and draw ``name``.png from it."""
    import json
    import os

    with open(os.path.join(here, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(here, f"{name}.png"))
    print(f"\nwrote {os.path.join(here, name + '.png')}")


def replot(here, name, plot):
    """Redraw ``name``.png from the saved ``name``.json (a script's --plot-only)."""
    import json
    import os

    with open(os.path.join(here, f"{name}.json")) as f:
        plot(json.load(f), os.path.join(here, f"{name}.png"))
