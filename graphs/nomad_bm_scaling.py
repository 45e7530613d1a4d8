"""NOMAD's low-rank form (Burer-Monteiro) at the sizes dnomad exists for, in one run.

step: all 70,000 MNIST digits (K = 16, r = 8K = 128), one multiplier step capped at
    --inner iterations, by each inner optimizer from the same start: SciPy's L-BFGS-B
    (Y gathered in this process, the solver this replaces), the row-space projected
    L-BFGS (the default) with every evaluation in float64 and with X's products by
    float32 increments, and spectral projected gradient (--step-rows reruns some rows
    and keeps the others).  Seconds per evaluation of
    L and its gradient, and their split: the passes over X (D Y = F (F^T Y)), the
    optimizer's own work (row-space vector passes, or L-BFGS-B's setulb and the copies
    in and out of the row space), the Lagrangian at the cap.
million: 10^6 rows (a noisy trefoil knot, dnomad.data) read from a Zarr store by the
    workers of a 2-worker LocalCluster, Y in row chunks on the workers (K = 8,
    r = 64), capped at --million-outer outer steps of --million-inner iterations:
    seconds per outer step and per evaluation, share of the X passes, and the peak
    resident memory of every process against Y (n r 8 bytes) and against D (n^2 8).  The
    JSON keeps the run before the preconditioner as million_unpreconditioned and the one
    before the fused state kernels as million_numpy_state (neither redrawn).
mnist: all 70,000 digits to the stopping rule with the defaults of its time (r = 8K,
    start_tol 1e-5; graphs/nomad_bm_rank.py measures today's 2K and 1e-3), capped at
    --max-seconds: outer steps, evaluations, violations, wall time.  The JSON also keeps
    runs of earlier code, which the plot shows faintly beside this one: mnist_earlier
    (commit 8a01381, before the curvature carry-over), mnist_float64 (commit 7f01719,
    every evaluation's products in float64, before the float32 increments) and
    mnist_increments (with float32 increments, before the preconditioned L-BFGS and
    phi = 0.1) and mnist_numpy_state (commit de8dade, the preconditioner with the state
    kernels as numpy expressions, before the fused numba kernels).
quality: a 7,000-digit subset (K = 16): conditional gradient to the authors' rule,
    then Burer-Monteiro with the defaults, with the defaults before the preconditioner
    (phi 1, plain L-BFGS), with float32 increments (--quality-rows
    picks which run) and with the solver they replaced (sigma = 1,
    SciPy's L-BFGS-B, exact steps), each capped at --max-seconds: the distance of
    Y Y^T to the conditional gradient's Q.
tuning: the trace penalty phi and the preconditioner's eta behind BurerMonteiroParams'
    defaults: on 7,000 and 3,500 MNIST digits and 3,500 Fashion-MNIST images (seed-0
    subsets, K = 16), one symmetric NMF start each, then every setting of TUNING_SETS
    from it to the stopping rule or --tuning-max-seconds: evaluations, outer steps,
    seconds, objective (--tuning-sets / --tuning-rows rerun some; the others are kept).

step and million measure the cost of an evaluation and of capped steps, with the
settings they were recorded with (the paper's sigma = 1, every step to inner_tol).

    python graphs/nomad_bm_scaling.py [--only step,million,mnist,quality,tuning] [--plot-only]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import code_commit, replot, write_result  # noqa: E402

from dnomad.blocks import RowChunks  # noqa: E402
from dnomad.nomad import bm  # noqa: E402

NAME = "nomad_bm_scaling"


def _peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _TimeUp(Exception):
    pass


class _Timed:
    """Wraps the augmented Lagrangian's evaluate: count, seconds in it (the X passes and
    the state passes that form the gradient), last value."""

    def __init__(self, deadline=None):
        self.orig = bm._AugmentedLagrangian.evaluate
        self.count, self.seconds, self.last = 0, 0.0, None
        self.t0 = time.perf_counter()
        self.trace = []             # (seconds since start, L) per evaluation
        self.deadline = deadline    # seconds after which an evaluation raises _TimeUp

    def __enter__(self):
        timed = self

        def evaluate(problem, x, g):
            t0 = time.perf_counter()
            f = timed.orig(problem, x, g)
            timed.seconds += time.perf_counter() - t0
            timed.count += 1
            timed.last = f
            timed.trace.append((time.perf_counter() - timed.t0, f))
            if timed.deadline is not None and timed.trace[-1][0] > timed.deadline:
                raise _TimeUp
            return f

        bm._AugmentedLagrangian.evaluate = evaluate
        return self

    def __exit__(self, *exc):
        bm._AugmentedLagrangian.evaluate = self.orig


def _dataset(name, n=None):
    """``name``'s images (mnist or fashion-mnist), or a seed-0 subset of n of them in their order."""
    from dnomad.data.real import fashion_mnist, mnist

    X, y = {"mnist": mnist, "fashion-mnist": fashion_mnist}[name]()
    if n is not None and n < len(X):
        idx = np.sort(np.random.default_rng(0).permutation(len(X))[:n])
        X, y = X[idx], y[idx]
    return X, y


