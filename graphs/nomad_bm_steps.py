"""NOMAD by Burer-Monteiro: the start and the multiplier steps' schedule.
For each data set, ``NOMAD(n_clusters, solver="bm")`` with its defaults but for two
solver options, in five schedules:

* "paper start, uncut" (the defaults before): the symmetric NMF start as it is, zero
  multipliers, the first multiplier step solved to inner_tol and every inexact step
  run until its projected gradient falls to inner_rtol of its start;
* "balanced, uncut": the start's rows scaled so that Y Y^T 1 = 1, its first step
  inexact like the others;
* "paper start, cut at 50": inexact steps cut at inexact_max_iter = 50 iterations;
* "balanced, cut at 50" and "balanced, cut" (the defaults: cut at 150).

Printed and saved: the labels' ARI against the classes, the objective Tr(D Q) over the
best of the five (the same normalized D in each; higher is better), outer steps,
evaluations of L (each one product D Y, two passes over X), fit seconds, and each
schedule's seconds and evaluations over the paper start's, measured in the same run,
each fit in a fresh process.

    python graphs/nomad_bm_steps.py
    python graphs/nomad_bm_steps.py --datasets mnist_10k --schedules balanced_cut
    python graphs/nomad_bm_steps.py --plot-only

Rows are merged into nomad_bm_steps.json (a rerun replaces its own rows); the plot is
nomad_bm_steps.png.  The data sets are graphs/quality.py's and seed-0 subsets of
10,000 and 20,000 MNIST digits.
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
from quality import DATASETS, _machine, _mnist  # noqa: E402

DATASETS = dict(DATASETS, mnist_10k=lambda: _mnist(10_000), mnist_20k=lambda: _mnist(20_000))
DEFAULT_DATASETS = ("rings", "unequal_blobs", "digits", "satimage", "mnist_5k", "mnist_10k")
UNCUT = 15000             # inexact_max_iter = inner_max_iter: inexact steps end on inner_rtol alone
SCHEDULES = {
    "paper_uncut": ("paper start, uncut", {"balance": False, "inexact_max_iter": UNCUT}),
    "balanced_uncut": ("balanced, uncut", {"balance": True, "inexact_max_iter": UNCUT}),
    "paper_cut": ("paper start, cut at 50", {"balance": False, "inexact_max_iter": 50}),
    "balanced_cut50": ("balanced, cut at 50", {"inexact_max_iter": 50}),
    "balanced_cut": ("balanced, cut (default)", {}),
}
BASELINE = "paper_uncut"


def _run_one(dataset, schedule, queue):
    from sklearn.metrics import adjusted_rand_score

    import dnomad

    X, y = DATASETS[dataset]()
    X = np.asarray(X, dtype=np.float64)
    k = int(len(np.unique(y)))
    est = dnomad.NOMAD(k, solver="bm", random_state=0, solver_options=SCHEDULES[schedule][1])
    with ResidentPeak() as peak:
        t = time.perf_counter()
        est.fit(X)
        seconds = time.perf_counter() - t
    history = est.history_
    first = history[0]
    queue.put({"ari": float(adjusted_rand_score(y, est.labels_)), "objective": float(est.objective_),
               "outer_steps": len(history), "evaluations": int(sum(r["evaluations"] for r in history)),
               "first_step_evaluations": int(first["evaluations"]), "first_step_seconds": float(first["seconds"]),
               "stop_reason": est.stop_reason_, "seconds": seconds, "peak_mib": peak.peak_above_start / 2**20,
               "start_seconds": est.layers_[0]["start"]["seconds"],
               "n": int(len(X)), "d": int(X.shape[1]), "k": k, "sdp_k": int(est.sdp_k_)})


def run(dataset, schedule, timeout):
    row = {"dataset": dataset, "schedule": schedule, "options": SCHEDULES[schedule][1], "commit": code_commit()}
    status, out, _ = run_in_fresh_process(_run_one, (dataset, schedule), timeout)
    return dict(row, status=status, **(out or {}))


def _ok(result, dataset):
    return {r["schedule"]: r for r in result["rows"] if r["dataset"] == dataset and r["status"] == "ok"}


def table(result):
    lines = ["| data set | schedule | ARI | objective / best | outer steps | evaluations (first step) | seconds "
             "(first step) | seconds / paper start's | evaluations / paper start's |",
             "|---|---|---|---|---|---|---|---|---|"]
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in result["rows"])]
    for d in datasets:
        ok = _ok(result, d)
        best = max((r["objective"] for r in ok.values()), default=np.nan)
        base = ok.get(BASELINE)
        for s in SCHEDULES:
            r = next((r for r in result["rows"] if r["dataset"] == d and r["schedule"] == s), None)
            if r is None:
                continue
            if r["status"] != "ok":
                lines.append(f"| {d} | {SCHEDULES[s][0]} | {r['status']} | | | | | | |")
                continue
            ratio_s = f"{r['seconds'] / base['seconds']:.2f}" if base else ""
            ratio_e = f"{r['evaluations'] / base['evaluations']:.2f}" if base else ""
            lines.append(f"| {d} (n {r['n']}, sdp_k {r['sdp_k']}) | {SCHEDULES[s][0]} | {r['ari']:.3f} | "
                         f"{r['objective'] / best:.5f} | {r['outer_steps']} | {r['evaluations']} "
                         f"({r['first_step_evaluations']}) | {r['seconds']:.1f} ({r['first_step_seconds']:.1f}) | "
                         f"{ratio_s} | {ratio_e} |")
    return "\n".join(lines)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in result["rows"])]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    width = 0.8 / len(SCHEDULES)
    x = np.arange(len(datasets))
    for j, s in enumerate(SCHEDULES):
        secs, objs = [], []
        for d in datasets:
            ok = _ok(result, d)
            best = max((r["objective"] for r in ok.values()), default=np.nan)
            r = ok.get(s)
            secs.append(r["seconds"] if r else np.nan)
            objs.append(1 - r["objective"] / best if r else np.nan)
        axes[0].bar(x + j * width, secs, width, label=SCHEDULES[s][0])
        axes[1].bar(x + j * width, objs, width, label=SCHEDULES[s][0])
    for ax, title in zip(axes, ("fit seconds (2 cores)", "1 - objective / best of the five")):
        ax.set_xticks(x + 0.4 - width / 2)
        ax.set_xticklabels(datasets, fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].set_yscale("log")
    axes[1].set_yscale("symlog", linthresh=1e-5)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"graphs/nomad_bm_steps.py: NOMAD bm's start and multiplier steps "
                 f"({result['environment']['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS), help="comma-separated")
    p.add_argument("--schedules", default=",".join(SCHEDULES), help=f"comma-separated, of {list(SCHEDULES)}")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--plot-only", action="store_true")
    args = p.parse_args(argv)
    unknown = sorted(set(args.schedules.split(",")) - set(SCHEDULES)) + sorted(
        set(args.datasets.split(",")) - set(DATASETS))
    if unknown:
        p.error(f"unknown schedules or data sets: {unknown}")
    path = os.path.join(HERE, "nomad_bm_steps.json")
    result = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    if not args.plot_only:
        result["environment"] = _machine()
        command = "python graphs/nomad_bm_steps.py " + " ".join(argv if argv is not None else sys.argv[1:])
        for dataset in args.datasets.split(","):
            for schedule in args.schedules.split(","):
                merge_row(path, result, dict(run(dataset, schedule, args.timeout), command=command),
                          lambda r: (r["dataset"], r["schedule"]))
    print(table(result))
    plot(result, os.path.join(HERE, "nomad_bm_steps.png"))


if __name__ == "__main__":
    main()
