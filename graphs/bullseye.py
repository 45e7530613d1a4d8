"""Geodesic-distance preservation under noise (Tepper et al., Sec. 3.2, Fig. 10), in one run.

Protocol (Sec. 3.2): the truth is the geodesic distances on the N-nearest-neighbour
graph of the clean data (Dijkstra).  5 d dimensions of Gaussian noise (std 0.05 and
0.10) are appended to the d-dimensional data; each method's geodesic distances on the
noisy data are then compared with the truth by the bullseye score (the fraction of
the nearest p percent of pairs by the truth that are also the nearest p percent by
the method):

  NO-EMB     kNN graph of the noisy data itself
  Isomap, LLE, spectral embedding (scikit-learn, N neighbours, d dimensions), then
             the kNN graph of the embedding
  NOMAD      K = n / N (conditional gradient), the graph on the support of Q
             (Q_ij > 1% of max Q) with lengths Q_ii + Q_jj - 2 Q_ij

on one manifold (a trefoil knot in 3-D) and on two (two concentric rings in 2-D).

    python graphs/bullseye.py [--plot-only]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import replot, write_result  # noqa: E402

import dnomad  # noqa: E402
from dnomad.data import trefoil_knot, two_rings  # noqa: E402
from dnomad.errors import ConvergenceWarning  # noqa: E402
from dnomad.metrics import bullseye_score, geodesic_distances, knn_graph, nomad_graph  # noqa: E402

NAME = "bullseye"
N_NEIGHBORS = 10
NOISE = (0.05, 0.10)
PERCENTILES = (1, 2, 5, 10, 20)
DATASETS = {"one manifold (trefoil)": lambda: trefoil_knot(300)[0],
            "two manifolds (rings)": lambda: two_rings(300)[0]}


def embed_distances(method, X, d):
    from sklearn.manifold import Isomap, LocallyLinearEmbedding, SpectralEmbedding

    if method == "NO-EMB":
        E = X
    elif method == "Isomap":
        E = Isomap(n_neighbors=N_NEIGHBORS, n_components=d).fit_transform(X)
    elif method == "LLE":
        E = LocallyLinearEmbedding(n_neighbors=N_NEIGHBORS, n_components=d, random_state=0).fit_transform(X)
    elif method == "spectral":
        E = SpectralEmbedding(n_components=d, n_neighbors=N_NEIGHBORS, random_state=0).fit_transform(X)
    else:
        K = len(X) // N_NEIGHBORS
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            Q = np.asarray(dnomad.NOMAD(n_clusters=K, dtype=np.float64).fit(X).Q_)
        return geodesic_distances(nomad_graph(Q))
    return geodesic_distances(knn_graph(E, N_NEIGHBORS))


METHODS = ("NO-EMB", "NOMAD", "Isomap", "LLE", "spectral")


def run():
    rng = np.random.default_rng(0)
    rows = []
    for name, make in DATASETS.items():
        X = make()
        n, d = X.shape
        truth = geodesic_distances(knn_graph(X, N_NEIGHBORS))
        for noise in NOISE:
            Xn = np.c_[X, noise * rng.standard_normal((n, 5 * d))]
            for method in METHODS:
                t = time.perf_counter()
                dist = embed_distances(method, Xn, d)
                seconds = time.perf_counter() - t
                scores = {p: bullseye_score(truth, dist, p) for p in PERCENTILES}
                rows.append({"data": name, "noise": noise, "method": method, "seconds": seconds,
                             "disconnected": float(np.isinf(dist).mean()),
                             **{f"p{p}": s for p, s in scores.items()}})
                print(f"{name:24s} noise {noise:.2f} {method:9s} " +
                      " ".join(f"p{p}={s:.3f}" for p, s in scores.items()) + f"  {seconds:6.1f}s", flush=True)
    print("\nNOMAD's bullseye score at p = 10 against each method's (ratio > 1: NOMAD preserves more):")
    print(f"{'data':24s} {'noise':>5s} " + " ".join(f"{m:>9s}" for m in METHODS if m != "NOMAD"))
    for name in DATASETS:
        for noise in NOISE:
            sel = {r["method"]: r["p10"] for r in rows if r["data"] == name and r["noise"] == noise}
            print(f"{name:24s} {noise:5.2f} " + " ".join(
                f"{sel['NOMAD'] / max(sel[m], 1e-12):9.2f}" for m in METHODS if m != "NOMAD"))
    return {"n_neighbors": N_NEIGHBORS, "percentiles": list(PERCENTILES), "rows": rows}


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    datasets = list(dict.fromkeys(r["data"] for r in rows))
    noises = list(dict.fromkeys(r["noise"] for r in rows))
    fig, axes = plt.subplots(len(datasets), len(noises), figsize=(5 * len(noises), 3.8 * len(datasets)),
                             squeeze=False, sharey=True)
    ps = result["percentiles"]
    for i, data in enumerate(datasets):
        for j, noise in enumerate(noises):
            ax = axes[i, j]
            for r in rows:
                if r["data"] == data and r["noise"] == noise:
                    ax.plot(ps, [r[f"p{p}"] for p in ps], "o-", lw=2.5 if r["method"] == "NOMAD" else 1.2,
                            label=r["method"])
            ax.set_xscale("log")
            ax.set_xticks(ps, [str(p) for p in ps])
            ax.set_title(f"{data}, noise {noise}")
            ax.set_xlabel("percentile p")
            if j == 0:
                ax.set_ylabel("bullseye score")
            ax.set_ylim(0, 1.02)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, NAME, plot)
    else:
        write_result(HERE, NAME, run(), plot)
