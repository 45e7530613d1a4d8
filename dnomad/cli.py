"""The ``dnomad`` command: demo, fit, resume, info."""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
import time
import traceback
import warnings

import numpy as np

from dnomad.api import ESTIMATORS
from dnomad.blocks import device
from dnomad.blocks.cluster import BACKEND_CHOICES
from dnomad.blocks.store import redact
from dnomad.errors import DnomadError, InputTypeError, InputValueError, StoreError


logger = logging.getLogger("dnomad")


class ClusterConnectError(DnomadError, TimeoutError):
    """The cluster named by --scheduler-file / --scheduler-address (or the config's
    [cluster]) could not be reached within the connect timeout."""


class MissingPackageError(DnomadError, ImportError):
    """A setting needs an optional package that is not installed."""


def cmd_demo(args):
    """NOMAD on two rings: Q, the history and checkpoints in a local Zarr store, and a PNG.

    In this process by default (a problem of this size takes seconds); ``--cluster``
    runs the same job with its blocks in the workers of an embedded 2-worker
    LocalCluster, as a large run's would (each pass then a round trip to the workers)."""
    import dnomad
    from dnomad.data import two_rings

    os.makedirs(args.output, exist_ok=True)
    store = os.path.join(args.output, "nomad.zarr")
    where = "on an embedded 2-worker LocalCluster" if args.cluster else "in this process"
    print(f"dnomad demo: NOMAD (conditional gradient, {args.n_clusters} clusters) on two rings, "
          f"n={args.n_samples}, {where}; Q, history and checkpoints to {store}", flush=True)
    X, y = two_rings(args.n_samples)
    est = dnomad.NOMAD(n_clusters=args.n_clusters, sdp_k=args.sdp_k,
                       backend="distributed" if args.cluster else "local",
                       store=store, overwrite=True, block_size=args.block_size, verbose=args.progress)
    if args.cluster:
        from dnomad.blocks.cluster import cluster_client

        with cluster_client(n_workers=2) as client:
            if client.dashboard_link and "None" not in client.dashboard_link:
                print(f"dashboard: {client.dashboard_link} (the passes as they run: its /events page)",
                      flush=True)
            est.fit(X)
    else:
        est.fit(X)
    png = os.path.join(args.output, "nomad_demo.png")
    dnomad.plot(est, png, X=X)
    ari = dnomad.metrics.adjusted_rand_score(y, est.labels_)
    print(f"NOMAD on two rings: n={len(X)}, K={est.sdp_k_}, {est.n_iter_} outer iterations "
          f"({est.stop_reason_}), objective {est.objective_:.6g}, {len(np.unique(est.labels_))} groups "
          f"({est.label_method_used_}), ARI vs the rings {ari:.3f}")
    print(f"Q and history: {store}\nplot: {png}")
    return 0


def _one_line(text):
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _read_input(path):
    """.npy, .csv or .txt (a local path or any fsspec URL: s3://, gs://, ...), read here
    and checked to be a numeric 2-D array; else a Zarr array's path or URL, whose
    metadata only is checked here (it is read where it is).  A refused input raises
    InputValueError / InputTypeError naming it, before any store is touched."""
    shown = redact(path)
    if "://" not in path and not os.path.exists(path):
        raise InputValueError(f"input {shown!r} does not exist (give a .npy, .csv or .txt file, or a Zarr "
                              f"array's path or URL)")
    if not path.endswith((".npy", ".csv", ".txt")):
        return _check_zarr_input(path, shown)
    import fsspec

    kind = ("a .npy of a float or integer array, saved with np.save" if path.endswith(".npy") else
            "numbers only, one row per point, comma-separated, without a header line" if path.endswith(".csv")
            else "numbers only, one row per point, separated by whitespace, without a header line")
    try:
        with fsspec.open(path, "rb") as f:
            if path.endswith(".npy"):
                X = np.load(f, allow_pickle=False)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")          # "input contained no data": checked below
                    X = np.loadtxt(f, delimiter="," if path.endswith(".csv") else None, ndmin=2)
    except FileNotFoundError:
        raise InputValueError(f"input {shown!r} does not exist") from None
    except Exception as exc:  # noqa: BLE001 - numpy and every fsspec backend have their own errors
        raise InputValueError(f"input {shown!r} cannot be read as a numeric 2-D array "
                              f"({_one_line(redact(exc, path))}); expected {kind}") from exc
    _check_array(X.dtype, X.shape, shown, kind)
    return X


def _check_array(dtype, shape, shown, kind):
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        raise InputTypeError(f"input {shown!r} holds a {dtype} array; expected {kind}")
    if len(shape) != 2:
        hint = "; for one feature per point save X.reshape(-1, 1)" if len(shape) == 1 else ""
        raise InputValueError(f"input {shown!r} holds an array of shape {tuple(shape)}; expected a 2-D "
                              f"array (points x features, or an n x n matrix with --precomputed){hint}")
    if 0 in shape:
        raise InputValueError(f"input {shown!r} is empty (shape {tuple(shape)}); expected {kind}")


