"""The run record in a store: the run's identity, its marker (what ``dnomad.resume``
needs), its result (written last), and restarts from the last checkpoint."""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import platform
from dataclasses import asdict

import numpy as np

from ..errors import InputChangedError, WorkerLostError
from . import digest
from . import store as run_store


logger = logging.getLogger(__name__)


# Restarts from the last checkpoint after workers holding blocks died, per fit.
MAX_RESTARTS = 3


def with_restarts(attempt, *, store, resume, checkpoint_key, rebuildable=True):
    """Run ``attempt(resume)``; when a worker holding blocks in memory dies
    (:class:`WorkerLostError`), run it again from the last checkpoint in ``store`` (from
    the start if none was written yet), up to MAX_RESTARTS times.  Checkpoint and resume
    are exact, so a restarted run ends where an uninterrupted one would.  Returns the
    number of restarts."""
    restarts = 0
    while True:
        try:
            attempt(resume)
            return restarts
        except WorkerLostError as exc:
            why = ("no store= to checkpoint to" if store is None else
                   "the input matrix was held by the lost worker" if not rebuildable else
                   f"{MAX_RESTARTS} restarts already" if restarts >= MAX_RESTARTS else None)
            if why is not None:
                raise WorkerLostError(f"{exc}; not restarted: {why}") from exc
            restarts += 1
            resume = run_store.Checkpoints(store, checkpoint_key).latest() is not None
            logger.warning("%s; restart %d from %s", exc, restarts,
                           "the last checkpoint" if resume else "the start")


# A finished run's arrays under result/ and summary keys, and the attributes they set.
RESULT_ARRAYS = {"labels": "labels_", "embedding": "embedding_", "Y": "Y_", "W": "components_",
                 "F": "components_", "hott_rows": "hott_rows_", "diag": "diag_", "U": "U_",
                 "posteriors": "posteriors_", "V": "V_", "rotation": "Q_", "X_hott": "W_",
                 "row_sums": "row_sums_"}
RESULT_SUMMARY = ("n_iter", "stop_reason", "objective", "gap", "passes", "penalty", "tau", "error",
                  "n_epochs", "cost", "mu", "grad_norm", "min_eigenvalue", "infeasibility",
                  "relaxation_objective", "reoptimized_objectives", "costs", "curvature_steps", "dual_steps",
                  "beta", "grad_tol", "n_neighbors", "scale_factor", "n_components", "explained_variance_ratio")


def run_identity(method, params, source, dtype, block_size, **extra):
    # max_iter and checkpoint_every may change on resume; the rest defines the run.
    fixed = {k: v for k, v in asdict(params).items() if k not in ("max_iter", "checkpoint_every")}
    payload = json.dumps({"method": method, "params": fixed, "input": source.fingerprint(),
                          "dtype": str(dtype), "block_size": block_size, **extra}, sort_keys=True,
                         default=str)
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def jsonable_params(params):
    out = {}
    for k, v in params.items():
        if isinstance(v, (type, np.dtype)):
            # Before the callable test: numpy scalar types (np.float32) are callable.
            out[k] = np.dtype(v).name
        elif callable(v):
            out[k] = None
        elif isinstance(v, (np.random.Generator, np.random.BitGenerator, np.random.SeedSequence)):
            out[k] = None                  # a generator's state is not a setting (nor JSON)
        else:
            out[k] = v
    return out


def versions():
    import dask
    import numba
    import scipy
    import zarr

    from .. import __version__

    return {"dnomad": __version__, "numpy": np.__version__, "scipy": scipy.__version__,
            "dask": dask.__version__, "zarr": zarr.__version__, "numba": numba.__version__,
            "python": platform.python_version()}


