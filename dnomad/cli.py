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
    """.npy, .csv or .txt (a local path or any fsspec URL: s3://, gs://, ...), else a Zarr
    array's path or URL, read where it is."""
    if not path.endswith((".npy", ".csv", ".txt")):
        return path
    import fsspec

    with fsspec.open(path, "rb") as f:
        if path.endswith(".npy"):
            return np.load(f, allow_pickle=False)
        return np.loadtxt(f, delimiter="," if path.endswith(".csv") else None)


# Keys of a run configuration file (TOML or YAML) and of the [cluster] / [security] tables.
CONFIG_KEYS = {"input", "method", "n_clusters", "rank", "store", "overwrite", "precomputed", "backend",
               "device", "dtype", "params", "cluster", "security"}
CLUSTER_KEYS = {"address", "scheduler_file", "local", "n_workers", "slurm_jobs", "wait_for_workers"}
SECURITY_KEYS = {"tls_ca_file", "tls_client_cert", "tls_client_key", "tls_scheduler_cert",
                 "tls_scheduler_key", "tls_worker_cert", "tls_worker_key", "require_encryption"}


def load_config(path):
    """A run configuration: TOML (.toml) or YAML (.yaml/.yml), keys as the flags of
    ``dnomad fit`` (``n_clusters`` or ``rank``, ``params`` a table of estimator
    parameters), plus ``[cluster]`` (``address``, ``scheduler_file``, ``local = true``
    with ``n_workers``, or ``slurm_jobs``; ``wait_for_workers``) and ``[security]`` (TLS
    files for distributed's Security).
    Unknown keys are refused, so that a typo does not silently fall back to a default."""
    if not os.path.exists(path):
        raise SystemExit(f"dnomad: config file {path!r} does not exist")
    if path.endswith(".toml"):
        import tomllib

        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    elif path.endswith((".yaml", ".yml")):
        import yaml

        with open(path) as f:
            cfg = yaml.safe_load(f) or {}
    else:
        raise SystemExit(f"dnomad: config file {path!r} must end in .toml, .yaml or .yml")
    for table, allowed in ((cfg, CONFIG_KEYS), (cfg.get("cluster", {}), CLUSTER_KEYS),
                           (cfg.get("security", {}), SECURITY_KEYS)):
        unknown = set(table) - allowed
        if unknown:
            raise SystemExit(f"dnomad: unknown keys {sorted(unknown)} in {path!r}; allowed: {sorted(allowed)}")
    if "rank" in cfg:
        cfg.setdefault("n_clusters", cfg.pop("rank"))
    return cfg


def _security(cfg):
    if not cfg:
        return None
    from distributed.security import Security

    files = {k: v for k, v in cfg.items() if k != "require_encryption"}
    for key, path in files.items():
        if not os.path.exists(path):
            raise SystemExit(f"dnomad: security.{key} = {path!r} does not exist")
    # A LocalCluster started from this config (cluster.local) serves with the client's
    # certificate unless scheduler/worker ones are given.
    for role in ("scheduler", "worker"):
        files.setdefault(f"tls_{role}_cert", files.get("tls_client_cert"))
        files.setdefault(f"tls_{role}_key", files.get("tls_client_key"))
    return Security(require_encryption=cfg.get("require_encryption", True),
                    **{k: v for k, v in files.items() if v is not None})


def _connect(address=None, scheduler_file=None, *, local=False, n_workers=None, slurm_jobs=None,
             wait_for_workers=None, security=None):
    """(client, cluster) for a run, the first that applies of: a scheduler ``address``;
    $DASK_SCHEDULER_ADDRESS (what the Dask Kubernetes operator sets in a DaskJob's pod);
    a ``scheduler_file`` (a SLURM job's scheduler, see deploy/slurm); ``slurm_jobs``
    batch jobs of workers submitted by dask-jobqueue's SLURMCluster (its settings from
    dask config ``jobqueue.slurm``); a LocalCluster of ``n_workers`` when ``local``;
    else (None, None): run in this process.  ``wait_for_workers``: block until that
    many workers have joined (default: all that ``slurm_jobs`` asked for)."""
    from distributed import Client

    address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
    cluster = None
    if address:
        client = Client(address, security=security)
    elif scheduler_file:
        client = Client(scheduler_file=scheduler_file, security=security)
    elif slurm_jobs:
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError as exc:
            raise SystemExit("dnomad: slurm_jobs needs dask-jobqueue (pip install dask-jobqueue)") from exc
        cluster = SLURMCluster(security=security, protocol="tls://" if security else None)
        cluster.scale(jobs=int(slurm_jobs))
        client = Client(cluster, security=security)
        wait_for_workers = wait_for_workers or len(cluster.plan)   # workers the jobs will start
    elif local:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None,
                               security=security, protocol="tls://" if security else None)
        client = Client(cluster, security=security)
    else:
        return None, None
    if wait_for_workers:
        logger.info("waiting for %d workers", wait_for_workers)
        client.wait_for_workers(int(wait_for_workers))
    return client, cluster


