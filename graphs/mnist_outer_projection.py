"""How many outer iterations NOMAD needs on all 70,000 MNIST digits, projected from subsets
run to the stopping rule on the CPU.

    python graphs/mnist_outer_projection.py                     # n = 1750, 3500, 7000
    python graphs/mnist_outer_projection.py --sizes 1750 3500 --max-seconds 600

The GPU benchmark (graphs/gpu_nomad.py) runs all 70,000 digits with K = 256, about 273
images per cluster; a time cap stops it before the stopping rule.  The outer iterations
that the rule needs are a property of the problem, not of the device, so they are measured
here on stratified random subsets of MNIST with the same images per cluster
(K = round(n / 273.4)), float32, --solver block (dnomad's default: block Frank-Wolfe steps,
2 per outer iteration) or paper (Alg. 2's loop: 10 Frank-Wolfe steps to a vertex per outer
iteration), NOMAD's defaults otherwise, each to the authors' stopping
rule (RMSE of [Q]_- <= 1e-4, |min Q| <= 1e-2 K / n) or a time cap per size.  The slow part
is the max violation |min Q| n / K reaching 0.01; for each of the levels 0.3, 0.1, 0.03 and
0.01 that three or more sizes reach, a power law in n fitted to the outer iterations to first
reach it gives the projection for n = 70,000, and times the GPU's seconds per outer
iteration (graphs/gpu_nomad.json) the projected GPU time.  Writes
graphs/mnist_outer_projection.json and .png for --solver paper, mnist_outer_projection_block.*
for block (--plot-only recomputes them from the json).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
from _bench import code_commit, write_result

import dnomad

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "mnist_outer_projection"


def result_name(solver):
    """The paper's loop keeps the original file name (its runs are quoted as such)."""
    return NAME if solver == "paper" else f"{NAME}_{solver}"
N_FULL = 70_000
K_FULL = 256
PER_CLUSTER = N_FULL / K_FULL


def stratified_subset(y, n, seed=0):
    """n indices drawn from every digit in proportion to its count."""
    rng = np.random.default_rng(seed)
    picks = []
    for digit in np.unique(y):
        members = np.flatnonzero(y == digit)
        take = int(round(n * len(members) / len(y)))
        picks.append(rng.choice(members, take, replace=False))
    return np.sort(np.concatenate(picks))


# The solvers' settings: "paper" is Alg. 2 as the authors run it (10 Frank-Wolfe steps to
# the vertex per outer iteration); "block" is dnomad's default (block steps, n_inner 2).
SOLVERS = {"paper": dict(direction="vertex", lagrangian="paper", n_inner=10, tau="scale"),
           "block": {}}


def run_size(X, y, n, max_seconds, solver="block", stop_at=None):
    idx = stratified_subset(y, n)
    Xs, ys = X[idx], y[idx]
    K = max(2, int(round(len(idx) / PER_CLUSTER)))
    t0 = time.perf_counter()

    def stop(row):
        reached = stop_at is not None and row["max_violation"] <= stop_at
        return reached or time.perf_counter() - t0 > max_seconds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = dnomad.NOMAD(n_clusters=K, backend="local", device="cpu", max_iter=100000, callback=stop,
                           **SOLVERS[solver],
                           label_method="spectral", n_groups=10, random_state=0).fit(Xs)
    h = est.history_
    row = {"n": len(idx), "K": K, "solver": solver, "n_inner": est.n_inner, "outer_iterations": est.n_iter_,
           "stop_reason": est.stop_reason_,
           "seconds": time.perf_counter() - t0, "passes": est.passes_["passes"],
           "objective": h[-1]["objective"], "rmse_neg": h[-1]["rmse_neg"], "max_violation": h[-1]["max_violation"],
           "ari_spectral10": dnomad.metrics.adjusted_rand_score(ys, est.labels_),
           "max_violation_history": [r["max_violation"] for r in h],
           "passes_history": np.cumsum([r["passes"] for r in h]).tolist(),
           "rmse_neg_history": [r["rmse_neg"] for r in h]}
    print(json.dumps({k: v for k, v in row.items() if not k.endswith("_history")}), flush=True)
    return row


# Levels of the max violation (|min Q| n / K); the stopping rule is the last.
LEVELS = (0.3, 0.1, 0.03, 0.01)


def first_below(history, level):
    """The first outer iteration (1-based) whose max violation is <= level, or None."""
    hits = np.flatnonzero(np.asarray(history) <= level)
    return int(hits[0]) + 1 if len(hits) else None