# One multiplier step's variants: (name, optimizer, float32 increments).
STEP_VARIANTS = (("scipy", "scipy", False), ("lbfgs", "lbfgs", False),
                 ("lbfgs + float32 increments", "lbfgs", True), ("spg", "spg", False))


def part_step(inner=100, names=None, previous=()):
    """The variants named (all by default), each for ``inner`` iterations of one
    multiplier step from the same start; rows of ``previous`` not rerun are kept."""
    X, _ = _dataset("mnist")
    n, K = len(X), 16
    r = 8 * K
    # One start for all: symmetric NMF would take minutes; a scaled random Y does here.
    rng = np.random.default_rng(0)
    Y0 = rng.random((n, r)) * np.sqrt(1.0 / (n * r) * 4)
    variants = [v for v in STEP_VARIANTS if names is None or v[0] in names]
    unknown = set(names or ()) - {v[0] for v in STEP_VARIANTS}
    if unknown:
        raise SystemExit(f"--step-rows: unknown {sorted(unknown)}; choose from {[v[0] for v in STEP_VARIANTS]}")
    rows = {row["optimizer"]: row for row in previous}
    for name, optimizer, increments in variants:
        with RowChunks(X) as chunks, _Timed() as timed, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x_seconds0 = chunks.seconds - chunks.state_seconds
            t = time.perf_counter()
            res = bm.burer_monteiro(chunks, bm.BurerMonteiroParams(
                n_clusters=K, rank=r, max_iter=1, inner_max_iter=inner, optimizer=optimizer, sigma=1.0, inner_rtol=0.0,
                increments=increments), Y0=Y0)
            seconds = time.perf_counter() - t
            x_seconds = chunks.seconds - chunks.state_seconds - x_seconds0
        h = res.history[-1]
        row = {"optimizer": name, "n": n, "rank": r, "seconds": seconds, "inner": h["inner_iterations"],
               "evaluations": h["evaluations"], "incremental_evaluations": h["incremental_evaluations"],
               "x_pass_seconds": x_seconds, "evaluate_seconds": timed.seconds, "lagrangian": h["lagrangian"],
               "state_seconds": chunks.state_seconds, "trace": timed.trace, "measured_with": names or "all"}
        row["optimizer_seconds"] = seconds - x_seconds
        rows[name] = row
        print(f"{name:>26}: {seconds:7.1f} s for {row['inner']} iterations, {row['evaluations']} evaluations "
              f"({seconds / row['evaluations'] * 1e3:.0f} ms each); X passes {x_seconds / seconds:.0%}, "
              f"optimizer and vector work {row['optimizer_seconds'] / seconds:.0%}; L = {h['lagrangian']:.6g}",
              flush=True)
    rows = [rows[v[0]] for v in STEP_VARIANTS if v[0] in rows]
    # Progress at equal wall time: the best L each reached within the default's run time.
    horizon = next((r["seconds"] for r in rows if r["optimizer"] == "lbfgs"), None)
    if horizon is not None:
        for r in rows:
            r["best_L_at_horizon"] = min((f for t, f in r["trace"] if t <= horizon), default=float("nan"))
        print(f"best L within {horizon:.0f} s: " + ", ".join(f"{r['optimizer']} {r['best_L_at_horizon']:.6g}"
                                                             for r in rows))
    per = {r["optimizer"]: r["seconds"] / r["evaluations"] for r in rows}
    ran = {v[0] for v in variants}
    for a, b in (("scipy", "lbfgs"), ("scipy", "spg"), ("lbfgs", "lbfgs + float32 increments")):
        if a in per and b in per:
            same = "in this run" if {a, b} <= ran else "from different runs"
            print(f"per evaluation, {a} / {b}: {per[a] / per[b]:.2f}x ({same})")
    return rows


