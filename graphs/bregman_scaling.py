"""Scaling of the Bregman relaxations with the number of points t.

    python graphs/bregman_scaling.py                      # both parts (about 10 minutes)
    python graphs/bregman_scaling.py --parts cond --sizes 10000 100000

Parts (one run, one machine; single-threaded BLAS, chunks on a thread per core):
  cond    cvxCond (GCG, KL divergence, alpha = 1e-5, d = 3) with X (t x 10, a positive
          mixture of 3 clusters) in Zarr, 65,536-row chunks, T in the row chunks beside
          it: seconds per GCG iteration and passes over X per iteration (the first 6
          iterations), rows per second per pass, the resident memory's peak rise against
          X's size, and at t = 10^5 the same run with X in memory (ratio Zarr / memory).
  condjc  cvxCondJC (ADMM, Euclidean, d = 3) at t = 500 ... 4000, M and Lambda in row
          chunks: seconds per ADMM iteration (iterations 21-40) with the Krylov projection
          onto M2 (its passes per iteration and Z's rank) and, up to t = 2000, with the
          dense one (ratio); the peak memory rise.  Its state is two t x t matrices, so
          on one machine it stops fitting at the t printed.
A part not run keeps its rows in the saved json.
Writes graphs/bregman_scaling.json and graphs/bregman_scaling.png.
"""
from __future__ import annotations

import argparse
import json
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
    from dnomad.bregman import cond

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


def condjc_part(sizes, iterations=40, steady_from=21, dense_up_to=2000):
    """cvxCondJC's ADMM, M and Lambda in row chunks (one thread each), the first
    ``iterations`` iterations; with the Krylov projection at every t and the dense one
    up to ``dense_up_to``.  Z's rank is high in the first iterations (from M = 1 1'/t,
    theta = 0 keeps every positive eigenvalue: 2/3 t of them), then falls to about 15:
    the time per iteration and the eigensolver's passes are reported over iterations
    ``steady_from`` to ``iterations``."""
    from dnomad.blocks import single_threaded_blas
    from dnomad.bregman import cond_jc

    rows = []
    for t in sizes:
        X, _ = mixture(t)
        for projection in ("partial", "dense") if t <= dense_up_to else ("partial",):
            with single_threaded_blas(), ResidentPeak() as peak:
                t0 = time.perf_counter()
                res = cond_jc(X, 3, "euclidean", max_iter=iterations, tol=0.0, projection=projection)
                seconds = time.perf_counter() - t0
            h = res.history
            steady = h[steady_from - 1:]
            eig = [r["eig_passes"] for r in steady]
            row = {"t": t, "projection": projection, "iterations": res.n_iter, "s_total": seconds,
                   "s_per_iteration": (steady[-1]["seconds"] - h[steady_from - 2]["seconds"]) / len(steady),
                   "eig_passes_per_iteration": float(np.mean(eig)), "eig_passes_max": int(max(eig)),
                   "rank_first": h[0]["rank"],
                   "rank": h[-1]["rank"], "peak_rise_bytes": peak.peak_above_start, "t2_bytes": 8 * t * t}
            rows.append(row)
            print(f"condjc t={t:>6d} {projection:8s} {row['s_per_iteration']:8.3f} s/it (its {steady_from}-{iterations}; "
                  f"{seconds:6.1f} s in all)  eigensolver passes/it "
                  f"{row['eig_passes_per_iteration']:5.1f} (max {row['eig_passes_max']:3d})  rank {row['rank_first']} -> {row['rank']}  "
                  f"mem rise {row['peak_rise_bytes'] / 2**20:8.1f} MiB = {row['peak_rise_bytes'] / row['t2_bytes']:5.2f} "
                  f"t x t matrices", flush=True)
    for t in sorted({r["t"] for r in rows}):
        pair = {r["projection"]: r for r in rows if r["t"] == t}
        if len(pair) == 2:
            print(f"condjc t={t:>6d} dense / partial time per iteration: "
                  f"{pair['dense']['s_per_iteration'] / pair['partial']['s_per_iteration']:.2f}")
    partial = [r for r in rows if r["projection"] == "partial"]
    if partial:
        top = max(partial, key=lambda r: r["t"])
        per = top["peak_rise_bytes"] / top["t2_bytes"]
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        # M and Lambda grow as 2 t^2; the chunks' temporaries stop growing once the row
        # blocks reach their 64 MiB cap (from t = 4096 with 2 threads)
        rest = top["peak_rise_bytes"] - 2 * top["t2_bytes"]
        print(f"condjc holds about {per:.2f} t x t float64 matrices at t = {top['t']}: M and Lambda (2) and "
              f"{rest / 2**20:.0f} MiB of the chunks' temporaries, capped in t; it stops fitting in this "
              f"machine's {total / 2**30:.0f} GiB near t = {int(np.sqrt(max(total - rest, 0) / 16)):,} "
              f"(on a cluster, M and Lambda spread over the workers' memory)")
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
        for projection, style in (("partial", "o-"), ("dense", "^:")):
            sel = [r for r in rows if r.get("projection", "dense") == projection]
            if sel:
                ax.loglog([r["t"] for r in sel], [r["s_per_iteration"] for r in sel], style,
                          label=f"s per ADMM iteration ({projection} projection)")
        sel = [r for r in rows if r.get("projection", "dense") == "partial"] or rows
        ax.loglog([r["t"] for r in sel], [r["peak_rise_bytes"] / 2**30 for r in sel], "s--",
                  label="peak memory rise (GiB)")
        ax.set_xlabel("t (points)")
        ax.set_title("cvxCondJC (t x t state, d = 3)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["cond", "condjc"], choices=["cond", "condjc"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[10000, 100000, 1000000])
    ap.add_argument("--jc-sizes", nargs="+", type=int, default=[500, 1000, 2000, 4000])
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "bregman_scaling", plot)
        return
    # a part not run keeps its saved rows
    path = os.path.join(HERE, "bregman_scaling.json")
    result = json.load(open(path)) if os.path.exists(path) else {}
    if "cond" in args.parts:
        result["cond"] = cond_part(args.sizes)
    if "condjc" in args.parts:
        result["condjc"] = condjc_part(args.jc_sizes)
    write_result(HERE, "bregman_scaling", result, plot)


if __name__ == "__main__":
    main()