def _cluster_settings(args, cluster=None):
    """The [cluster] table, with the cluster flags (which win) applied."""
    cluster = dict(cluster or {})
    if args.scheduler_address:
        cluster = {"address": args.scheduler_address}
    elif args.scheduler_file:
        cluster = {"scheduler_file": args.scheduler_file}
    elif args.slurm_jobs:
        cluster = {"slurm_jobs": args.slurm_jobs}
    elif args.local_workers:
        cluster = {"local": True, "n_workers": args.local_workers}
    if args.wait_for_workers:
        cluster["wait_for_workers"] = args.wait_for_workers
    return cluster


def _fit_settings(args):
    """Flags over the config file over the defaults; missing required settings refused."""
    cfg = load_config(args.config) if args.config else {}
    defaults = {"method": "nomad", "overwrite": False, "precomputed": False, "backend": "auto",
                "dtype": "float32", "params": {}}
    out = {}
    for key in ("input", "method", "n_clusters", "store", "overwrite", "precomputed", "backend", "device",
                "dtype"):
        flag = getattr(args, key)
        out[key] = flag if flag not in (None, False) else cfg.get(key, defaults.get(key))
    out["params"] = dict(cfg.get("params", {}))
    if args.params:
        out["params"].update(json.loads(args.params))
    missing = [k for k in ("input", "n_clusters", "store") if out[k] is None]
    if missing:
        raise SystemExit(f"dnomad fit: missing {', '.join('--' + m.replace('_', '-') for m in missing)} "
                         f"(give them as flags or in --config)")
    if out["device"] is not None:
        if out["method"] != "nomad":
            raise SystemExit(f"dnomad fit: --device is NOMAD's (its blocks on a GPU); --method "
                             f"{out['method']} runs on the host")
        out["params"]["device"] = out["device"]
    out["cluster"] = _cluster_settings(args, cfg.get("cluster", {}))
    out["security"] = cfg.get("security")
    return out


def cmd_fit(args):
    import dnomad

    run = _fit_settings(args)
    security = _security(run["security"])
    client, cluster = _connect(**run["cluster"], security=security)
    try:
        params = run["params"]
        X = _read_input(run["input"])
        if run["method"] == "hottopixx":
            est = dnomad.fit(X, method="hottopixx", rank=run["n_clusters"], store=run["store"],
                             overwrite=run["overwrite"], **params)
            print(f"hottopixx: {est.n_epochs_} epochs, hott rows {est.hott_rows_.tolist()}, "
                  f"||X - F W||_inf,1 = {est.error_:.4g}; results in {run['store']}")
            return 0
        if run["method"] == "bregman":
            est = dnomad.fit(X, method="bregman", n_clusters=run["n_clusters"], store=run["store"],
                             overwrite=run["overwrite"], **params)
            print(f"bregman ({est.model}, {est.divergence}): relaxation {est.n_iter_} iterations "
                  f"({est.stop_reason_}), hard objective {est.objective_:.6g}; labels in {run['store']}")
            return 0
        if run["method"] in ("riemannian-kmeans", "nlr"):
            est = dnomad.fit(X, method=run["method"], n_clusters=run["n_clusters"], store=run["store"],
                             overwrite=run["overwrite"], backend=run["backend"], **params)
            print(f"{run['method']}: {est.n_iter_} iterations ({est.stop_reason_}), labels and U in "
                  f"{run['store']}")
            return 0
        if run["method"] == "symnmf":
            params.setdefault("affinity", "precomputed" if run["precomputed"] else "gaussian")
        else:
            params.setdefault("precomputed", run["precomputed"])
        est = dnomad.fit(X, method=run["method"], n_clusters=run["n_clusters"], store=run["store"],
                         overwrite=run["overwrite"], backend=run["backend"],
                         dtype=np.float64 if run["dtype"] == "float64" else np.float32, **params)
        print(f"{run['method']}: {est.n_iter_} iterations ({est.stop_reason_}), objective "
              f"{est.objective_:.6g}; results in {run['store']}")
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    return 0


def cmd_resume(args):
    import dnomad

    client, cluster = _connect(**_cluster_settings(args))
    try:
        est = dnomad.resume(args.store)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(f"resumed: {est.n_iter_} outer iterations ({est.stop_reason_}), objective {est.objective_:.6g}")
    return 0