def part_million(n=1_000_000, K=8, outer=2, inner=20):
    import zarr
    from distributed import Client, LocalCluster

    from dnomad.data import trefoil_knot

    X = trefoil_knot(n, noise=0.05)[0]
    r = 8 * K
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        url = os.path.join(tmp, "X.zarr")
        z = zarr.create_array(store=url, shape=X.shape, dtype=X.dtype, chunks=(62_500, X.shape[1]))
        z[...] = X
        del X
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                          memory_limit=0) as cluster, Client(cluster) as client:
            t = time.perf_counter()
            with RowChunks(url, client=client) as chunks, _Timed() as timed:
                rows = []

                def report(row):
                    rows.append(row)
                    print(f"  outer {row['iteration']}: {row['seconds']:.1f} s, {row['evaluations']} evaluations, "
                          f"row-sum violation {row['row_sum_violation']:.2e}", flush=True)

                res = bm.burer_monteiro(chunks, bm.BurerMonteiroParams(
                    n_clusters=K, rank=r, max_iter=outer, inner_max_iter=inner, start="random", random_state=0, sigma=1.0,
                    inner_rtol=0.0),
                    callback=report)
                x_seconds = chunks.seconds - chunks.state_seconds
                state_seconds = chunks.state_seconds
            seconds = time.perf_counter() - t
            workers = client.run(_peak_rss)
    client_peak = _peak_rss()
    evaluations = sum(r["evaluations"] for r in res.history)
    row = {"n": n, "K": K, "rank": r, "seconds": seconds, "outer": res.n_iter, "evaluations": evaluations,
           "x_pass_seconds": x_seconds, "state_seconds": state_seconds, "evaluate_seconds": timed.seconds,
           "worker_peak_bytes": sorted(workers.values()), "client_peak_bytes": client_peak,
           "Y_bytes": n * r * 8, "D_bytes": n * n * 8, "history": res.history}
    print(f"\nmillion: n = {n:,}, r = {r}, 2 workers, X from Zarr: {seconds:.0f} s for {res.n_iter} outer steps "
          f"({seconds / res.n_iter:.0f} s each), {evaluations} evaluations "
          f"({seconds / evaluations:.2f} s each); X passes {x_seconds / seconds:.0%} of the time, state "
          f"(optimizer) passes {state_seconds / seconds:.0%}; peak RSS: workers "
          + ", ".join(f"{b / 2**30:.2f} GiB = {b / (n * r * 8):.1f} x Y" for b in row["worker_peak_bytes"])
          + f", client {client_peak / 2**30:.2f} GiB = {client_peak / (n * r * 8):.1f} x Y; "
          f"D would be {n * n * 8 / 2**40:.1f} TiB", flush=True)
    return row


