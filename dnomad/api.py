"""``dnomad.fit`` and ``dnomad.resume``, and the method registry the CLI reads."""
from __future__ import annotations

import numpy as np

from .blocks import store as run_store
from .bregman.estimator import BregmanClustering
from .errors import InputValueError, StoreError
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


def resume(store, **overrides):
    """Continue the run in ``store`` from its last checkpoint (after a crash or preemption)
    and return the fitted estimator.  A finished run (its result written) is left as it
    is: the estimator comes back with the stored result's attributes, and nothing is
    computed or written.  A run that crashed after its last checkpoint but before its
    result finishes from that checkpoint, to the result an uninterrupted run writes."""
    meta = run_store.read_json(store, run_store.RUN_MARKER)
    if meta is None:
        raise StoreError(f"store {run_store.redact(str(store))!r} holds no dnomad run to resume")
    params = dict(meta["estimator_params"])
    params.update(overrides)
    params["store"] = store
    params["overwrite"] = False
    if params.get("dtype") is not None:
        params["dtype"] = np.dtype(params["dtype"])
    est = ESTIMATORS[meta["method"]](**params)
    validate_params(est)
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
