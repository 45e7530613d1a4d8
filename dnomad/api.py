"""``dnomad.fit`` and ``dnomad.resume``, and the method registry the CLI reads."""
from __future__ import annotations

import numpy as np

from .blocks import store as run_store
from .bregman.estimator import BregmanClustering
from .errors import DnomadError, InputValueError, StoreError
from .hottopixx.estimator import Hottopixx
from .kmeans_sdp.estimators import NLR, RiemannianKMeans
from .nomad.estimator import NOMAD
from .symnmf.estimator import SymNMF
from .validation import validate_params


ESTIMATORS = {"nomad": NOMAD, "symnmf": SymNMF, "hottopixx": Hottopixx,
              "riemannian-kmeans": RiemannianKMeans, "nlr": NLR, "bregman": BregmanClustering}


def fit(data, method="nomad", **params):
    """Fit ``method`` on ``data`` and return the fitted estimator.

    ``dnomad.fit(X, method="nomad", n_clusters=16, store="run.zarr")`` is
    ``dnomad.NOMAD(n_clusters=16, store="run.zarr").fit(X)``.
    """
    if method not in ESTIMATORS:
        raise InputValueError(f"method must be one of {sorted(ESTIMATORS)}; got {method!r}")
    resume = params.pop("resume", False)
    return ESTIMATORS[method](**params).fit(data, resume=resume)


def run_record(store):
    """The run record of ``store`` checked as a resume needs it (None where the store
    holds no run): its fields (:func:`dnomad.blocks.store.read_run_record`), a method
    dnomad has, and parameters its estimator takes; else the StoreError naming it."""
    meta = run_store.read_run_record(store)
    if meta is not None:
        _estimator_of_record(store, meta, {})
    return meta


def load_finished(store):
    """The estimator of the finished run in ``store`` with its stored result (nothing is
    computed, written or locked), or None where the run has not finished; StoreError
    where the record or the result is damaged, as a resume would find it."""
    meta = run_store.read_run_record(store)
    if meta is None:
        return None
    est = _estimator_of_record(store, meta, {})
    return est if est._load_finished() else None


def _estimator_of_record(store, meta, overrides):
    """The estimator the run record ``meta`` describes, with ``overrides``: a StoreError
    where the record names a method or parameters dnomad does not have, or values its
    estimator refuses (the overrides' own errors are the caller's)."""
    part = f"the run record {run_store.RUN_MARKER!r}"
    if meta["method"] not in ESTIMATORS:
        raise run_store.damaged(store, part, f"names the method {meta['method']!r}, not one of {sorted(ESTIMATORS)}")
    cls = ESTIMATORS[meta["method"]]
    recorded = dict(meta["estimator_params"])
    unknown = sorted(set(recorded) - set(cls().get_params()))
    if unknown:
        from . import __version__

        written = meta.get("versions", {}).get("dnomad") if isinstance(meta.get("versions"), dict) else None
        raise run_store.damaged(store, part, f"gives {cls.__name__} parameters it does not have: "
                                f"{', '.join(unknown)} (written by dnomad {written or 'of an unknown version'}, "
                                f"read by {__version__})")

    def build(params):
        params = dict(params, store=store, overwrite=False)
        if params.get("dtype") is not None:
            params["dtype"] = np.dtype(params["dtype"])
        est = cls(**params)
        validate_params(est)
        return est

    try:
        est = build(recorded)
    except (DnomadError, TypeError, ValueError) as exc:
        raise run_store.damaged(store, part, f"holds parameters {cls.__name__} refuses ({exc})") from None
    return build(dict(recorded, **overrides)) if overrides else est


def resume(store, **overrides):
    """Continue the run in ``store`` from its last checkpoint (after a crash or preemption)
    and return the fitted estimator.  A finished run (its result written) is left as it
    is: the estimator comes back with the stored result's attributes, and nothing is
    computed or written.  A run that crashed after its last checkpoint but before its
    result finishes from that checkpoint, to the result an uninterrupted run writes."""
    meta = run_store.read_run_record(store)
    if meta is None:
        raise StoreError(f"store {run_store.redact(str(store))!r} holds no dnomad run to resume")
    est = _estimator_of_record(store, meta, overrides)
    inp = meta["input"]
    if inp["kind"] == "data":
        X = run_store.read_vector(store, "input/X")
    elif inp["kind"] in ("gram_zarr", "data_zarr") and inp.get("url"):
        X = inp["url"]
    elif est._load_finished():
        # A finished run without checkpoints (or given its matrix in memory): its result.
        return est
    else:
        raise StoreError(f"the run in {run_store.redact(str(store))!r} was given an in-memory matrix; call "
                         f"dnomad.fit(..., store=STORE, resume=True) with it again")
    if not est._checkpoints:
        if est._load_finished():
            return est
        raise InputValueError(f"{type(est).__name__} keeps no checkpoints and its run in "
                              f"{run_store.redact(str(store))!r} did not finish: fit again")
    # fit(resume=True): the gate, the store's lock and the run's identity, then either
    # the finished result as it is or the run from its last checkpoint
    return est.fit(X, resume=True)
