"""Performance profiles of HOTTOPIXX against the exact LP (Bittorf et al. 2012, Fig. 2).

Synthetic instances of the paper's Sec. 5 (``dnomad.data.separable_nmf``): r hott topics
on the simplex, each repeated d more times, the other rows random convex combinations,
noise whose (inf,1)-norm is the paper's bound eta alpha^2 / (20 + 13 alpha) (each row keeps
the realized norm, ``noise_norm``; at eta = 100, where the bound exceeds what the simplex
holds, X is the noise alone and its norm below the bound).  Methods:

* ``hott``: Alg. 4, 50 epochs, s_p = 0.1, s_d = 0.01, hott rows by candidate groups
  (dnomad's default);
* ``hott (fast)``: the same with 4 epochs (the paper's "hott (fast)");
* ``hott (diag rule)``: 50 epochs with the r largest diagonal entries (Alg. 4 line 11);
* ``LP``: Alg. 3 solved exactly by HiGHS with tau = 2 epsilon (the paper used CVX + SDPT3,
  "prohibitively slow to factor larger matrices"), its hott rows the r largest entries of
  diag C as the paper reads them, given --lp-seconds (default 300): past
  them it did not finish, which the profiles count as a failure (Dolan & More: never
  within any factor of the best) and the tables report;
* ``AGKM``: Alg. 1 (``dnomad.hottopixx.agkm``) told the instance's epsilon and alpha, as the
  paper ran it (it cannot run without them); it finds as many hott rows as its clusters,
  which past eta = 1 is fewer than the rank.

A method that fails on an instance (an LP HiGHS solves by neither simplex nor interior
point) is recorded as not finishing there, with the message, and the run goes on.

Every method's F is fitted the same way (dnomad's cleaning epochs), as the paper did
for all of its methods, so the profiles compare the hott rows chosen; time is the whole
run.  The profile of a method at t is the fraction of instances whose value is within a
factor t of the best method's (Dolan & More).

    python graphs/hottopixx_profiles.py --hours 2       # run the grid for two hours, then stop
    python graphs/hottopixx_profiles.py --hours 2       # ... and continue where it stopped
    python graphs/hottopixx_profiles.py --plot-only     # tables and plot from what is done
    python graphs/hottopixx_profiles.py --hours 2 --lp-seconds 600   # give the LP longer

The grid is the paper's: f in {40, 80, 160}, n in {400, 800, 1600}, r in {3, 5, 10},
d in {0, 1, 2}, eta in {0.25, 0.95, 4, 10, 100}, 405 settings, each repeated 5 times (2,025
instances, each with a seed of its own).  Every finished instance is appended at once to
graphs/hottopixx_profiles_runs.jsonl; a run skips the instances already there, so a long
run can be stopped (or cut by --hours) and continued later.  Instances go in repeat order
(every setting once before any twice), smaller shapes first within a repeat, so a partial
run covers the grid as evenly as it can.  The tables and the plot cover what is done and
say how much that is.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import code_commit, replot, write_result  # noqa: E402

METHODS = ("hott", "hott (fast)", "hott (diag rule)", "LP", "AGKM")
LP_SECONDS = 300.0           # the LP's time limit per instance (--lp-seconds)
ETAS = (0.25, 0.95, 4.0, 10.0, 100.0)


SHAPES = [(f, n) for f in (40, 80, 160) for n in (400, 800, 1600)]
RANKS = (3, 5, 10)
DUPLICATES = (0, 1, 2)
REPEATS = 5
RUNS_FILE = os.path.join(HERE, "hottopixx_profiles_runs.jsonl")


def grid():
    """Every instance of the paper's grid as (f, n, r, d, eta, seed), in the order they run:
    repeat by repeat, each repeat over the 405 settings by size (f n) then r, d, eta.  The
    seed numbers the instance in a fixed enumeration, so it does not depend on the order."""
    settings = [(f, n, r, d, eta) for f, n in SHAPES for r in RANKS for d in DUPLICATES for eta in ETAS]
    cases = [(*setting, REPEATS * i + rep) for i, setting in enumerate(settings) for rep in range(REPEATS)]
    return sorted(cases, key=lambda c: (c[5] % REPEATS, c[0] * c[1], c[0], c[2], c[3], c[4]))


def load_runs():
    """The finished instances recorded so far, by case."""
    import json

    runs = {}
    if os.path.exists(RUNS_FILE):
        with open(RUNS_FILE) as fh:
            for line in fh:
                if line.strip():
                    r = json.loads(line)
                    runs[tuple(r["case"])] = r
    return runs


def run_case(case, lp_seconds=LP_SECONDS):
    from dnomad import blocks
    from dnomad.errors import LPFailedError, TimeLimitError
    from dnomad.data import separable_nmf
    from dnomad.metrics import inf1_norm
    from dnomad.hottopixx import solver as H
    from dnomad.hottopixx.agkm import agkm

    f, n, r, d, eta, seed = case
    inst = separable_nmf(f, n, r, duplicates=d, noise=eta, random_state=seed)
    data = blocks.feature_columns(inst["X"])
    X = data.rows(np.arange(f))
    out = {"case": list(case), "epsilon": inst["epsilon"], "alpha": inst["alpha"],
           "noise_norm": float(inf1_norm(X - inst["F"] @ inst["W"]))}
    settings = {"hott": {}, "hott (fast)": {"n_epochs": 4}, "hott (diag rule)": {"selection": "diagonal"}}
    for name, kw in settings.items():
        def run_hott(kw=kw):
            res = H.hottopixx(data, H.HottopixxParams(rank=r, **kw), random_state=seed)
            return res.hott_rows, res.F
        out[name] = _timed(run_hott, X, inst, inf1_norm, LPFailedError)
    cost = np.random.default_rng(seed).permutation(f) / f

    def run_lp():
        C = H.exact_lp(X, r, 2 * inst["epsilon"], cost, time_limit=lp_seconds)
        hott = H.hott_rows_from_diagonal(np.diagonal(C), r)
        return hott, H.fit_components(data, hott, H.HottopixxParams(rank=r), C=C, rng=np.random.default_rng(seed))

    def run_agkm():
        hott = agkm(X, inst["epsilon"], inst["alpha"]).hott_rows
        return hott, H.fit_components(data, hott, H.HottopixxParams(rank=max(len(hott), 1)),
                                      rng=np.random.default_rng(seed))

    out["LP"] = _timed(run_lp, X, inst, inf1_norm, LPFailedError, TimeLimitError)
    out["LP"]["time_limit"] = lp_seconds
    out["AGKM"] = _timed(run_agkm, X, inst, inf1_norm, LPFailedError)
    print(f"f={f} n={n} r={r} d={d} eta={eta:g}: " + "  ".join(
        f"{m} {out[m]['error']:.3g}/{out[m]['seconds']:.2f}s" if finished(out, m, lp_seconds)
        else f"{m} failed ({out[m]['failure']})" if "failure" in out[m]
        else f"{m} did not finish in {lp_seconds:g} s" for m in METHODS), flush=True)
    return out


def _timed(run, X, inst, inf1_norm, failed, stopped=None):
    """Score ``run`` () -> (hott rows, F), timed.  ``failed`` (an LP HiGHS could not solve)
    or ``stopped`` (the LP's time limit) is recorded as the method not finishing on this
    instance, not the end of the grid run: a failure with its message (``failure``, which
    the summary counts), a stop with its own (``stopped``).  Any other error is a bug and
    ends the run, so no row records it and a later run retries the instance."""
    t = time.perf_counter()
    try:
        hott, F = run()
    except (failed,) + ((stopped,) if stopped else ()) as exc:
        key = "failure" if isinstance(exc, failed) else "stopped"
        return {"finished": False, "error": None, "rmse": None, "seconds": time.perf_counter() - t,
                "recovered": False, "n_hott": 0, key: f"{type(exc).__name__}: {exc}"}
    return _scores(hott, F, X, inst, time.perf_counter() - t, inf1_norm)


def _scores(hott, F, X, inst, seconds, inf1_norm):
    R = X - F @ X[hott]
    return {"error": float(inf1_norm(R)), "rmse": float(np.sqrt((R ** 2).mean())), "seconds": seconds,
            "recovered": bool(len(hott) == len(inst["hott"])
                              and set(inst["copies"][hott]) == set(range(len(inst["hott"])))),
            "n_hott": int(len(hott))}


def finished(row, method, lp_seconds):
    """Whether ``method`` finished on an instance (``row``): not where it failed, and the
    LP only within ``lp_seconds`` (rows timed under a longer limit, or none, are cut to it,
    so every row has the same limit)."""
    score = row[method]
    return score.get("finished", True) and (method != "LP" or score["seconds"] <= lp_seconds)


def identifiable(row):
    """eta <= 0.95: the hott rows are identifiable and AGKM is guaranteed (Theorem 2.3)."""
    return row["case"][4] <= 0.95


def recovered_count(rows, method, lp_seconds):
    """Of the ``rows`` with identifiable hott rows that ``method`` finished on: how many
    it recovered every hott topic on, and how many there were."""
    ran = [r for r in rows if identifiable(r) and finished(r, method, lp_seconds)]
    return sum(r[method]["recovered"] for r in ran), len(ran)


def values(rows, key, lp_seconds):
    """(instances, methods) array of ``key``; inf where a method did not finish."""
    return np.array([[r[m][key] if finished(r, m, lp_seconds) else np.inf for m in METHODS] for r in rows],
                    dtype=np.float64)


def profile(values, ts):
    """values: (instances, methods) -> (len(ts), methods) fraction within t of the best."""
    best = values.min(axis=1, keepdims=True)
    ratio = values / np.maximum(best, 1e-300)
    return np.array([(ratio <= t).mean(axis=0) for t in ts])


def summarize(result, lp_seconds=LP_SECONDS):
    rows = result["runs"]
    lp = METHODS.index("LP")
    table = []
    for key in ("error", "seconds"):
        V = values(rows, key, lp_seconds)
        # Ratios to the LP where it finished; the profile's "best" over every instance.
        with_lp = V[np.isfinite(V[:, lp])]
        for j, m in enumerate(METHODS):
            ratio = with_lp[:, j] / with_lp[:, lp] if len(with_lp) else np.array([np.nan])
            done = V[np.isfinite(V[:, j]), j]
            table.append((key, m, float(np.median(ratio)), float(np.mean(ratio <= 1.5)),
                          float(profile(V, [1.0])[0, j]), float(np.median(done)) if len(done) else float("nan")))
    by_shape = shape_table(rows, lp_seconds)
    done = ", ".join(f"{shape}: {e['instances']}" for shape, e in by_shape.items())
    lp_unfinished = {shape: e["instances"] - e["lp_finished"] for shape, e in by_shape.items()
                     if e["lp_finished"] < e["instances"]}
    total = len(grid())
    codes = dict(Counter(r.get("code") or "unrecorded" for r in rows))
    n_lp = len(rows) - sum(lp_unfinished.values())
    print(f"\n{len(rows)} of {total} instances done ({done}); ratios to the exact LP on the {n_lp} "
          f"instances where it finished in {lp_seconds:g} s"
          + (f" (it did not on {sum(lp_unfinished.values())}: " + ", ".join(f"{k}: {c}" for k, c in
                                                                         lp_unfinished.items()) + ")"
             if lp_unfinished else ""))
    print("instances by the commit that ran them: " + ", ".join(f"{c}: {k}" for c, k in codes.items()))
    # The generator puts the noise at eps, eta's bound (below it only where eps exceeds
    # what the simplex holds, eta = 100): the realized (inf,1)-norm over eps, by eta.
    noise_over_eps = {str(eta): float(np.median([r["noise_norm"] / r["epsilon"] for r in rows
                                                  if r["case"][4] == eta]))
                      for eta in ETAS if any(r["case"][4] == eta for r in rows)}
    print("noise's (inf,1)-norm / epsilon, median by eta: "
          + ", ".join(f"{k}: {v:.3g}" for k, v in noise_over_eps.items()))
    print(f"{'metric':8s} {'method':18s} {'median ratio':>13s} {'<= 1.5 LP':>10s} {'best':>6s} {'median':>10s}")
    for key, m, med, within, best, median in table:
        print(f"{key:8s} {m:18s} {med:13.3g} {within:10.2f} {best:6.2f} {median:10.3g}")
    recovered, recovered_over = {}, {}
    for m in METHODS:
        count, over = recovered_count(rows, m, lp_seconds)
        rec = count / over if over else float("nan")
        recovered[m], recovered_over[m] = rec, over
        print(f"hott rows recovered (eta <= 0.95): {m:18s} {rec:.2f} of {over}")
    # Past eta = 1 AGKM finds fewer hott rows than the rank (its clusters merge): its error range there.
    agkm_high = [r["AGKM"]["error"] for r in rows if r["case"][4] > 1 and finished(r, "AGKM", lp_seconds)]
    failures = {m: sum("failure" in r[m] for r in rows) for m in METHODS}
    if any(failures.values()):
        print("failed (an LP HiGHS could not solve; counted as not finishing): "
              + ", ".join(f"{m}: {k}" for m, k in failures.items() if k))
    lp_done = [r["LP"]["seconds"] for r in rows if finished(r, "LP", lp_seconds)]
    extremes = {"lp_max_finished_seconds": max(lp_done, default=float("nan")),
                "agkm_max_seconds": max((r["AGKM"]["seconds"] for r in rows if finished(r, "AGKM", lp_seconds)),
                                        default=float("nan")),
                "agkm_eta_gt_1": {"instances": len(agkm_high), "error_min": min(agkm_high, default=float("nan")),
                                  "error_max": max(agkm_high, default=float("nan"))}}
    print_shape_table(by_shape, lp_seconds)
    print(f"longest finished LP {extremes['lp_max_finished_seconds']:.0f} s; longest AGKM "
          f"{extremes['agkm_max_seconds']:.0f} s; AGKM's error past eta = 1: "
          f"{extremes['agkm_eta_gt_1']['error_min']:.2f}-{extremes['agkm_eta_gt_1']['error_max']:.2f} "
          f"on {len(agkm_high)}")
    return {"instances_done": len(rows), "instances_total": total, "by_shape": done, "by_commit": codes,
            "noise_over_epsilon": noise_over_eps, "lp_seconds": lp_seconds, "lp_finished": n_lp,
            "lp_unfinished_by_shape": lp_unfinished,
            "table": [dict(zip(("metric", "method", "median_ratio_to_LP", "within_1.5_LP", "best", "median"), t))
                      for t in table],
            "recovered_eta_le_0.95": recovered, "recovered_eta_le_0.95_over": recovered_over, **extremes,
            "failures": failures,
            "by_shape_table": by_shape}


def shape_table(rows, lp_seconds):
    """Per shape (f x n): the instances done and how many the LP finished; each method's
    median seconds over them all (the LP's unfinished ones count as past its limit, so its
    median is exact where it is under the limit, and None where half or more did not
    finish); and, at eta <= 0.95 (where the hott rows are identifiable and AGKM is
    guaranteed), the median over instances of hott's error over AGKM's and, of the
    instances hott finished on, how many it recovered, apart for the instances where the
    LP finished and where it did not; and each method's range of seconds apart at
    eta <= 0.95 and past it (AGKM's time depends on eta: a median can fall among either)."""
    out = {}
    for f, n in sorted({tuple(r["case"][:2]) for r in rows}):
        here = [r for r in rows if r["case"][:2] == [f, n]]
        seconds = values(here, "seconds", lp_seconds)
        medians = np.median(seconds, axis=0)
        entry = {"instances": len(here), "lp_finished": int(np.isfinite(seconds[:, METHODS.index("LP")]).sum()),
                 "median_seconds": {m: float(t) if np.isfinite(t) else None for m, t in zip(METHODS, medians)},
                 "hott_over_agkm_error_median": {}, "hott_recovered": {}}
        for name, lp_done in (("lp_finished", True), ("lp_unfinished", False)):
            low = [r for r in here if identifiable(r) and finished(r, "LP", lp_seconds) == lp_done]
            both = [r for r in low if finished(r, "hott", lp_seconds) and finished(r, "AGKM", lp_seconds)]
            entry["hott_over_agkm_error_median"][name] = (
                float(np.median([r["hott"]["error"] / max(r["AGKM"]["error"], 1e-300) for r in both]))
                if both else None)
            entry["hott_recovered"][name] = "{} of {}".format(*recovered_count(low, "hott", lp_seconds))
        entry["seconds_range_by_eta"] = {}
        for m in METHODS:
            entry["seconds_range_by_eta"][m] = {}
            for name, low_eta in (("eta_le_0.95", True), ("eta_gt_0.95", False)):
                t = [r[m]["seconds"] for r in here
                     if identifiable(r) == low_eta and finished(r, m, lp_seconds)]
                entry["seconds_range_by_eta"][m][name] = [min(t), max(t)] if t else None
        out[f"{f}x{n}"] = entry
    return out


def print_shape_table(table, lp_seconds):
    print("median seconds by shape (the LP's unfinished counted as past its limit):")
    print(f"{'shape':9s} {'instances':>9s} {'LP done':>8s} " + " ".join(f"{m:>16s}" for m in METHODS))
    for shape, e in table.items():
        print(f"{shape:9s} {e['instances']:9d} {e['lp_finished']:8d} " + " ".join(
            f"{t:16.3g}" if t is not None else f"{'> ' + format(lp_seconds, 'g') if m == 'LP' else 'failed':>16s}"
            for m, t in e["median_seconds"].items()))


def plot(result, path, lp_seconds=LP_SECONDS):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["runs"]
    small = [r for r in rows if r["case"][:2] == [40, 400]]
    medium = [r for r in rows if r["case"][:2] != [40, 400]]
    high = [r for r in rows if r["case"][4] >= 1]
    panels = [("(inf,1) error, f=40 n=400", small, "error", np.linspace(1, 3, 200)),
              ("(inf,1) error, all instances", rows, "error", np.linspace(1, 3, 200)),
              ("time, all instances", rows, "seconds", np.logspace(0, 3, 200)),
              ("RMSE, f=40 n=400", small, "rmse", np.linspace(1, 3, 200)),
              ("RMSE, larger shapes", medium, "rmse", np.linspace(1, 3, 200)),
              ("(inf,1) error, eta >= 1", high, "error", np.linspace(1, 3, 200))]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.6))
    for ax, (title, subset, key, ts) in zip(axes, panels):
        if not subset:
            ax.set_title(f"{title} (none done yet)", fontsize=10)
            continue
        P = profile(values(subset, key, lp_seconds), ts)
        for j, m in enumerate(METHODS):
            ax.plot(ts, P[:, j], label=m, lw=1.8)
        if key == "seconds":
            ax.set_xscale("log")
        ax.set_title(f"{title} ({len(subset)})", fontsize=10)
        ax.set_xlabel("within a factor t of the best")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of instances")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    import json
    from concurrent.futures import FIRST_COMPLETED, wait

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--lp-seconds", type=float, default=LP_SECONDS,
                    help="the exact LP's time limit per instance; the tables and profiles cut every "
                         "row's LP to it (default %(default)g)")
    ap.add_argument("--hours", type=float, default=None,
                    help="start no instance after this long (the finished ones are kept; run again to go on)")
    args = ap.parse_args()
    done = load_runs()
    if not args.plot_only:
        todo = [c for c in grid() if c not in done]
        code = code_commit()          # each instance records it: timings move with the LP's form
        print(f"{len(done)} of {len(grid())} instances already in {os.path.basename(RUNS_FILE)}, "
              f"{len(todo)} to go", flush=True)
        deadline = time.perf_counter() + 3600 * args.hours if args.hours else float("inf")
        with ProcessPoolExecutor(args.processes) as pool, open(RUNS_FILE, "a") as log:
            pending, queue = set(), iter(todo)
            while True:
                while len(pending) < args.processes and time.perf_counter() < deadline:
                    case = next(queue, None)
                    if case is None:
                        break
                    pending.add(pool.submit(run_case, case, args.lp_seconds))
                if not pending:
                    break
                ready, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    r = fut.result()
                    r["code"] = code
                    log.write(json.dumps(r) + "\n")
                    log.flush()          # a kill loses at most the instances in flight
                    done[tuple(r["case"])] = r
    order = {c: i for i, c in enumerate(grid())}
    result = {"runs": sorted(done.values(), key=lambda r: order.get(tuple(r["case"]), 0)),
              "methods": list(METHODS)}
    if not result["runs"]:
        sys.exit("no instance done yet")
    summary = summarize(result, args.lp_seconds)
    write_result(HERE, "hottopixx_profiles", {"methods": list(METHODS), "summary": summary,
                                              "runs_file": os.path.basename(RUNS_FILE)},
                 lambda _, path: plot(result, path, args.lp_seconds))


if __name__ == "__main__":
    main()