def part_mnist(max_seconds=1800):
    """The default solver on all of MNIST until its stopping rule or ``max_seconds``
    (checked at every evaluation: one multiplier step may outlast the cap)."""
    X, y = _dataset("mnist")
    n, K = len(X), 16
    rows = []

    def report(row):
        rows.append(row)
        print(f"  outer {row['iteration']}: {row['seconds']:.0f} s, {row['evaluations']} evaluations, "
              f"objective {row['objective']:.6g}, row-sum violation {row['row_sum_violation']:.2e}, "
              f"change {row['change']:.2e}", flush=True)

    stop, start_seconds, start_iterations = "tolerance", None, None
    with RowChunks(X) as chunks, _Timed(deadline=max_seconds) as timed, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        orig_admm = bm._symnmf_admm

        def admm(*a, **kw):
            nonlocal start_seconds, start_iterations
            out = orig_admm(*a, **kw)
            start_seconds, start_iterations = out.seconds, out.n_iter
            print(f"  symmetric NMF start: {out.n_iter} ADMM iterations, {out.passes} passes, "
                  f"{start_seconds:.0f} s ({start_seconds / out.n_iter:.2f} s each)", flush=True)
            return out

        bm._symnmf_admm = admm
        try:
            res = bm.burer_monteiro(chunks, bm.BurerMonteiroParams(n_clusters=K, rank=8 * K, start_tol=1e-5, random_state=0),
                                    callback=report)
            stop = res.stop_reason
        except _TimeUp:
            stop = "time cap"
        finally:
            bm._symnmf_admm = orig_admm
    seconds = time.perf_counter() - timed.t0
    out = {"n": n, "K": K, "rank": 8 * K, "seconds": seconds, "stop": stop, "outer": len(rows),
           "start_seconds": start_seconds, "start_iterations": start_iterations,
           "evaluations": timed.count, "evaluate_seconds": timed.seconds, "history": rows,
           "trace": timed.trace, "cap_seconds": max_seconds}
    print(f"\nmnist: n = {n:,}, K = {K}, r = {8 * K}: {stop} after {len(rows)} complete outer steps, "
          f"{timed.count} evaluations ({timed.seconds / max(timed.count, 1):.2f} s each), {seconds:.0f} s "
          f"(start {start_seconds or 0:.0f} s; cap {max_seconds:.0f} s)", flush=True)
    return out


# The quality part's Burer-Monteiro variants: key -> (row name, parameters).
QUALITY_VARIANTS = {"defaults": ("bm, defaults", {}),
                    "unpreconditioned": ("bm, phi 1, no preconditioner (the defaults before)",
                                         {"phi": 1.0, "precondition": None}),
                    "increments": ("bm, float32 increments", {"increments": True}),
                    "before": ("bm, before (sigma 1, L-BFGS-B)", {"sigma": 1.0, "phi": 1.0, "optimizer": "scipy"})}


