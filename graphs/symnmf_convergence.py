"""Simplicial SymNMF: Frank-Wolfe against the paper's baselines on its real data sets
(Zhao & Gordon 2018, Figs. 2 and 3), and the cost of one Frank-Wolfe iteration against
one pass over the same P.

    python graphs/symnmf_convergence.py                   # all of it (about 30 minutes)
    python graphs/symnmf_convergence.py --sets yeast --sizes 2000 4000 --cap 60

Everything in one run on one machine:
  * yeast (k = 10), satimage (k = 6), pendigits (k = 10 and the paper's 100), features
    scaled to [0, 1], Gaussian affinity with bandwidth 1 (the paper's), float64, in this process: Frank-Wolfe (exact
    line search), projected gradient with backtracking and the penalty method, from one
    random start, each until its stopping rule or the time cap.  Table: final f, time to
    come within 1% and 0.1% of the best f any of them found, passes over P, and the ratio
    of PGD's and the penalty method's times to Frank-Wolfe's.
  * Gaussian blobs, k = 10, float32, in memory, n = 2000 ... 20000: seconds per
    Frank-Wolfe iteration over seconds per pass P @ W (W: n x k, what PGD pays per trial
    step) and over a single matvec P @ v (the cheapest possible pass), and the FW
    iteration's effective bandwidth against the machine's numpy copy.
Writes graphs/symnmf_convergence.json and graphs/symnmf_convergence.png.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
from _bench import memory_bandwidth, replot, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = {"yeast": ("yeast", 10), "satimage": ("satimage", 6), "pendigits": ("pendigits", 10),
        "pendigits-100": ("pendigits", 100)}
SOLVERS = ("fw", "pgd", "penalty")


def run_set(name, cap):
    import dnomad
    from dnomad import blocks
    from dnomad.symnmf import solvers as S

    loader, k = SETS[name]
    X, y = getattr(dnomad.data, loader)()
    # Every feature min-max scaled to [0, 1], as in LIBSVM's scaled copies of these sets:
    # satimage's raw pixel values (0-255) and pendigits' (0-100) make exp(-||x_i - x_j||^2)
    # the identity matrix to machine precision at the paper's bandwidth 1.
    lo, hi = X.min(axis=0), X.max(axis=0)
    X = (X - lo) / np.where(hi > lo, hi - lo, 1.0)
    n = len(X)
    P = blocks.gaussian_affinity(X, 1.0, dtype=np.float64, backend="local")
    fro2 = P.summary()["fro"] ** 2
    W0 = S.random_simplex_rows(n, k, np.random.default_rng(0))
    out = {"n": n, "k": k, "fro2": fro2, "runs": {}}
    for solver in SOLVERS:
        t0 = time.perf_counter()

        def stop_at_cap(row):
            return time.perf_counter() - t0 > cap

        params = S.SymNMFParams(n_components=k, max_iter=100000 if solver != "penalty" else 50,
                                tol=1e-6)
        with warnings.catch_warnings(), blocks.single_threaded_blas():
            warnings.simplefilter("ignore")
            res = S.solve(solver, P, W0, params, fro2=fro2, callback=stop_at_cap)
        out["runs"][solver] = {
            "objective": res.objective, "gap": res.gap, "stop_reason": res.stop_reason,
            "n_iter": res.n_iter, "passes": res.passes, "seconds": time.perf_counter() - t0,
            "ari": dnomad.metrics.adjusted_rand_score(y, np.argmax(res.W, axis=1)),
            "trace": [(r["seconds"], r["objective"]) for r in res.history]}
    P.group.close()
    best = min(r["objective"] for r in out["runs"].values())
    for r in out["runs"].values():
        for tag, rel in (("t_1pct", 1e-2), ("t_01pct", 1e-3)):
            # The penalty method's iterates are infeasible: only its final, projected W counts.
            trace = r["trace"] if r is not out["runs"]["penalty"] else [(r["seconds"], r["objective"])]
            hit = [s for s, f in trace if f <= best * (1 + rel)]
            r[tag] = hit[0] if hit else None
    out["best"] = best
    for r in out["runs"].values():
        r["trace"] = thin(r["trace"])
    return out


def thin(trace, keep=400):
    """At most ~``keep`` points, spaced evenly in log(iteration), the last one kept."""
    if len(trace) <= keep:
        return trace
    idx = np.unique(np.geomspace(1, len(trace), keep).astype(int) - 1)
    return [trace[0]] + [trace[i] for i in idx if i > 0]


def iteration_cost(n, k, bandwidth):
    from dnomad import blocks
    from dnomad.data import gaussian_blobs
    from dnomad.symnmf import solvers as S

    X, _ = gaussian_blobs(n, n_centers=k, separation=4.0, random_state=0)
    X = X[np.random.default_rng(0).permutation(n)]      # no order a kernel could exploit
    P = blocks.gaussian_affinity(X, 4.0, dtype=np.float32, backend="local")
    fro2 = P.summary()["fro"] ** 2
    W0 = S.random_simplex_rows(n, k, np.random.default_rng(0))
    v = np.ones(n)
    with blocks.single_threaded_blas():
        P.matmat(v)
        P.matmat(W0)
        t = time.perf_counter()
        for _ in range(5):
            P.matmat(v)
        matvec = (time.perf_counter() - t) / 5
        t = time.perf_counter()
        for _ in range(3):
            P.matmat(W0)
        matmat = (time.perf_counter() - t) / 3
        res = S.frank_wolfe(P, W0, S.SymNMFParams(n_components=k, max_iter=40, tol=0), fro2=fro2)
    h = res.history
    fw = (h[-1]["seconds"] - h[10]["seconds"]) / (len(h) - 11)
    nbytes = P.group.matrix_nbytes
    P.group.close()
    return {"n": n, "k": k, "fw_iteration": fw, "matmat": matmat, "matvec": matvec,
            "fw_over_matmat": fw / matmat, "fw_over_matvec": fw / matvec,
            "fw_GBps": nbytes / fw / 1e9, "fw_efficiency": nbytes / fw / bandwidth}


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    sets = list(result["sets"])
    fig, axes = plt.subplots(3, max(len(sets), 1), figsize=(4.2 * max(len(sets), 1), 11), squeeze=False)
    for col, name in enumerate(sets):
        res = result["sets"][name]
        ax, ax2 = axes[0, col], axes[1, col]
        for solver, style in zip(SOLVERS, ("o-", "s-", "^-")):
            r = res["runs"][solver]
            s = np.array([max(p[0], 1e-3) for p in r["trace"]])
            f = np.array([p[1] for p in r["trace"]])
            ax.loglog(s, f, style, ms=2, lw=1, label=f"{solver} (final {r['objective']:.5g})")
            if solver != "penalty":
                gap = f - r["objective"]
                keep = gap > 0
                ax2.loglog(s[keep], gap[keep], style, ms=2, lw=1, label=solver)
        ax.set_title(f"{name}: n={res['n']}, k={res['k']}")
        ax.set_xlabel("seconds")
        ax.set_ylabel("f (penalty: infeasible iterates)")
        ax.legend(fontsize=7)
        ax2.set_xlabel("seconds")
        ax2.set_ylabel("f - f* (f*: the run's own final f)")
        ax2.legend(fontsize=7)
    for col in range(1, axes.shape[1]):
        axes[2, col].axis("off")
    ax = axes[2, 0]
    rows = result["iteration_cost"]
    if rows:
        ns = [r["n"] for r in rows]
        ax.semilogx(ns, [r["fw_over_matmat"] for r in rows], "o-", label="FW iteration / pass P @ W")
        ax.semilogx(ns, [r["fw_over_matvec"] for r in rows], "s-", label="FW iteration / matvec P @ v")
        ax.axhline(1.3, color="k", ls="--", lw=1, label="target 1.3")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("n (blobs, k=10, float32)")
        ax.set_ylabel("time ratio")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="*", default=list(SETS))
    ap.add_argument("--cap", type=float, default=240.0, help="seconds per solver run")
    ap.add_argument("--sizes", type=int, nargs="*", default=[2000, 4000, 8000, 16000, 20000])
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "symnmf_convergence", plot)
        return
    bandwidth = memory_bandwidth()
    print(f"memory bandwidth (numpy copy, read + write): {bandwidth / 1e9:.1f} GB/s", flush=True)
    result = {"bandwidth_GBps": bandwidth / 1e9, "sets": {}, "iteration_cost": [],
              "cpu_count": len(os.sched_getaffinity(0))}
    print(f"\n{'set':14s} {'solver':8s} {'stop':9s} {'iters':>6s} {'passes':>7s} {'seconds':>8s} "
          f"{'f':>11s} {'f/best':>8s} {'t(1%)':>7s} {'t(0.1%)':>8s} {'t(1%)/FW':>9s} {'ARI':>6s}", flush=True)
    for name in args.sets:
        res = run_set(name, args.cap)
        result["sets"][name] = res
        fw1 = res["runs"]["fw"]["t_1pct"]
        for solver in SOLVERS:
            r = res["runs"][solver]
            t1 = r["t_1pct"]
            ratio = t1 / fw1 if (t1 is not None and fw1) else float("nan")
            fmt = lambda v: f"{v:7.1f}" if v is not None else "      -"
            print(f"{name:14s} {solver:8s} {r['stop_reason']:9s} {r['n_iter']:6d} {r['passes']:7d} "
                  f"{r['seconds']:8.1f} {r['objective']:11.6g} {r['objective'] / res['best']:8.4f} "
                  f"{fmt(t1)} {fmt(r['t_01pct']):>8s} {ratio:9.2f} {r['ari']:6.3f}", flush=True)
    print(f"\n{'n':>6s} {'FW s/it':>8s} {'P@W s':>8s} {'P@v s':>8s} {'FW/P@W':>7s} {'FW/P@v':>7s} "
          f"{'FW GB/s':>8s} {'FW eff.':>7s}", flush=True)
    for n in args.sizes:
        r = iteration_cost(n, 10, bandwidth)
        result["iteration_cost"].append(r)
        print(f"{n:6d} {r['fw_iteration']:8.4f} {r['matmat']:8.4f} {r['matvec']:8.4f} "
              f"{r['fw_over_matmat']:7.2f} {r['fw_over_matvec']:7.2f} {r['fw_GBps']:8.1f} "
              f"{r['fw_efficiency']:7.2f}", flush=True)
    write_result(HERE, "symnmf_convergence", result, plot)


if __name__ == "__main__":
    main()
