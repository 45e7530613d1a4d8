"""NOMAD's scaling on one machine: pass efficiency, passes per inner step, time to the
stopping rule for growing n, and the authors' code and cvxpy + SCS on the same instances.

    python graphs/nomad_scaling.py --authors /path/to/sdp_kmeans     # all of it (about 2 hours)
    python graphs/nomad_scaling.py --sizes 1000 2000 --paper-sizes 1000 --scs 500 --per-step 8000

Everything is measured in this run on this machine:
  * the machine's memory bandwidth (a large numpy copy: bytes read + written per second);
  * each pass's effective bandwidth at n = --per-step (float32, in memory) and its ratio to
    the copy (pass efficiency);
  * passes and seconds per inner Frank-Wolfe step;
  * time to the authors' stopping rule (RMSE of [Q]_- <= 1e-4, |min Q| <= 1e-2 K/n) on two
    rings with K = 16, one process per size so each peak RSS is its own, with the default
    penalty="scale" and (--paper-sizes) with the paper's fixed gamma = tau = 1;
  * the authors' CGM (``sdp_km_conditional_gradient`` of simonsfoundation/sdp_kmeans,
    float64, dense numpy, as their MNIST timing script calls it: no line search,
    stop_tol_max = 1e-2, at most 2,000 outer iterations) on the same D, one process per
    size, stopped at --authors-cap seconds; a run the cap stops prints "did not finish in
    T" with the outer iterations it made and its violation then.  Their code is not part
    of dnomad and is never copied into it: get it with
        git clone https://github.com/simonsfoundation/sdp_kmeans /path/to/sdp_kmeans
    and pass --authors /path/to/sdp_kmeans (or set DNOMAD_SDP_KMEANS); without it the
    column is left out;
  * cvxpy + SCS on the same instances (time, objective, ||Q - Q_scs|| / ||Q_scs|| for each
    NOMAD run of that size and the authors' run).
Writes graphs/nomad_scaling.json and graphs/nomad_scaling.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
from _bench import memory_bandwidth, pass_rate, replot, write_result

from dnomad.blocks.engine import _worker_peak_rss

HERE = os.path.dirname(os.path.abspath(__file__))
K = 16
AUTHORS_STOP = {"max_violation": 1e-2, "rmse_neg": 1e-4}     # as their timing script


def pass_efficiency(n, bandwidth, repeat=5):
    """Time NOMAD's fused pass and a matvec on in-memory float32 state of size n."""
    from dnomad import blocks
    from dnomad.nomad import passes as nomad_passes
    from dnomad.data import two_rings
    from dnomad.nomad.cgm import NomadParams, nomad_cgm

    X = blocks.prepare_gram_data(two_rings(n)[0])
    group = blocks.new_group(n, dtype=np.float32, backend="local")
    data = blocks.DataPanels(group, X.astype(np.float32))
    blocks.zeros_like_layout(group, ["P", "Gamma"])
    v = np.random.default_rng(0).standard_normal(n)
    v /= np.linalg.norm(v)
    rows = {}
    # The two fused passes exactly as the solver calls them.
    for label, run in [
        ("inner pass (P, G written)", lambda: nomad_passes.nomad_pass(
            group, v=v, step=0.01, vv_scale=K - 1, gamma=1.0, tau=1.0, update_gamma=False,
            full_stats=False, data=data)),
        ("closing pass (P, Gamma written)", lambda: nomad_passes.nomad_pass(
            group, v=v, step=0.01, vv_scale=K - 1, gamma=1.0, tau=1.0, update_gamma=True,
            write_g=False, data=data)),
        ("matvec G v", lambda: blocks.matmat(group, "G", v)),
        ("matmat G V (V: n x 4)", lambda: blocks.matmat(group, "G", np.tile(v[:, None], 4))),
    ]:
        sec, rate = pass_rate(group, run, repeat)
        rows[label] = {"seconds": sec, "GB_per_s": rate / 1e9, "efficiency": rate / bandwidth}
    # Per inner step of the real solver (warm-started eigensolver included).
    res = nomad_cgm(group, NomadParams(n_clusters=K, max_iter=3, rmse_tol=0, min_tol=0, objective_tol=0,
                                       **PAPER_LOOP), data=data)
    h = res.history[1:]
    step = {"passes_per_inner_step": float(np.mean([r["passes"] for r in h])) / 10,
            "seconds_per_inner_step": float(np.mean([r["seconds"] for r in h])) / 10,
            "matvecs_per_inner_step": float(np.mean([r["eig_matvecs"] for r in h])) / 10}
    group.close()
    return rows, step