def part_quality(n=7000, K=16, max_seconds=1500, keys=None, previous=None):
    """On an n-digit subset: NOMAD by conditional gradient to the authors' stopping rule
    (the reference), then Burer-Monteiro (r = 8K, from the same symmetric NMF start) with
    today's defaults (every evaluation's products in float64), with the defaults before
    the preconditioner (phi = 1, L-BFGS from gamma I), with the opt-in float32
    increments, and with the solver it replaced (the paper's sigma = 1, SciPy's
    L-BFGS-B, every multiplier step solved to inner_tol); ``keys`` picks which of these
    run (all by default; rows of ``previous`` not rerun are kept, marked as from an
    earlier run).  Each to its stopping rule or
    ``max_seconds`` (checked at every evaluation): relative Frobenius distance of the
    last complete outer step's Y Y^T to the reference Q, objectives."""
    import dnomad

    unknown = set(keys or ()) - set(QUALITY_VARIANTS)
    if unknown:
        raise SystemExit(f"--quality-rows: unknown {sorted(unknown)}; choose from {list(QUALITY_VARIANTS)}")
    X, y = _dataset("mnist", n)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cgm = dnomad.NOMAD(n_clusters=K, solver="cgm", backend="local", device="cpu", max_iter=100000,
                           random_state=0).fit(X)
    Q = np.asarray(cgm.Q_, dtype=np.float64)
    ref = {"solver": "cgm (block steps)", "seconds": time.perf_counter() - t0, "stop": cgm.stop_reason_,
           "outer": cgm.n_iter_, "objective": float(cgm.history_[-1]["objective"])}
    print(f"  cgm: {ref['stop']} after {ref['outer']} outer iterations, {ref['seconds']:.0f} s, "
          f"objective {ref['objective']:.6g}", flush=True)
    qnorm = float(np.linalg.norm(Q))
    rows = [ref]
    with RowChunks(X) as chunks, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Y0, start_seconds, fro = _symnmf_start(chunks, K)      # given to every run
        # CGM's Q in Burer-Monteiro's objective Tr(D Q) (D = F F^T / ||F^T F||_F), to compare.
        F = np.asarray(X, dtype=np.float64) - chunks.mean
        ref["objective_bm_scale"] = float(np.vdot(F, Q @ F)) / fro
        del F
        print(f"  cgm's Q in Burer-Monteiro's objective: {ref['objective_bm_scale']:.6g}", flush=True)
        for key, (name, kw) in QUALITY_VARIANTS.items():
            if keys is not None and key not in keys:
                old = next((r for r in (previous or {}).get("rows", ()) if r["solver"] == name), None)
                if old is not None:
                    rows.append(dict(old, kept_from_an_earlier_run=True))
                continue
            row, Y = _bm_from_start(chunks, K, kw, Y0, max_seconds)
            row = {"solver": name, **row, "seconds": row["seconds"] + start_seconds,
                   "start_seconds": start_seconds, "distance_to_cgm": None}
            if Y is not None:
                row["distance_to_cgm"] = float(np.linalg.norm(Y @ Y.T - Q)) / qnorm
            rows.append(row)
            if Y is not None:
                print(f"  {name}: {row['stop']} after {row['outer']} complete outer steps, {row['evaluations']} "
                      f"evaluations, {row['seconds']:.0f} s (start {start_seconds:.0f} s), objective "
                      f"{row['objective']:.6g}, row-sum violation {row['row_sum_violation']:.2e}, "
                      f"||Y Y^T - Q_cgm|| / ||Q_cgm|| = {row['distance_to_cgm']:.3g}", flush=True)
            else:
                print(f"  {name}: {row['stop']} before its first outer step finished, {row['evaluations']} "
                      f"evaluations, {row['seconds']:.0f} s", flush=True)
    return {"n": n, "K": K, "rank": 8 * K, "cap_seconds": max_seconds, "rows": rows}


def _bm_from_start(chunks, K, kw, Y0, max_seconds):
    """Burer-Monteiro on ``chunks`` (r = 8K) with parameters ``kw`` from the start ``Y0``, to
    its stopping rule or ``max_seconds`` (checked at every evaluation): (row, Y of the last
    complete outer step, or None if none completed).  The row's seconds leave out the start."""
    last = {}       # the last complete outer step's Y (a checkpoint every step)
    with _Timed(deadline=max_seconds) as timed:
        try:
            res = bm.burer_monteiro(chunks, bm.BurerMonteiroParams(n_clusters=K, rank=8 * K, random_state=0, **kw),
                                    Y0=Y0, checkpoint=last.update)
            stop = res.stop_reason
        except _TimeUp:
            stop = "time cap"
    h = last.get("history", [])
    row = {"seconds": time.perf_counter() - timed.t0, "stop": stop, "outer": len(h),
           "evaluations": timed.count, "objective": float(h[-1]["objective"]) if h else None,
           "row_sum_violation": float(h[-1]["row_sum_violation"]) if h else None}
    return row, (last["Y"] if h else None)


def _symnmf_start(chunks, K):
    """The defaults' symmetric NMF start (r = 8K, by ADMM in float32), taken out of the
    chunks so that every run from it starts alike: (Y0, seconds, ||F F^T||_F)."""
    fro = float(np.linalg.norm(chunks.gram))
    start = bm._symnmf_admm(chunks, 8 * K, gram_scale=fro, dtype=np.float32, random_state=0)
    Y0 = chunks.get("W")
    chunks.map(bm.drop_states, ["W", "_H", "_Gamma"], read_x=False)
    return Y0, start.seconds, fro


