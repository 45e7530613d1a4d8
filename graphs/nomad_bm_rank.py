"""NOMAD by Burer-Monteiro: what the factor's width r and the start's accuracy buy.
For each data set, ``NOMAD(n_clusters, solver="bm")`` with its defaults (sdp_k from n
and n_clusters) but r = f sdp_k for f in ``--factors`` and the symmetric NMF start's
ADMM stopped at split gap ``start_tol`` for each of ``--start-tols``: the labels' ARI
against the classes, the objective Tr(D Q) (the same normalized D at every setting, so
the objectives compare; higher is better), the start's iterations and seconds, outer
steps, evaluations, fit seconds and peak resident memory, each run in a fresh process.
The memory a row costs grows as r (Y and the optimizer's states are n x r), so r sets
how many rows a worker can hold; the start is a fixed cost before the first outer step.

    python graphs/nomad_bm_rank.py                              # the data sets below, f = 1, 2, 4, 8
    python graphs/nomad_bm_rank.py --datasets rings --factors 2,8
    python graphs/nomad_bm_rank.py --datasets mnist_5k --factors 2 --start-tols 1e-5,1e-3,1e-2
    python graphs/nomad_bm_rank.py --plot-only

Rows are merged into nomad_bm_rank.json (a rerun replaces its own rows); the plot, of
the rows at the default start_tol, is nomad_bm_rank.png.  The data sets are
graphs/quality.py's, and "trefoil_100k" (10^5 points of a noisy trefoil knot, d = 3,
8 classes by arc length: a low-dimensional case where X's products are cheap).
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

from _bench import ResidentPeak, code_commit, merge_row, run_in_fresh_process  # noqa: E402
from quality import DATASETS, _machine  # noqa: E402

DEFAULT_DATASETS = ("rings", "moons", "unequal_blobs", "digits", "satimage", "mnist_5k")
START_TOL = 1e-5          # the rank sweep's start (the default before 1e-3); rows without start_tol ran at it


def _trefoil(n=100_000, parts=8):
    from dnomad.data import trefoil_knot
    X, t = trefoil_knot(n, noise=0.05, random_state=0)
    return X, np.floor(parts * (t - t.min()) / (np.ptp(t) + 1e-12)).astype(int)


DATASETS = dict(DATASETS, trefoil_100k=_trefoil)


def _run_one(dataset, factor, start_tol, queue):
    from sklearn.metrics import adjusted_rand_score

    import dnomad
    from dnomad.nomad.estimator import default_sdp_k

    X, y = DATASETS[dataset]()
    X = np.asarray(X, dtype=np.float64)
    k = int(len(np.unique(y)))
    sdp_k = default_sdp_k(len(X), k)
    est = dnomad.NOMAD(k, solver="bm", rank=factor * sdp_k, random_state=0,
                       solver_options={"start_tol": start_tol})
    with ResidentPeak() as peak:
        t = time.perf_counter()
        est.fit(X)
        seconds = time.perf_counter() - t
    history = est.history_
    queue.put({"ari": float(adjusted_rand_score(y, est.labels_)), "objective": float(est.objective_),
               "outer_steps": len(history), "evaluations": int(sum(r["evaluations"] for r in history)),
               "stop_reason": est.stop_reason_, "seconds": seconds, "peak_mib": peak.peak_above_start / 2**20,
               "start_iterations": est.layers_[0]["start"]["iterations"],
               "start_seconds": est.layers_[0]["start"]["seconds"],
               "n": int(len(X)), "d": int(X.shape[1]), "k": k, "sdp_k": sdp_k, "rank": factor * sdp_k})


def _key(row):
    return row["dataset"], row["factor"], row.get("start_tol", START_TOL)


def run(dataset, factor, start_tol, timeout):
    row = {"dataset": dataset, "factor": factor, "start_tol": start_tol, "commit": code_commit()}
    status, out, _ = run_in_fresh_process(_run_one, (dataset, factor, start_tol), timeout)
    return dict(row, status=status, **(out or {}))


def table(result):
    rows = [r for r in result["rows"] if r["status"] == "ok"]
    best = {}
    for r in rows:
        best[r["dataset"]] = max(best.get(r["dataset"], -np.inf), r["objective"])
    lines = ["| data set | r / sdp_k | r | start_tol | ARI | objective / best | start iterations (s) | outer steps | "
             "evaluations | seconds | peak MiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: (list(DATASETS).index(r["dataset"]), r["factor"],
                                                   -r.get("start_tol", START_TOL))):
        tol = r.get("start_tol", START_TOL)
        if r["status"] != "ok":
            lines.append(f"| {r['dataset']} | {r['factor']} | | {tol:g} | {r['status']} | | | | | | |")
            continue
        start = f"{r['start_iterations']} ({r['start_seconds']:.1f})" if "start_iterations" in r else ""
        lines.append(f"| {r['dataset']} (n {r['n']}, sdp_k {r['sdp_k']}) | {r['factor']} | {r['rank']} | {tol:g} | "
                     f"{r['ari']:.3f} | {r['objective'] / best[r['dataset']]:.5f} | {start} | {r['outer_steps']} | "
                     f"{r['evaluations']} | {r['seconds']:.1f} | {r['peak_mib']:.0f} |")
    return "\n".join(lines)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["status"] == "ok" and r.get("start_tol", START_TOL) == START_TOL]
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in rows)]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for d in datasets:
        rs = sorted((r for r in rows if r["dataset"] == d), key=lambda r: r["factor"])
        f = [r["factor"] for r in rs]
        best = max(r["objective"] for r in rs)
        axes[0].plot(f, [r["ari"] for r in rs], "o-", label=d)
        axes[1].plot(f, [1 - r["objective"] / best for r in rs], "o-", label=d)
        axes[2].plot(f, [r["seconds"] for r in rs], "o-", label=d)
    for ax, title in zip(axes, ("ARI against the classes", "1 - objective / best objective",
                                "fit seconds (2 cores)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("r / sdp_k")
        ax.set_title(title, fontsize=9)
    axes[1].set_yscale("symlog", linthresh=1e-5)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"graphs/nomad_bm_rank.py: NOMAD bm with its defaults at r = f sdp_k "
                 f"({result['environment']['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS), help="comma-separated, from graphs/quality.py's")
    p.add_argument("--factors", default="1,2,4,8", help="r / sdp_k, comma-separated")
    p.add_argument("--start-tols", default=str(START_TOL), help="the start's ADMM split gaps, comma-separated")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    path = os.path.join(HERE, "nomad_bm_rank.json")
    result = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    if not args.plot_only:
        result["environment"] = _machine()
        command = "python graphs/nomad_bm_rank.py " + " ".join(argv if argv is not None else sys.argv[1:])
        for dataset in args.datasets.split(","):
            for factor in (int(f) for f in args.factors.split(",")):
                for start_tol in (float(t) for t in args.start_tols.split(",")):
                    merge_row(path, result, dict(run(dataset, factor, start_tol, args.timeout), command=command),
                              _key)
    print(table(result))
    plot(result, os.path.join(HERE, "nomad_bm_rank.png"))


if __name__ == "__main__":
    main()
