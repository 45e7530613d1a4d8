"""Scale on a cluster as a user runs it: NOMAD and SymNMF with their default blocks on
workers of a given memory limit, each worker's and the client's peak memory beside the limit.

Each row runs NOMAD (two rings, n rows, sdp_k 16, 3 outer steps) or SymNMF (six blobs,
20 Frank-Wolfe iterations), backend "zarr", on a fresh LocalCluster of 2 worker processes (1 thread each; no pausing or spilling, so the
nanny's terminate threshold, 95% of the limit, is the bound), and records the block
side the engine chose, seconds, each worker's peak resident memory (ru_maxrss) and the
client's rise over its start.  A row given ``block_size`` forces it (the 64 MiB target
the engine used whatever the workers' limit).  The "nomad_bm" rows run
``NOMAD(n_clusters=8, solver="bm")`` with every other parameter at its default on a noisy
trefoil knot (``trefoil_knot(n, noise=0.05)``) read from a Zarr path in chunks of 62,500
rows, until its stopping rule or ``--bm-timeout`` seconds (then recorded as not finished,
with the outer steps it had made).  The row capped at 2 outer steps measures the result
(labels, embedding, Y written: its seconds from the last step) and the client's memory
for it, beside the same row with a ``--baseline`` checkout's dnomad.  The "nlr" row runs
``NLR(n_clusters=8, max_iter=30)`` on the same rows and cluster and measures the same
(its start, 30 iterations, then the labels and U written), beside a ``--baseline`` too.
The "riemannian" row runs ``RiemannianKMeans(n_clusters=8, max_iter=5,
min_eigenvalue="final")`` on 200,000 of those rows (its k-means start, 5 Newton steps,
the Hessian's smallest eigenvalue by Lanczos, then the labels, U and V written) and
measures the same, beside a ``--baseline`` too.

    python graphs/scale.py              # run every row (each replaces its row in scale.json), draw scale.png
    python graphs/scale.py --only bm    # the rows whose name contains "bm"
    python graphs/scale.py --only "2 outer" --baseline /tmp/old   # beside the dnomad of another checkout
    python graphs/scale.py --plot-only  # redraw from scale.json
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import ResidentPeak, code_commit, merge_row, replot, run_in_fresh_process, write_result  # noqa: E402

ROWS = (  # (name, method, n, worker memory limit in MiB, block_size (None: the default) or bm's max_iter)
    ("NOMAD, defaults, 2 x 400 MiB", "nomad", 6000, 400, None),
    ("NOMAD, defaults, 2 x 2 GiB", "nomad", 6000, 2048, None),
    ("NOMAD, 64 MiB target (3,000-blocks), 2 x 400 MiB", "nomad", 6000, 400, 3000),
    ("NOMAD, 64 MiB target (3,000-blocks), 2 x 2 GiB", "nomad", 6000, 2048, 3000),
    ("SymNMF, defaults, 2 x 400 MiB", "symnmf", 8000, 400, None),
    ("SymNMF, 64 MiB target (4,000-blocks), 2 x 400 MiB", "symnmf", 8000, 400, 4000),
    ("NOMAD bm, defaults, 10^6 trefoil rows from Zarr, 2 x 8 GiB", "nomad_bm", 1_000_000, 8192, None),
    ("NOMAD bm, 2 outer steps then the result, 10^6 trefoil rows from Zarr, 2 x 8 GiB", "nomad_bm", 1_000_000,
     8192, 2),
    ("NLR, 30 iterations then the result, 10^6 trefoil rows from Zarr, 2 x 8 GiB", "nlr", 1_000_000, 8192, 30),
    ("Riemannian K-means, 5 Newton steps, the Hessian's smallest eigenvalue, then the result, 200,000 trefoil "
     "rows from Zarr, 2 x 8 GiB", "riemannian", 200_000, 8192, 5),
)
# The rows whose solver runs on X's row chunks (each in a child process: see run_chunks_row).
ROW_CHUNK_METHODS = ("nomad_bm", "nlr", "riemannian")
BM_CHUNK_ROWS = 62_500
TERMINATE_FRACTION = 0.95
# Workers that neither pause nor spill: the nanny's terminate threshold is the only bound.
NO_PAUSE_OR_SPILL = {"distributed.worker.memory.pause": False, "distributed.worker.memory.spill": False,
                     "distributed.worker.memory.target": False}


def _estimator(method, store, block_size):
    """NOMAD on two rings (sdp_k 16, 3 outer steps) or SymNMF on six blobs (20 Frank-Wolfe
    iterations), both with their n x n matrices in Zarr."""
    import dnomad

    if method == "nomad":
        return dnomad.NOMAD(n_clusters=2, sdp_k=16, backend="zarr", store=store, block_size=block_size, max_iter=3)
    return dnomad.SymNMF(6, backend="zarr", store=store, block_size=block_size, max_iter=20)


def _block_side(store, n):
    """The chunk side of the n x n matrices the run stored (its blocks)."""
    import zarr

    sides = {a.chunks[0] for _, a in zarr.open_group(store, mode="r").members(max_depth=None)
             if isinstance(a, zarr.Array) and a.shape == (n, n)}
    return int(sides.pop()) if len(sides) == 1 else None


def _chunks_row_fields(name, method, n, limit_mib, max_iter):
    return {"name": name, "method": method, "n": n, "worker_limit_mib": limit_mib, "block_size_given": None,
            "max_iter": max_iter, "commit": code_commit()}


def run_chunks_row(name, method, n, limit_mib, max_iter, timeout):
    """NOMAD bm with its defaults (``max_iter`` None) or at most ``max_iter`` outer steps,
    or NLR for ``max_iter`` iterations, on n trefoil rows from a Zarr path, on a fresh
    2-worker LocalCluster in a child process, stopped at ``timeout`` seconds (wall, the
    data's making and the cluster's start included); a row stopped so gives the steps
    it made (bm: outer steps and their evaluations) and their fit seconds."""
    steps, fields = [], _chunks_row_fields(name, method, n, limit_mib, max_iter)     # the code the row measures
    status, row, wall = run_in_fresh_process(_chunks_child, (name, method, n, limit_mib, max_iter), timeout,
                                             on_progress=steps.append)
    if status == "ok":
        return row
    return dict(fields, status=status, wall=wall,
                seconds=steps[-1]["fit_seconds"] if steps else None, n_iter=steps[-1]["iteration"] if steps else 0,
                evaluations=sum(r.get("evaluations", 0) for r in steps) if method == "nomad_bm" else None,
                row_sum_violation=steps[-1].get("row_sum_violation") if steps else None,
                worker_peaks_mib=[], client_rise_mib=float("nan"))


def _chunks_estimator(method, store, callback, max_iter):
    import dnomad

    if method == "nlr":
        return dnomad.NLR(n_clusters=8, max_iter=max_iter, store=store, callback=callback)
    if method == "riemannian":
        return dnomad.RiemannianKMeans(n_clusters=8, max_iter=max_iter, min_eigenvalue="final", store=store,
                                       callback=callback)
    options = {} if max_iter is None else {"max_iter": max_iter}
    return dnomad.NOMAD(n_clusters=8, solver="bm", store=store, callback=callback, **options)


def _chunks_child(name, method, n, limit_mib, max_iter, queue):
    if os.environ.get("DNOMAD_CHECKOUT"):       # a --baseline row: that checkout's dnomad
        sys.path.insert(0, os.environ["DNOMAD_CHECKOUT"])
    import dask
    import zarr
    from distributed import Client, LocalCluster

    import dnomad
    import dnomad.api  # noqa: F401 - the estimators (dnomad imports them on first use), before the client is measured
    from dnomad.blocks.engine import _worker_peak_rss
    from dnomad.data import trefoil_knot

    row = dict(_chunks_row_fields(name, method, n, limit_mib, max_iter), dnomad_path=os.path.dirname(dnomad.__file__))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "X.zarr")
        X = trefoil_knot(n, noise=0.05)[0]
        zarr.create_array(store=path, shape=X.shape, dtype=X.dtype, chunks=(BM_CHUNK_ROWS, X.shape[1]))[...] = X
        del X
        with dask.config.set(NO_PAUSE_OR_SPILL), LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, memory_limit=limit_mib * 2**20,
                dashboard_address=None) as cluster, Client(cluster) as client, ResidentPeak() as client_peak:
            t0 = time.perf_counter()
            last_step = [t0]

            def callback(row):
                last_step[0] = time.perf_counter()
                measures = ", ".join(f"{key} {row[key]:.3g}" for key in ("evaluations", "row_sum_violation",
                                                                        "infeasibility") if key in row)
                print(f"  step {row['iteration']}: {measures}, {time.perf_counter() - t0:.0f} s", flush=True)
                queue.put({"progress": dict(row, fit_seconds=time.perf_counter() - t0)})

            est = _chunks_estimator(method, os.path.join(tmp, "run.zarr"), callback, max_iter)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
                    est.fit(path)
                row.update(status="ok", stop_reason=est.stop_reason_, n_iter=int(est.n_iter_),
                           fit_seconds=est.fit_seconds_,
                           # from the last step's end: its checkpoint, the labels (bm: and the
                           # embedding) and the result written
                           result_seconds=time.perf_counter() - last_step[0])
                if method == "nlr":
                    row.update(infeasibility=est.infeasibility_, rank=int(est.U_.shape[1]))
                elif method == "riemannian":
                    row.update(min_eigenvalue=est.min_eigenvalue_, grad_norm=est.grad_norm_,
                               rank=int(est.U_.shape[1]), curvature_steps=int(est.curvature_steps_))
                else:
                    start = est.layers_[0].get("start") or {}
                    row.update(evaluations=int(sum(h["evaluations"] for h in est.history_)),
                               row_sum_violation=est.history_[-1]["row_sum_violation"], sdp_k=int(est.sdp_k_),
                               rank=int(est.Y_.shape[1]), start_seconds=start.get("seconds"),
                               start_iterations=start.get("iterations"), label_method_used=est.label_method_used_)
            except Exception as exc:  # noqa: BLE001 - a killed run is a result of this benchmark
                row.update(status=f"failed: {type(exc).__name__}: {exc}"[:300])
            row["seconds"] = time.perf_counter() - t0
            peaks = client.run(_worker_peak_rss)
        row["worker_peaks_mib"] = sorted(v / 2**20 for v in peaks.values())
        row["client_rise_mib"] = client_peak.peak_above_start / 2**20
    queue.put(row)


def chunks_plan(method, n, limit_mib):
    """dnomad.plan's prediction for a row-chunk row (this checkout's dnomad): each worker's
    and the client's bytes in MiB, from an X of the row's shape and chunks (metadata only)."""
    import zarr

    import dnomad

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "X.zarr")
        zarr.create_array(store=path, shape=(n, 3), chunks=(BM_CHUNK_ROWS, 3), dtype="f8")
        params = {"nomad_bm": {"solver": "bm"}, "riemannian": {"min_eigenvalue": "final"}}.get(method, {})
        plan = dnomad.plan(path, {"nomad_bm": "nomad", "riemannian": "riemannian-kmeans"}.get(method, method),
                           n_clusters=8, store=os.path.join(tmp, "run.zarr"), n_workers=2,
                           worker_memory=limit_mib * 2**20, **params)
    return _plan_fields(plan)


def _plan_fields(plan):
    return {"plan_worker_mib": plan.worker_total / 2**20, "plan_client_mib": plan.client_total / 2**20}


def run_row(name, method, n, limit_mib, block_size):
    import dask
    from distributed import Client, LocalCluster

    import dnomad
    import dnomad.api  # noqa: F401 - the estimators (dnomad imports them on first use), before the client is measured
    from dnomad.blocks.engine import _worker_peak_rss
    from dnomad.data import gaussian_blobs, two_rings

    cfg = dict(NO_PAUSE_OR_SPILL, **{"distributed.scheduler.allowed-failures": 0})
    row = {"name": name, "method": method, "n": n, "worker_limit_mib": limit_mib, "block_size_given": block_size,
           "commit": code_commit()}
    X = two_rings(n)[0] if method == "nomad" else gaussian_blobs(n, n_centers=6, n_features=5)[0]
    with dask.config.set(cfg), LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                            memory_limit=limit_mib * 2**20, dashboard_address=None) as cluster, \
            Client(cluster) as client, tempfile.TemporaryDirectory() as tmp, ResidentPeak() as client_peak:
        est = _estimator(method, os.path.join(tmp, "run.zarr"), block_size)
        t = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
                est.fit(X)
            row.update(status="ok", block_size=_block_side(os.path.join(tmp, "run.zarr"), n),
                       n_iter=int(est.n_iter_))
        except Exception as exc:  # noqa: BLE001 - a killed run is a result of this benchmark
            row.update(status=f"failed: {type(exc).__name__}")
        row["seconds"] = time.perf_counter() - t
        peaks = client.run(_worker_peak_rss)
    row["worker_peaks_mib"] = sorted(v / 2**20 for v in peaks.values())
    row["client_rise_mib"] = client_peak.peak_above_start / 2**20
    # the plan of this fit (its estimator's parameters) on these workers
    row.update(_plan_fields(dnomad.plan(X, method, n_workers=2, worker_memory=limit_mib * 2**20,
                                        **est.get_params(deep=False))))
    return row


def _block(row):
    return row.get("block_size") or row["block_size_given"] or "-"


def table(result):
    lines = ["| run | n | worker limit | block | status | seconds | worker peaks (MiB) | of the 95% bound | client rise | "
             "plan: worker / client (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    chunked = [r for r in result["rows"] if r["method"] in ROW_CHUNK_METHODS]
    for r in result["rows"]:
        peak = max(r["worker_peaks_mib"]) if r["worker_peaks_mib"] else float("nan")
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
        lines.append(f"| {r['name']} | {r['n']} | {r['worker_limit_mib']} MiB | {_block(r)} | "
                     f"{r['status']} | {seconds} | {', '.join(f'{p:.0f}' for p in r['worker_peaks_mib'])} | "
                     f"{peak / (TERMINATE_FRACTION * r['worker_limit_mib']):.2f} | {r['client_rise_mib']:.0f} MiB | "
                     f"{_pair(r.get('plan_worker_mib'), r.get('plan_client_mib'))} |")
    if chunked:
        lines += ["", "| row-chunk run | stop | steps | evaluations | row-sum violation | start (s) | labels | "
                      "result (s) | worker peak / plan (MiB) | client rise / plan (MiB) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in chunked:
            start, violation, finish = r.get("start_seconds"), r.get("row_sum_violation"), r.get("result_seconds")
            peak = max(r["worker_peaks_mib"]) if r["worker_peaks_mib"] else None
            lines.append(f"| {r['name']} | {r.get('stop_reason', r['status'])} | {r.get('n_iter', '-')} | "
                         f"{r.get('evaluations', '-')} | {'-' if violation is None else f'{violation:.2g}'} | "
                         f"{'-' if start is None else f'{start:.0f}'} | {r.get('label_method_used', '-')} | "
                         f"{'-' if finish is None else f'{finish:.0f}'} | "
                         f"{_pair(peak, r.get('plan_worker_mib'))} | "
                         f"{_pair(r['client_rise_mib'], r.get('plan_client_mib'))} |")
    return "\n".join(lines)


def _pair(measured, planned):
    def show(v):
        return "-" if v is None or v != v else f"{v:.0f}"
    return f"{show(measured)} / {show(planned)}"


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(11, 0.75 * len(rows) + 2.0))
    y = np.arange(len(rows))
    peaks = [max(r["worker_peaks_mib"]) if r["worker_peaks_mib"] else 1 for r in rows]     # none: a killed row
    ax.barh(y, peaks, color=["tab:blue" if r["status"] == "ok" else "tab:red" for r in rows],
            label="largest worker peak")
    ax.scatter([TERMINATE_FRACTION * r["worker_limit_mib"] for r in rows], y, marker="|", s=400, color="black",
               label="95% of the limit (the nanny restarts the worker)")
    ax.scatter([max(r["client_rise_mib"], 1) for r in rows], y, marker="x", color="tab:orange",
               label="the client's rise over its start")
    ax.set_yticks(y, [textwrap.fill(r["name"], 55) + f"\nblock {_block(r)}, {r['status']}" for r in rows],
                  fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("MiB")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    ax.set_title("graphs/scale.py: NOMAD (two rings, n = 6,000; bm and NLR: trefoil, n = 10^6; Riemannian "
                 "K-means: 200,000),\n"
                 "SymNMF (blobs, n = 8,000); backend 'zarr' (bm, NLR: row chunks), 2 workers "
                 f"({result['environment']['machine']}, at {result['environment']['commit']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@contextlib.contextmanager
def _package_at(checkout):
    """Child processes started inside import dnomad from ``checkout`` (None: as this
    process does) and stamp their rows with its commit; yields that commit."""
    if checkout is None:
        yield code_commit()
        return
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True,
                            check=True).stdout.strip()
    # PYTHONPATH for the workers' processes too (the path finder comes before an editable install's)
    saved = {k: os.environ.get(k) for k in ("DNOMAD_CHECKOUT", "DNOMAD_COMMIT", "PYTHONPATH")}
    os.environ.update(DNOMAD_CHECKOUT=os.path.abspath(checkout), DNOMAD_COMMIT=commit,
                      PYTHONPATH=os.pathsep.join([os.path.abspath(checkout)] + ([saved["PYTHONPATH"]]
                                                                                if saved["PYTHONPATH"] else [])))
    try:
        yield commit
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv=None):
    import json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plot-only", action="store_true")
    p.add_argument("--only", help="run only the rows whose name contains this text")
    p.add_argument("--bm-timeout", type=float, default=3600.0,
                   help="seconds a nomad_bm or nlr row may take before it is recorded as not finished (default 3600)")
    p.add_argument("--baseline", metavar="PATH",
                   help="also run the row-chunk rows (nomad_bm, nlr, riemannian) with the dnomad package of the checkout at PATH "
                        "(an earlier commit: git worktree add PATH <commit>), as rows named '<row> (dnomad at "
                        "<commit>)'")
    args = p.parse_args(argv)
    path = os.path.join(HERE, "scale.json")
    if args.plot_only:
        replot(HERE, "scale", plot)
        print(table(json.load(open(path))))
        return
    import dask
    import distributed

    import dnomad
    environment = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
                   "dnomad": dnomad.__version__, "dask": dask.__version__, "distributed": distributed.__version__,
                   "commit": code_commit()}
    command = "python graphs/scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = json.load(open(path)) if os.path.exists(path) else {"rows": []}     # rows replaced by name
    result.update(environment=environment, command=command)
    for name, method, n, limit, block_size in ROWS:
        if args.only is not None and args.only not in name:
            continue
        if method not in ROW_CHUNK_METHODS:
            row = run_row(name, method, n, limit, block_size)
            merge_row(path, result, dict(row, command=command), key=lambda r: r["name"])
            continue
        for code in ([None, args.baseline] if args.baseline else [None]):
            with _package_at(code) as commit:
                row_name = name if code is None else f"{name} (dnomad at {commit})"
                row = run_chunks_row(row_name, method, n, limit, block_size, args.bm_timeout)
            if code is None:
                row.update(chunks_plan(method, n, limit))
            merge_row(path, result, dict(row, command=command), key=lambda r: r["name"])
    print(table(result))
    write_result(HERE, "scale", result, plot)


if __name__ == "__main__":
    main()