def _check_zarr_input(path, shown):
    import zarr

    try:
        arr = zarr.open_array(store=path, mode="r")
    except Exception as exc:  # noqa: BLE001 - any backend error means unreadable
        raise InputValueError(f"input {shown!r} cannot be opened as a Zarr array "
                              f"({type(exc).__name__}: {_one_line(redact(exc, path))}); give a .npy, "
                              f".csv or .txt file, or a Zarr array's path or URL") from exc
    _check_array(arr.dtype, arr.shape, shown, "a numeric 2-D Zarr array")
    return path


# Keys of a run configuration file (TOML or YAML) and of the [cluster] / [security] tables,
# with the type each value must have: TOML and YAML both have booleans and integers, so a
# quoted "false" (truthy in Python) or "3" is refused rather than guessed at.
METHODS = list(ESTIMATORS)
BACKENDS = list(BACKEND_CHOICES)
DEVICES = list(device.DEVICES)
DTYPES = ["float32", "float64"]
_STR, _BOOL, _INT, _TABLE, _SECONDS = "a string", "true or false", "an integer >= 1", "a table", \
    "a number of seconds > 0 (or a duration string such as \"90s\")"
CONFIG_KEYS = {"input": _STR, "method": METHODS, "n_clusters": _INT, "rank": _INT, "store": _STR,
               "overwrite": _BOOL, "precomputed": _BOOL, "backend": BACKENDS, "device": DEVICES,
               "dtype": DTYPES, "params": _TABLE, "cluster": _TABLE, "security": _TABLE}
CLUSTER_KEYS = {"address": _STR, "scheduler_file": _STR, "local": _BOOL, "n_workers": _INT,
                "slurm_jobs": _INT, "wait_for_workers": _INT, "connect_timeout": _SECONDS}
SECURITY_KEYS = {"tls_ca_file": _STR, "tls_client_cert": _STR, "tls_client_key": _STR,
                 "tls_scheduler_cert": _STR, "tls_scheduler_key": _STR, "tls_worker_cert": _STR,
                 "tls_worker_key": _STR, "require_encryption": _BOOL}


def _seconds(value, what):
    """``value`` (a number of seconds, or a dask duration string: "90s", "2 minutes") as
    a float > 0; InputValueError naming ``what`` otherwise."""
    from dask.utils import parse_timedelta

    try:
        seconds = None if isinstance(value, bool) else parse_timedelta(value, default="s")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or not 0 < seconds < float("inf"):
        raise InputValueError(f"{what} must be {_SECONDS}; got {value!r}")
    return float(seconds)


def _check_value(key, value, expected, where):
    """Refuse ``value`` for ``key`` unless it has the type (or is one of the choices)
    ``expected``; the message names the key and the file."""
    if isinstance(expected, list):
        ok = isinstance(value, str) and value in expected
        expected_text = f"one of {expected}"
    elif expected == _STR:
        ok, expected_text = isinstance(value, str) and value != "", expected
    elif expected == _BOOL:
        ok, expected_text = isinstance(value, bool), expected
    elif expected == _INT:
        ok, expected_text = isinstance(value, int) and not isinstance(value, bool) and value >= 1, expected
    elif expected == _TABLE:
        ok, expected_text = isinstance(value, dict), expected
    else:
        _seconds(value, f"{key} in {where}")
        return
    if not ok:
        name, hint = key.split(".")[-1], ""
        if expected == _BOOL and isinstance(value, str):
            hint = (f" (write {name} = true or {name} = false, without quotes: a quoted string such as "
                    f"{value!r} is not a boolean)")
        elif expected == _INT and isinstance(value, str):
            hint = f" (write {name} = {value.strip()}, without quotes)"
        raise InputValueError(f"{key} in {where} must be {expected_text}; got {value!r} "
                              f"({type(value).__name__}){hint}")


