"""Scaling of the Bregman relaxations with the number of points t.

    python graphs/bregman_scaling.py                      # both parts (about 10 minutes)
    python graphs/bregman_scaling.py --parts cond --sizes 10000 100000

Parts (one run, one machine; single-threaded BLAS, chunks on a thread per core):
  cond    cvxCond (GCG, KL divergence, alpha = 1e-5, d = 3) with X (t x 10, a positive
          mixture of 3 clusters) in Zarr, 65,536-row chunks, T in the row chunks beside
          it: seconds per GCG iteration and passes over X per iteration (the first 6
          iterations), rows per second per pass, the resident memory's peak rise against
          X's size, and at t = 10^5 the same run with X in memory (ratio Zarr / memory).
  condjc  cvxCondJC (ADMM, Euclidean, d = 3) at t = 250 ... 2000: seconds per ADMM
          iteration (10 iterations) and the peak memory rise; its state is t x t
          matrices, so it stops fitting in this machine's memory at the t printed.
Writes graphs/bregman_scaling.json and graphs/bregman_scaling.png.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
from _bench import ResidentPeak, replot, write_result

HERE = os.path.dirname(os.path.abspath(__file__))


def mixture(t, n=10, d=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.5, 3.0, size=(d, n))
    y = rng.integers(0, d, size=t)
    return centers[y] * rng.gamma(20.0, 1 / 20.0, size=(t, n)), y


def to_zarr(X, path, chunk_rows=65536):
    import zarr

    z = zarr.open_array(path, mode="w", shape=X.shape, chunks=(min(chunk_rows, X.shape[0]), X.shape[1]),
                        dtype="f8")
    for r0 in range(0, X.shape[0], chunk_rows):
        z[r0:r0 + chunk_rows] = X[r0:r0 + chunk_rows]
    return path


def cond_part(sizes, iterations=6):
    from dnomad.blocks import RowChunks, single_threaded_blas
    from dnomad.solvers.bregman import cond

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in sizes:
            X, _ = mixture(t)
            path = to_zarr(X, os.path.join(tmp, f"X{t}.zarr"))
            nbytes = X.nbytes
            del X
            for source in ("zarr", "memory") if t == 100000 else ("zarr",):
                Xin = path if source == "zarr" else mixture(t)[0]
                with single_threaded_blas(), ResidentPeak() as peak:
                    data = RowChunks(Xin, chunk_rows=65536, center=False)
                    t0 = time.perf_counter()
                    passes0 = data.passes
                    res = cond(data, 3, "kl", alpha=1e-5, max_iter=iterations, tol=0.0)
                    seconds = time.perf_counter() - t0
                    passes = data.passes - passes0
                    data.close()
                row = {"t": t, "source": source, "iterations": res.n_iter, "s_per_iteration": seconds / res.n_iter,
                       "passes_per_iteration": passes / res.n_iter, "rows_per_s_per_pass": t * passes / seconds,
                       "peak_rise_bytes": peak.peak_above_start, "x_bytes": nbytes,
                       "objective": res.objective, "gap": res.history[-1]["gap"]}
                rows.append(row)
                print(f"cond   t={t:>8d} {source:6s} {row['s_per_iteration']:8.3f} s/it  "
                      f"{row['passes_per_iteration']:5.1f} passes/it  {row['rows_per_s_per_pass'] / 1e6:6.2f} M rows/s  "
                      f"mem rise {row['peak_rise_bytes'] / nbytes:5.2f} x X", flush=True)
    return rows


def condjc_part(sizes, iterations=10):
    from dnomad.solvers.bregman import cond_jc

    rows = []
    for t in sizes:
        X, _ = mixture(t)
        with ResidentPeak() as peak:
            t0 = time.perf_counter()
            res = cond_jc(X, 3, "euclidean", max_iter=iterations, tol=0.0)
            seconds = time.perf_counter() - t0
        row = {"t": t, "s_per_iteration": seconds / res.n_iter, "peak_rise_bytes": peak.peak_above_start,
               "t2_bytes": 8 * t * t}
        rows.append(row)
        print(f"condjc t={t:>6d} {row['s_per_iteration']:8.3f} s/it  mem rise {row['peak_rise_bytes'] / 2**20:8.1f} MiB "
              f"= {row['peak_rise_bytes'] / row['t2_bytes']:5.1f} t x t matrices", flush=True)
    if rows:
        per = max(r["peak_rise_bytes"] / r["t2_bytes"] for r in rows)
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        print(f"condjc holds about {per:.1f} t x t float64 matrices: it stops fitting in this machine's "
              f"{total / 2**30:.0f} GiB at t = {int(np.sqrt(total / (8 * per))):,}")
    return rows


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = [r for r in result.get("cond", []) if r["source"] == "zarr"]
    if rows:
        ax = axes[0]
        ts = [r["t"] for r in rows]
        ax.loglog(ts, [r["s_per_iteration"] for r in rows], "o-", label="s per GCG iteration (X in Zarr)")
        ax.loglog(ts, [rows[0]["s_per_iteration"] * t / ts[0] for t in ts], "k:", label="linear in t")
        ax.set_xlabel("t (points)")
        ax.set_ylabel("seconds")
        ax.set_title("cvxCond out of core (n = 10, d = 3, KL)")
        ax.legend()
    rows = result.get("condjc", [])
    if rows:
        ax = axes[1]
        ts = [r["t"] for r in rows]
        ax.loglog(ts, [r["s_per_iteration"] for r in rows], "o-", label="s per ADMM iteration")
        ax.loglog(ts, [r["peak_rise_bytes"] / 2**30 for r in rows], "s--", label="peak memory rise (GiB)")
        ax.set_xlabel("t (points)")
        ax.set_title("cvxCondJC (t x t state, d = 3)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["cond", "condjc"], choices=["cond", "condjc"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[10000, 100000, 1000000])
    ap.add_argument("--jc-sizes", nargs="+", type=int, default=[250, 500, 1000, 2000])
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "bregman_scaling", plot)
        return
    result = {}
    if "cond" in args.parts:
        result["cond"] = cond_part(args.sizes)
    if "condjc" in args.parts:
        result["condjc"] = condjc_part(args.jc_sizes)
    write_result(HERE, "bregman_scaling", result, plot)


if __name__ == "__main__":
    main()