def project(runs):
    """For each level of the max violation that at least three runs reached: the outer
    iterations to first reach it, a least-squares power law a n^b over the runs, and its
    value at n = 70,000 (times the GPU's seconds per outer iteration, where measured)."""
    seconds_per_outer, seconds_per_pass, code, device = None, None, None, None
    gpu = os.path.join(HERE, "gpu_nomad.json")
    solver = runs[0].get("solver", "paper")
    if os.path.exists(gpu):
        from gpu_nomad import row_device

        with open(gpu) as f:
            saved = json.load(f)
        mnist = saved.get(f"mnist_{solver}") or {}          # the GPU row of the same solver
        seconds_per_outer, code = mnist.get("seconds_per_outer"), mnist.get("code")
        device = row_device(saved, f"mnist_{solver}") if mnist else None
        if mnist.get("passes"):     # fused and eigensolver passes alike, over n = 70,000
            seconds_per_pass = mnist["solve_seconds"] / mnist["passes"]
        # An outer iteration's cost depends on its inner steps (rows before the option: 10).
        if mnist and mnist.get("n_inner", 10) != runs[0].get("n_inner", 10):
            seconds_per_outer, code = None, f"GPU row ran {mnist.get('n_inner', 10)} inner steps: not comparable"
    out = {"gpu_seconds_per_outer": seconds_per_outer, "gpu_seconds_per_pass": seconds_per_pass,
           "gpu_code": code, "gpu_device": device, "levels": {}}
    for level in LEVELS:
        pts = [(r["n"], first_below(r["max_violation_history"], level), r.get("passes_history")) for r in runs]
        pts = [(n, it, ph) for n, it, ph in pts if it is not None]
        entry = {"iterations": {str(n): it for n, it, _ in pts}}
        if len(pts) >= 3:          # two noisy first crossings make no trend
            n, it = np.array([p[:2] for p in pts], float).T
            b, log_a = np.polyfit(np.log(n), np.log(it), 1)
            entry.update(exponent=float(b), coefficient=float(np.exp(log_a)),
                         at_70000=float(np.exp(log_a) * N_FULL ** b))
            if seconds_per_outer:
                entry["gpu_minutes_at_70000"] = entry["at_70000"] * seconds_per_outer / 60
            if all(p[2] for p in pts):
                # Passes to the level, and the GPU's measured seconds per pass (a pass at
                # n = 70,000 costs the same whichever step it serves).
                passes = np.array([p[2][p[1] - 1] for p in pts], float)
                bp, log_ap = np.polyfit(np.log(n), np.log(passes), 1)
                entry.update(passes={str(int(k)): int(v) for k, v in zip(n, passes)}, passes_exponent=float(bp),
                             passes_at_70000=float(np.exp(log_ap) * N_FULL ** bp))
                if seconds_per_pass:
                    entry["gpu_minutes_at_70000_from_passes"] = entry["passes_at_70000"] * seconds_per_pass / 60
        out["levels"][str(level)] = entry
    return out


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    ax = axes[0]
    runs = result["runs"]
    for r in runs:
        ax.semilogy(np.arange(1, len(r["max_violation_history"]) + 1), r["max_violation_history"],
                    label=f"n = {r['n']}, K = {r['K']}")
    ax.axhline(0.01, color="k", lw=0.8, ls="--")
    ax.set_xlabel("outer iteration")
    ax.set_ylabel("max violation (|min Q| n / K); rule: 0.01")
    ax.set_title(f"MNIST subsets, 273 images per cluster, {runs[0].get('solver', 'paper')} steps, "
                 f"{runs[0].get('n_inner', 10)} per outer iteration (CPU)",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    p = result["projection"]
    grid = np.geomspace(min(r["n"] for r in runs), N_FULL, 50)
    for level, entry in p["levels"].items():
        pts = sorted((int(n), it) for n, it in entry["iterations"].items())
        if not pts:
            continue
        line, = ax.loglog(*zip(*pts), "o", label=f"max violation <= {level}")
        if "exponent" in entry:
            ax.loglog(grid, entry["coefficient"] * grid ** entry["exponent"], "-", color=line.get_color(),
                      lw=0.8, label=f"  n^{entry['exponent']:.2f}: {entry['at_70000']:.0f} at 70,000")
    capped = [r for r in runs if r["stop_reason"] != "tolerance"]
    if capped:
        ax.set_title("stopped by the time cap before the rule: n = "
                     + ", ".join(str(r["n"]) for r in capped), fontsize=9)
    ax.set_xlabel("n")
    ax.set_ylabel("outer iterations to first reach the level")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1750, 3500, 7000])
    ap.add_argument("--max-seconds", type=float, default=900.0, help="cap per size")
    ap.add_argument("--solver", choices=sorted(SOLVERS), default="block",
                    help="block: dnomad's default steps; paper: Alg. 2's loop, 10 Frank-Wolfe steps")
    ap.add_argument("--stop-at", type=float, default=None,
                    help="also stop a size when its max violation reaches this (a level, not the rule)")
    ap.add_argument("--out", default=HERE, help="folder for the json and png (default: beside this script)")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:        # the projection is recomputed from the saved runs
        with open(os.path.join(args.out, f"{result_name(args.solver)}.json")) as f:
            result = json.load(f)
        result["projection"] = project(result["runs"])
        write_result(args.out, result_name(args.solver), result, plot)
        return
    X, y = dnomad.data.mnist()
    code = code_commit()            # before the runs: the tree may move during an hour's run
    runs = [run_size(X, y, n, args.max_seconds, args.solver, args.stop_at) for n in args.sizes]
    result = {"runs": runs, "projection": project(runs), "per_cluster": PER_CLUSTER,
              "cpu_count": os.cpu_count(), "code": code}
    print(json.dumps(result["projection"]), flush=True)
    write_result(args.out, result_name(args.solver), result, plot)


if __name__ == "__main__":
    main()
