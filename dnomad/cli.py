"""The ``dnomad`` command: demo, fit, resume, info."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

logger = logging.getLogger("dnomad")


def _plot(X, est, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Q = np.asarray(est.Q_)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    axes[0].scatter(X[:, 0], X[:, 1], c=est.labels_, cmap="tab10", s=8)
    axes[0].set_title(f"data colored by label ({len(np.unique(est.labels_))} groups)")
    axes[0].set_aspect("equal")
    axes[1].imshow(Q, cmap="magma", vmin=0, vmax=np.percentile(Q, 99.5))
    axes[1].set_title(f"Q (n={Q.shape[0]}, K={est.n_clusters})")
    axes[2].scatter(est.embedding_[:, 0], est.embedding_[:, 1], c=est.labels_, cmap="tab10", s=8)
    axes[2].set_title("2-D spectral embedding of Q")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_demo(args):
    """NOMAD on two rings: Q, the history and checkpoints in a local Zarr store, and a PNG.

    By default the blocks live in the workers of an embedded LocalCluster (or of the
    current client), as a real run's would; ``--backend local`` runs the same kernels in
    this process, several times faster at this size (no round trip per pass)."""
    import dnomad
    from dnomad.data import two_rings

    os.makedirs(args.output, exist_ok=True)
    store = os.path.join(args.output, "nomad.zarr")
    X, y = two_rings(args.n_samples)
    est = dnomad.NOMAD(n_clusters=args.n_clusters, backend=args.backend, store=store,
                       overwrite=True, block_size=args.block_size)
    est.fit(X)
    png = os.path.join(args.output, "nomad_demo.png")
    _plot(X, est, png)
    ari = dnomad.metrics.adjusted_rand_score(y, est.labels_)
    print(f"NOMAD on two rings: n={len(X)}, K={args.n_clusters}, {est.n_iter_} outer iterations "
          f"({est.stop_reason_}), objective {est.objective_:.6g}, ARI vs rings {ari:.3f}")
    print(f"Q and history: {store}\nplot: {png}")
    return 0


def _read_input(path):
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if path.endswith((".csv", ".txt")):
        return np.loadtxt(path, delimiter="," if path.endswith(".csv") else None)
    return path  # a Zarr path or URL


def _connect(address=None, scheduler_file=None):
    """A client for the given scheduler, else for $DASK_SCHEDULER_ADDRESS (what the Dask
    Kubernetes operator sets in a DaskJob's pod), else None (run in process)."""
    address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not (address or scheduler_file):
        return None
    from distributed import Client

    return Client(address) if address else Client(scheduler_file=scheduler_file)


def cmd_fit(args):
    import dnomad

    client = _connect(args.scheduler_address, args.scheduler_file)
    try:
        params = json.loads(args.params) if args.params else {}
        if args.method == "hottopixx":
            est = dnomad.fit(_read_input(args.input), method="hottopixx", rank=args.n_clusters,
                             store=args.store, overwrite=args.overwrite, **params)
            print(f"hottopixx: {est.n_epochs_} epochs, hott rows {est.hott_rows_.tolist()}, "
                  f"||X - F W||_inf,1 = {est.error_:.4g}; results in {args.store}")
            return 0
        if args.method == "symnmf":
            params.setdefault("affinity", "precomputed" if args.precomputed else "gaussian")
        else:
            params.setdefault("precomputed", args.precomputed)
        est = dnomad.fit(_read_input(args.input), method=args.method, n_clusters=args.n_clusters,
                         store=args.store, overwrite=args.overwrite, backend=args.backend,
                         dtype=np.float64 if args.dtype == "float64" else np.float32, **params)
        print(f"{args.method}: {est.n_iter_} iterations ({est.stop_reason_}), objective "
              f"{est.objective_:.6g}; results in {args.store}")
    finally:
        if client is not None:
            client.close()
    return 0


def cmd_resume(args):
    import dnomad

    client = _connect()
    try:
        est = dnomad.resume(args.store)
    finally:
        if client is not None:
            client.close()
    print(f"resumed: {est.n_iter_} outer iterations ({est.stop_reason_}), objective {est.objective_:.6g}")
    return 0


def cmd_info(args):
    from dnomad.blocks import store as run_store

    meta = run_store.read_json(args.store, run_store.RUN_MARKER)
    if meta is None:
        print(f"{args.store}: no dnomad run here", file=sys.stderr)
        return 1
    ck = run_store.read_json(args.store, f"{meta['method']}_checkpoint") or {}
    res = run_store.read_json(args.store, "result") or {}
    print(json.dumps({"run": meta, "checkpoint_iteration": ck.get("t", ck.get("iteration")),
                      "result": {k: v for k, v in res.items() if k != "history"},
                      "last_history_row": (res.get("history") or ck.get("history") or [None])[-1]},
                     indent=2))
    return 0


def build_parser():
    """The ``dnomad`` argument parser (also used by the tests to check deploy/ commands)."""
    parser = argparse.ArgumentParser(prog="dnomad", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every outer iteration")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="NOMAD on two rings on an embedded LocalCluster; writes Q and a PNG")
    p.add_argument("--output", default="demo_out")
    p.add_argument("--n-samples", type=int, default=200)
    p.add_argument("--n-clusters", type=int, default=8)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--backend", default="distributed", choices=["auto", "local", "distributed", "zarr"])
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("fit", help="fit a method on data (.npy, .csv or a Zarr path)")
    p.add_argument("--input", required=True)
    p.add_argument("--method", default="nomad", choices=["nomad", "symnmf", "hottopixx"])
    p.add_argument("--n-clusters", "--rank", dest="n_clusters", type=int, required=True,
                   help="K (nomad), k (symnmf) or the rank r (hottopixx: features x samples input)")
    p.add_argument("--store", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--precomputed", action="store_true",
                   help="the input is an n x n Gram (nomad) or affinity (symnmf) matrix")
    p.add_argument("--backend", default="auto", choices=["auto", "local", "distributed", "zarr"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--params", help="other estimator parameters as JSON, e.g. '{\"max_iter\": 500}'")
    p.add_argument("--scheduler-address", help="connect to this scheduler (default: "
                   "$DASK_SCHEDULER_ADDRESS when set, else run in process)")
    p.add_argument("--scheduler-file")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("resume", help="continue the run in STORE from its last checkpoint")
    p.add_argument("store")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("info", help="print the metadata and progress of the run in STORE")
    p.add_argument("store")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
