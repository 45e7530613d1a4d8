"""Helpers shared by the benchmark scripts in graphs/ (run as scripts from this folder)."""
from __future__ import annotations

import os
import threading
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


def pass_rate(group, run, repeat):
    """(seconds, bytes moved per second) of ``run()``, one or more passes over ``group``'s
    blocks, from the group's pass records: mean over ``repeat`` calls after one that
    compiles and touches the blocks."""
    run()
    mark = group.passes.mark()
    for _ in range(repeat):
        run()
    tot = group.passes.since(mark)
    seconds = tot["seconds"] / repeat
    return seconds, (tot["bytes_read"] + tot["bytes_written"]) / repeat / seconds


def chunk_files(store):
    for root, _, files in os.walk(store):
        for name in files:
            if not name.startswith((".", "zarr.json")):
                yield os.path.join(root, name)


def evict(store):
    """Drop the store's files from the page cache (they are clean: written and synced)."""
    for path in chunk_files(store):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_read_bandwidth(store):
    """Bytes per second reading every chunk file once, after evicting them."""
    os.sync()
    evict(store)
    buf = bytearray(256 << 20)
    total = 0
    t = time.perf_counter()
    for path in chunk_files(store):
        with open(path, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf)
                if not got:
                    break
                total += got
    return total / (time.perf_counter() - t), total


def write_result(here, name, result, plot):
    """Save ``result`` as ``name``.json beside the script and draw ``name``.png from it."""
    import json
    import os

    with open(os.path.join(here, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(here, f"{name}.png"))
    print(f"\nwrote {os.path.join(here, name + '.png')}")


def merge_row(path, result, row, key):
    """Put ``row`` into ``result["rows"]`` in place of the rows with the same ``key(row)``
    (a rerun replaces its own rows, the others stay), print it, and save ``result`` to
    ``path`` (after every row: a stopped run keeps the rows it finished)."""
    import json

    result["rows"] = [r for r in result["rows"] if key(r) != key(row)]
    result["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(path + ".tmp", "w") as f:      # then renamed: a run killed mid-write keeps the old file
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def replot(here, name, plot):
    """Redraw ``name``.png from the saved ``name``.json (a script's --plot-only)."""
    import json
    import os

    with open(os.path.join(here, f"{name}.json")) as f:
        plot(json.load(f), os.path.join(here, f"{name}.png"))


class ResidentPeak:
    """The largest rise of this process's resident memory over its value at entry,
    sampled every 20 ms by a thread (no allocation hooks: the run's timing stands)."""

    def __enter__(self):
        self.start = self._rss()
        self.peak_above_start = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak_above_start = max(self.peak_above_start, self._rss() - self.start)

    @staticmethod
    def _rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def code_commit():
    """The commit the run's code is at (with '+' when the code has changes: the package,
    the scripts or the build files, not the results that benchmarks write), or None; a
    copy of the tree without git (a device machine) says it in DNOMAD_COMMIT."""
    import subprocess

    if os.environ.get("DNOMAD_COMMIT"):
        return os.environ["DNOMAD_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "dnomad",
                                "graphs/*.py", "pyproject.toml"], cwd=os.path.dirname(here),
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def run_in_fresh_process(target, args, timeout, on_progress=None):
    """``target(*args, queue)`` in a spawned process, killed past ``timeout`` seconds:
    (status, what it put on the queue at its end or None, wall seconds).  status is "ok", "did
    not finish in <timeout> s" or "failed (exit <code>)".  What it puts as
    ``{"progress": x}`` goes to ``on_progress(x)`` as it arrives (a run killed at the
    timeout has reported how far it got)."""
    import multiprocessing as mp
    import queue as queues

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    start = time.perf_counter()
    proc.start()
    result, deadline = None, start + timeout
    while True:
        alive = proc.is_alive()
        try:        # what came so far (read before the process ends: it waits for its queue to drain)
            item = queue.get(timeout=max(0.0, min(0.5, deadline - time.perf_counter())) if alive else 0.1)
        except queues.Empty:
            if not alive or time.perf_counter() > deadline:
                break
            continue
        if isinstance(item, dict) and "progress" in item:
            if on_progress is not None:
                on_progress(item["progress"])
        else:
            result = item           # the last message: the process ends now
            break
        if time.perf_counter() > deadline:
            break
    wall = time.perf_counter() - start
    proc.join(60 if result is not None else 0)      # a process that sent its result is ending
    if proc.is_alive():
        proc.kill()
        proc.join()
        if result is None:
            return f"did not finish in {timeout:.0f} s", None, time.perf_counter() - start
        return "ok", result, wall
    if proc.exitcode != 0 or result is None:
        return f"failed (exit {proc.exitcode})", None, time.perf_counter() - start
    return "ok", result, wall