# The tuning part's settings of the trace penalty phi and the preconditioner's eta
# (BurerMonteiroParams.precondition; None: plain L-BFGS): key -> (label, parameters).
TUNING_SETTINGS = {"before": ("phi 1, none (before)", {"phi": 1.0, "precondition": None}),
                   "phi0.1": ("phi 0.1, none", {"phi": 0.1, "precondition": None}),
                   "phi1-eta0.1": ("phi 1, eta 0.1", {"phi": 1.0, "precondition": 0.1}),
                   "eta1": ("phi 0.1, eta 1", {"phi": 0.1, "precondition": 1.0}),
                   "eta0.01": ("phi 0.1, eta 0.01", {"phi": 0.1, "precondition": 0.01}),
                   "phi0.156": ("phi 0.156, eta 0.1", {"phi": 0.156, "precondition": 0.1}),
                   "chosen": ("phi 0.1, eta 0.1", {"phi": 0.1, "precondition": 0.1})}
# Data set : subset size -> the settings run on it by default.
TUNING_SETS = {"mnist:7000": tuple(TUNING_SETTINGS),
               "mnist:3500": ("before", "phi1-eta0.1", "phi0.156", "chosen"),
               "fashion-mnist:3500": ("before", "chosen")}


def part_tuning(sets=None, keys=None, K=16, max_seconds=600, previous=None):
    """The trace penalty phi and the preconditioner's eta that BurerMonteiroParams defaults
    to: on each data set's seed-0 subset (K = 16, r = 128), one symmetric NMF start, then
    Burer-Monteiro from it under each setting, to the stopping rule or ``max_seconds``:
    evaluations, outer steps, seconds, objective.  ``sets`` (default every TUNING_SETS
    entry) and ``keys`` (default each set's own list) pick the runs; the rows of
    ``previous`` not rerun are kept, each with the commit that measured it."""
    sets = list(sets or TUNING_SETS)
    unknown = [s for s in sets if s not in TUNING_SETS] + [k for k in keys or () if k not in TUNING_SETTINGS]
    if unknown:
        raise SystemExit(f"--tuning-sets/--tuning-rows: unknown {unknown}; sets {list(TUNING_SETS)}, "
                         f"rows {list(TUNING_SETTINGS)}")
    defaults = bm.BurerMonteiroParams(n_clusters=K)
    out = {"K": K, "rank": 8 * K, "cap_seconds": max_seconds,
           "defaults": {"phi": defaults.phi, "precondition": defaults.precondition},
           "sets": dict((previous or {}).get("sets", {}))}
    for key in sets:
        name, n = key.split(":")
        X, _ = _dataset(name, int(n))
        entry = dict(out["sets"].get(key, {}), data=name, n=len(X))
        entry["rows"] = dict(entry.get("rows", {}))
        with RowChunks(X) as chunks, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Y0, start_seconds, _ = _symnmf_start(chunks, K)
            print(f"\ntuning on {key}: symmetric NMF start {start_seconds:.0f} s", flush=True)
            for setting in keys or TUNING_SETS[key]:
                label, kw = TUNING_SETTINGS[setting]
                row, _ = _bm_from_start(chunks, K, kw, Y0, max_seconds)
                row.update(label=label, params=kw, start_seconds=start_seconds, code=code_commit())
                entry["rows"][setting] = row
                print(f"  {label:36s} {row['stop']:>12s}: {row['evaluations']:5d} evaluations, "
                      f"{row['outer']:3d} outer steps, {row['seconds']:5.0f} s, objective "
                      f"{row['objective'] if row['objective'] is None else format(row['objective'], '.7g')}",
                      flush=True)
        out["sets"][key] = entry
    return out


