"""NOMAD's 2-D embeddings of real images (Tepper et al., Fig. 16 and Fig. 6c), in one run.

zeros:   all 6,903 MNIST zeros (70k set; the paper's Fig. 16 had 9,603), K = 128, by
         conditional gradient (dnomad's default block steps; the paper's Alg. 2 took
         10^4 outer iterations on MNIST subsets): seconds, outer iterations, passes
         and bytes over the n x n blocks, the rise of resident memory during the fit against
         what the three n x n state matrices (P, Gamma, G; upper blocks) take.
zeros_bm: the same zeros and K by Burer-Monteiro (``solver="bm"``, r = 8K = 1,024,
         Y >= 0 in row chunks beside X), to its own stopping rule (App. E's: row sums
         and trace met within feasibility_tol, Y changing by less than tol): minutes on 2
         cores where the conditional-gradient run takes hours; Q = Y Y^T >= 0 by
         construction, so the authors' negativity rule holds exactly.  Its objective is
         also given as Tr(D Q) with the conditional-gradient run's D, to compare.
digits:  500 ones and 500 twos, each on its own, K = 16 (Fig. 6c).
fashion: 1,000 Fashion-MNIST sandals, K = 32.

Each embedding is Q's two leading eigenvectors after the constant one, scaled by
sqrt(eigenvalue) (NOMAD.embedding_), drawn with thumbnails of images spread over it.

    python graphs/mnist_zero.py [--only zeros,digits,fashion] [--max-iter N] [--plot-only]
    python graphs/mnist_zero.py --only zeros --hours 1.5         # go on with the zeros' run
    python graphs/mnist_zero.py --only zeros --device cuda       # go on with it on a GPU
    python graphs/mnist_zero.py --only zeros --overwrite         # start it afresh
    python graphs/mnist_zero.py --only zeros --device cuda --store '' --max-iter 20000 --hours 0.12
                                            # one fit in GPU memory, to the rule or the time cap
    python graphs/mnist_zero.py --only zeros_bm                  # Burer-Monteiro (not in the default parts)

The zeros run to the stopping rule takes hours on 2 host cores (in memory, --store '': 183
outer iterations in 2.1 h at 5459e80, one fit with no checkpoint).  With a store it runs in segments of
--segment outer iterations against a Zarr store (--store, default graphs/mnist_zero.zarr,
ignored by git): each invocation resumes the store's run from its last checkpoint (on the
same device it retraces an uninterrupted run exactly; on another, it goes on from the same
state) and stops after the segment in which --hours runs out.  Its row then says
"resumable"; "seconds" counts the solver's time over every session (the history's),
"segments" which commit and device ran which outer iterations, in how many wall seconds.
A store whose run has finished is loaded, not recomputed (the script says so).  The rows
of parts not rerun are kept from the saved JSON; a part rerun on other devices than its
saved row (--device cuda beside a CPU row) keeps that row and files the new one under
"earlier" (merge_saved).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import ResidentPeak, code_commit, memory_bandwidth, write_result  # noqa: E402

import dnomad  # noqa: E402
from dnomad.blocks import store as run_store  # noqa: E402
from dnomad.blocks.device import resolve_device  # noqa: E402
from dnomad.cli import run_info  # noqa: E402
from dnomad.errors import ConvergenceWarning, MissingDataError  # noqa: E402
from dnomad.nomad.estimator import CGM_MAX_ITER  # noqa: E402

NAME = "mnist_zero"
FASHION_CLASS = 5          # sandals
PARTS = ("zeros", "zeros_bm", "digits", "fashion")
SEGMENTS_KEY = "mnist_zero_segments"     # the store's record of which session ran what


def images(kind, label, count=None):
    X, _ = dnomad.data.mnist(label) if kind == "mnist" else dnomad.data.fashion_mnist(label)
    return X if count is None else X[:count]


def fit(kind, label, K, count=None, max_iter=None, device=None, store=None, segment=40, hours=None,
        overwrite=False):
    """Fit NOMAD to one image class and summarize the run.  With ``store``: in segments of
    ``segment`` outer iterations, each resuming the store's run, until the stopping rule,
    ``max_iter`` (default the solver's) or the segment in which ``hours`` runs out; without,
    one fit, stopped at ``hours`` if given (nothing to resume then: "time cap")."""
    X = images(kind, label, count)
    n = len(X)
    code = code_commit()            # the code that runs, before a long run's edits
    t = time.perf_counter()

    def time_cap(row):
        return time.perf_counter() - t > 3600 * hours

    est = dnomad.NOMAD(n_clusters=K, max_iter=max_iter, label_method="components", device=device,
                       store=store, overwrite=overwrite, checkpoint_every=segment if store else None,
                       callback=time_cap if store is None and hours is not None else None)
    cap = CGM_MAX_ITER if max_iter is None else max_iter
    segments = []
    with ResidentPeak() as rss:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if store is None:
                est.fit(X)
            else:
                resume, done = (False, 0) if overwrite else stored_progress(store)
                segments = [] if overwrite else run_store.read_json(store, SEGMENTS_KEY, [])
                if resume:
                    print(f"  {kind} {label}: resuming the run in {store} after {done} outer iterations", flush=True)
                while True:
                    began, start = done, time.perf_counter()
                    est.set_params(max_iter=int(min(cap, done + segment)))
                    est.fit(X, resume=resume)
                    resume, done = True, est.n_iter_
                    if done > began:
                        segments.append({"from": began, "to": done, "device": resolve_device(device),
                                         "commit": code_commit(), "seconds": time.perf_counter() - start})
                        run_store.write_json(store, SEGMENTS_KEY, segments)
                    else:
                        print(f"  {kind} {label}: nothing to run: the store's run is at {done} outer "
                              f"iterations; its result is read from the store, not recomputed", flush=True)
                    print(f"  {kind} {label}: {done} outer iterations ({est.stop_reason_}), max violation "
                          f"{est.history_[-1]['max_violation']:.3g}, rmse_neg {est.history_[-1]['rmse_neg']:.2g}, "
                          f"{time.perf_counter() - t:.0f} s this session", flush=True)
                    if est.stop_reason_ != "max_iter" or done >= cap or \
                            (hours is not None and time.perf_counter() - t > 3600 * hours):
                        break
        seconds = time.perf_counter() - t
    peak = rss.peak_above_start
    h = est.history_
    bytes_read = sum(r["bytes_read"] for r in h)
    solve_seconds = sum(r["seconds"] for r in h)
    # A stored run stopped by a --max-iter below the solver's cap can go on: "resumable".
    finished = store is None or est.stop_reason_ != "max_iter" or est.n_iter_ >= max(cap, CGM_MAX_ITER)
    stop_reason = "time cap" if est.stop_reason_ == "callback" else est.stop_reason_ if finished else "resumable"
    row = {"data": f"{kind} {label}", "n": n, "K": K, "code": code,
           # A resumed run: the solver's seconds over every session (its history's: not the
           # setup each segment repeats, which "segments" counts), and this session's wall time.
           "seconds": solve_seconds if store else seconds, "session_seconds": seconds,
           "n_iter": est.n_iter_, "stop_reason": stop_reason,
           "device": sorted({seg["device"] for seg in segments}) or [resolve_device(device)],
           "segments": segments, "passes": sum(r["passes"] for r in h),
           "bytes_read": bytes_read, "bytes_written": sum(r["bytes_written"] for r in h),
           "read_GB_per_s": bytes_read / max(solve_seconds, 1e-9) / 1e9,
           "state_GB": 3 * n * n / 2 * 4 / 1e9, "peak_GB": peak / 1e9, "rmse_neg": h[-1]["rmse_neg"],
           "max_violation": h[-1]["max_violation"], "objective": est.objective_,
           "trace": {"passes": np.cumsum([r["passes"] for r in h]).tolist(),
                     "max_violation": [r["max_violation"] for r in h],
                     "seconds": np.cumsum([r["seconds"] for r in h]).round(2).tolist(),
                     "rank": [r.get("rank") for r in h]},
           "embedding": np.round(est.embedding_, 4).tolist(), "kind": kind, "label": label,
           "count": count}
    print(f"{row['data']:12s} n={n:5d} K={K:4d}  {row['seconds']:7.1f} s  {est.n_iter_} outer ({row['stop_reason']})  "
          f"{row['passes']} passes  {bytes_read / 1e9:.1f} GB read at {row['read_GB_per_s']:.2f} GB/s  "
          f"rmse_neg {row['rmse_neg']:.1e}", flush=True)
    return row


def fit_bm(kind, label, K):
    """NOMAD by Burer-Monteiro on one image class, to its stopping rule, summarized."""
    X = images(kind, label)
    n = len(X)
    est = dnomad.NOMAD(n_clusters=K, solver="bm", label_method="components")
    code = code_commit()
    with ResidentPeak() as rss:
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est.fit(X)
        seconds = time.perf_counter() - t
    h = est.history_
    Y = np.asarray(est.Y_, dtype=np.float64)
    # Tr(D Y Y^T) = ||F^T Y||_F^2 with the conditional-gradient run's D = F F^T.
    F = dnomad.blocks.prepare_gram_data(np.asarray(X, dtype=np.float64))
    row = {"data": f"{kind} {label} (Burer-Monteiro)", "solver": "bm", "code": code, "n": n, "K": K,
           "rank": Y.shape[1],
           "seconds": seconds, "n_iter": est.n_iter_, "stop_reason": est.stop_reason_,
           "evaluations": int(sum(r["evaluations"] for r in h)),
           "objective": est.objective_, "objective_cgm_scale": float(np.sum((F.T @ Y) ** 2)),
           "row_sum_violation": h[-1]["row_sum_violation"], "trace_violation": h[-1]["trace_violation"],
           # Y in [0, 1], so Q = Y Y^T has no negative entry: the authors' violation is 0.
           "change": h[-1]["change"], "max_violation": 0.0, "peak_GB": rss.peak_above_start / 1e9,
           "Y_GB": Y.nbytes / 1e9,
           "trace": {"seconds": [round(r["seconds"], 2) for r in h],       # since the fit began
                     "evaluations": np.cumsum([r["evaluations"] for r in h]).tolist(),
                     "row_sum_violation": [r["row_sum_violation"] for r in h],
                     "inner_stop": [r.get("inner_stop") for r in h]},
           "embedding": np.round(est.embedding_, 4).tolist(), "kind": kind, "label": label, "count": None}
    print(f"{row['data']:12s} n={n:5d} K={K:4d} r={row['rank']}  {seconds:7.1f} s  {est.n_iter_} outer steps "
          f"({row['stop_reason']})  {row['evaluations']} evaluations  row-sum violation "
          f"{row['row_sum_violation']:.1e}  Tr(D Q) {row['objective_cgm_scale']:.6g}  peak +{row['peak_GB']:.2f} GB",
          flush=True)
    return row


def stored_progress(store):
    """(whether ``store`` holds a run, the outer iterations it has done): its result's,
    else its last checkpoint's (a session that ended mid-segment leaves no result); read
    as ``dnomad info`` reads a store."""
    info = run_info(store)
    if info is None:
        return False, 0
    if info["result"] is not None:
        return True, int(info["result"]["n_iter"])
    return True, 0 if info["checkpoint"] is None else int(info["checkpoint"]["iteration"])


def run(parts, max_iter, device=None, store=None, segment=40, hours=None, overwrite=False):
    rows = []
    bandwidth = memory_bandwidth() / 1e9
    if "zeros" in parts:
        rows.append(fit("mnist", 0, 128, max_iter=max_iter, device=device, store=store, segment=segment,
                        hours=hours, overwrite=overwrite))
    if "zeros_bm" in parts:
        rows.append(fit_bm("mnist", 0, 128))
    if "digits" in parts:
        rows += [fit("mnist", 1, 16, count=500, device=device), fit("mnist", 2, 16, count=500, device=device)]
    if "fashion" in parts:
        rows.append(fit("fashion", FASHION_CLASS, 32, count=1000, device=device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    print(f"\nmachine: memory copy bandwidth {bandwidth:.1f} GB/s; peak resident memory of the run "
          f"{peak:.2f} GB (the loaders included)")
    print(f"{'data':12s} {'n':>6s} {'K':>4s} {'seconds':>8s} {'s/outer':>8s} {'read/copy bw':>12s} "
          f"{'state GB':>9s} {'peak GB':>8s} {'peak/state':>10s}")
    for r in rows:
        if r.get("solver") == "bm":         # no n x n blocks: no bandwidth or state to compare
            continue
        print(f"{r['data']:12s} {r['n']:6d} {r['K']:4d} {r['seconds']:8.1f} {r['seconds'] / r['n_iter']:8.2f} "
              f"{r['read_GB_per_s'] / bandwidth:12.2f} {r['state_GB']:9.3f} {r['peak_GB']:8.3f} "
              f"{r['peak_GB'] / r['state_GB']:10.2f}")
    return {"copy_bandwidth_GB_per_s": bandwidth, "peak_rss_GB": peak, "rows": rows}


def _devices(row):
    device = row.get("device", ["cpu"])        # Burer-Monteiro rows run on the host, unrecorded
    return set([device] if isinstance(device, str) else device)


def merge_saved(result, saved):
    """``result``'s rows merged into the saved JSON's.  A fresh row replaces the saved row
    of its data set where it ran on that row's devices (a resumed store run adds devices:
    the same run gone on); on other devices only (a GPU fit beside the 2-core row the
    figure draws) the saved row stays and the fresh one goes under "earlier" as
    "<data>_<devices>_<commit>", without its embedding but with the Procrustes disparity
    of that embedding to the kept row's.  Saved rows of parts not rerun keep their order."""
    from scipy.spatial import procrustes

    rows, earlier = list(saved["rows"]), dict(saved.get("earlier") or {})
    for fresh in result["rows"]:
        at = next((i for i, r in enumerate(rows) if r["data"] == fresh["data"]), None)
        if at is None:
            rows.append(fresh)
        elif _devices(rows[at]) <= _devices(fresh):
            rows[at] = fresh
        else:
            kept = rows[at]
            fresh_devices = sorted(_devices(fresh))
            fresh_on, kept_on = ", ".join(fresh_devices), ", ".join(sorted(_devices(kept)))
            beside = {k: v for k, v in fresh.items() if k != "embedding"}
            A, B = np.asarray(kept.get("embedding")), np.asarray(fresh.get("embedding"))
            beside["procrustes_to_row"] = float(procrustes(A, B)[2]) if A.ndim == 2 and A.shape == B.shape \
                else None
            beside["note"] = (f"run on {fresh_on} beside the row of {kept_on} (code {kept.get('code')}), "
                              "which the figure draws; embedding not kept")
            key = "_".join([re.sub(r"\W+", "_", fresh["data"]).strip("_"), *fresh_devices, str(fresh.get("code"))])
            earlier[key] = beside
            print(f"{fresh['data']}: ran on {fresh_on}, the saved row on {kept_on}: kept as earlier[{key!r}] "
                  f"(Procrustes disparity to the row's embedding {beside['procrustes_to_row']})")
    return {**result, "rows": rows, **({"earlier": earlier} if earlier else {})}


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    rows = result["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(6.5 * len(rows), 6.5), squeeze=False)
    for ax, r in zip(axes[0], rows):
        E = np.asarray(r["embedding"])
        try:
            X = images(r["kind"], r["label"], r["count"])
        except MissingDataError:            # e.g. Fashion-MNIST on a GPU machine: points only
            X = None
        ax.scatter(E[:, 0], E[:, 1], s=2, c="0.7")
        # Thumbnails at points spread over the embedding: the first point in each cell
        # of a 9 x 9 grid.
        lo, hi = E.min(axis=0), E.max(axis=0)
        cells = np.floor((E - lo) / np.maximum(hi - lo, 1e-12) * 8.999).astype(int)
        _, first = np.unique(cells[:, 0] * 9 + cells[:, 1], return_index=True)
        for i in first if X is not None else ():
            box = OffsetImage(X[i].reshape(28, 28), cmap="gray_r", zoom=0.9)
            ax.add_artist(AnnotationBbox(box, E[i], frameon=False))
        state = {"tolerance": "at the rule", "resumable": f"not yet at the rule (max violation "
                 f"{r['max_violation']:.3f}), resumable", "time cap": f"stopped at the time cap (max "
                 f"violation {r['max_violation']:.3f})"}.get(r["stop_reason"], f"stopped: {r['stop_reason']}")
        work = (f"{r['n_iter']} multiplier steps, {r['evaluations']} evaluations" if r.get("solver") == "bm"
                else f"{r['n_iter']} outer iterations, {r['passes']} passes")
        ax.set_title(f"{r['data']}: n = {r['n']}, K = {r['K']}\n{r['seconds']:.0f} s, {work}, {state}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="zeros,digits,fashion", help=f"comma-separated parts of {list(PARTS)}")
    ap.add_argument("--max-iter", type=int, default=None, help="outer iterations for the zeros (default: "
                                                                "the solver's, to its stopping rule)")
    ap.add_argument("--device", default=None, help="'cpu' or 'cuda' (default: NOMAD's)")
    ap.add_argument("--store", default=os.path.join(HERE, f"{NAME}.zarr"),
                    help="the zeros' run store, resumed where it holds a run ('' for none: one fit in memory)")
    ap.add_argument("--segment", type=int, default=40, help="outer iterations between the zeros' checkpoints")
    ap.add_argument("--overwrite", action="store_true", help="start the zeros' run afresh in --store")
    ap.add_argument("--hours", type=float, default=None,
                    help="stop the zeros after the segment in which this much time has run (resume later); "
                         "with --store '': at this time, for good")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        with open(os.path.join(HERE, f"{NAME}.json")) as f:
            plot(json.load(f), os.path.join(HERE, f"{NAME}.png"))
    else:
        parts = args.only.split(",")
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            ap.error(f"--only: unknown parts {unknown}; known: {list(PARTS)}")
        result = run(parts, args.max_iter, device=args.device, store=args.store or None, segment=args.segment,
                     hours=args.hours, overwrite=args.overwrite)
        path = os.path.join(HERE, f"{NAME}.json")
        if os.path.exists(path):
            with open(path) as f:
                result = merge_saved(result, json.load(f))
        write_result(HERE, NAME, result, plot)