# The runs recorded in nomad_scaling.json are of the paper's loop (Alg. 2: 10 Frank-Wolfe
# steps to a vertex per outer iteration), with dnomad's scaled penalty ("scale") or the
# paper's fixed gamma = tau = 1 ("paper"); graphs/nomad_convergence.py sets it against
# the default block steps.
PAPER_LOOP = {"direction": "vertex", "lagrangian": "paper", "n_inner": 10, "tau": "scale"}
PARAMS = {"scale": PAPER_LOOP, "paper": {**PAPER_LOOP, "penalty": 1.0, "tau": 1.0}}


def solve_one(n, time_cap, save_q, params):
    """Child process: NOMAD to the stopping rule (or the time cap) on two rings of size n,
    with the default penalty and multiplier step ("scale") or the paper's ("paper")."""
    import warnings

    import dnomad
    from dnomad.data import two_rings

    X, y = two_rings(n)
    t0 = time.perf_counter()

    def cap(row):
        return time.perf_counter() - t0 > time_cap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = dnomad.NOMAD(n_clusters=K, backend="local", callback=cap, max_iter=100000,
                           **PARAMS[params]).fit(X)
    h = est.history_
    inner = sum(r["passes"] for r in h) / (len(h) * est.n_inner)
    out = {"n": n, "params": params, "penalty": est.penalty_, "seconds": time.perf_counter() - t0, "outer_iterations": est.n_iter_,
           "stop_reason": est.stop_reason_, "passes_per_inner_step": inner,
           "seconds_per_inner_step": sum(r["seconds"] for r in h) / (len(h) * est.n_inner),
           "matvecs_per_inner_step": sum(r["eig_matvecs"] for r in h) / (len(h) * est.n_inner),
           "rmse_neg": h[-1]["rmse_neg"], "max_violation": h[-1]["max_violation"],
           "objective": est.objective_, "ari": dnomad.metrics.adjusted_rand_score(y, est.labels_),
           "peak_rss_bytes": _worker_peak_rss()}
    if save_q:
        np.save(save_q, np.asarray(est.Q_, dtype=np.float64))
    return out


def scs_one(n, *q_paths):
    """Child process: the same SDP by cvxpy + SCS (eps 1e-4), and its distance to NOMAD's Q."""
    import cvxpy as cp

    from dnomad import blocks
    from dnomad.data import two_rings

    F = blocks.prepare_gram_data(two_rings(n)[0])
    D = F @ F.T
    Z = cp.Variable((n, n), PSD=True)
    prob = cp.Problem(cp.Maximize(cp.trace(D @ Z)), [Z >= 0, Z @ np.ones(n) == 1, cp.trace(Z) == K])
    t0 = time.perf_counter()
    prob.solve(solver="SCS", eps=1e-4, max_iters=100000)
    sec = time.perf_counter() - t0
    Qs = Z.value
    out = {"n": n, "seconds": sec, "objective": float(np.sum(D * Qs)),
           "peak_rss_bytes": _worker_peak_rss()}
    for tag, Q in saved_qs(q_paths):
        out[f"rel_distance_{tag}"] = float(np.linalg.norm(Q - Qs) / np.linalg.norm(Qs))
        out[f"objective_{tag}"] = float(np.sum(D * Q))
    return out


def negative_part_stats(Q, n):
    """The authors' stopping measures of a Q that has Q 1 = 1: |min [Q]_-| n / K and the
    RMSE of Q's negative entries (0 where there are none)."""
    neg = Q[Q < 0]
    if neg.size == 0:
        return 0.0, 0.0
    return float(-neg.min() / (K / n)), float(np.sqrt(np.mean(neg * neg)))


class _TimeCap(Exception):
    pass