def load_config(path):
    """A run configuration: TOML (.toml) or YAML (.yaml/.yml), keys as the flags of
    ``dnomad fit`` (``n_clusters`` or ``rank``, ``params`` a table of estimator
    parameters), plus ``[cluster]`` (``address``, ``scheduler_file``, ``local = true``
    with ``n_workers``, or ``slurm_jobs``; ``wait_for_workers``; ``connect_timeout``) and
    ``[security]`` (TLS files for distributed's Security).
    Unknown keys, and values of the wrong type (``overwrite = "false"``), are refused, so
    that a typo does not silently fall back to a default or turn into its opposite."""
    shown = redact(path)
    if not path.endswith((".toml", ".yaml", ".yml")):
        raise InputValueError(f"config file {shown!r} must end in .toml, .yaml or .yml")
    if not os.path.exists(path):
        raise InputValueError(f"config file {shown!r} does not exist")
    try:
        if path.endswith(".toml"):
            import tomllib

            with open(path, "rb") as f:
                cfg = tomllib.load(f)
        else:
            import yaml

            with open(path) as f:
                cfg = yaml.safe_load(f)
            cfg = {} if cfg is None else cfg
    except Exception as exc:  # noqa: BLE001 - tomllib's and yaml's parse errors, a bad encoding
        raise InputValueError(f"config file {shown!r} cannot be parsed: {_one_line(exc)}") from exc
    if not isinstance(cfg, dict):
        raise InputValueError(f"config file {shown!r} must hold a table of settings; got a "
                              f"{type(cfg).__name__}")
    for prefix, table, allowed in (("", cfg, CONFIG_KEYS), ("cluster.", cfg.get("cluster", {}), CLUSTER_KEYS),
                                   ("security.", cfg.get("security", {}), SECURITY_KEYS)):
        if not isinstance(table, dict):
            _check_value(prefix.rstrip("."), table, _TABLE, repr(shown))
        unknown = set(table) - set(allowed)
        if unknown:
            raise InputValueError(f"unknown keys {sorted(unknown)} in {shown!r}; allowed: {sorted(allowed)}")
        for key, value in table.items():
            _check_value(prefix + str(key), value, allowed[key], repr(shown))
    if "rank" in cfg:
        if "n_clusters" in cfg:
            raise InputValueError(f"{shown!r} gives both n_clusters and rank (the same setting); keep one")
        cfg["n_clusters"] = cfg.pop("rank")
    return cfg


def _security(cfg):
    if not cfg:
        return None
    from distributed.security import Security

    files = {k: v for k, v in cfg.items() if k != "require_encryption"}
    for key, path in files.items():
        if not os.path.exists(path):
            raise InputValueError(f"security.{key} = {path!r} does not exist")
    # A LocalCluster started from this config (cluster.local) serves with the client's
    # certificate unless scheduler/worker ones are given.
    for role in ("scheduler", "worker"):
        files.setdefault(f"tls_{role}_cert", files.get("tls_client_cert"))
        files.setdefault(f"tls_{role}_key", files.get("tls_client_key"))
    return Security(require_encryption=cfg.get("require_encryption", True),
                    **{k: v for k, v in files.items() if v is not None})


def _connect_timeout(connect_timeout):
    """Seconds to wait for a scheduler file and, then, for the scheduler to answer: the
    flag or [cluster] connect_timeout, else dask config ``distributed.comm.timeouts.connect``
    (distributed's own default, 30 s; deploy/slurm/dask.yaml sets 60 s)."""
    if connect_timeout is not None:
        return _seconds(connect_timeout, "--connect-timeout (cluster.connect_timeout)")
    import dask

    return _seconds(dask.config.get("distributed.comm.timeouts.connect"),
                    "dask config distributed.comm.timeouts.connect")


def _scheduler_file_address(scheduler_file, timeout):
    """The address in ``scheduler_file``, waiting up to ``timeout`` seconds for the file
    (a batch job may start `dnomad fit` before its scheduler has written it)."""
    deadline = time.monotonic() + timeout
    logged = False
    while True:
        try:
            with open(scheduler_file) as f:
                return json.load(f)["address"]
        except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:
            why = exc           # not written yet, or half written
        except OSError as exc:
            raise ClusterConnectError(f"scheduler file {scheduler_file!r} cannot be read: {exc}") from exc
        if time.monotonic() >= deadline:
            state = ("does not exist" if isinstance(why, FileNotFoundError) else
                     f"holds no scheduler address ({_one_line(why)})")
            raise ClusterConnectError(
                f"scheduler file {scheduler_file!r} {state} after waiting {timeout:g} s (--connect-timeout); "
                f"start a scheduler with `dask scheduler --scheduler-file {scheduler_file}`, or wait "
                f"longer with --connect-timeout SECONDS")
        if not logged:
            logger.warning("waiting up to %g s for the scheduler file %s (--connect-timeout)", timeout,
                           scheduler_file)
            logged = True
        time.sleep(0.1)