def run_info(store):
    """What ``dnomad info`` reports: the run record, the last checkpoint, the result, and
    the history table (the result's if finished, else the last checkpoint's)."""
    from dnomad.blocks import store as run_store

    meta = run_store.read_json(store, run_store.RUN_MARKER)
    if meta is None:
        return None
    layers = []
    ck = None
    if meta["method"] == "nomad":
        from dnomad.fit import finished_layers, layer_checkpoint_key

        layers = [run_store.read_json(store, f"layers/{layer}") for layer in range(finished_layers(store))]
        # The checkpoint of the layer running (or last run) in a multi-layer run.
        for layer in range(len(layers), -1, -1):
            ck = run_store.Checkpoints(store, layer_checkpoint_key(layer)).latest()
            if ck is not None:
                ck["layer"] = layer
                break
    else:
        ck = run_store.Checkpoints(store, f"{meta['method']}_checkpoint").latest()
    res = run_store.read_json(store, "result")
    history = run_store.read_table(store, "result/history") if res else None
    if history is None:
        history = ck["history"] if ck else []
    checkpoint = None if ck is None else {k: v for k, v in ck.items() if k not in ("history", "params")}
    return {"store": str(store), "run": meta, "checkpoint": checkpoint, "result": res, "layers": layers,
            "status": "finished" if res else ("interrupted or running" if ck else "started"),
            "history": history}


def _format_table(rows, columns=None):
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def cell(v):
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    cells = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def cmd_info(args):
    info = run_info(args.store)
    if info is None:
        print(f"{args.store}: no dnomad run here", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    run, res, ck, history = info["run"], info["result"], info["checkpoint"], info["history"]
    params = {k: v for k, v in run["estimator_params"].items() if v is not None and k != "callback"}
    print(f"store       {info['store']}")
    print(f"run         {run['method']} (run id {run['run_id']}), started {run['started']} on "
          f"{run.get('host')}")
    print(f"status      {info['status']}" + (f", {res['finished']} after {res.get('fit_seconds', 0):.1f} s"
                                           if res else ""))
    print(f"input       {json.dumps(run['input'])}")
    print(f"params      {' '.join(f'{k}={v}' for k, v in params.items())}")
    print(f"versions    {' '.join(f'{k} {v}' for k, v in run['versions'].items())}")
    for i, layer in enumerate(info["layers"]):
        print(f"layer {i}     K={layer['n_clusters']} {layer['n_iter']} iterations ({layer['stop_reason']}), "
              f"objective {layer['objective']:.6g}")
    if ck is not None:
        where = f" of layer {ck['layer']}" if info["layers"] or ck.get("layer") else ""
        print(f"checkpoint  iteration {ck['iteration']}{where} in {ck['prefix']}")
    if res:
        print("result      " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in res.items() if k not in ("finished", "passes")))
    shown = history if args.history == "all" else history[-int(args.history):]
    print(f"history     {len(history)} rows" + (f", the last {len(shown)}:" if shown else ""))
    if shown:
        print(_format_table(shown))
    return 0


def _add_cluster_flags(p):
    g = p.add_argument_group("cluster (one of; default: $DASK_SCHEDULER_ADDRESS when set, else "
                             "in process)")
    g.add_argument("--scheduler-address", help="connect to this scheduler")
    g.add_argument("--scheduler-file", help="connect to the scheduler that wrote this file "
                   "(deploy/slurm/dnomad.sbatch)")
    g.add_argument("--slurm-jobs", type=int, help="submit this many SLURM jobs of workers "
                   "(dask-jobqueue's SLURMCluster, settings from dask config jobqueue.slurm)")
    g.add_argument("--local-workers", type=int, help="start a LocalCluster of this many workers")
    g.add_argument("--wait-for-workers", type=int, help="wait until this many workers have joined")


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

    p = sub.add_parser("fit", help="fit a method on data (.npy, .csv or a Zarr path or URL)")
    p.add_argument("--config", help="run configuration (TOML or YAML); flags override it")
    p.add_argument("--input", help="data: .npy, .csv, or a Zarr path or URL (required)")
    p.add_argument("--method", choices=["nomad", "symnmf", "hottopixx", "riemannian-kmeans", "nlr", "bregman"],
                   help="default nomad")
    p.add_argument("--n-clusters", "--rank", dest="n_clusters", type=int,
                   help="K (nomad), k (symnmf) or the rank r (hottopixx: features x samples input); "
                        "required")
    p.add_argument("--store", help="the run store, a Zarr path or URL (required)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--precomputed", action="store_true",
                   help="the input is an n x n Gram (nomad) or affinity (symnmf) matrix")
    p.add_argument("--backend", choices=["auto", "local", "distributed", "zarr"], help="default auto")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"],
                   help="where NOMAD's blocks compute (default: dask config dnomad.device, else cpu); "
                        "cuda needs CuPy and a GPU (deploy/gpu/README.md)")
    p.add_argument("--dtype", choices=["float32", "float64"], help="default float32")
    p.add_argument("--params", help="other estimator parameters as JSON, e.g. '{\"max_iter\": 500}'")
    _add_cluster_flags(p)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("resume", help="continue the run in STORE from its last checkpoint")
    p.add_argument("store")
    _add_cluster_flags(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("info", help="print the record, progress and history of the run in STORE")
    p.add_argument("store")
    p.add_argument("--json", action="store_true", help="everything, as JSON (the whole history)")
    p.add_argument("--history", default="10", help="history rows to print: a number, or all")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