def authors_one(n, cap, path, save_q, *q_paths):
    """Child process: the authors' CGM on two rings of size n, called as their MNIST timing
    script calls it, stopped at ``cap`` seconds.  Its loop has no callback: a wrapper around
    the eigensolver it calls at every inner step counts those steps, stops the run at the
    cap, and at the first inner step of each outer iteration reads the violation of the Q
    the last one left (from its frame; O(n^2), against the step's several O(n^2) passes)."""
    import scipy.sparse.linalg

    sys.path.insert(0, path)
    from sdp_kmeans.sdp import sdp_km_conditional_gradient
    from sdp_kmeans.utils import dot_matrix

    from dnomad.data import two_rings

    X, _ = two_rings(n)
    D = dot_matrix(X)                  # the same D as dnomad's prepare_gram_data gives
    eigsh, inner, progress = scipy.sparse.linalg.eigsh, [0], []
    t0 = time.perf_counter()

    def counted_eigsh(*args, **kwargs):
        solver = sys._getframe(2).f_locals            # sdp_km_conditional_gradient's
        if solver.get("inner_it") == 0 and solver.get("t", 0) > 0:
            progress.append((solver["t"], time.perf_counter() - t0,
                             *negative_part_stats(solver["Q"] + 1.0 / n, n)))
        if time.perf_counter() - t0 > cap:
            raise _TimeCap
        inner[0] += 1
        return eigsh(*args, **kwargs)

    scipy.sparse.linalg.eigsh = counted_eigsh
    try:
        Q = sdp_km_conditional_gradient(D, K, use_line_search=False,
                                        stop_tol_max=AUTHORS_STOP["max_violation"])
    except _TimeCap:
        Q = None
    seconds = time.perf_counter() - t0
    out = {"n": n, "seconds": seconds, "inner_steps": inner[0],
           "seconds_per_inner_step": seconds / max(inner[0], 1), "peak_rss_bytes": _worker_peak_rss()}
    if Q is None:
        last = progress[-1] if progress else (0, 0.0, float("nan"), float("nan"))
        out.update(stop_reason="time_cap", outer_iterations=int(last[0]), max_violation=last[2],
                   rmse_neg=last[3])
        return out
    violation, rmse = negative_part_stats(Q, n)
    converged = violation < AUTHORS_STOP["max_violation"] and rmse < AUTHORS_STOP["rmse_neg"]
    out.update(stop_reason="tolerance" if converged else "max_iter", outer_iterations=len(progress) + 1,
               max_violation=violation, rmse_neg=rmse, objective=float(np.sum(D * Q)))
    for tag, Qd in saved_qs(q_paths):
        out[f"rel_distance_{tag}"] = float(np.linalg.norm(Q - Qd) / np.linalg.norm(Qd))
    if save_q:
        np.save(save_q, Q)
    return out


def child(kind, *args):
    res = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, args)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def q_path(n, params):
    return f"/tmp/dnomad_scaling_Q{n}_{params}.npy"


