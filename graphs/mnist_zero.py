"""NOMAD's 2-D embeddings of real images (Tepper et al., Fig. 16 and Fig. 6c), in one run.

zeros:   all 6,903 MNIST zeros (70k set; the paper's Fig. 16 had 9,603), K = 128, by
         conditional gradient (Alg. 2) as the paper: seconds, outer iterations, passes
         and bytes over the n x n blocks, the rise of resident memory during the fit against
         what the three n x n state matrices (P, Gamma, G; upper blocks) take.
digits:  500 ones and 500 twos, each on its own, K = 16 (Fig. 6c).
fashion: 1,000 Fashion-MNIST sandals, K = 32.

Each embedding is Q's two leading eigenvectors after the constant one, scaled by
sqrt(eigenvalue) (NOMAD.embedding_), drawn with thumbnails of images spread over it.

    python graphs/mnist_zero.py [--only zeros,digits,fashion] [--max-iter N] [--plot-only]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import ResidentPeak, memory_bandwidth, write_result  # noqa: E402

import dnomad  # noqa: E402
from dnomad.errors import ConvergenceWarning  # noqa: E402

NAME = "mnist_zero"
FASHION_CLASS = 5          # sandals


def images(kind, label, count=None):
    X, _ = dnomad.data.mnist(label) if kind == "mnist" else dnomad.data.fashion_mnist(label)
    return X if count is None else X[:count]


def fit(kind, label, K, count=None, max_iter=None):
    X = images(kind, label, count)
    n = len(X)
    with ResidentPeak() as rss:
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est = dnomad.NOMAD(n_clusters=K, max_iter=max_iter, label_method="components").fit(X)
        seconds = time.perf_counter() - t
    peak = rss.peak_above_start
    h = est.history_
    bytes_read = sum(r["bytes_read"] for r in h)
    row = {"data": f"{kind} {label}", "n": n, "K": K, "seconds": seconds, "n_iter": est.n_iter_,
           "stop_reason": est.stop_reason_, "passes": sum(r["passes"] for r in h),
           "bytes_read": bytes_read, "bytes_written": sum(r["bytes_written"] for r in h),
           "read_GB_per_s": bytes_read / max(sum(r["seconds"] for r in h), 1e-9) / 1e9,
           "state_GB": 3 * n * n / 2 * 4 / 1e9, "peak_GB": peak / 1e9, "rmse_neg": h[-1]["rmse_neg"],
           "max_violation": h[-1]["max_violation"], "objective": est.objective_,
           "embedding": np.round(est.embedding_, 4).tolist(), "kind": kind, "label": label,
           "count": count}
    print(f"{row['data']:12s} n={n:5d} K={K:4d}  {seconds:7.1f} s  {est.n_iter_} outer ({est.stop_reason_})  "
          f"{row['passes']} passes  {bytes_read / 1e9:.1f} GB read at {row['read_GB_per_s']:.2f} GB/s  "
          f"rmse_neg {row['rmse_neg']:.1e}", flush=True)
    return row


def run(parts, max_iter):
    rows = []
    bandwidth = memory_bandwidth() / 1e9
    if "zeros" in parts:
        rows.append(fit("mnist", 0, 128, max_iter=max_iter))
    if "digits" in parts:
        rows += [fit("mnist", 1, 16, count=500), fit("mnist", 2, 16, count=500)]
    if "fashion" in parts:
        rows.append(fit("fashion", FASHION_CLASS, 32, count=1000))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    print(f"\nmachine: memory copy bandwidth {bandwidth:.1f} GB/s; peak resident memory of the run "
          f"{peak:.2f} GB (the loaders included)")
    print(f"{'data':12s} {'n':>6s} {'K':>4s} {'seconds':>8s} {'s/outer':>8s} {'read/copy bw':>12s} "
          f"{'state GB':>9s} {'peak GB':>8s} {'peak/state':>10s}")
    for r in rows:
        print(f"{r['data']:12s} {r['n']:6d} {r['K']:4d} {r['seconds']:8.1f} {r['seconds'] / r['n_iter']:8.2f} "
              f"{r['read_GB_per_s'] / bandwidth:12.2f} {r['state_GB']:9.3f} {r['peak_GB']:8.3f} "
              f"{r['peak_GB'] / r['state_GB']:10.2f}")
    return {"copy_bandwidth_GB_per_s": bandwidth, "peak_rss_GB": peak, "rows": rows}


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    rows = result["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(6.5 * len(rows), 6.5), squeeze=False)
    for ax, r in zip(axes[0], rows):
        E = np.asarray(r["embedding"])
        X = images(r["kind"], r["label"], r["count"])
        ax.scatter(E[:, 0], E[:, 1], s=2, c="0.7")
        # Thumbnails at points spread over the embedding: the first point in each cell
        # of a 9 x 9 grid.
        lo, hi = E.min(axis=0), E.max(axis=0)
        cells = np.floor((E - lo) / np.maximum(hi - lo, 1e-12) * 8.999).astype(int)
        _, first = np.unique(cells[:, 0] * 9 + cells[:, 1], return_index=True)
        for i in first:
            box = OffsetImage(X[i].reshape(28, 28), cmap="gray_r", zoom=0.9)
            ax.add_artist(AnnotationBbox(box, E[i], frameon=False))
        ax.set_title(f"{r['data']}: n = {r['n']}, K = {r['K']}\n{r['seconds']:.0f} s, {r['n_iter']} outer "
                     f"iterations, {r['passes']} passes")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="zeros,digits,fashion")
    ap.add_argument("--max-iter", type=int, default=None, help="outer iterations for the zeros (default: "
                                                                "the solver's, to its stopping rule)")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        with open(os.path.join(HERE, f"{NAME}.json")) as f:
            plot(json.load(f), os.path.join(HERE, f"{NAME}.png"))
    else:
        write_result(HERE, NAME, run(args.only.split(","), args.max_iter), plot)