def matrix_run_identity(method, id_params, X, content=None):
    """The identity of a run on input X given as it is (an array, sparse or dense, in
    memory, dask, or Zarr): its method, its parameters and X's content (a hash of an
    array in memory, a dask array's token, a Zarr input's URL)."""
    # Hashed as the run marker stores it (NumPy scalars as numbers), so that a resume,
    # which rebuilds the estimator from the marker, finds the same identity.
    payload = json.dumps(json.loads(json.dumps({"method": method, "params": jsonable_params(id_params),
                                                "input": describe_matrix(X),
                                                "content": content or _content_token(X)},
                                               default=run_store._jsonable)), sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def _content_token(X):
    import scipy.sparse as sp

    if isinstance(X, np.ndarray):
        return hashlib.sha1(np.ascontiguousarray(X)).hexdigest()[:16]
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        digest = hashlib.sha1()
        for part in (X.data, X.indices, X.indptr):
            digest.update(np.ascontiguousarray(part))
        return digest.hexdigest()[:16]
    return getattr(X, "name", None)             # a dask array's token; a Zarr input: its URL


def run_record(method, est, input_record, run_id=None):
    """What a later ``dnomad.resume(store)`` needs (method, parameters, the input) and
    what names a change of identity on resume (the input's content token)."""
    params = jsonable_params(est.get_params())
    if isinstance(params.get("init"), (list, np.ndarray)):
        params["init"] = None          # a resumed run starts from its checkpoint, not from init
    return {"method": method, "run_id": run_id,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "estimator_params": params, "input": input_record, "versions": versions(), "host": platform.node()}


def matrix_input_record(X):
    """The run record's input for X as given (:func:`describe_matrix` and its content token)."""
    content = _content_token(X)
    return describe_matrix(X) if content is None else dict(describe_matrix(X), content=content)


def start_matrix_run(est, method, id_params, X, resume=False):
    """Claim ``est.store`` for a run on X as given: its identity (X's content hashed once)
    checked against the store's run; returns its run record (:func:`write_run_record`)."""
    input_record = matrix_input_record(X)
    run_id = matrix_run_identity(method, id_params, X, content=input_record.get("content"))
    record = run_record(method, est, input_record, run_id)
    est._claim_store(run_id, resume, record)
    return record


def start_run_without_checkpoints(est, method, id_params, X):
    """Claim ``est.store`` for a run that keeps no checkpoints: its id (from ``id_params``
    and the input) checked against the store's, then the run marker."""
    write_run_record(est.store, start_matrix_run(est, method, id_params, X))


def describe_matrix(X):
    """What a run marker says of its input; a Zarr input by its URL, which
    ``dnomad.resume`` opens again."""
    if isinstance(X, str) or hasattr(X, "__fspath__"):
        return {"kind": "data_zarr", "url": str(X)}
    return {"kind": type(X).__name__, "shape": list(getattr(X, "shape", ()))}


def source_input_record(source):
    """The run record's input for an :class:`InputSource` (its description and, for an
    input in memory, its content's fingerprint)."""
    record = source.describe()
    if source.data is not None or source.array is not None:
        record = dict(record, content=source.fingerprint())
    return record


def write_run_record(store, record, source=None):
    """The run record (:func:`run_record`), and the data X of a ``source`` held in memory."""
    run_store.write_json(store, run_store.RUN_MARKER, record)
    if source is not None and source.data is not None:
        run_store.write_vector(store, "input/X", source.data)


def content_check(store, X, name="X"):
    """What to call with the digest of the chunks of X (a Zarr input: its path or URL, or
    the array; a dask array, whose token does not change with the data behind it) as a
    session's first pass read them (:mod:`dnomad.blocks.digest`): the first session
    records it in ``store``; a resumed one is refused where a chunk read then and now
    differs.  None without a store or for X in memory (nothing is then digested: an
    input in memory is identified by its bytes)."""
    location = digest.zarr_location(X) if X is not None else None
    if store is None or (location is None and not hasattr(X, "dask")):
        return None
    where = f"{name} at {run_store.redact(location[0])!r}" if location else f"{name} (the dask array {X.name})"
    url = location[0] if location else X.name

    def check(seen):
        recorded = run_store.read_input_digest(store)
        if recorded is None:
            run_store.write_input_digest(store, {"input": name, "url": str(url), "chunks": seen})
            return
        changed, comparable = digest.compare(recorded["chunks"], seen)
        if not changed and (comparable or not seen or not recorded["chunks"]):
            return
        what = (f"{len(changed)} of the chunks the run read {'differs' if len(changed) == 1 else 'differ'} "
                f"(first: {changed[0]})" if changed else
                "none of the chunks read now was read when the run began (was it rewritten with other chunks?)")
        raise InputChangedError(f"{where} is not the input the run in {run_store.redact(str(store))!r} began with: "
                                f"{what}; resuming would mix two inputs. Restore {name} as it was, or start "
                                f"again with overwrite=True (--overwrite)")
    return check


def write_result(store, arrays, summary, history, seconds):
    """A finished run's arrays, history table and summary (written last: ``dnomad info``
    reports a run finished only once everything else is in place).  An array held in row
    chunks (:meth:`dnomad.blocks.RowChunks.held`) is written by the chunks, where they
    live."""
    shapes = {}
    with run_store.writing(store, "the result", keep="the last checkpoint is intact"):
        for path, value in arrays.items():
            if hasattr(value, "save_to"):
                shapes[path] = list(value.save_to(store, f"result/{path}"))
            else:
                run_store.write_vector(store, f"result/{path}", value)
                shapes[path] = list(np.shape(value))
        run_store.write_table(store, "result/history", history)
        run_store.write_json(store, "result", dict(
            summary, fit_seconds=seconds, arrays=sorted(arrays), shapes=shapes,
            finished=datetime.datetime.now(datetime.timezone.utc).isoformat()))
