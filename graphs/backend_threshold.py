"""Where the in-process backend stops paying: one NOMAD inner step (the fused pass plus
the warm-started eigensolver's matvecs) in this process against the same step on a
LocalCluster (2 workers x 1 thread, blocks held by one actor per worker).

    python graphs/backend_threshold.py                 # n = 1000 ... 16000
    python graphs/backend_threshold.py --sizes 2000 8000

Both backends run the same kernels on the same machine, so their ratio is the cost of
the cluster's round trips (a pass is one call per worker, one gather) against the pass's
own time.  ``dnomad.fit``'s backend="auto" runs n below LOCAL_MAX_N in process; this
table is what that constant rests on.  Writes graphs/backend_threshold.json and .png.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from _bench import write_result

HERE = os.path.dirname(os.path.abspath(__file__))
K = 16
STEPS = 3          # outer iterations timed per size (after one warm-up)
N_INNER = 10


def seconds_per_inner_step(n, backend, client):
    from dnomad import blocks
    from dnomad.data import two_rings
    from dnomad.nomad.cgm import NomadParams, nomad_cgm

    F = blocks.prepare_gram_data(two_rings(n)[0]).astype(np.float32)
    group = blocks.new_group(n, dtype=np.float32, backend=backend, client=client)
    data = blocks.DataPanels(group, F)
    params = NomadParams(n_clusters=K, max_iter=1 + STEPS, n_inner=N_INNER, rmse_tol=0, min_tol=0,
                         objective_tol=0)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = nomad_cgm(group, params, data=data)
    h = res.history[1:]
    out = {"seconds": float(np.mean([r["seconds"] for r in h])) / N_INNER,
           "passes": float(np.mean([r["passes"] for r in h])) / N_INNER,
           "blocks_per_side": group.layout.nblocks}
    group.close()
    return out


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows = result["rows"]
    ns = [r["n"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    ax.loglog(ns, [r["local"]["seconds"] for r in rows], "o-", label="in process (2 threads)")
    ax.loglog(ns, [r["distributed"]["seconds"] for r in rows], "s-",
              label="LocalCluster (2 workers x 1 thread)")
    ax.set_ylabel("seconds per NOMAD inner step")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.semilogx(ns, [r["ratio"] for r in rows], "o-")
    ax.axhline(1.0, color="k", lw=1)
    ax.axvline(result["local_max_n_in_code"], color="C3", ls="--", lw=1,
               label=f"LOCAL_MAX_N = {result['local_max_n_in_code']}")
    ax.set_ylabel("distributed / in process")
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("n")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle("two rings, K=16, float32, one 2-core machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 2000, 4000, 8000, 16000])
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    from dnomad.blocks.cluster import LOCAL_MAX_N

    rows = []
    print(f"{'n':>6s} {'blocks':>6s} {'local s/step':>12s} {'dist s/step':>11s} {'passes/step':>11s} "
          f"{'dist/local':>10s} {'dist overhead ms/pass':>21s}", flush=True)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for n in args.sizes:
            loc = seconds_per_inner_step(n, "local", None)
            dist = seconds_per_inner_step(n, "distributed", client)
            ratio = dist["seconds"] / loc["seconds"]
            overhead = (dist["seconds"] - loc["seconds"]) / dist["passes"] * 1e3
            rows.append({"n": n, "local": loc, "distributed": dist, "ratio": ratio,
                         "overhead_ms_per_pass": overhead})
            print(f"{n:6d} {dist['blocks_per_side']:6d} {loc['seconds']:12.4f} {dist['seconds']:11.4f} "
                  f"{dist['passes']:11.1f} {ratio:10.2f} {overhead:21.1f}", flush=True)
    result = {"rows": rows, "local_max_n_in_code": LOCAL_MAX_N, "cpu_count": len(os.sched_getaffinity(0)),
              "when": time.strftime("%Y-%m-%d %H:%M")}
    write_result(HERE, "backend_threshold", result, plot)


if __name__ == "__main__":
    main()