def saved_qs(paths):
    """(tag, Q) for each of ``paths`` (made by :func:`q_path`) that a run has saved."""
    for path in paths:
        if os.path.exists(path):
            yield os.path.basename(path).split("_")[-1].split(".")[0], np.load(path)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    axes = axes.ravel()
    runs = [r for r in result["runs"] if r]
    scs = [r for r in result["scs"] if r]
    ax = axes[0]
    for params, marker in (("scale", "o-"), ("paper", "v--")):
        rs = [r for r in runs if r["params"] == params]
        if rs:
            ax.loglog([r["n"] for r in rs], [r["seconds"] for r in rs], marker,
                      label=f"dnomad, penalty={params!r}")
        for r in rs:
            if r["stop_reason"] != "tolerance":
                ax.annotate("cap", (r["n"], r["seconds"]))
    peer = [r for r in result.get("authors", []) if r]
    done = [r for r in peer if r["stop_reason"] == "tolerance"]
    if done:
        ax.loglog([r["n"] for r in done], [r["seconds"] for r in done], "s-", color="C3",
                  label="authors' CGM (float64, dense)")
    capped = [r for r in peer if r["stop_reason"] != "tolerance"]
    if capped:
        ax.loglog([r["n"] for r in capped], [r["seconds"] for r in capped], "s", color="C3", mfc="none",
                  label="authors' CGM: stopped by the cap / max_iter (lower bound)")
    if scs:
        ax.loglog([r["n"] for r in scs], [r["seconds"] for r in scs], "^-", label="cvxpy + SCS")
    ax.set_xlabel("n")
    ax.set_ylabel("seconds to the stopping rule")
    ax.legend(fontsize=8)
    ax.set_title(f"two rings, K={K}, float32, one process")
    ax = axes[1]
    for params, marker in (("scale", "o-"), ("paper", "v--")):
        rs = [r for r in runs if r["params"] == params]
        if rs:
            ax.semilogx([r["n"] for r in rs], [r["outer_iterations"] for r in rs], marker,
                        label=f"penalty={params!r}")
    if done:
        ax.semilogx([r["n"] for r in done], [r["outer_iterations"] for r in done], "s-", color="C3",
                    label="authors' CGM")
    if capped:
        ax.semilogx([r["n"] for r in capped], [r["outer_iterations"] for r in capped], "s", color="C3",
                    mfc="none", label="authors' CGM: outer iterations when the cap stopped it")
    ax.set_xlabel("n")
    ax.set_ylabel("outer iterations to the stopping rule")
    ax.legend(fontsize=8)
    ax = axes[2]
    rs = [r for r in runs if r["params"] == "scale"]
    pn = [r["n"] for r in rs] + [result["per_step"]["n"]]
    ps = [r["seconds_per_inner_step"] for r in rs] + [result["per_step"]["seconds_per_inner_step"]]
    order = np.argsort(pn)
    ax.loglog(np.array(pn)[order], np.array(ps)[order], "o-", label="dnomad")
    if peer:
        ax.loglog([r["n"] for r in peer], [r["seconds_per_inner_step"] for r in peer], "s-", color="C3",
                  label="authors' CGM")
    ax.set_xlabel("n")
    ax.set_ylabel("seconds per inner step")
    ax.legend(fontsize=8)
    ax = axes[3]
    labels = list(result["passes"])
    ax.barh(labels, [result["passes"][k]["efficiency"] for k in labels])
    ax.axvline(0.5, color="k", ls="--", lw=1)
    ax.set_xlabel(f"pass bandwidth / numpy copy ({result['bandwidth_GBps']:.1f} GB/s)")
    ax.set_title(f"pass efficiency, n={result['per_step']['n']} float32")
    from matplotlib.ticker import NullFormatter

    for ax in axes[:3]:
        ns = sorted({int(x) for line in ax.get_lines() for x in line.get_xdata()})
        ax.set_xticks(ns, [str(x) for x in ns])
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[500, 1000, 2000, 4000, 8000])
    ap.add_argument("--paper-sizes", type=int, nargs="*", default=[500, 1000, 2000],
                    help="sizes also run with the paper's gamma = tau = 1")
    ap.add_argument("--scs", type=int, nargs="*", default=[500, 1000])
    ap.add_argument("--per-step", type=int, default=16000)
    ap.add_argument("--time-cap", type=float, default=3600.0, help="seconds per size")
    ap.add_argument("--authors", default=os.environ.get("DNOMAD_SDP_KMEANS"),
                    help="a checkout of simonsfoundation/sdp_kmeans (outside this repository)")
    ap.add_argument("--authors-sizes", type=int, nargs="*", default=[500, 1000, 2000, 4000, 8000])
    ap.add_argument("--authors-cap", type=float, default=900.0, help="seconds per size for the authors' code")
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "nomad_scaling", plot)
        return
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        if kind == "solve":
            n, cap, params = int(rest[0]), float(rest[1]), rest[2]
            save = q_path(n, params) if rest[3] == "save" else None
            print(json.dumps(solve_one(n, cap, save, params)))
        elif kind == "authors":
            n, cap, path = int(rest[0]), float(rest[1]), rest[2]
            save = q_path(n, "authors") if rest[3] == "save" else None
            print(json.dumps(authors_one(n, cap, path, save, *rest[4:])))
        else:
            print(json.dumps(scs_one(int(rest[0]), *rest[1:])))
        return
    authors = args.authors
    if authors and not os.path.isdir(os.path.join(authors, "sdp_kmeans")):
        sys.exit(f"--authors {authors!r}: no sdp_kmeans package there; clone "
                 "https://github.com/simonsfoundation/sdp_kmeans and pass the checkout's folder")
    if not authors:
        print("the authors' code: not given (--authors or DNOMAD_SDP_KMEANS), its column left out", flush=True)
    bw = memory_bandwidth()
    print(f"memory bandwidth (numpy copy, read + write): {bw / 1e9:.1f} GB/s", flush=True)
    rows, step = pass_efficiency(args.per_step, bw)
    step["n"] = args.per_step
    print(f"\npasses at n={args.per_step}, float32, in memory")
    print(f"{'pass':32s} {'seconds':>9s} {'GB/s':>7s} {'efficiency':>10s}")
    for k, r in rows.items():
        print(f"{k:32s} {r['seconds']:9.3f} {r['GB_per_s']:7.1f} {r['efficiency']:10.2f}")
    print(f"per inner step: {step['passes_per_inner_step']:.1f} passes "
          f"({step['matvecs_per_inner_step']:.1f} matvecs), {step['seconds_per_inner_step']:.3f} s", flush=True)
    runs, scs, peer = [], [], []
    authors_sizes = args.authors_sizes if authors else []
    # Q is kept on disk where a peer's distance to it is measured.
    keep_q = set(args.scs) | set(authors_sizes)
    print(f"\n{'n':>6s} {'params':>6s} {'gamma':>6s} {'stop':>9s} {'outer':>6s} {'seconds':>8s} {'s/inner':>8s} "
          f"{'passes/inner':>12s} {'peak MB':>8s} {'ARI':>5s}", flush=True)
    jobs = [(n, "scale") for n in args.sizes] + [(n, "paper") for n in args.paper_sizes]
    for n, params in jobs:
        r = child("solve", n, args.time_cap, params, "save" if n in keep_q else "-")
        runs.append(r)
        if r:
            print(f"{n:6d} {params:>6s} {r['penalty']:6.2f} {r['stop_reason']:>9s} {r['outer_iterations']:6d} "
                  f"{r['seconds']:8.1f} {r['seconds_per_inner_step']:8.4f} {r['passes_per_inner_step']:12.1f} "
                  f"{r['peak_rss_bytes'] / 2**20:8.0f} {r['ari']:5.2f}", flush=True)
    if authors_sizes:
        print(f"\nthe authors' CGM (float64, dense), capped at {args.authors_cap:g} s, against dnomad "
              f"(penalty='scale') on the same instance\n"
              f"{'n':>6s} {'stop':>22s} {'outer':>6s} {'seconds':>8s} {'s/inner':>8s} {'violation':>9s} "
              f"{'rmse':>8s} {'peak MB':>8s} {'dnomad s':>9s} {'time ratio':>10s} {'s/inner ratio':>13s} "
              f"{'||Q-Qd||/||Qd||':>15s}", flush=True)
    for n in authors_sizes:
        r = child("authors", n, args.authors_cap, authors, "save" if n in args.scs else "-",
                  q_path(n, "scale"))
        peer.append(r)
        if not r:
            continue
        mine = next((x for x in runs if x and x["n"] == n and x["params"] == "scale"), None)
        stop = (f"did not finish in {args.authors_cap:g} s" if r["stop_reason"] == "time_cap"
                else r["stop_reason"])
        ratio = "-"                     # the authors' time to the rule over dnomad's
        if mine and mine["stop_reason"] == "tolerance":
            ratio = format(r["seconds"] / mine["seconds"], ".1f")
            if r["stop_reason"] != "tolerance":
                # A lower bound (theirs did not get there), so rounded down.
                ratio = "> " + format(math.floor(10 * r["seconds"] / mine["seconds"]) / 10, ".1f")
        ratio = f"{ratio:>10s}"
        step_ratio = (r["seconds_per_inner_step"] / mine["seconds_per_inner_step"]) if mine else float("nan")
        print(f"{n:6d} {stop:>22s} {r['outer_iterations']:6d} {r['seconds']:8.1f} {r['seconds_per_inner_step']:8.4f} "
              f"{r['max_violation']:9.4f} {r['rmse_neg']:8.2e} {r['peak_rss_bytes'] / 2**20:8.0f} "
              f"{mine['seconds'] if mine else float('nan'):9.1f} {ratio} {step_ratio:13.1f} "
              f"{r.get('rel_distance_scale', float('nan')):15.4f}", flush=True)
    print(f"\n{'n':>6s} {'SCS s':>8s} {'SCS peak MB':>11s} {'solver':>8s} {'its s':>9s} {'time ratio':>10s} "
          f"{'||Q-Qscs||/||Qscs||':>20s} {'objective ratio':>15s}")
    for n in args.scs:
        r = child("scs", n, q_path(n, "scale"), q_path(n, "paper"), q_path(n, "authors"))
        scs.append(r)
        if not r:
            continue
        for params in (*PARAMS, "authors"):
            if params == "authors":
                mine = next((x for x in peer if x and x["n"] == n and "objective" in x), None)
            else:
                mine = next((x for x in runs if x and x["n"] == n and x["params"] == params), None)
            if mine is None or f"rel_distance_{params}" not in r:
                continue
            print(f"{n:6d} {r['seconds']:8.1f} {r['peak_rss_bytes'] / 2**20:11.0f} {params:>8s} "
                  f"{mine['seconds']:9.1f} {r['seconds'] / mine['seconds']:10.1f} "
                  f"{r[f'rel_distance_{params}']:20.4f} {r[f'objective_{params}'] / r['objective']:15.5f}",
                  flush=True)
    result = {"bandwidth_GBps": bw / 1e9, "passes": rows, "per_step": step, "runs": runs, "scs": scs,
              "authors": peer, "authors_cap": args.authors_cap,
              "cpu_count": len(os.sched_getaffinity(0))}
    write_result(HERE, "nomad_scaling", result, plot)


if __name__ == "__main__":
    main()
