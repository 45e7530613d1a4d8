"""NOMAD's solvers side by side (the paper's Figs. 12 and 15), in one run.

accuracy: two rings, n = 200, K = 8: the exact SDP (SCS) against conditional gradient
    (dnomad.NOMAD) and Burer-Monteiro at r = K, 2K, 4K, 8K, 16K (3 seeds each):
    relative Frobenius distance to Q*, objective, seconds.
time: two rings at growing n: seconds of CGM and of Burer-Monteiro (r = K, 4K, 8K),
    both to their stopping rules, data given as X (BM matrix-free, CGM's blocks in
    this process).
zarr: Burer-Monteiro on 200,000 rows read from a Zarr store by row chunks, capped at
    5 outer steps: seconds per outer step and per product D Y, bytes of X read per
    second against the copy bandwidth, peak traced memory against Y and against D.

    python graphs/nomad_solvers.py [--only accuracy,time,zarr] [--plot-only]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import replot, write_result  # noqa: E402

import dnomad  # noqa: E402
from dnomad.blocks.operators import DataGram  # noqa: E402
from dnomad.data import two_rings  # noqa: E402
from dnomad.nomad.bm import BurerMonteiroParams, burer_monteiro  # noqa: E402

NAME = "nomad_solvers"
K = 8


def exact_sdp(D, K):
    import cvxpy as cp

    n = len(D)
    Z = cp.Variable((n, n), PSD=True)
    cp.Problem(cp.Maximize(cp.trace(D @ Z)), [Z >= 0, Z @ np.ones(n) == 1, cp.trace(Z) == K]).solve(
        solver="SCS", eps=1e-6, max_iters=50000)
    return Z.value


def part_accuracy():
    X = two_rings(200)[0]
    G = DataGram(X)
    D = G.dense()
    t = time.perf_counter()
    Qs = exact_sdp(D, K)
    rows = [{"solver": "SCS (exact)", "rank": None, "seed": None, "distance": 0.0,
             "objective": float(np.sum(D * Qs)), "seconds": time.perf_counter() - t}]
    t = time.perf_counter()
    est = dnomad.NOMAD(n_clusters=K, dtype=np.float64).fit(X)
    Q = np.asarray(est.Q_)
    rows.append({"solver": "CGM", "rank": None, "seed": None,
                 "distance": float(np.linalg.norm(Q - Qs) / np.linalg.norm(Qs)),
                 "objective": float(np.sum(D * Q)), "seconds": time.perf_counter() - t})
    for mult in (1, 2, 4, 8, 16):
        for seed in (0, 1, 2):
            t = time.perf_counter()
            res = burer_monteiro(G, BurerMonteiroParams(n_clusters=K, rank=mult * K, random_state=seed))
            Q = res.Y @ res.Y.T
            rows.append({"solver": "BM", "rank": mult * K, "seed": seed,
                         "distance": float(np.linalg.norm(Q - Qs) / np.linalg.norm(Qs)),
                         "objective": float(np.sum(D * Q)), "seconds": time.perf_counter() - t,
                         "outer": res.n_iter, "matmats": res.matmats, "stop": res.stop_reason})
    print(f"\naccuracy: two rings, n = 200, K = {K}; distance = ||Q - Q*||_F / ||Q*||_F")
    print(f"{'solver':>12} {'r':>4} {'seed':>4} {'distance':>9} {'objective':>10} {'obj/SCS':>8} {'s':>7}")
    for r in rows:
        print(f"{r['solver']:>12} {str(r['rank'] or '-'):>4} {str(r['seed'] if r['seed'] is not None else '-'):>4} "
              f"{r['distance']:9.4f} {r['objective']:10.6f} {r['objective'] / rows[0]['objective']:8.5f} "
              f"{r['seconds']:7.2f}")
    return rows


def part_time(sizes=(500, 1000, 2000, 4000, 8000), cgm_max=2000):
    rows = []
    for n in sizes:
        X = two_rings(n)[0]
        row = {"n": n}
        if n <= cgm_max:
            t = time.perf_counter()
            est = dnomad.NOMAD(n_clusters=K, backend="local").fit(X)
            row["CGM"] = time.perf_counter() - t
            row["CGM_iterations"] = est.n_iter_
        for mult in (1, 4, 8):
            t = time.perf_counter()
            res = burer_monteiro(DataGram(X), BurerMonteiroParams(n_clusters=K, rank=mult * K, random_state=0))
            row[f"BM r={mult}K"] = time.perf_counter() - t
            row[f"BM r={mult}K outer"] = res.n_iter
        rows.append(row)
        print(json.dumps(row))
    print(f"\ntime (s) to the stopping rule, two rings, K = {K}")
    cols = ["CGM", "BM r=1K", "BM r=4K", "BM r=8K"]
    print(f"{'n':>7} " + " ".join(f"{c:>9}" for c in cols) + f" {'CGM/BM8K':>9}")
    for r in rows:
        ratio = r["CGM"] / r["BM r=8K"] if "CGM" in r else float("nan")
        print(f"{r['n']:>7} " + " ".join(f"{r.get(c, float('nan')):9.2f}" for c in cols) + f" {ratio:9.2f}")
    return rows


def part_zarr(n=200_000, rank=K, max_iter=5, inner_max_iter=300):
    """Burer-Monteiro on n rows read from Zarr, capped at ``max_iter`` outer steps of at
    most ``inner_max_iter`` L-BFGS-B iterations (to the stopping rule it runs for
    hours on 2 cores): seconds per outer step and per product D Y, X's bytes read per
    second against the machine's copy bandwidth, peak traced memory against Y and D."""
    import zarr

    from _bench import memory_bandwidth

    bandwidth = memory_bandwidth()
    X = two_rings(n)[0]
    d = X.shape[1]
    with tempfile.TemporaryDirectory() as tmp:
        z = zarr.create_array(store=os.path.join(tmp, "X.zarr"), shape=X.shape, dtype=X.dtype,
                              chunks=(50_000, d))
        z[...] = X
        del X
        tracemalloc.start()
        t = time.perf_counter()
        D = DataGram(os.path.join(tmp, "X.zarr"))
        product_seconds = [0.0]
        matmat = D.matmat

        def timed(Y):
            t0 = time.perf_counter()
            out = matmat(Y)
            product_seconds[0] += time.perf_counter() - t0
            return out

        D.matmat = timed

        def report(row):
            print(f"  outer {row['iteration']}: {row['seconds']:.1f} s, {row['matmats']} products, "
                  f"row-sum violation {row['row_sum_violation']:.2e}, trace violation "
                  f"{row['trace_violation']:.2e}", flush=True)

        res = burer_monteiro(D, BurerMonteiroParams(n_clusters=K, rank=rank, random_state=0, max_iter=max_iter,
                                                    inner_max_iter=inner_max_iter), callback=report)
        seconds = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    x_bytes = D.rows_read * d * 8
    row = {"n": n, "rank": rank, "seconds": seconds, "outer": res.n_iter, "matmats": res.matmats,
           "stop": res.stop_reason, "peak_bytes": peak, "D_bytes": n * n * 8, "Y_bytes": n * rank * 8,
           "rows_read": D.rows_read, "product_seconds": product_seconds[0],
           "x_read_bytes_per_s": x_bytes / product_seconds[0], "copy_bandwidth": bandwidth,
           "history": res.history}
    print(f"\nzarr: n = {n}, r = {rank}, capped at {max_iter} outer steps of <= {inner_max_iter} L-BFGS-B "
          f"iterations: {seconds:.1f} s ({seconds / res.n_iter:.1f} s per outer step), {res.matmats} products "
          f"D Y at {product_seconds[0] / res.matmats * 1e3:.1f} ms each ({product_seconds[0] / seconds:.0%} of "
          f"the time); X read at {x_bytes / product_seconds[0] / 1e9:.2f} GB/s = "
          f"{x_bytes / product_seconds[0] / bandwidth:.2f} x the copy bandwidth ({bandwidth / 1e9:.1f} GB/s); "
          f"peak traced memory {peak / 2**20:.0f} MiB = {peak / (n * rank * 8):.0f} x Y, "
          f"{n * n * 8 / peak:.0f}x less than D ({n * n * 8 / 2**30:.0f} GiB)")
    return row


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if "accuracy" in result:
        rows = [r for r in result["accuracy"] if r["solver"] == "BM"]
        ranks = sorted({r["rank"] for r in rows})
        for seed in (0, 1, 2):
            axes[0].plot(ranks, [next(r["distance"] for r in rows if r["rank"] == k and r["seed"] == seed)
                                 for k in ranks], "o-", alpha=0.7, label=f"BM seed {seed}")
        cgm = next(r for r in result["accuracy"] if r["solver"] == "CGM")
        axes[0].axhline(cgm["distance"], color="k", ls="--", label="CGM")
        axes[0].set_xscale("log", base=2)
        axes[0].set_yscale("log")
        axes[0].set_xlabel("rank r")
        axes[0].set_ylabel("||Q - Q*||_F / ||Q*||_F")
        axes[0].set_title(f"two rings, n = 200, K = {K} (Fig. 12)")
        axes[0].legend()
    if "time" in result:
        rows = result["time"]
        for col in ("CGM", "BM r=1K", "BM r=4K", "BM r=8K"):
            pts = [(r["n"], r[col]) for r in rows if col in r]
            axes[1].plot(*zip(*pts), "o-", label=col)
        axes[1].set_xscale("log")
        axes[1].set_yscale("log")
        axes[1].set_xticks([r["n"] for r in rows], [str(r["n"]) for r in rows])
        axes[1].minorticks_off()
        axes[1].set_xlabel("n")
        axes[1].set_ylabel("seconds to the stopping rule")
        title = "two rings, time vs n (Fig. 15)"
        if "zarr" in result:
            z = result["zarr"]
            title += (f"\nBM on {z['n']:,} rows from Zarr (r={z['rank']}): {z['seconds'] / z['outer']:.0f} s "
                      f"per outer step, peak {z['peak_bytes'] / 2**20:.0f} MiB")
        axes[1].set_title(title)
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="accuracy,time,zarr")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, NAME, plot)
        return
    path = os.path.join(HERE, f"{NAME}.json")
    result = json.load(open(path)) if os.path.exists(path) else {}
    parts = {"accuracy": part_accuracy, "time": part_time, "zarr": part_zarr}
    for name in args.only.split(","):
        result[name] = parts[name]()
        write_result(HERE, NAME, result, plot)


if __name__ == "__main__":
    main()