def _client(address, security, timeout, where):
    """A Client of the scheduler at ``address`` (``where`` says where the address came
    from), or one clear error within ``timeout`` seconds."""
    from distributed import Client

    if address.startswith("tls://") and security is None:
        raise InputValueError(
            f"the scheduler at {address!r} ({where}) speaks TLS, and no certificates were given: pass "
            f"--config with the run's [security] table (also `dnomad resume STORE --config run.toml`)")
    try:
        return Client(address, security=security, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - distributed raises OSError, TypeError, ...
        raise ClusterConnectError(f"cannot reach the scheduler at {address!r} ({where}) within "
                                  f"{timeout:g} s (--connect-timeout): {_one_line(exc)}") from exc


def _connect(address=None, scheduler_file=None, *, local=False, n_workers=None, slurm_jobs=None,
             wait_for_workers=None, connect_timeout=None, security=None):
    """(client, cluster) for a run, the first that applies of: a scheduler ``address``;
    $DASK_SCHEDULER_ADDRESS (what the Dask Kubernetes operator sets in a DaskJob's pod);
    a ``scheduler_file`` (a SLURM job's scheduler, see deploy/slurm); ``slurm_jobs``
    batch jobs of workers submitted by dask-jobqueue's SLURMCluster (its settings from
    dask config ``jobqueue.slurm``); a LocalCluster of ``n_workers`` when ``local``;
    else (None, None): run in this process.  ``wait_for_workers``: block until that
    many workers have joined (default: all that ``slurm_jobs`` asked for).
    ``connect_timeout`` (seconds): how long to wait for the scheduler file to appear
    and, then, for the scheduler to answer (see :func:`_connect_timeout`); past it,
    :class:`ClusterConnectError` names the file or address."""
    from distributed import Client

    cluster = None
    if address:
        client = _client(address, security, _connect_timeout(connect_timeout), "--scheduler-address")
    elif os.environ.get("DASK_SCHEDULER_ADDRESS"):
        client = _client(os.environ["DASK_SCHEDULER_ADDRESS"], security, _connect_timeout(connect_timeout),
                         "$DASK_SCHEDULER_ADDRESS")
    elif scheduler_file:
        timeout = _connect_timeout(connect_timeout)
        address = _scheduler_file_address(scheduler_file, timeout)
        client = _client(address, security, timeout, f"from the scheduler file {scheduler_file!r}")
    elif slurm_jobs:
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError as exc:
            raise MissingPackageError("slurm_jobs (--slurm-jobs) needs dask-jobqueue: pip install "
                                      "dask-jobqueue") from exc
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
    connect_timeout = cluster.get("connect_timeout")
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
    if args.connect_timeout is not None or connect_timeout is not None:
        cluster["connect_timeout"] = connect_timeout if args.connect_timeout is None else args.connect_timeout
    return cluster


def _fit_settings(args):
    """Flags over the config file over the defaults; missing required settings refused."""
    cfg = load_config(args.config) if args.config else {}
    defaults = {"method": "nomad", "overwrite": False, "precomputed": False, "backend": "auto",
                "dtype": "float32", "params": {}}
    out, given = {}, set()
    for key in ("input", "method", "n_clusters", "store", "overwrite", "precomputed", "backend", "device",
                "dtype"):
        flag = getattr(args, key)
        out[key] = flag if flag is not None and flag is not False else cfg.get(key, defaults.get(key))
        if (flag is not None and flag is not False) or cfg.get(key, defaults.get(key)) != defaults.get(key):
            given.add(key)                  # a config key that restates the default changes nothing
    out["params"] = dict(cfg.get("params", {}))
    if args.params:
        out["params"].update(_json_params(args.params))
    missing = [k for k in ("input", "n_clusters", "store") if out[k] is None]
    if missing:
        raise InputValueError(f"missing {', '.join('--' + m.replace('_', '-') for m in missing)} "
                              f"(give them as flags or in --config)")
    _check_param_keys(out["method"], out["params"])
    _check_flags_apply(out["method"], given)
    if out["device"] is not None:
        out["params"]["device"] = out["device"]
    out["cluster"] = _cluster_settings(args, cfg.get("cluster", {}))
    out["security"] = cfg.get("security")
    return out


def _json_params(text):
    try:
        params = json.loads(text)
    except ValueError as exc:
        raise InputValueError(f"--params must be a JSON object, e.g. '{{\"max_iter\": 500}}'; got "
                              f"{text!r} ({exc})") from None
    if not isinstance(params, dict):
        raise InputValueError(f"--params must be a JSON object, e.g. '{{\"max_iter\": 500}}'; got {text!r}")
    return params


# The flags that set an estimator parameter, and the parameters they set (--precomputed:
# NOMAD's precomputed, SymNMF's affinity).
_FLAG_PARAMS = {"backend": ("backend",), "dtype": ("dtype",), "device": ("device",),
                "precomputed": ("precomputed", "affinity")}


def _check_flags_apply(method, given):
    """A flag (or config key) given for a method whose estimator has no such parameter is
    refused by name, not ignored."""
    if method not in ESTIMATORS:
        return                           # refused with the list of methods by the settings' check
    params = ESTIMATORS[method]().get_params()
    for key, names in _FLAG_PARAMS.items():
        if key in given and not any(name in params for name in names):
            takers = [m for m, est in ESTIMATORS.items() if any(name in est().get_params() for name in names)]
            raise InputValueError(f"--{key} (or {key} in --config) does not apply to --method {method}; it is "
                                  f"for {', '.join(takers)}")


def _check_param_keys(method, params, *, flags=True):
    """--params / [params] keys are the method's estimator parameters (a typo is refused
    here, naming the nearest one, before the input is read); with ``flags``, those that
    a flag of `dnomad fit` sets are refused too."""
    import difflib

    if method not in ESTIMATORS:
        return                           # refused with the list of methods by the settings' check
    allowed = sorted(ESTIMATORS[method]().get_params())
    flag_names = {"n_clusters": "--n-clusters", "rank": "--rank", "store": "--store", "overwrite": "--overwrite",
                  "backend": "--backend", "dtype": "--dtype", "device": "--device"}
    for key in params:
        if flags and key in flag_names and key in allowed and (key != "rank" or method == "hottopixx"):
            raise InputValueError(f"--params: {key!r} is set by its flag: give {flag_names[key]} instead")
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise InputValueError(f"--params: {key!r} is not a parameter of --method {method}; {hint}"
                                  f"its parameters: {', '.join(allowed)}")


def _shape(text):
    parts = text.lower().replace(",", "x").split("x")
    try:
        n, d = (int(v.replace("_", "")) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N x D (e.g. 1000000x3); got {text!r}") from None
    if n < 2 or d < 1:
        raise argparse.ArgumentTypeError(f"expected at least 2 rows and 1 column; got {text!r}")
    return n, d


def cmd_plan(args):
    from .memory_plan import plan

    params = _json_params(args.params) if args.params else {}
    _check_param_keys(args.method, params, flags=False)        # store, dtype, backend: in --params here
    data = args.shape if args.shape is not None else _input_for_plan(args.input)
    # --n-clusters is the estimator's first parameter: n_clusters, or HOTTOPIXX's rank
    size = next(iter(inspect.signature(ESTIMATORS[args.method]).parameters))
    print(plan(data, args.method, n_workers=args.workers, worker_memory=args.worker_memory,
               threads_per_worker=args.threads_per_worker, **{size: args.n_clusters}, **params))
    return 0


def _input_for_plan(path):
    """The input without reading its values where it can: a local .npy mapped (its
    header read), a Zarr path as it is; a .csv is read."""
    if path.endswith(".npy") and "://" not in path and os.path.exists(path):
        try:
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - numpy's errors for a bad file vary
            raise InputValueError(f"input {redact(path)!r} cannot be read as a .npy array "
                                  f"({_one_line(redact(exc, path))})") from None
    return _read_input(path)


def cmd_fit(args):
    import dnomad

    run = _fit_settings(args)
    security = _security(run["security"])
    redact("", run["store"], run["input"])      # their passwords are scrubbed from any later message
    X = _read_input(run["input"])               # refused here, before a cluster or the store is touched
    shown = redact(run["store"])
    client, cluster = _connect(**run["cluster"], security=security)
    try:
        params = run["params"]
        if args.quiet or args.verbose or "verbose" not in params:
            params["verbose"] = args.progress
        if run["method"] == "hottopixx":
            est = dnomad.fit(X, method="hottopixx", rank=run["n_clusters"], store=run["store"],
                             overwrite=run["overwrite"], **params)
            print(f"hottopixx: {est.n_epochs_} epochs, hott rows {est.hott_rows_.tolist()}, "
                  f"||X - F W||_inf,1 = {est.error_:.4g}; results in {shown}")
            return 0
        if run["method"] == "bregman":
            est = dnomad.fit(X, method="bregman", n_clusters=run["n_clusters"], store=run["store"],
                             overwrite=run["overwrite"], **params)
            print(f"bregman ({est.model}, {est.divergence}): relaxation {est.n_iter_} iterations "
                  f"({est.stop_reason_}), hard objective {est.objective_:.6g}; labels in {shown}")
            return 0
        if run["method"] in ("riemannian-kmeans", "nlr"):
            est = dnomad.fit(X, method=run["method"], n_clusters=run["n_clusters"], store=run["store"],
                             overwrite=run["overwrite"], backend=run["backend"], **params)
            print(f"{run['method']}: {est.n_iter_} iterations ({est.stop_reason_}), labels and U in "
                  f"{shown}")
            return 0
        if run["method"] == "symnmf":
            params.setdefault("affinity", "precomputed" if run["precomputed"] else "gaussian")
        else:
            params.setdefault("precomputed", run["precomputed"])
        est = dnomad.fit(X, method=run["method"], n_clusters=run["n_clusters"], store=run["store"],
                         overwrite=run["overwrite"], backend=run["backend"],
                         dtype=np.float64 if run["dtype"] == "float64" else np.float32, **params)
        print(f"{run['method']}: {est.n_iter_} iterations ({est.stop_reason_}), objective "
              f"{est.objective_:.6g}; results in {shown}")
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    return 0


def cmd_resume(args):
    """Continue the run in STORE.  With --config, the file's [cluster] and [security]
    tables are used (flags win, as in fit); its other keys are ignored: the run's
    method, parameters and input are the ones recorded in the store."""
    import dnomad
    from dnomad.blocks import store as run_store

    if _run_marker(args.store) is None:       # before any cluster is reached
        raise StoreError(f"store {redact(args.store)!r} holds no dnomad run to resume")
    from dnomad.api import load_finished

    cfg = load_config(args.config) if args.config else {}
    # a finished run's result is read (and checked) as a resume reads it
    done = run_store.read_json(args.store, "result") if load_finished(args.store) is not None else None
    if done is not None:                     # a finished run stays as it is
        stop = ", ".join(f"{k} {done[k]}" for k in ("stop_reason", "n_iter", "n_epochs") if k in done)
        print(f"the run in {redact(args.store)} finished on {done.get('finished')} ({stop}): nothing to "
              f"resume; `dnomad info {redact(args.store)}` shows it")
        return 0
    ignored = sorted(set(cfg) - {"cluster", "security"})
    if ignored:
        logger.info("resume: %s in %s ignored (the run's settings are the store's)", ", ".join(ignored),
                    args.config)
    security = _security(cfg.get("security"))
    client, cluster = _connect(**_cluster_settings(args, cfg.get("cluster", {})), security=security)
    try:
        est = dnomad.resume(args.store, verbose=args.progress)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    objective = getattr(est, "objective_", None)
    print(f"resumed: {est.n_iter_} iterations ({est.stop_reason_})"
          + ("" if objective is None else f", objective {objective:.6g}"))
    return 0


def _run_marker(store):
    """The run record in ``store`` (None if it holds none), checked; StoreError if it is
    damaged or cannot be read."""
    from dnomad.api import run_record

    try:
        return run_record(store)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - any backend error means unreadable
        raise StoreError(f"store {redact(store)!r} cannot be read ({type(exc).__name__}: "
                         f"{_one_line(redact(exc, store))})") from exc


def run_info(store):
    """What ``dnomad info`` reports: the run record, the last checkpoint, the result, and
    the history table (the result's if finished, else the last checkpoint's)."""
    from dnomad.blocks import store as run_store

    meta = _run_marker(store)
    if meta is None:
        return None
    layers, ck, res, history = [], None, None, []
    try:
        if meta["method"] == "nomad":
            from dnomad.nomad.estimator import finished_layers, layer_checkpoint_key

            layers = [run_store.read_json(store, f"layers/{layer}") for layer in range(finished_layers(store))]
            # The checkpoint of the layer running (or last run) in a multi-layer run.
            for layer in range(len(layers), -1, -1):
                ck = run_store.Checkpoints(store, layer_checkpoint_key(layer)).latest()
                if ck is not None:
                    ck["layer"] = layer
                    break
        else:
            ck = run_store.Checkpoints(store, f"{meta['method']}_checkpoint").latest()
        res = run_store.read_result(store)
        if res is not None:
            from dnomad.api import load_finished

            history = load_finished(store).history_      # read as a resume reads it: damage is named
        else:
            run_store.read_input_digest(store)            # what a resume checks its Zarr input against
            history = ck["history"] if ck else []
        status = "finished" if res else ("interrupted or running" if ck else "started")
    except StoreError as exc:
        status = f"damaged: {exc}"
    checkpoint = None if ck is None else {k: v for k, v in ck.items() if k not in ("history", "params")}
    return {"store": redact(str(store)), "run": meta, "checkpoint": checkpoint, "result": res,
            "layers": layers, "status": status, "history": history}


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


def cmd_plot(args):
    """A PNG of the finished run in STORE (dnomad.plot): what its method has."""
    import dnomad

    if _run_marker(args.store) is None:
        raise StoreError(f"store {redact(args.store)!r} holds no dnomad run")
    out = args.output or _default_plot_path(args.store)
    dnomad.plot(args.store, out)
    print(f"plot: {out}")
    return 0


def _default_plot_path(store):
    """Beside a local store (run.zarr -> run.png); for a URL, its name in this folder."""
    base = store.rstrip("/")
    if "://" in base:
        base = os.path.basename(base)
    return (base[:-5] if base.endswith(".zarr") else base) + ".png"


def cmd_info(args):
    info = run_info(args.store)
    if info is None:
        print(f"dnomad: error: {redact(args.store)!r} holds no dnomad run", file=sys.stderr)
        return 1
    failed = 1 if info["status"].startswith("damaged") else 0
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return failed
    run, res, ck, history = info["run"], info["result"], info["checkpoint"], info["history"]
    params = {k: v for k, v in run["estimator_params"].items() if v is not None and k != "callback"}
    print(f"store       {info['store']}")
    print(f"run         {run['method']} (run id {run['run_id']}), started {run.get('started')} on "
          f"{run.get('host')}")
    seconds = res.get("fit_seconds") if res else None
    print(f"status      {info['status']}" + (f", {res['finished']}" + (f" after {seconds:.1f} s" if isinstance(
        seconds, (int, float)) else "") if res else ""))
    print(f"input       {json.dumps(run['input'])}")
    print(f"params      {' '.join(f'{k}={v}' for k, v in params.items())}")
    versions = run.get("versions") if isinstance(run.get("versions"), dict) else {}
    print(f"versions    {' '.join(f'{k} {v}' for k, v in versions.items())}")
    for i, layer in enumerate(info["layers"]):
        layer = layer if isinstance(layer, dict) else {}
        objective = layer.get("objective")
        print(f"layer {i}     K={layer.get('sdp_k')} {layer.get('n_iter')} iterations ({layer.get('stop_reason')}), "
              f"objective {f'{objective:.6g}' if isinstance(objective, float) else objective}")
    if ck is not None:
        where = f" of layer {ck['layer']}" if info["layers"] or ck.get("layer") else ""
        print(f"checkpoint  iteration {ck['iteration']}{where} in {ck['prefix']}")
    if res:
        print("result      " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in res.items() if k not in ("finished", "passes", "arrays", "shapes")))
    shown = history if args.history == "all" else history[len(history) - min(args.history, len(history)):]
    print(f"history     {len(history)} rows" + (f", the last {len(shown)}:" if shown else ""))
    if shown:
        print(_format_table(shown))
    return failed


def _int_at_least(minimum, wanted):
    """An argparse type: an integer >= ``minimum`` (``wanted`` says so in the error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {wanted}; got {value}")
        return value
    return parse


_positive_int = _int_at_least(1, "an integer >= 1")          # counts
_row_count = _int_at_least(0, "a number of rows >= 0 or all")


def _history_rows(text):
    """``--history``: "all" or a number of rows >= 0."""
    return text if text == "all" else _row_count(text)


def _parsed_seconds(text):
    """``--connect-timeout``: checked when parsed, whether or not a cluster is named."""
    try:
        _seconds(text, "--connect-timeout")
    except InputValueError:
        raise argparse.ArgumentTypeError(f"must be {_SECONDS}; got {text!r}") from None
    return text


def _add_cluster_flags(p):
    g = p.add_argument_group("cluster (one of; default: $DASK_SCHEDULER_ADDRESS when set, else "
                             "in process)")
    g.add_argument("--scheduler-address", help="connect to this scheduler")
    g.add_argument("--scheduler-file", help="connect to the scheduler that wrote this file "
                   "(deploy/slurm/dnomad.sbatch)")
    g.add_argument("--slurm-jobs", type=_positive_int, help="submit this many SLURM jobs of workers "
                   "(dask-jobqueue's SLURMCluster, settings from dask config jobqueue.slurm)")
    g.add_argument("--local-workers", type=_positive_int, help="start a LocalCluster of this many workers")
    g.add_argument("--wait-for-workers", type=_positive_int, help="wait until this many workers have joined")
    g.add_argument("--connect-timeout", metavar="SECONDS", type=_parsed_seconds,
                   help="wait this long for the scheduler file to appear, then this long for the "
                        "scheduler to answer, before failing (also [cluster] connect_timeout; default: "
                        "dask config distributed.comm.timeouts.connect, 30 s unless set)")


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported as one line, ``dnomad: error: ...`` (status 2)."""

    def error(self, message):
        self.exit(2, f"dnomad: error: {redact(message)} (see `{self.prog} --help`)\n")


def build_parser():
    """The ``dnomad`` argument parser (also used by the tests to check deploy/ commands)."""
    from dnomad import __version__

    # -v and -q go before or after the command (dnomad -v fit ..., dnomad fit ... -v).
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="a progress line per iteration, INFO logs (distributed's too) and tracebacks; "
                             "-vv: DEBUG logs (every pass)")
    output.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress line: only warnings, errors and the result's summary")
    parser = _Parser(prog="dnomad", description=__doc__, parents=[output])
    parser.add_argument("--version", action="version", version=f"dnomad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_parser = sub.add_parser
    sub.add_parser = lambda *a, **kw: _add_parser(*a, parents=[output], **kw)

    p = sub.add_parser("demo", help="NOMAD on two rings (in this process; --cluster: on a LocalCluster); "
                                    "writes Q, the history and a PNG")
    p.add_argument("--output", default="demo_out", help="folder for the run store and the PNG (default demo_out)")
    p.add_argument("--n-samples", type=_positive_int, default=200, help="points on the two rings (default 200)")
    p.add_argument("--n-clusters", type=_positive_int, default=2, help="the clusters to return (default 2, the rings)")
    p.add_argument("--sdp-k", type=_positive_int, default=None, help="NOMAD's K, the trace of Q (default: NOMAD's rule "
                   "from n and n_clusters)")
    p.add_argument("--block-size", type=_positive_int, default=None, help="the blocks' size (default: one block per "
                   "worker thread's share)")
    p.add_argument("--cluster", action="store_true",
                   help="run the same job on an embedded 2-worker LocalCluster, as a large run would")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("fit", help="fit a method on data (.npy, .csv or a Zarr path or URL)")
    p.add_argument("--config", help="run configuration (TOML or YAML); flags override it")
    p.add_argument("--input", help="data: .npy, .csv, or a Zarr path or URL (required)")
    p.add_argument("--method", choices=METHODS, help="default nomad")
    p.add_argument("--n-clusters", "--rank", dest="n_clusters", type=_positive_int,
                   help="the number of clusters (nomad, symnmf, the k-means methods, bregman) or the "
                        "rank r (hottopixx: features x samples input); required; NOMAD's K is "
                        "--params '{\"sdp_k\": K}'")
    p.add_argument("--store", help="the run store, a Zarr path or URL (required)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace another run's store (default: a store holding another run is refused)")
    p.add_argument("--precomputed", action="store_true",
                   help="the input is an n x n Gram (nomad) or affinity (symnmf) matrix")
    p.add_argument("--backend", choices=BACKENDS, help="default auto")
    p.add_argument("--device", choices=DEVICES,
                   help="where NOMAD's blocks compute (default: dask config dnomad.device, else cpu); "
                        "cuda needs CuPy and a GPU (deploy/gpu/README.md)")
    p.add_argument("--dtype", choices=DTYPES, help="default float32")
    p.add_argument("--params", help="other estimator parameters as JSON, e.g. '{\"max_iter\": 500}'")
    _add_cluster_flags(p)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("plan", help="the memory a fit needs on each worker and in the client, before it runs")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--input", help="the data (.npy, .csv or a Zarr path or URL): its shape and chunks are used")
    where.add_argument("--shape", type=_shape, help="the data's shape instead, N x D (e.g. 1000000x3)")
    p.add_argument("--method", choices=METHODS, default="nomad", help="default nomad")
    p.add_argument("--n-clusters", type=_positive_int, required=True, help="the number of clusters")
    p.add_argument("--params", help="other estimator parameters as JSON, e.g. '{\"solver\": \"bm\", \"store\": "
                   "\"run.zarr\"}'")
    p.add_argument("--workers", type=_positive_int, help="workers (default: the connected scheduler's, else "
                   "this process alone)")
    p.add_argument("--worker-memory", help="each worker's memory limit, e.g. '8 GiB' (default: the connected "
                   "workers' smallest limit, else the memory available here)")
    p.add_argument("--threads-per-worker", type=_positive_int, default=1, help="tasks a worker runs at once "
                   "(default 1)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("resume", help="continue the run in STORE from its last checkpoint")
    p.add_argument("store", help="the run store, a Zarr path or URL")
    p.add_argument("--config", help="a run configuration (TOML or YAML): its [cluster] and [security] "
                   "tables are used (a run under TLS resumes under TLS), its other keys ignored "
                   "(the run's settings are the store's); flags override it")
    _add_cluster_flags(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("plot", help="draw the finished run in STORE: data by label, Q, the embedding, W or "
                                    "the hott rows, the history against its targets")
    p.add_argument("store", help="the run store, a Zarr path or URL")
    p.add_argument("--output", help="the picture (.png, .pdf or .svg; default: beside the store, "
                   "run.zarr -> run.png)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("info", help="print the record, progress and history of the run in STORE")
    p.add_argument("store", help="the run store, a Zarr path or URL")
    p.add_argument("--json", action="store_true", help="everything, as JSON (the whole history)")
    p.add_argument("--history", default="10", type=_history_rows, help="history rows to print: a number, or all")
    p.set_defaults(func=cmd_info)
    return parser


class _RedactingFormatter(logging.Formatter):
    def format(self, record):
        return redact(super().format(record))


def _report(exc, verbose):
    """The one line (and with -v the traceback) printed for ``exc``, credentials removed;
    the exit status: 2 for a refused input, setting or store (a DnomadError), 1 for any
    other error."""
    if verbose:
        sys.stderr.write(redact("".join(traceback.format_exception(exc))))
    expected = isinstance(exc, DnomadError)
    message = _one_line(redact(exc)) or type(exc).__name__
    if not expected:
        message = f"{type(exc).__name__}: {message}" + ("" if verbose else " (-v for the traceback)")
    print(f"dnomad: error: {message}", file=sys.stderr)
    return 2 if expected else 1


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.verbose, args.quiet = getattr(args, "verbose", 0), getattr(args, "quiet", False)
    # The estimators' verbose: a live progress line by default, a line per iteration with
    # -v, nothing with -q.
    args.progress = 0 if args.quiet else (2 if args.verbose else 1)
    for value in vars(args).values():
        if isinstance(value, str):
            redact(value)          # a password in any argument is scrubbed from every later message
    level = logging.DEBUG if args.verbose >= 2 else logging.INFO if args.verbose else logging.WARNING
    with _logging_to_stderr(level):
        try:
            return args.func(args)
        except Exception as exc:  # noqa: BLE001 - every error ends as one line on stderr
            return _report(exc, args.verbose)


@contextlib.contextmanager
def _logging_to_stderr(level):
    """Log records at ``level`` and above to stderr, one format, credentials removed, for
    as long as the command runs; then the logging and dask configuration are as they
    were (main() also runs inside other programs and tests).  distributed sets its
    loggers to INFO from dask's config when it is imported (here and in each worker
    process): its start-up and shut-down chatter stays out of the terminal unless -v
    asks for it."""
    import dask

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(name)s %(message)s"))
    handler.setLevel(level)
    root = logging.getLogger()
    quiet = [logging.getLogger(name) for name in ("distributed", "dask_jobqueue")]
    saved = (root.level, [lg.level for lg in quiet])
    root.addHandler(handler)
    root.setLevel(level)
    for lg in quiet:
        lg.setLevel(level)
    name = logging.getLevelName(level).lower()
    try:
        with dask.config.set({"logging": {**dask.config.get("logging", {}), "distributed": name}}):
            yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        for lg, lvl in zip(quiet, saved[1]):
            lg.setLevel(lvl)


if __name__ == "__main__":
    sys.exit(main())