# Earlier code's all-MNIST runs kept in the JSON: before the curvature carry-over, before
# the float32 increments (every evaluation's products in float64), with them before the
# preconditioner, and with it before the fused state kernels.
EARLIER_MNIST_RUNS = ("mnist_earlier", "mnist_float64", "mnist_increments", "mnist_numpy_state")


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(25, 4.6))
    if "step" in result:
        rows = result["step"]
        names = [r["optimizer"] for r in rows]
        per = [r["seconds"] / r["evaluations"] * 1e3 for r in rows]
        xp = [r["x_pass_seconds"] / r["evaluations"] * 1e3 for r in rows]
        axes[0].bar(names, xp, label="passes over X (D Y)")
        axes[0].bar(names, np.subtract(per, xp), bottom=xp, label="optimizer and vector work")
        axes[0].set_ylabel("ms per evaluation")
        axes[0].set_title(f"MNIST n = {rows[0]['n']:,}, r = {rows[0]['rank']}: one multiplier step")
        axes[0].legend(loc="upper left", fontsize=7)
        inset = axes[0].inset_axes([0.55, 0.42, 0.42, 0.36])
        for r in rows:
            t, f = np.array(r.get("trace") or [(np.nan, np.nan)]).T
            inset.semilogy(t, np.minimum.accumulate(f), label=r["optimizer"])
        inset.set_xlabel("s", fontsize=7)
        inset.set_ylabel("best L", fontsize=7)
        inset.tick_params(labelsize=6)
        inset.legend(fontsize=6)
    if "million" in result:
        m = result["million"]
        procs = [f"worker {i}" for i in range(len(m["worker_peak_bytes"]))] + ["client"]
        peaks = list(m["worker_peak_bytes"]) + [m["client_peak_bytes"]]
        axes[1].bar(procs, [p / m["Y_bytes"] for p in peaks])
        axes[1].set_ylabel("peak resident memory / bytes of Y")
        axes[1].set_title(f"{m['n']:,} rows from Zarr, 2 workers, r = {m['rank']}:\n"
                          f"{m['seconds'] / m['outer']:.0f} s per outer step, D would be "
                          f"{m['D_bytes'] / 2**40:.1f} TiB")
    if "mnist" in result:
        m = result["mnist"]
        start = m.get("start_seconds") or 0.0          # history's seconds count from after the start
        t = [start + row["seconds"] for row in m["history"]]
        viol = [max(row["row_sum_violation"], row["trace_violation"]) for row in m["history"]]
        axes[2].semilogy(t, viol, "o-", ms=3, label="constraint violation")
        axes[2].semilogy(t, [row["change"] for row in m["history"]], "s-", ms=3, label="relative change of Y")
        axes[2].axhline(1e-4, color="C0", ls="--", lw=0.8, label="feasibility_tol")
        axes[2].axhline(1e-5, color="C1", ls="--", lw=0.8, label="tol")
        for k, key in enumerate(EARLIER_MNIST_RUNS):      # runs of earlier code, faint
            if key not in result:
                continue
            e = result[key]
            te = [(e.get("start_seconds") or 0.0) + row["seconds"] for row in e["history"]]
            axes[2].semilogy(te, [max(row["row_sum_violation"], row["trace_violation"]) for row in e["history"]],
                             "o-", ms=2, lw=0.6, color=f"C{2 + k}", alpha=0.45,
                             label=f"violation, earlier run ({e['code'].split(' ')[0]}, {e['outer']} steps)")
        axes[2].axvline(start, color="k", ls=":", lw=0.8, label="end of the symmetric NMF start")
        axes[2].axvline(1800, color="r", ls=":", lw=0.8, label="30 minutes")
        axes[2].set_xlabel("seconds (2 cores)")
        axes[2].set_ylabel("at the end of each multiplier step")
        axes[2].set_title(f"all 70,000 MNIST digits, K = 16, r = 128: {m['stop']}\n"
                          f"{m['outer']} multiplier steps, {m['evaluations']} evaluations in {m['seconds']:.0f} s")
        axes[2].legend(fontsize=7)
    if "quality" in result:
        q = result["quality"]
        rows = [r for r in q["rows"] if "distance_to_cgm" in r]      # the reference has none
        axes[3].bar([r["solver"].replace(" (", "\n(") for r in rows],
                    [r["distance_to_cgm"] or 0.0 for r in rows])
        for i, r in enumerate(rows):
            label = (f"{r['stop']}, {r['seconds']:.0f} s" if r["distance_to_cgm"] is not None else
                     f"no complete outer step\nin {r['seconds']:.0f} s ({r['evaluations']} evaluations)")
            if r.get("kept_from_an_earlier_run"):
                label += "\n(earlier run)"
            axes[3].text(i, r["distance_to_cgm"] or 0.0, label, ha="center", va="bottom", fontsize=7)
        axes[3].set_ylabel("||Y Y^T - Q_cgm||_F / ||Q_cgm||_F")
        axes[3].set_title(f"MNIST subset n = {q['n']:,}, K = {q['K']}, r = {q['rank']}:\n"
                          f"distance to conditional gradient's Q")
        axes[3].tick_params(axis="x", labelsize=7)
    if "tuning" in result:
        _plot_tuning(axes[4], result["tuning"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_tuning(ax, tuning):
    """Evaluations to the stopping rule under each (phi, eta) setting, a group of bars per
    data set; hatched where the run stopped at its cap (a lower bound)."""
    keys = list(TUNING_SETTINGS)
    sets = list(tuning["sets"])
    width = 0.8 / max(len(sets), 1)
    for j, key in enumerate(sets):
        rows = tuning["sets"][key]["rows"]
        for i, setting in enumerate(keys):
            if setting not in rows:
                continue
            r = rows[setting]
            ax.bar(i + (j - (len(sets) - 1) / 2) * width, r["evaluations"], width, color=f"C{j}",
                   hatch="//" if r["stop"] == "time cap" else None, label=key if i == keys.index(
                       next(k for k in keys if k in rows)) else None)
    ax.set_xticks(range(len(keys)), [TUNING_SETTINGS[k][0].replace(", ", ",\n") for k in keys], fontsize=7)
    ax.set_ylabel("evaluations to the stopping rule (hatched: capped)")
    d = tuning["defaults"]
    ax.set_title(f"phi and eta (defaults {d['phi']:g}, {d['precondition']:g}), K = {tuning['K']}, "
                 f"r = {tuning['rank']}:\nevaluations from one start per data set")
    ax.legend(fontsize=7)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="step,million,mnist,quality,tuning")
    ap.add_argument("--inner", type=int, default=100)
    ap.add_argument("--step-rows", default=None,
                    help="comma-separated names of the step part's rows to (re)run; the others are kept")
    ap.add_argument("--million-outer", type=int, default=2)
    ap.add_argument("--million-inner", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=1800)
    ap.add_argument("--quality-rows", default=None,
                    help="comma-separated Burer-Monteiro variants of the quality part to (re)run: "
                         + ", ".join(QUALITY_VARIANTS) + "; the others are kept")
    ap.add_argument("--tuning-sets", default=None,
                    help="comma-separated data:size entries of the tuning part to (re)run: " + ", ".join(TUNING_SETS))
    ap.add_argument("--tuning-rows", default=None,
                    help="comma-separated settings to run on each of them (default each set's own): "
                         + ", ".join(TUNING_SETTINGS))
    ap.add_argument("--tuning-max-seconds", type=float, default=600)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, NAME, plot)
        return
    path = os.path.join(HERE, f"{NAME}.json")
    result = json.load(open(path)) if os.path.exists(path) else {}
    parts = {"step": lambda: part_step(args.inner, args.step_rows and args.step_rows.split(","),
                                       result.get("step", ())),
             "million": lambda: part_million(outer=args.million_outer, inner=args.million_inner),
             "mnist": lambda: part_mnist(args.max_seconds),
             "quality": lambda: part_quality(max_seconds=args.max_seconds,
                                             keys=args.quality_rows and args.quality_rows.split(","),
                                             previous=result.get("quality")),
             "tuning": lambda: part_tuning(args.tuning_sets and args.tuning_sets.split(","),
                                           args.tuning_rows and args.tuning_rows.split(","),
                                           max_seconds=args.tuning_max_seconds, previous=result.get("tuning"))}
    for name in args.only.split(","):
        result[name] = parts[name]()
        write_result(HERE, NAME, result, plot)


if __name__ == "__main__":
    main()
