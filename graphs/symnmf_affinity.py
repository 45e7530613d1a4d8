"""SymNMF's default affinity: which neighbour's distance should scale a point's Gaussian
affinities?  SymNMF (every other parameter at its default, ``n_clusters`` = the number of
classes) with local scaling from the m-th neighbour, for m a fixed count (7, Zelnik-Manor
and Perona's for spectral clustering), a fraction of n / k (the mean cluster's size), or
"auto" (the default: the scales that make P's mean row sum n / (10 k)), beside
scikit-learn's KMeans (k-means++, the goal's reference) on the data sets of
graphs/quality.py.

    python graphs/symnmf_affinity.py
    python graphs/symnmf_affinity.py --datasets digits,moons --rules auto,7
    python graphs/symnmf_affinity.py --plot-only

Writes symnmf_affinity.json (ARI, NMI and fit seconds per data set and m) and
symnmf_affinity.png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _bench import code_commit  # noqa: E402
from quality import DATASETS, _machine  # noqa: E402

# m = 7, 15, or n / (c k) for these c: c = 1 scales by the distance across a mean-sized cluster.
FIXED = (7, 15)
FRACTIONS = (20, 10, 5, 2)
DEFAULT_SETS = ("rings", "moons", "swiss_roll", "unequal_blobs", "anisotropic_blobs", "digits", "mnist_5k",
                "fashion_5k", "satimage", "yeast")


def rules(n, k):
    out = {"auto": "auto"}
    out.update({f"{m}": m for m in FIXED})
    out.update({f"n/({c}k)": max(1, n // (c * k)) for c in FRACTIONS})
    return out


def run_dataset(name, only=None):
    import dnomad
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score as ari
    from sklearn.metrics import normalized_mutual_info_score as nmi

    X, y = DATASETS[name]()
    X = np.asarray(X, dtype=np.float64)
    n, k = len(X), int(len(np.unique(y)))
    km = KMeans(k, random_state=0).fit(X).labels_
    rows = [{"dataset": name, "rule": "KMeans", "ari": float(ari(y, km)), "nmi": float(nmi(y, km))}]
    for rule, m in rules(n, k).items():
        if only is not None and rule not in only:
            continue
        t = time.perf_counter()
        est = dnomad.SymNMF(k, n_neighbors=m if m == "auto" else min(m, n - 1), random_state=0).fit(X)
        rows.append({"dataset": name, "rule": rule, "n_neighbors": int(est.n_neighbors_),
                     "scale_factor": est.scale_factor_, "n": n, "k": k, "commit": code_commit(),
                     "ari": float(ari(y, est.labels_)), "nmi": float(nmi(y, est.labels_)),
                     "seconds": time.perf_counter() - t, "n_iter": int(est.n_iter_),
                     "stop_reason": est.stop_reason_})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["dataset"] for r in result["rows"]))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, d in enumerate(sets):
        rows = [r for r in result["rows"] if r["dataset"] == d]
        km = next(r["ari"] for r in rows if r["rule"] == "KMeans")
        pts = sorted((r["n_neighbors"] / (r["n"] / r["k"]), r["ari"] - km) for r in rows
                     if r["rule"] not in ("KMeans", "auto"))
        ax.plot(*zip(*pts), "o-", color=plt.cm.tab10(i % 10), label=d)
        auto = next((r for r in rows if r["rule"] == "auto"), None)
        if auto is not None:
            ax.plot(auto["n_neighbors"] / (auto["n"] / auto["k"]), auto["ari"] - km, "*", ms=13,
                    color=plt.cm.tab10(i % 10), mec="k")
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(-0.02, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("m / (n / k): the scaling neighbour over the mean cluster's size")
    ax.set_ylabel("SymNMF's ARI minus KMeans'")
    ax.set_title("graphs/symnmf_affinity.py: local scaling from the m-th neighbour; star: \"auto\" "
                 "(dotted: the goal, -0.02)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result):
    sets = list(dict.fromkeys(r["dataset"] for r in result["rows"]))
    names = list(dict.fromkeys(r["rule"] for r in result["rows"]))
    lines = ["| rule | " + " | ".join(sets) + " |", "|---" * (len(sets) + 1) + "|"]
    for rule in names:
        cells = []
        for d in sets:
            r = next((r for r in result["rows"] if r["dataset"] == d and r["rule"] == rule), None)
            m = "" if r is None or rule in ("KMeans", "7", "15") else f" (m={r['n_neighbors']}" + (
                f", c={r['scale_factor']:.2f})" if r.get("scale_factor", 1.0) != 1.0 else ")")
            cells.append("" if r is None else f"{r['ari']:.2f}{m}")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=",".join(DEFAULT_SETS))
    p.add_argument("--rules", default=None, help="comma-separated rules to run (default all): auto, 7, 15, "
                   + ", ".join(f"n/({c}k)" for c in FRACTIONS))
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    path = os.path.join(HERE, "symnmf_affinity.json")
    result = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    if not args.plot_only:
        result["environment"] = _machine()
        result["command"] = "python graphs/symnmf_affinity.py " + " ".join(argv if argv is not None else sys.argv[1:])
        only = None if args.rules is None else args.rules.split(",")
        for name in args.datasets.split(","):
            rows = run_dataset(name, only)
            # a rerun replaces its own (data set, rule) rows and keeps the others
            ran = {r["rule"] for r in rows}
            result["rows"] = [r for r in result["rows"] if r["dataset"] != name or r["rule"] not in ran] + rows
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
    print(table(result))
    plot(result, os.path.join(HERE, "symnmf_affinity.png"))


if __name__ == "__main__":
    main()
