"""``dnomad.fit`` and the scikit-learn-style estimators."""
from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import logging
import numbers
import platform
import time
from dataclasses import asdict

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin

from . import blocks
from .blocks import store as run_store
from .errors import InputTypeError, InputValueError, InvalidParameterError, StoreError, WorkerLostError
from .linalg import top_eigenvectors
from .solvers import hottopixx as hott_solver
from .solvers import nlr as nlr_solver
from .solvers._rounding import component_labels, kmeans_rows
from .solvers import riemannian_kmeans as rk
from .solvers import symnmf
from .solvers.nomad import CHECKPOINT_KEY as nomad_checkpoint_key
from .blocks.operators import LowRankGram, ScaledMatrix
from .solvers import nomad as nomad_solver
from .solvers.bregman.divergences import DIVERGENCES, BregmanDivergence
from .solvers.burer_monteiro import BurerMonteiroParams, burer_monteiro
from .solvers.nomad import NomadParams, nomad_cgm
from .validation import Interval, Options, check_data, validate_params

logger = logging.getLogger(__name__)

# Below this n the in-process backend runs even when a cluster is connected: a NOMAD
# inner step (6 passes) then takes under 50 ms, and a cluster's round trips add 2 to 9 ms
# per pass (graphs/backend_threshold.py measures both on one machine).
LOCAL_MAX_N = 8000
BACKEND_CHOICES = ("auto", "local", "distributed", "zarr")
SOLVERS = ("cgm", "bm")
LABEL_METHODS = ("components", "spectral")


def _get_client():
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


@contextlib.contextmanager
def _cluster_client(n_workers=None):
    """The current dask.distributed client, else an embedded LocalCluster closed on exit."""
    client = _get_client()
    if client is not None:
        yield client
        return
    from distributed import Client, LocalCluster

    import os

    ncores = len(os.sched_getaffinity(0))
    cluster = LocalCluster(n_workers=n_workers or max(1, min(ncores, 4)), threads_per_worker=1,
                           processes=True, dashboard_address=None)
    client = Client(cluster)
    logger.info("started an embedded LocalCluster: %s", cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _is_precomputed(X):
    return isinstance(X, blocks.BlockMatrix)


def _choose_backend(backend, n, dtype, *, n_matrices, store, what):
    """The backend for ``n_matrices`` stored n x n symmetric matrices (upper blocks).

    ``backend`` other than "auto" is returned as given (checked).  "auto": in this
    process for n < LOCAL_MAX_N or when no dask client is connected, else the client's
    workers; in Zarr (needs ``store``) when the matrices do not fit in half of the memory
    that would hold them.
    """
    if backend not in BACKEND_CHOICES:
        raise InputValueError(f"backend must be one of {BACKEND_CHOICES}; got {backend!r}")
    if backend != "auto":
        if backend == "zarr" and store is None:
            raise InputValueError("backend='zarr' needs store= (where the n x n matrices live)")
        return backend
    need = n_matrices * n * n / 2 * dtype.itemsize
    client = _get_client()
    if client is not None and n >= LOCAL_MAX_N:
        mem = sum(w.get("memory_limit", 0)
                  for w in client.scheduler_info(n_workers=-1)["workers"].values())
        in_memory = "distributed"
    else:
        # Without a cluster (or for small n) the blocks stay in this process: on one
        # machine a LocalCluster runs the same kernels with a round trip per pass on
        # top (graphs/backend_threshold.py: 2.1x slower per NOMAD inner step at
        # n = 8000, 1.36x at 16000 on 2 cores), so starting one would never pay.
        from .blocks.matrix import _available_memory

        mem = _available_memory()
        in_memory = "local"
    if need > 0.5 * mem:
        if store is None:
            raise InputValueError(f"{what} needs {need / 2**30:.1f} GiB, more than half of the "
                                  f"{mem / 2**30:.1f} GiB of memory: give store= to run out of core "
                                  f"in Zarr")
        return "zarr"
    return in_memory


def _client_context(backend, n):
    """The client a fit runs under: the cluster's for "distributed" (an embedded
    LocalCluster when none is connected); for "zarr", the current one when there is
    one, an embedded one for large n, none (the thread pool here) otherwise."""
    if backend == "distributed" or (backend == "zarr" and (n >= LOCAL_MAX_N or _get_client() is not None)):
        return _cluster_client()
    return contextlib.nullcontext(None)


# Restarts from the last checkpoint after workers holding blocks died, per fit.
MAX_RESTARTS = 3


def _with_restarts(attempt, *, store, resume, checkpoint_key, rebuildable=True):
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


def _n_features(X):
    """The column count of a fit's input (n for a precomputed n x n matrix), read from
    its metadata; None where the input does not say."""
    shape = blocks.input_metadata(X).get("shape")
    if shape is None:
        shape = np.shape(X)
    return int(shape[1]) if len(shape) == 2 else None


def _gated(fit):
    """The input gate around an estimator's ``fit``: every parameter checked against
    ``_parameter_constraints`` first; the store, claimed inside ``fit`` (after its data
    passed :func:`dnomad.validation.check_data`) by :meth:`_Estimator._claim_store`, is
    released when ``fit`` ends, however it ends; and a run refused for its input after
    the claim (content found bad where lazy data is read) leaves no store behind."""
    @functools.wraps(fit)
    def gated(self, X, y=None, *, resume=False):
        validate_params(self)
        if not isinstance(resume, (bool, np.bool_)):
            raise InvalidParameterError(f"{type(self).__name__}.fit: resume must be a bool; got {resume!r}")
        self._store_claim = None
        self.__dict__.pop("n_features_in_", None)
        try:
            fitted = fit(self, X, y, resume=bool(resume))
            n_features = _n_features(X)
            if n_features is not None:
                self.n_features_in_ = n_features
            return fitted
        except (InputValueError, InputTypeError):
            if self._store_claim is not None and not resume:
                try:
                    run_store.abandon(self.store, created=self._store_claim[1])
                except OSError as exc:          # the input's error is the one to report
                    logger.warning("could not release store %s: %s", run_store.redact(str(self.store)), exc)
            raise
        finally:
            claim = self.__dict__.pop("_store_claim", None)
            if claim is not None:
                claim[0].release()
    return gated


# Parameter constraints shared by several estimators (see dnomad.validation).
_POSITIVE_INT = [Interval(numbers.Integral, 1, None)]
_OPTIONAL_POSITIVE_INT = [None] + _POSITIVE_INT
_POSITIVE = [Interval(numbers.Real, 0, None, closed="neither")]
_NONNEGATIVE = [Interval(numbers.Real, 0, None)]
_RUN_CONSTRAINTS = {"store": [None, "path"], "overwrite": ["boolean"], "random_state": ["random_state"]}


class _Estimator(BaseEstimator):
    """scikit-learn's estimator: __init__ stores its arguments as given (get_params,
    set_params, clone and the repr come from BaseEstimator); fit checks them against
    ``_parameter_constraints`` (:func:`_gated`) and sets ``n_features_in_``."""

    _parameter_constraints = {}
    _checkpoints = False          # fit(resume=True) continues from a checkpoint (NOMAD, SymNMF)

    def _claim_store(self, run_id, resume=False):
        """Claim ``store`` for this run (lock, then the run-identity check: see
        :func:`dnomad.blocks.store.claim`); :func:`_gated` releases it."""
        self._store_claim = run_store.claim(self.store, run_id, overwrite=self.overwrite and not resume,
                                            resume=resume)

    def _load_finished(self, max_iter=None):
        """If ``store`` holds this run's result, set the learned attributes from it
        (nothing is computed or written) and return True: resuming a finished run leaves
        it as it is.  Else return False; also for a run that stopped at max_iter when
        ``max_iter`` (this fit's, resolved) is larger: its result is withdrawn (so that a
        crash while it goes on leaves no stale result standing) and the run's record
        takes the new max_iter, and resuming goes on from the last checkpoint."""
        summary = run_store.read_json(self.store, "result")
        if summary is None:
            return False
        if summary.get("stop_reason") == "max_iter" and max_iter is not None and \
                max_iter > summary.get("n_iter", max_iter):
            run_store.drop_json(self.store, "result")
            marker = run_store.read_json(self.store, run_store.RUN_MARKER)
            marker["estimator_params"]["max_iter"] = int(max_iter)
            run_store.write_json(self.store, run_store.RUN_MARKER, marker)
            return False
        for path, attr in RESULT_ARRAYS.items():
            if run_store.has_array(self.store, f"result/{path}"):
                setattr(self, attr, run_store.read_vector(self.store, f"result/{path}"))
        if run_store.has_array(self.store, "result/Q"):
            self.Q_ = blocks.from_zarr(self.store, "result/Q", backend="zarr", store=self.store)
        elif run_store.has_array(self.store, "result/Y"):
            self.Q_ = LowRankGram(self.Y_)
        for key in RESULT_SUMMARY:
            if key in summary:
                setattr(self, f"{key}_", summary[key])
        self.history_ = run_store.read_table(self.store, "result/history") or []
        self.fit_seconds_ = summary.get("fit_seconds")
        logger.info("the run in %s finished on %s (%s): nothing to resume", run_store.redact(str(self.store)),
                    summary.get("finished"), summary.get("stop_reason"))
        return True


# A finished run's arrays under result/ and summary keys, and the attributes they set.
RESULT_ARRAYS = {"labels": "labels_", "embedding": "embedding_", "Y": "Y_", "W": "components_",
                 "F": "components_", "hott_rows": "hott_rows_", "diag": "diag_", "U": "U_",
                 "posteriors": "posteriors_"}
RESULT_SUMMARY = ("n_iter", "stop_reason", "objective", "gap", "passes", "penalty", "tau", "error",
                  "n_epochs", "cost", "mu", "grad_norm", "min_eigenvalue", "infeasibility",
                  "relaxation_objective", "reoptimized_objectives")


class _Clustering(ClusterMixin):
    """The estimators that learn ``labels_`` (not Hottopixx): scikit-learn's clusterer."""

    def fit_predict(self, X, y=None, **kwargs):
        """Fit on X and return ``labels_`` (ClusterMixin's, defined here so that a
        warning from the fit points at the caller's line, not at scikit-learn's)."""
        return self.fit(X, **kwargs).labels_


class NOMAD(_Clustering, _Estimator):
    """NOnnegative MAnifold Disentangling: the K-means SDP, by conditional gradient or
    in low rank (Burer-Monteiro), in one layer or several.

    Solves max Tr(D Q) s.t. Q 1 = 1, Tr Q = K, Q PSD, Q >= 0 with D the Gram matrix of
    the (centered, scaled) data.  ``solver="cgm"`` works on n x n block matrices that
    live in this process, in a Dask cluster's memory or in a Zarr store;
    ``solver="bm"`` keeps Q = Y Y^T with Y >= 0 of ``rank`` columns (O(n r) memory;
    nonconvex) and needs only products D Y: two passes over the rows of X (NumPy or
    Zarr, never an n x n matrix) or one pass over a precomputed D.

    Parameters
    ----------
    n_clusters : int
        K, the trace of Q; 1 < K < n.  Larger K than the number of groups lets
        NOMAD resolve manifolds (the paper uses K = 8 to 128).
    solver : {"cgm", "bm"}, default "cgm"
        Conditional gradient in the method of multipliers (Sec. 5, Alg. 2; converges
        to the SDP's solution), or Burer-Monteiro (Sec. 4, App. E: the augmented
        Lagrangian (32) minimized over Y in [0, 1]^{n x r} by projected L-BFGS over Y's
        row chunks, multipliers by (33b, 33c), D divided by its Frobenius norm,
        symmetric-NMF start).
    rank : int, optional
        (bm) r, Y's columns, K <= r <= n; default 8 K, the authors' practice: r = K
        returns hard clusterings (Kulis et al.), larger r comes closer to the SDP's
        solution (graphs/nomad_solvers.py: relative distance 0.9 at r = K, 0.06-0.09
        at 8 K on two rings).  In multi-layer runs the same r serves every layer
        (default 8 K_l).
    layers : list of int or "halving", optional
        Multi-layer NOMAD (Sec. 3.1): Q_1 = NOMAD(D, K_1), Q_l = NOMAD(Q_{l-1}, K_l) for a
        strictly decreasing schedule K_1 > ... > K_L, the last equal to the number of
        groups (``n_groups`` when given); ``n_clusters`` is then not used.
        "halving": n_clusters, n_clusters / 2, ... down to n_groups (e.g. 16, 8, 4, 2:
        separates two rings and two half-moons, where one layer with K = 2 does not).
        Q_l of the inner layers is kept in ``store`` (``layers/<l>/Q``, or ``/Y`` for
        bm) and in ``layers_``.  A layer's D is the previous Q as it is (bm: divided by
        its Frobenius norm).
    solver_options : dict, optional
        (bm) sigma (the row-sum penalty; default 10 / n, the paper's 1 is
        ill-conditioned at large n), phi, eta (default 1), tol (1e-5: stop when Y
        changes by less, relative, and the constraints hold to feasibility_tol, 1e-4),
        optimizer of each multiplier step ("lbfgs": projected L-BFGS over Y's row
        chunks, the default; "spg": spectral projected gradient; "scipy": SciPy's
        L-BFGS-B in this process), memory (5 pairs, lbfgs), inner_max_iter (15000),
        inner_tol (1e-10: ftol and gtol), inner_rtol (0.1: a multiplier step stops
        once its projected gradient has fallen to this fraction of where it started,
        except the first and one confirming the stopping rule, solved to inner_tol;
        0: every step to inner_tol; not "scipy"), start ("symnmf" or "random").
    max_iter : int, optional
        Outer (multiplier) iterations; default 2000 (cgm), 1000 (bm).
    n_inner : int, default 2
        Inner steps (Frank-Wolfe or block) per multiplier update; the paper uses 10.
    penalty : "scale" or float, default "scale"
        gamma of the augmented Lagrangian.  "scale": 0.15 n rms(J D J) / K with J
        the centering projector, which keeps the penalty's weight against Tr(D Q) the
        same at every n, so the outer iterations to the stopping rule do not grow with
        n; with the paper's fixed gamma = tau = 1 they grow about as n (see
        graphs/nomad_scaling.py).  0.15 is what gamma = 1 amounts to on two rings with
        n = 120 and K = 8.
    penalty_schedule : {"sqrt", "constant"}, default "sqrt"
        gamma sqrt(t + 1) at outer iteration t (the authors' code), or constant.
    tau : "auto", "penalty", "scale" or float, default "auto"
        Multiplier step (15b).  "penalty": the penalty of each outer iteration (the
        classical method of multipliers); "scale" or a number: fixed, in the units of
        ``penalty``; "auto": "penalty" with the shifted Lagrangian, "scale" with eq. 13.
    direction : {"block", "vertex"}, default "block"
        The inner step.  "block": a projected step restricted to rank k, P <- P + a (V - P)
        with V the projection of P - G / gamma onto the spectraplex {P PSD, Tr P = K - 1,
        P 1 = 0} within its top-k eigenvectors (LOBPCG, warm-started: one pass per
        product, whatever k) and a the exact line-search step (Allen-Zhu et al. 2017's
        block Frank-Wolfe).  "vertex": the paper's Frank-Wolfe step toward (K - 1) v v^T
        (Alg. 1).  Measured (graphs/nomad_convergence.py): block needs 40-100x fewer
        passes to the same stopping rule on rings, the trefoil, blobs and MNIST.
    block_rank : int, optional
        k of the block direction; default 2 K + 8, grown by half whenever all k
        eigenvalues survive the projection.
    lagrangian : {"shifted", "paper"}, default "shifted"
        "shifted": the classical augmented Lagrangian of Q >= 0,
        -Tr(D Q) + 1/(2 gamma) ||[Gamma + gamma Q]_-||^2, gradient -D + [Gamma + gamma Q]_-;
        "paper": eq. (13), -Tr(D Q) + <Gamma, Q> + gamma/2 ||[Q]_-||^2.  Both update
        Gamma <- [Gamma + tau Q]_- and have the same solutions.
    step_rule : {"global", "paper", "line_search"}, default "global"
        2/(k + 2) over all Frank-Wolfe steps k (the authors' code);
        2/(t + t_inner + 2) as Alg. 2 line 8 (measured: slower to meet the stopping rule);
        or the exact minimizer of the augmented Lagrangian along the Frank-Wolfe direction
        (one more pass per inner step, reading P; measured: no faster than "global").
        For direction="vertex" (the block direction always takes the exact step).
    eigen_tol : {"inner", "outer"}, default "inner"
        Eigenvector accuracy 1/(t_inner + 1) or 1/(t + 1).
    eigen_ncv : int or None, default 4
        Lanczos basis size of the warm-started eigensolver.
    rmse_tol, min_tol, objective_tol : float
        Stop when the RMSE of [Q]_- <= rmse_tol (1e-4), |min Q| <= min_tol K / n
        (1e-2), and Tr(D Q) changed by <= objective_tol (1e-3, relative) in the last
        outer iteration.
    precomputed : bool, default False
        The input is an n x n Gram/affinity (NumPy, dask, Zarr path, BlockMatrix)
        rather than data X (n_samples, n_features).
    center, normalize : bool, default True
        Center X and scale it so that its largest row norm is 1 before D = X X^T.
    dtype : float32 or float64, default float32
    block_size : int, optional
        Side of the blocks (default: about 64 MB blocks, or n if smaller; in this process
        at least 4 blocks per side, down to 512, so that every core has blocks to run).
    backend : {"auto", "local", "distributed", "zarr"}, default "auto"
        "auto": in this process for n < 8000 or when no dask client is connected (on
        one machine a LocalCluster only adds round trips: graphs/backend_threshold.py),
        else the current client's workers hold the blocks; in Zarr (needs ``store``)
        when the state does not fit in half of the memory that would hold it.
    device : {"cpu", "cuda", "auto"}, optional
        (cgm) Where the blocks compute: "cuda" keeps P, Gamma and G on the GPU as CuPy
        blocks, in this process (backend "local"), with the eigensolver's vectors; D
        enters through its factor (the centered, scaled X), never as an n x n matrix (a
        precomputed D is stored there too).  Default: dask config ``dnomad.device``, else
        "cpu" (:func:`dnomad.blocks.device.resolve_device`).  deploy/gpu/README.md.
    store : str, optional
        Zarr store (path or fsspec URL) for Q, the history and checkpoints.
    overwrite : bool, default False
        Replace a store holding another run.
    checkpoint_every : int, optional
        Outer iterations between checkpoints to ``store``; default 20 (cgm), 1 (bm: an
        outer step is a whole inner solve, and a checkpoint only writes Y and mu).
    label_method : {"components", "spectral"}, default "components"
        Hard labels: connected components of the graph that links i and j where
        Q_ij > component_threshold * max(Q_ii, Q_jj) (Sec. 3;
        :func:`dnomad.solvers._rounding.component_labels`), or k-means on the spectral
        embedding into ``n_groups`` groups.  The components rule is the same for
        cgm, bm and every layer, and depends neither on the groups' sizes nor on Q's
        scale: on separated groups the SDP's Q is block diagonal with entries
        1 / |group|, and the components are the groups.  With ``n_clusters`` larger
        than the number of groups or manifolds (the paper's use), Q is a band along
        each manifold and ``labels_`` are the manifolds, not K clusters (two rings with
        K = 16: two labels); a manifold sampled too sparsely for its band to connect
        comes out in pieces.  For exactly ``n_groups`` labels use "spectral".
    component_threshold : float, default 0.5
        The fraction in (0, 1) above.  On the exact solution any value in (0, 1) gives
        the groups; conditional-gradient iterates stopped by the stopping rule keep
        Frank-Wolfe residue between groups of up to 0.17 of the larger diagonal and
        links above 0.76 of it inside each group (blobs with sizes up to 20:1, two
        rings), hence 0.5.
    n_groups : int, optional
        Groups for spectral rounding (required with label_method="spectral"), and the
        last layer's K of a multi-layer run.
    n_components : int, default 2
        Dimensions of ``embedding_``.
    random_state : int or Generator, optional
        Seeds the k-means of spectral rounding (and bm's start).
    callback : callable, optional
        Called with each history row; returning True stops the run.

    Parameters n_inner to eigen_ncv, the stopping tolerances, dtype and block_size are
    conditional gradient's; Burer-Monteiro runs in this process in float64 (D Y over
    X's row chunks on a thread per core, or over the blocks of a precomputed D
    wherever they live).

    Attributes
    ----------
    Q_ : BlockMatrix (cgm) or LowRankGram (bm)
        Both have ``matmat``, ``diag`` and ``np.asarray(Q_)`` (dense; small n).
    Y_ : ndarray (n, r)
        (bm) The factor: Q = Y Y^T (in the store: ``result/Y``, row-chunked).
    layers_ : list of dict
        Per layer: n_clusters, n_iter, stop_reason, objective, seconds, and Q (the
        inner layers' Q when kept, else None; the last layer's is ``Q_``).
    embedding_ : ndarray (n, n_components)
        Leading eigenvectors of Q (after the constant one) scaled by sqrt(eigenvalue).
    labels_ : ndarray (n,)
    history_ : list of dict
    penalty_, tau_ : float
        (cgm) The gamma and tau used (resolved from "scale").
    n_iter_, stop_reason_, objective_, backend_used_ : as named.

    References
    ----------
    M. Tepper, A. M. Sengupta, D. Chklovskii. Clustering is semidefinitely not that
    hard: Nonnegative SDP for manifold disentangling. JMLR 19(82), 2018.
    B. Kulis, A. C. Surendran, J. C. Platt. Fast low-rank semidefinite programming for
    embedding and clustering. AISTATS 2007.
    """

    _solver_params = ("max_iter", "n_inner", "penalty", "penalty_schedule", "tau", "direction", "block_rank",
                      "lagrangian", "step_rule", "eigen_tol", "eigen_ncv", "rmse_tol", "min_tol",
                      "objective_tol", "checkpoint_every")

    _checkpoints = True
    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "solver": [Options(*SOLVERS)],
        "rank": _OPTIONAL_POSITIVE_INT, "layers": [None, Options("halving"), list, tuple, range, np.ndarray],
        "solver_options": [None, "dict"], "max_iter": _OPTIONAL_POSITIVE_INT, "n_inner": _POSITIVE_INT,
        "penalty": [Options("scale")] + _POSITIVE, "penalty_schedule": [Options(*nomad_solver.PENALTY_SCHEDULES)],
        "tau": [Options("auto", "scale", "penalty")] + _POSITIVE,
        "direction": [Options(*nomad_solver.DIRECTIONS)], "block_rank": _OPTIONAL_POSITIVE_INT,
        "lagrangian": [Options(*nomad_solver.LAGRANGIANS)], "step_rule": [Options(*nomad_solver.STEP_RULES)],
        "eigen_tol": [Options("inner", "outer")], "eigen_ncv": [None, Interval(numbers.Integral, 3, None)],
        "rmse_tol": _NONNEGATIVE, "min_tol": _NONNEGATIVE, "objective_tol": _NONNEGATIVE,
        "precomputed": ["boolean"], "center": ["boolean"], "normalize": ["boolean"], "dtype": ["dtype"],
        "block_size": _OPTIONAL_POSITIVE_INT, "backend": [Options(*BACKEND_CHOICES)],
        "device": [None, str], "checkpoint_every": _OPTIONAL_POSITIVE_INT,
        "label_method": [Options(*LABEL_METHODS)],
        "component_threshold": [Interval(numbers.Real, 0, 1, closed="neither")],
        "n_groups": [None, Interval(numbers.Integral, 2, None)], "n_components": _POSITIVE_INT,
        "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, solver="cgm", rank=None, layers=None, solver_options=None,
                 max_iter=None, n_inner=2, penalty="scale",
                 penalty_schedule="sqrt", tau="auto", direction="block", block_rank=None,
                 lagrangian="shifted", step_rule="global", eigen_tol="inner",
                 eigen_ncv=4, rmse_tol=1e-4, min_tol=1e-2, objective_tol=1e-3, precomputed=False,
                 center=True, normalize=True, dtype=np.float32, block_size=None, backend="auto",
                 device=None, store=None, overwrite=False, checkpoint_every=None,
                 label_method="components", component_threshold=0.5, n_groups=None, n_components=2,
                 random_state=None, callback=None):
        self.n_clusters = n_clusters
        self.solver = solver
        self.rank = rank
        self.layers = layers
        self.solver_options = solver_options
        self.max_iter = max_iter
        self.n_inner = n_inner
        self.penalty = penalty
        self.penalty_schedule = penalty_schedule
        self.tau = tau
        self.direction = direction
        self.block_rank = block_rank
        self.lagrangian = lagrangian
        self.step_rule = step_rule
        self.eigen_tol = eigen_tol
        self.eigen_ncv = eigen_ncv
        self.rmse_tol = rmse_tol
        self.min_tol = min_tol
        self.objective_tol = objective_tol
        self.precomputed = precomputed
        self.center = center
        self.normalize = normalize
        self.dtype = dtype
        self.block_size = block_size
        self.backend = backend
        self.device = device
        self.store = store
        self.overwrite = overwrite
        self.checkpoint_every = checkpoint_every
        self.label_method = label_method
        self.component_threshold = component_threshold
        self.n_groups = n_groups
        self.n_components = n_components
        self.random_state = random_state
        self.callback = callback

    # ---------------------------------------------------------------- fit
    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Solve NOMAD for data X (n_samples, n_features), or a Gram matrix when
        ``precomputed``.  Returns self."""
        start = time.perf_counter()
        dtype = blocks.check_dtype(self.dtype)
        self._check_options()
        source = _InputSource(X, precomputed=self.precomputed, center=self.center,
                              normalize=self.normalize, keep_zarr=self.solver == "bm", owner="NOMAD",
                              dtype=dtype, not_constant=True)
        n = source.n
        schedule = self._schedule(n)
        params_list = [self._solver_params_for(K) for K in schedule]
        for params in params_list:
            params.validate(n)
        if self.store is None and resume:
            raise InputValueError("resume=True needs the run's store")
        if self.store is not None:
            extra = {} if self.solver == "cgm" and len(schedule) == 1 else \
                {"solver": self.solver, "layers": schedule}
            run_id = _run_id("nomad", params_list[0], source, dtype, self.block_size, **extra)
            self._claim_store(run_id, resume)
            if resume and self._load_finished(params_list[-1].max_iter):
                return self
            if not resume:
                _write_run_marker(self.store, "nomad", run_id, self, source)

        self.layers_ = []
        if self.solver == "bm":
            self._fit_bm(source, params_list, dtype, resume, start)
        else:
            self._fit_cgm(source, params_list, dtype, resume, start)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def _load_finished(self, max_iter=None):
        if not super()._load_finished(max_iter):
            return False
        done = finished_layers(self.store)
        summary = run_store.read_json(self.store, "result")
        self.layers_ = _layer_records(self.store, done) + [
            {"n_clusters": summary["layers"][-1], "n_iter": summary["n_iter"], "stop_reason": summary["stop_reason"],
             "objective": summary["objective"], "seconds": summary.get("fit_seconds"), "Q": self.Q_}]
        return True

    def _check_options(self):
        """What ``_parameter_constraints`` cannot say: parameters that depend on each other."""
        if self.label_method == "spectral" and self.n_groups is None:
            raise InputValueError("label_method='spectral' needs n_groups (an int >= 2): the number of "
                                  "groups k-means rounds the embedding into")
        allowed = BM_OPTIONS if self.solver == "bm" else ()
        bad = sorted(set(self.solver_options or {}) - set(allowed))
        if bad:
            raise InputValueError(f"solver_options {bad} are not options of solver={self.solver!r}; "
                                  f"allowed: {list(allowed)}")
        if self.solver == "bm" and isinstance(self.device, str) and self.device.lower() == "cuda":
            raise InputValueError("device='cuda' runs solver='cgm'; the Burer-Monteiro solver runs on the "
                                  "host (NumPy row chunks)")
        if self.solver == "cgm" and blocks.device.resolve_device(self.device) == "cuda" and \
                self.backend not in ("auto", "local"):
            raise InputValueError(f"device='cuda' runs with backend='local' (the blocks in this process's "
                                  f"GPU); got backend={self.backend!r}")
        if self.solver == "cgm" and self.rank is not None:
            raise InputValueError("rank is the Burer-Monteiro factor's width: it needs solver='bm'")

    def _schedule(self, n):
        """The K of each layer: [n_clusters] for one layer."""
        layers = self.layers
        if layers is None:
            return [self.n_clusters]
        if isinstance(layers, str):                       # "halving" (_parameter_constraints)
            K, last = self.n_clusters, self.n_groups
            if not (isinstance(last, (int, np.integer)) and isinstance(K, (int, np.integer))
                    and 1 < last < K):
                raise InputValueError(f'layers="halving" needs integers 1 < n_groups < n_clusters; got '
                                      f'n_groups={last!r}, n_clusters={K!r}')
            schedule = []
            while K > last:
                schedule.append(int(K))
                K //= 2
            return schedule + [int(last)]
        try:
            schedule = [int(K) for K in layers]
        except (TypeError, ValueError):
            raise InputValueError(f"layers must be a list of integers; got {layers!r}") from None
        if not schedule or any(K != k for K, k in zip(schedule, layers)) or \
                any(a <= b for a, b in zip(schedule, schedule[1:])):
            raise InputValueError(f"layers must be a non-empty, strictly decreasing list of integers; got "
                                  f"{layers!r}")
        if self.n_groups is not None and schedule[-1] != self.n_groups:
            raise InputValueError(f"the last layer's K ({schedule[-1]}) must equal n_groups ({self.n_groups})")
        return schedule

    def _solver_params_for(self, K):
        if self.solver == "bm":
            max_iter = BM_MAX_ITER if self.max_iter is None else self.max_iter
            return BurerMonteiroParams(n_clusters=K, rank=self.rank, max_iter=max_iter,
                                       random_state=self.random_state, **(self.solver_options or {}))
        max_iter = CGM_MAX_ITER if self.max_iter is None else self.max_iter
        return NomadParams(n_clusters=K, max_iter=max_iter,
                           checkpoint_every=CGM_CHECKPOINT_EVERY if self.checkpoint_every is None
                           else self.checkpoint_every,
                           **{k: getattr(self, k) for k in self._solver_params
                              if k not in ("max_iter", "checkpoint_every")})

    # ------------------------------------------------ conditional gradient
    def _fit_cgm(self, source, params_list, dtype, resume, start):
        n, store, last = source.n, self.store, len(params_list) - 1
        device = blocks.device.resolve_device(self.device)
        backend = "local" if device == "cuda" and self.backend == "auto" else \
            self._resolve_backend(source, dtype)

        def attempt(resume):
            done = finished_layers(store) if resume else 0
            self.layers_ = _layer_records(store, done)
            with _client_context(backend, n) as client:
                kw = dict(backend=backend, client=client if backend != "local" else None, store=store,
                          dtype=dtype, block_size=self.block_size, device=device)
                if done:
                    # Layers 0..done-1 finished: the next one starts from the last one's Q.
                    group = blocks.from_zarr(store, f"layers/{done - 1}/Q", **kw).group
                    data = None
                else:
                    group, data = source.build(**kw)
                try:
                    for layer in range(done, last + 1):
                        key = layer_checkpoint_key(layer)
                        res = nomad_cgm(group, params_list[layer], data=data, store=store,
                                        resume=resume and _has_checkpoint(store, key),
                                        callback=self.callback, checkpoint_key=key)
                        if layer < last:
                            self._keep_layer(layer, res, group)
                            group.drop(["D", "P", "Gamma", "G"])
                            blocks.shifted_copy(group, "Q", "D", 0.0)       # D_{l+1} = Q_l
                            group.drop(["Q"])
                            data = None
                    self._finish(res, group, start)
                finally:
                    if backend == "local":
                        # Q_ (and kept layers) live on in this group; free the solver's state.
                        group.drop([m for m in group.names if m != "Q" and not m.startswith("layer")])
                    elif backend == "distributed":
                        group.close()

        self.restarts_ = _with_restarts(attempt, store=store, resume=resume,
                                        checkpoint_key=layer_checkpoint_key(0),
                                        rebuildable=source.matrix is None)
        self.backend_used_ = backend

    def _keep_layer(self, layer, res, group):
        """Record a finished inner layer; its Q goes to the store (``layers/<l>/Q``), or
        stays in the group as "layer<l>" when it lives in this process."""
        record = _layer_record(res)
        if self.store is not None:
            with run_store.writing(self.store, f"layer {layer}'s Q", keep="the last checkpoint is intact"):
                group.save(["Q"], self.store, f"layers/{layer}", mirror=True)
                run_store.write_json(self.store, f"layers/{layer}", record)
            record["Q"] = blocks.from_zarr(self.store, f"layers/{layer}/Q", dtype=group.dtype,
                                           block_size=group.layout.block_size, backend="zarr",
                                           store=self.store)
        elif group.backend == "local":
            blocks.shifted_copy(group, "Q", f"layer{layer}", 0.0)
            record["Q"] = blocks.BlockMatrix(group, f"layer{layer}")
        else:
            record["Q"] = None
        self.layers_.append(record)

    def _resolve_backend(self, source, dtype):
        if source.matrix is not None:
            return source.matrix.backend
        return _choose_backend(self.backend, source.n, dtype, n_matrices=3, store=self.store,
                               what="NOMAD's state (P, Gamma, G)")

    def _finish(self, res, group, start):
        self.passes_ = group.passes.since()
        if self.label_method == "components":
            labels = component_labels(res.Q, self.component_threshold)
        else:
            labels = None
        self._finish_common(res, lambda Y: res.P.matmat(Y), labels)
        if self.store is not None:
            with run_store.writing(self.store, "the result Q", keep="the last checkpoint is intact"):
                group.save(["Q"], self.store, "result", mirror=True)
            self._write_result({"embedding": self.embedding_, "labels": self.labels_}, res,
                               {"penalty": res.penalty, "tau": res.tau, "passes": self.passes_}, start)
            self.Q_ = blocks.from_zarr(self.store, "result/Q", dtype=group.dtype,
                                       block_size=group.layout.block_size, backend="zarr",
                                       store=self.store)
        else:
            self.Q_ = res.Q
            if group.backend == "distributed":
                # Keep a usable Q after the cluster call ends: bring it into this process.
                self.Q_ = blocks.from_array(np.asarray(res.Q), dtype=group.dtype,
                                            block_size=group.layout.block_size, check=False)
        self.layers_[-1]["Q"] = self.Q_

    def _finish_common(self, res, centered_matmat, labels):
        """History, embedding and labels: the same for every solver."""
        n = res.Q.shape[0]
        self.history_ = res.history
        self.penalty_ = res.penalty
        self.tau_ = res.tau
        self.n_iter_ = res.n_iter
        self.stop_reason_ = res.stop_reason
        self.objective_ = res.history[-1]["objective"] if res.history else float("nan")
        self.layers_.append(_layer_record(res))
        ones = np.ones(n) / np.sqrt(n)
        k = min(max(self.n_components, self.n_groups or 0), n - 2)
        with blocks.single_threaded_blas():
            w, V = top_eigenvectors(centered_matmat, n, k, deflate=ones, tol=1e-8)
        scaled = V * np.sqrt(np.clip(w, 0, None))
        self.embedding_ = scaled[:, : self.n_components]
        self.eigenvalues_ = w
        self.labels_ = labels if labels is not None else \
            kmeans_rows(scaled[:, : self.n_groups], self.n_groups, self.random_state)

    def _write_result(self, arrays, res, extra, start):
        _write_result(self.store, arrays, dict({
            "solver": self.solver, "n_iter": res.n_iter, "stop_reason": res.stop_reason,
            "objective": self.objective_, "layers": [r["n_clusters"] for r in self.layers_]}, **extra),
            res.history, time.perf_counter() - start)

    # ------------------------------------------------ Burer-Monteiro
    def _fit_bm(self, source, params_list, dtype, resume, start):
        n, store, last = source.n, self.store, len(params_list) - 1
        if source.is_data:
            # Y in row chunks beside X: on the workers when asked or when a connected
            # cluster's rows threshold is met, else in this process.
            backend = "distributed" if self.backend == "distributed" or (
                self.backend == "auto" and _get_client() is not None and n >= ROWS_DISTRIBUTED_MIN) else "local"
        elif source.matrix is not None:
            backend = source.matrix.backend
        else:
            backend = _choose_backend(self.backend, n, dtype, n_matrices=1, store=store, what="the matrix D")
        client_ctx = _client_context(backend, n) if source.matrix is None else contextlib.nullcontext(None)
        with client_ctx as client:
            D, group = self._bm_operator(source, backend, client, dtype)
            try:
                done = finished_layers(store) if resume else 0
                self.layers_ = _layer_records(store, done)
                if done:
                    D = _normalized_low_rank(run_store.read_vector(store, f"layers/{done - 1}/Y"))
                for layer in range(done, last + 1):
                    key = layer_checkpoint_key(layer)
                    ck = run_store.Checkpoints(store, key).latest() if resume and store is not None else None
                    state = None if ck is None else dict(
                        ck, Y=run_store.read_vector(store, f"{ck['prefix']}/Y"),
                        mu=run_store.read_vector(store, f"{ck['prefix']}/mu"))
                    res = burer_monteiro(D, params_list[layer], callback=self.callback, state=state,
                                         checkpoint=None if store is None else _bm_checkpointer(store, key),
                                         checkpoint_every=self.checkpoint_every or 1)  # default 1
                    if layer < last:
                        record = _layer_record(res)
                        if store is not None:
                            with run_store.writing(store, f"layer {layer}'s Y", keep="the last checkpoint is intact"):
                                _write_rows(store, f"layers/{layer}/Y", res.Y)
                                run_store.write_json(store, f"layers/{layer}", record)
                        record["Q"] = res.Q
                        self.layers_.append(record)
                        D = _normalized_low_rank(res.Y)                # D_{l+1} = Q_l / ||Q_l||_F
            finally:
                if group is not None and source.matrix is None:
                    group.close()
        self._finish_bm(res, start)
        self.restarts_ = 0
        self.backend_used_ = backend

    def _bm_operator(self, source, backend, client, dtype):
        """D / ||D||_F as an operator (Burer-Monteiro's normalization), and the block
        group holding D if there is one; for data, X's row chunks (here or on the
        client's workers) for both: D is their rows' normalized Gram matrix."""
        if source.is_data:
            X = source.zarr_data if source.zarr_data is not None else source.data
            chunks = blocks.RowChunks(X, client=client if backend == "distributed" else None,
                                      center=self.center)
            return chunks, chunks
        if source.matrix is not None:
            D = source.matrix
        else:
            group, _ = source.build(backend=backend, client=client if backend != "local" else None,
                                    store=self.store, dtype=dtype, block_size=self.block_size)
            D = blocks.BlockMatrix(group, "D")
        fro = D.summary()["fro"]
        if fro == 0:
            raise InputValueError("the input matrix is zero")
        return ScaledMatrix(D, fro, fro), D.group

    def _finish_bm(self, res, start):
        Q = res.Q
        self.passes_ = {"matmats": res.matmats}
        labels = component_labels(Q, self.component_threshold) if self.label_method == "components" else None
        # top_eigenvectors works on the complement of 1 (deflate=): Q itself will do.
        self._finish_common(res, Q.matmat, labels)
        self.Y_ = res.Y
        self.Q_ = Q
        self.layers_[-1]["Q"] = Q
        if self.store is not None:
            with run_store.writing(self.store, "the result Y", keep="the last checkpoint is intact"):
                _write_rows(self.store, "result/Y", res.Y)
            self._write_result({"embedding": self.embedding_, "labels": self.labels_}, res,
                               {"rank": int(res.Y.shape[1]), "lam": res.lam, "matmats": res.matmats}, start)


CGM_MAX_ITER = 2000
CGM_CHECKPOINT_EVERY = 20
BM_MAX_ITER = 1000
# Burer-Monteiro settings passed through ``solver_options`` (see BurerMonteiroParams).
BM_OPTIONS = ("sigma", "phi", "eta", "tol", "feasibility_tol", "optimizer", "memory", "inner_max_iter", "inner_tol",
              "inner_rtol", "start")
# Rows per chunk of the n x r factor Y in a store.
Y_CHUNK_ROWS = 65536


def layer_checkpoint_key(layer):
    return nomad_checkpoint_key if layer == 0 else f"{nomad_checkpoint_key}_layer{layer}"


def _has_checkpoint(store, key):
    return store is not None and run_store.Checkpoints(store, key).latest() is not None


def finished_layers(store):
    """How many inner layers of a multi-layer run in ``store`` have finished."""
    done = 0
    while store is not None and run_store.read_json(store, f"layers/{done}") is not None:
        done += 1
    return done


def _layer_record(res):
    return {"n_clusters": int(res.params.n_clusters), "n_iter": res.n_iter, "stop_reason": res.stop_reason,
            "objective": res.history[-1]["objective"] if res.history else float("nan"),
            "seconds": res.history[-1]["seconds"] if res.history else 0.0}


def _layer_records(store, done):
    return [dict(run_store.read_json(store, f"layers/{layer}"), Q=None) for layer in range(done)]


def _normalized_low_rank(Y):
    Q = LowRankGram(Y)
    return ScaledMatrix(Q, Q.fro_norm, Q.fro_norm)


def _write_rows(store, path, A):
    run_store.write_vector(store, path, A, chunks=(min(len(A), Y_CHUNK_ROWS),) + A.shape[1:])


def _bm_checkpointer(store, key):
    checkpoints = run_store.Checkpoints(store, key)

    def save(state):
        record = {"iteration": len(state["history"]), "lam": float(state["lam"]),
                  "matmats": int(state["matmats"]), "stop_reason": state["stop_reason"]}
        with checkpoints.write(record, state["history"]) as prefix:
            _write_rows(store, f"{prefix}/Y", state["Y"])
            run_store.write_vector(store, f"{prefix}/mu", state["mu"])
    return save


class _InputSource:
    """The input of a fit: data X (n x d) or a precomputed n x n matrix, validated
    before any heavy work."""

    def __init__(self, X, *, precomputed, center, normalize, keep_zarr=False, owner, dtype,
                 nonnegative=False, not_constant=False):
        self.matrix = None
        self.data = None
        self.array = None
        self.url = None
        self.zarr_data = None          # data X left in Zarr (``keep_zarr``), read chunk by chunk
        self.url_data = None
        if _is_precomputed(X):
            self.matrix = X
            self.n = X.n
            return
        # The gate: kind, dtype, shape (and for arrays in memory, content) before anything else.
        what = "X (precomputed)" if precomputed else "X"
        checked = check_data(X, owner=owner, name=what, square=precomputed, dtype=dtype if precomputed else None,
                             nonnegative=nonnegative and precomputed,
                             not_constant=not_constant and not precomputed)
        if isinstance(checked, np.ndarray):
            X = checked
        if precomputed:
            if isinstance(X, str) or hasattr(X, "__fspath__"):
                import zarr

                self.url = str(X)
                arr = zarr.open_array(store=self.url, mode="r")
                if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
                    raise InputValueError(f"precomputed Gram at {run_store.redact(self.url)!r} must be square n x n; got "
                                          f"shape {arr.shape}")
                self.n = arr.shape[0]
            else:
                A = X.compute() if hasattr(X, "dask") else X
                try:
                    A = np.asarray(A, dtype=np.float64)
                except (TypeError, ValueError) as exc:
                    raise InputTypeError(f"X must be a numeric n x n array when precomputed=True; got "
                                         f"{type(X).__name__}") from exc
                blocks.builders.check_square_symmetric(A, "X (precomputed Gram)")
                self.array = A
                self.n = A.shape[0]
            return
        if keep_zarr and (isinstance(X, str) or hasattr(X, "__fspath__")):
            import zarr

            self.url_data = str(X)
            X = zarr.open_array(store=self.url_data, mode="r")
        if keep_zarr and type(X).__module__.startswith("zarr"):
            if X.ndim != 2 or X.shape[0] < 2:
                raise InputValueError(f"X must be 2-D (n_samples, n_features) with n >= 2; got shape {X.shape}")
            self.zarr_data = X
            self.n = X.shape[0]
            return
        X = blocks.as_data_matrix(X)
        if checked is not X:                 # read from Zarr or dask just now: its content's turn
            X = check_data(X, owner=owner, not_constant=not_constant)
        self.data = X
        self._gram_scaling = (center, normalize)
        self.n = X.shape[0]

    @property
    def is_data(self):
        """Data X (in memory or in Zarr), not an n x n matrix."""
        return self.data is not None or self.zarr_data is not None

    @functools.cached_property
    def features(self):
        """The panels F with D = F F^T (NOMAD's Gram); made on first use, an n x d copy."""
        center, normalize = self._gram_scaling
        return blocks.prepare_gram_data(self.data, center=center, normalize=normalize)

    def describe(self):
        if self.matrix is not None:
            return {"kind": "block_matrix", "n": self.n}
        if self.url is not None:
            return {"kind": "gram_zarr", "url": self.url, "n": self.n}
        if self.array is not None:
            return {"kind": "gram_array", "n": self.n}
        if self.zarr_data is not None:
            return {"kind": "data_zarr", "url": self.url_data, "shape": list(self.zarr_data.shape)}
        return {"kind": "data", "shape": list(self.data.shape), "stored_as": "input/X"}

    def fingerprint(self):
        if self.data is not None:
            return hashlib.sha1(np.ascontiguousarray(self.data).tobytes()).hexdigest()[:16]
        if self.array is not None:
            return hashlib.sha1(np.ascontiguousarray(self.array).tobytes()).hexdigest()[:16]
        return json.dumps(self.describe(), sort_keys=True)

    def build(self, *, backend, client, store, dtype, block_size, device=None):
        """The block group holding D (or ready to form it from data panels)."""
        kw = dict(block_size=block_size, dtype=dtype, backend=backend,
                  client=client if backend != "local" else None, store=store, device=device)
        if self.matrix is not None:
            return self.matrix.group, None
        if self.url is not None:
            return blocks.from_zarr(self.url, **kw).group, None
        if self.array is not None:
            return blocks.from_array(self.array, check=False, **kw).group, None
        F = self.features
        if F.shape[1] <= blocks.kernels.INLINE_GRAM_MAX_FEATURES or \
                blocks.device.resolve_device(device) == "cuda":
            # NOMAD keeps D = F F^T as its factor: the passes leave D out and each matvec
            # adds F (F^T x) (nomad_cgm).  On the host that is cheaper than reading a stored
            # D only for few features (each matvec reads F twice, a pass reads D once:
            # MNIST zeros, n = 6,903, d = 784, took 50 ms per inner step factored against
            # 32 ms stored); on the GPU a stored D would be a fourth n x n matrix (20 GB
            # at n = 70,000) and forming it a GEMM per block in every pass.
            group = blocks.new_group(self.n, **kw)
            return group, blocks.DataPanels(group, F.astype(group.dtype))
        D = blocks.gram(F, center=False, normalize=False, **kw)
        return D.group, None


def _run_id(method, params, source, dtype, block_size, **extra):
    # max_iter and checkpoint_every may change on resume; the rest defines the run.
    fixed = {k: v for k, v in asdict(params).items() if k not in ("max_iter", "checkpoint_every")}
    payload = json.dumps({"method": method, "params": fixed, "input": source.fingerprint(),
                          "dtype": str(dtype), "block_size": block_size, **extra}, sort_keys=True,
                         default=str)
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def _jsonable_params(params):
    out = {}
    for k, v in params.items():
        if isinstance(v, (type, np.dtype)):
            # Before the callable test: numpy scalar types (np.float32) are callable.
            out[k] = np.dtype(v).name
        elif callable(v):
            out[k] = None
        elif isinstance(v, np.random.Generator):
            out[k] = None
        else:
            out[k] = v
    return out


def _versions():
    import dask
    import numba
    import scipy
    import zarr

    from . import __version__

    return {"dnomad": __version__, "numpy": np.__version__, "scipy": scipy.__version__,
            "dask": dask.__version__, "zarr": zarr.__version__, "numba": numba.__version__,
            "python": platform.python_version()}


class SymNMF(_Clustering, _Estimator):
    """Simplicial symmetric NMF: min 1/4 ||P - W W^T||_F^2 over W >= 0 with rows on the
    simplex, by Frank-Wolfe (Zhao & Gordon 2018), on a blocked affinity P.

    Row i of ``components_`` is point i's cluster-membership distribution.  P is the
    Gaussian affinity exp(-||x_i - x_j||^2 / bandwidth) built blockwise from X, or a given
    nonnegative symmetric matrix (``affinity="precomputed"``; symmetry and nonnegativity
    are checked, positive semidefiniteness, which the paper's analysis assumes, is not:
    that would cost an eigensolve).  One pass over P per Frank-Wolfe iteration.

    Parameters
    ----------
    n_clusters : int
        k, the number of columns of W; 2 <= k <= n.
    solver : {"fw", "pgd", "penalty"}, default "fw"
        Frank-Wolfe (Alg. 1 + 2); the paper's baselines: projected gradient with
        backtracking, or the penalty method of Zhao et al. (2015).
    step_rule : {"line_search", "paper"}, default "line_search"
        Frank-Wolfe step: the exact minimizer of f along the FW direction (a quartic,
        no extra pass), or the paper's min(gap / C, 1) with C = 2n(3n + ||P||_2) (a
        Lanczos estimate of ||P||_2 first; tiny steps: C grows as n^2).
    stop_rule : {"gap", "objective"}, default "gap"
        "gap": stop when the FW gap <= tol ||P||_F^2 (the gap is 0 exactly at KKT points,
        Thm. 1); "objective": the paper's experiments, |f_t - f_{t-1}| < objective_tol.
    tol : float, default 1e-4
        Relative FW gap, gap / ||P||_F^2, for stop_rule="gap" (Frank-Wolfe and PGD; the
        penalty method always stops by the paper's objective rule).  Measured on yeast (k = 10): 1e-4 after about 150
        iterations, 3e-5 after 1000 (Frank-Wolfe's gap falls as 1/sqrt(t) on nonconvex
        problems, Thm. 2).
    objective_tol : float, default 1e-3
        Absolute change of f (the paper's epsilon), for stop_rule="objective".
    max_iter : int, optional
        Iterations (outer ones for the penalty method); default 1000, or 50 with
        stop_rule="objective" (the paper's setting).
    affinity : {"gaussian", "precomputed"}, default "gaussian"
    bandwidth : float, default 1.0
        Of the Gaussian affinity (the paper's value).
    init : "random" or ndarray (n, k), default "random"
        Rows drawn uniformly from the simplex (seeded by ``random_state``), or a given
        feasible start (None means "random").
    random_state : int or Generator, optional
    dtype : float32 or float64, default float32
        Of P's blocks; W and the sums over P are float64.
    block_size : int, optional
    backend : {"auto", "local", "distributed", "zarr"}, default "auto"
        As for :class:`NOMAD` (one matrix, P, is stored).
    store : str, optional
        Zarr store for P (out of core), checkpoints and the results (W, labels, history);
        ``dnomad.resume(store)`` continues a run from its last checkpoint.
    overwrite : bool, default False
    checkpoint_every : int, default 50
        Iterations between checkpoints (W and M = P W: O(n k) numbers) to ``store``;
        Frank-Wolfe and projected gradient only.
    callback : callable, optional
        Called with each history row; returning True stops the run.

    Attributes
    ----------
    components_ : ndarray (n, k)
        W, rows on the simplex.
    labels_ : ndarray (n,)
        Row-wise argmax of W.
    objective_, gap_ : float
        f and the FW gap at ``components_``.
    history_ : list of dict
        A row per iteration: objective, gap, step, passes, seconds.
    n_iter_, stop_reason_, passes_, backend_used_
    step_rule_ : str
        The step rule used ("backtracking" for pgd, "L-BFGS" for penalty).
    spectral_norm_ : float or None
        ||P||_2 when the paper's step needed it.

    Notes
    -----
    Per Frank-Wolfe iteration: one pass over P (``BlockMatrix.label_sums``: the LMO's
    vertex is one-hot, so P S sums P's columns by label); O(n k^2) work on W and M = P W
    in this process; each block sends b x k partial sums.  Peak memory per worker: a few
    blocks.  P itself is n^2 / 2 entries (upper blocks).

    References
    ----------
    H. Zhao, G. Gordon. Frank-Wolfe optimization for symmetric-NMF under simplicial
    constraint. UAI 2018 (arXiv:1706.06348).
    H. Zhao, P. Poupart, Y. Zhang, M. Lysy. SoF: soft-cluster matrix factorization for
    probabilistic clustering. AAAI 2015.
    """

    AFFINITIES = ("gaussian", "precomputed")

    _checkpoints = True
    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "solver": [Options(*symnmf.METHODS)],
        "step_rule": [Options(*symnmf.STEP_RULES)], "stop_rule": [Options(*symnmf.STOP_RULES)],
        "tol": _NONNEGATIVE, "objective_tol": _NONNEGATIVE, "max_iter": _OPTIONAL_POSITIVE_INT,
        "affinity": [Options(*AFFINITIES)], "bandwidth": _POSITIVE,
        "init": [None, Options("random"), "array-like"], "dtype": ["dtype"],
        "block_size": _OPTIONAL_POSITIVE_INT, "backend": [Options(*BACKEND_CHOICES)],
        "checkpoint_every": _POSITIVE_INT, "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, solver="fw", step_rule="line_search", stop_rule="gap",
                 tol=1e-4, objective_tol=1e-3, max_iter=None, affinity="gaussian", bandwidth=1.0,
                 init="random", random_state=None, dtype=np.float32, block_size=None,
                 backend="auto", store=None, overwrite=False, checkpoint_every=50, callback=None):
        self.n_clusters = n_clusters
        self.solver = solver
        self.step_rule = step_rule
        self.stop_rule = stop_rule
        self.tol = tol
        self.objective_tol = objective_tol
        self.max_iter = max_iter
        self.affinity = affinity
        self.bandwidth = bandwidth
        self.init = init
        self.random_state = random_state
        self.dtype = dtype
        self.block_size = block_size
        self.backend = backend
        self.store = store
        self.overwrite = overwrite
        self.checkpoint_every = checkpoint_every
        self.callback = callback

    def _params(self, n):
        max_iter = self.max_iter if self.max_iter is not None else (
            50 if self.stop_rule == "objective" else 1000)
        params = symnmf.SymNMFParams(n_components=self.n_clusters, max_iter=max_iter, tol=self.tol,
                                     stop_rule=self.stop_rule, objective_tol=self.objective_tol,
                                     step_rule=self.step_rule)
        params.validate(n)
        return params

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Factor the affinity of X (n_samples, n_features), or X itself when
        ``affinity="precomputed"``.  ``resume=True`` continues the run in ``store`` from
        its last checkpoint.  Returns self."""
        start = time.perf_counter()
        dtype = blocks.check_dtype(self.dtype)
        if resume and (self.store is None or self.solver == "penalty"):
            raise InputValueError("resume=True needs the run's store and solver 'fw' or 'pgd'")
        if self.affinity == "precomputed":
            source = _InputSource(X, precomputed=True, center=False, normalize=False, owner="SymNMF",
                                  dtype=dtype, nonnegative=True)
        else:
            if _is_precomputed(X):
                raise InputValueError("X is a BlockMatrix: pass affinity='precomputed' to factor it")
            source = _InputSource(X, precomputed=False, center=False, normalize=False, owner="SymNMF",
                                  dtype=dtype)
        n = source.n
        params = self._params(n)
        W0 = self._start(n)
        backend = source.matrix.backend if source.matrix is not None else \
            _choose_backend(self.backend, n, dtype, n_matrices=1, store=self.store,
                            what="the affinity P")
        save = None
        if self.store is not None:
            # The start (init, random_state) is not part of the run's identity: a resumed
            # run continues from its checkpoint, whatever start it was given.
            run_id = _run_id("symnmf", params, source, dtype, self.block_size, solver=self.solver,
                             affinity=self.affinity, bandwidth=self.bandwidth)
            self._claim_store(run_id, resume)
            if resume and self._load_finished(params.max_iter):
                return self
            if not resume:
                _write_run_marker(self.store, "symnmf", run_id, self, source)
            save = _symnmf_checkpointer(self.store)

        def attempt(resume):
            state = _load_symnmf_checkpoint(self.store) if resume else None
            res = self._solve(source, backend, dtype, params, W0, state, save)
            self._finish(res, backend, dtype, start)

        self.restarts_ = _with_restarts(attempt, store=self.store, resume=resume,
                                        checkpoint_key=SYMNMF_CHECKPOINT_KEY,
                                        rebuildable=source.matrix is None)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def _solve(self, source, backend, dtype, params, W0, state, save):
        n = source.n
        with _client_context(backend, n) as client:
            kw = dict(block_size=self.block_size, dtype=dtype, backend=backend,
                      client=client if backend != "local" else None, store=self.store)
            if source.data is not None:
                P = blocks.gaussian_affinity(source.data, self.bandwidth, name="P", **kw)
            elif source.matrix is not None:
                P = source.matrix
            else:
                group, _ = source.build(**kw)
                P = blocks.BlockMatrix(group, "D")
            try:
                summ = P.summary()
                if summ["min"] < 0:
                    raise InputValueError(f"the affinity must be nonnegative; its smallest entry is "
                                          f"{summ['min']:.3g}")
                with blocks.single_threaded_blas():
                    res = symnmf.solve(self.solver, P, W0, params, fro2=summ["fro"] ** 2,
                                       callback=self.callback, resume=state, checkpoint=save,
                                       checkpoint_every=self.checkpoint_every)
            finally:
                if source.matrix is None:
                    P.group.close()
        return res

    def _start(self, n):
        k = self.n_clusters
        if self.init is None or isinstance(self.init, str):
            if self.init not in (None, "random"):
                raise InputValueError(f'init must be "random" or an (n, k) array; got {self.init!r}')
            rng = self.random_state if isinstance(self.random_state, np.random.Generator) else \
                np.random.default_rng(self.random_state)
            return symnmf.random_simplex_rows(n, k, rng)
        W0 = np.asarray(self.init, dtype=np.float64)
        if W0.shape != (n, k) or not np.isfinite(W0).all() or W0.min() < 0 or \
                np.abs(W0.sum(axis=1) - 1).max() > 1e-9:
            raise InputValueError(f"init must be an ({n}, {k}) array, nonnegative, rows summing to 1; "
                                  f"got shape {W0.shape}")
        return W0.copy()

    def _finish(self, res, backend, dtype, start):
        self.components_ = res.W
        self.labels_ = np.argmax(res.W, axis=1)
        self.objective_ = res.objective
        self.gap_ = res.gap
        self.history_ = res.history
        self.n_iter_ = res.n_iter
        self.stop_reason_ = res.stop_reason
        self.passes_ = res.passes
        self.step_rule_ = res.step_rule
        self.spectral_norm_ = res.extra.get("spectral_norm")
        self.backend_used_ = backend
        if self.store is not None:
            _write_result(self.store, {"W": res.W, "labels": self.labels_}, {
                "n_iter": res.n_iter, "stop_reason": res.stop_reason, "objective": res.objective,
                "gap": res.gap, "passes": res.passes, "solver": res.method,
                "step_rule": res.step_rule, "dtype": np.dtype(dtype).name},
                res.history, time.perf_counter() - start)


class Hottopixx(_Estimator):
    """Separable NMF by HOTTOPIXX (Bittorf, Recht, Re, Tropp 2012): the r "hott" rows of a
    nonnegative f x n matrix X whose convex hull holds the other rows, and F >= 0 with
    X ~ F X_hott.

    Rows of X are scaled to sum 1 first, as the paper assumes (an all-zero row cannot be
    and is refused); ``components_`` and ``W_`` factor that scaled X, and
    ``row_sums_`` undo it: X ~ diag(row_sums_) components_ W_.  A factorization
    localizing matrix C (f x f) is found by incremental subgradient epochs on the LP's
    Lagrangian (Alg. 4), each a block-nested loop in which row blocks of C stream X's
    columns (dense, sparse by nonzeros, or out of core from Zarr), then projected onto
    Phi_0 by column squishing (Alg. 5).

    Parameters
    ----------
    rank : int
        r, the number of hott rows; 1 <= r <= f.
    n_epochs : int or "fast", default 50
        The paper's runs use 50; "fast" is its 4-epoch setting.
    primal_step, dual_step : float, default 0.1, 0.01
        s_p and s_d of Alg. 4 (the paper's values).
    projection : {"squish", "clip"}, default "squish"
        The exact projection onto Phi_0, or Sec. 4's clipping (when the factorization is
        known to be unique).
    selection : {"clusters", "diagonal"}, default "clusters"
        How hott rows are read off C: the r largest diagonal entries (Alg. 4 line 11), or
        one per group of rows that express each other in C, the group's most extreme
        member (see :func:`dnomad.solvers.hottopixx.hottopixx`; needed for exact recovery
        with duplicated topics after 50 epochs).
    cluster_threshold : float, default 0.8
    fit_components : {"subgradient", "lp"}, default "subgradient"
        F by ``clean_epochs`` incremental-subgradient epochs, or exactly by one LP per
        row (HiGHS; small f and n).
    clean_epochs, clean_step, clean_decay : default 10, 1.0, 0.6
        The cleaning epochs' step starts at ``clean_step`` and shrinks by ``clean_decay``
        per epoch (the paper ran 2 epochs at a constant step, whose noise floor left
        errors of 0.15-0.45 where the LP's is 0).
    row_block : int, optional
        Rows of C per task; default about 1 MB of C (``blocks.default_row_block``).
    cost_scale : float, default 0.1
        The cost p has distinct entries in [0, cost_scale).
    error_every : int, default 1
        Epochs between the history's ||X - C X||_{inf,1} (one more pass over X each).
    random_state : int or Generator, optional
        Seeds p and the column orders.
    store : str, optional
        Zarr store: a dask/Zarr X too large for memory is staged there by columns
        (``input/Xt``); results (hott rows, F, diag C, history) are written there.
    overwrite : bool, default False
    callback : callable, optional
        Called with each epoch's history row; returning True stops.

    Attributes
    ----------
    hott_rows_ : ndarray (r,)
    components_ : ndarray (f, r)
        F.
    W_ : ndarray (r, n)
        X_hott (rows scaled to sum 1).
    diag_ : ndarray (f,)
        Diagonal of C.
    row_sums_ : ndarray (f,)
    history_ : list of dict
        Per epoch: epoch, trace (Tr C), beta, error (||X - C X||_{inf,1}), seconds.
    error_ : float
        ||X - F W||_{inf,1} on the scaled X.
    n_epochs_, fit_seconds_

    References
    ----------
    V. Bittorf, B. Recht, C. Re, J. A. Tropp. Factoring nonnegative matrices with linear
    programs. NIPS 2012 (arXiv:1206.1270).
    """

    _solver_params = ("primal_step", "dual_step", "projection", "selection", "cluster_threshold",
                      "fit_components", "clean_epochs", "clean_step", "clean_decay", "row_block",
                      "cost_scale", "error_every")

    _parameter_constraints = {
        "rank": _POSITIVE_INT, "n_epochs": [Options("fast")] + _POSITIVE_INT, "primal_step": _POSITIVE,
        "dual_step": _POSITIVE, "projection": [Options(*hott_solver.PROJECTIONS)],
        "selection": [Options(*hott_solver.SELECTIONS)],
        "cluster_threshold": [Interval(numbers.Real, 0, 1, closed="right")],
        "fit_components": [Options(*hott_solver.COMPONENT_FITS)],
        "clean_epochs": [Interval(numbers.Integral, 0, None)], "clean_step": _POSITIVE,
        "clean_decay": [Interval(numbers.Real, 0, 1, closed="right")], "row_block": _OPTIONAL_POSITIVE_INT,
        "cost_scale": _POSITIVE, "error_every": _POSITIVE_INT, "callback": [None, "callback"],
        **_RUN_CONSTRAINTS}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True        # X >= 0: a nonnegative factorization
        return tags

    def __init__(self, rank=10, *, n_epochs=50, primal_step=0.1, dual_step=0.01, projection="squish",
                 selection="clusters", cluster_threshold=0.8, fit_components="subgradient",
                 clean_epochs=10, clean_step=1.0, clean_decay=0.6, row_block=None, cost_scale=0.1,
                 error_every=1, random_state=None, store=None,
                 overwrite=False, callback=None):
        self.rank = rank
        self.n_epochs = n_epochs
        self.primal_step = primal_step
        self.dual_step = dual_step
        self.projection = projection
        self.selection = selection
        self.cluster_threshold = cluster_threshold
        self.fit_components = fit_components
        self.clean_epochs = clean_epochs
        self.clean_step = clean_step
        self.clean_decay = clean_decay
        self.row_block = row_block
        self.cost_scale = cost_scale
        self.error_every = error_every
        self.random_state = random_state
        self.store = store
        self.overwrite = overwrite
        self.callback = callback

    def _params(self):
        epochs = hott_solver.FAST_EPOCHS if self.n_epochs == "fast" else self.n_epochs
        return hott_solver.HottopixxParams(rank=self.rank, n_epochs=epochs,
                                           **{k: getattr(self, k) for k in self._solver_params})

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Find the hott rows of X (n_features, n_samples): NumPy, scipy.sparse, dask, a
        Zarr array or a Zarr path.  Returns self."""
        if resume:
            raise InputValueError("Hottopixx has no checkpoints to resume from: fit again")
        start = time.perf_counter()
        params = self._params()
        # The gate: in memory, X is checked whole here (nonnegative, finite, no zero row);
        # a dask or Zarr X by its metadata here and by content as it is read.
        X = check_data(X, owner="Hottopixx", sparse=True, nonnegative=True, no_zero_rows=True, min_rows=1)
        params.validate(int(blocks.input_metadata(X)["shape"][0]))     # rank against f, before reading X
        if self.store is not None:
            _start_run_without_checkpoints(self, "hottopixx", asdict(params), X)
        data = blocks.feature_columns(X, store=self.store)
        client = _get_client() if data.kind == "zarr" else None
        res = hott_solver.hottopixx(data, params, random_state=self.random_state,
                                    callback=self.callback, client=client)
        self.hott_rows_ = res.hott_rows
        self.components_ = res.F
        self.W_ = data.rows(res.hott_rows, client=client)
        self.diag_ = res.diag
        self.row_sums_ = data.row_sums
        self.history_ = res.history
        self.error_ = res.error
        self.n_epochs_ = len(res.history)
        self.fit_seconds_ = time.perf_counter() - start
        if self.store is not None:
            _write_result(self.store, {"hott_rows": self.hott_rows_, "F": self.components_,
                                       "diag": self.diag_},
                          {"error": res.error, "hott_rows": res.hott_rows.tolist(),
                           "n_epochs": self.n_epochs_}, res.history, self.fit_seconds_)
        return self

    def fit_transform(self, X, y=None):
        return self.fit(X).components_


# Rows from which "auto" runs the row-chunk solvers on a connected cluster's workers.
ROWS_DISTRIBUTED_MIN = 200_000


class _RowChunkEstimator(_Clustering, _Estimator):
    """What the K-means estimators on row chunks of X share: validation before X is
    read, the row chunks (here or on the client's workers), labels and the result in
    ``store``."""

    _method = None

    def _row_chunks(self, X, client):
        return blocks.RowChunks(X, chunk_rows=self.chunk_rows, client=client)

    def _client_context(self, X):
        n = getattr(X, "shape", (0,))[0] if not isinstance(X, str) else None
        if self.backend == "distributed":
            return _cluster_client()
        if self.backend == "auto" and _get_client() is not None and (n is None or n >= ROWS_DISTRIBUTED_MIN):
            return _cluster_client()
        return contextlib.nullcontext(None)

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Cluster the rows of X (n_samples, n_features): NumPy, a Zarr array or a Zarr
        path (read by row chunks).  Returns self."""
        if resume:
            raise InputValueError(f"{type(self).__name__} keeps no checkpoints to resume from: fit again")
        self._check()
        start = time.perf_counter()
        X = check_data(X, owner=type(self).__name__, not_constant=True)
        if self.store is not None:
            _start_run_without_checkpoints(self, self._method, _jsonable_params(self.get_params()), X)
        with self._client_context(X) as client, blocks.single_threaded_blas():
            data = self._row_chunks(X, client)
            try:
                self._solve(data)
            finally:
                data.close()
        self.fit_seconds_ = time.perf_counter() - start
        if self.store is not None:
            _write_result(self.store, {"labels": self.labels_, "U": self.U_}, self._summary(),
                          self.history_, self.fit_seconds_)
        return self

    def membership(self):
        """Z = U U^T (n x n): the relaxed membership matrix, for small n only."""
        n = self.U_.shape[0]
        if n > 20000:
            raise InputValueError(f"membership() forms an n x n matrix; n = {n} is too large (at most "
                                  f"20000): use labels_ or U_")
        return self.U_ @ self.U_.T


def _row_callback(callback):
    """An estimator's ``callback(row)`` as the solvers' ``callback(row, current_u)``."""
    return None if callback is None else (lambda row, current_u: callback(row))


class RiemannianKMeans(_RowChunkEstimator):
    """K-means by the cubic-regularized Riemannian Newton method of Xu, Hou, Chen and
    Zhang: the nonnegative low-rank K-means SDP max <X X^T, U U^T> over U U^T 1 = 1,
    Tr(U U^T) = K, U >= 0 (U n x r), written on the manifold V x Orth(r) with a log
    barrier mu, solved to a second-order critical point; O(n r^3 (r + d)^2) per Newton
    step (the Schur sums as dense GEMMs), every quantity a sum over row chunks of X
    (NumPy or Zarr, here or on a cluster's workers).

    Parameters
    ----------
    n_clusters : int, >= 2
    rank : int, optional
        r > n_clusters; default n_clusters + 1 (the paper's Fig. 6: results do not
        depend on r).
    mu : "auto", float or decreasing sequence of floats, default "auto"
        The barrier weight: App. F's heuristic (the barrier at 20 times the data term at
        the interior point), a value, or continuation stages (each warm-started).
    n_init : int, default 1
        Random strictly feasible starts; the lowest final cost wins.
    max_iter, tol : default 1000, 1e-6
        Newton iterations per stage; the Riemannian gradient norm to stop at.
    lam, kappa_plus, kappa_minus, max_inner : default 1.0, 1.3, 1.1, 60
        Alg. 1's regularization and its adaptation.
    lam_rule : {"adaptive", "bisection"}, default "adaptive"
        Alg. 1's lam (divided by kappa_minus on a taken step, multiplied by kappa_plus on
        a rejected one), or Sec. 3's bisection for 2 lam = L ||p(lam)|| with the cubic
        constant L (from ``cubic_L``, default 1.0) adapted instead (about ten Newton solves
        per iteration).
    boundary_fraction : float or None, default 0.95
        Steps cut to this fraction of the way to U = 0 (None: full steps, as printed).
    second_order : bool, default True
        Stop only at points whose Hessian has no eigenvalue below -sqrt(tol); step along
        negative curvature otherwise.
    min_eigenvalue : {None, "final", "every"}
        Report the smallest Riemannian Hessian eigenvalue at the end / in every history
        row (shift-invert Lanczos: tens of passes each).
    chunk_rows : int, optional
        Rows per chunk (default 8192 for NumPy X, the Zarr chunking for Zarr X).
    backend : {"auto", "local", "distributed"}
        "auto": the connected cluster's workers from 200,000 rows, else this process.
    random_state, store, overwrite, callback
        ``store``: labels, U, history and a summary are written there (no checkpoints:
        a run is minutes).  ``callback(row)`` returning True stops a stage.

    Attributes
    ----------
    labels_ : ndarray (n,)
        From the rows of U (Lemma 1).
    U_ : ndarray (n, r)
        U = [1/sqrt(n) 1, V] Q > 0; ``membership()`` gives Z = U U^T for small n.
    V_, Q_, mu_, cost_, grad_norm_, min_eigenvalue_, stop_reason_, n_iter_, history_,
    costs_ (every start's final cost), curvature_steps_, passes_ (over X), fit_seconds_

    References
    ----------
    Xu, Hou, Chen, Zhang. Efficient K-means clustering via a cubic-regularized
    Riemannian Newton method (the paper in ``../shared/papers/riemannian-newton-kmeans.md``).
    """

    _method = "riemannian-kmeans"

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "rank": _OPTIONAL_POSITIVE_INT,
        "mu": [Options("auto"), "array-like"] + _POSITIVE, "n_init": _POSITIVE_INT,
        "max_iter": _POSITIVE_INT, "tol": _POSITIVE, "lam": _POSITIVE,
        "kappa_plus": [Interval(numbers.Real, 1, None, closed="neither")],
        "kappa_minus": [Interval(numbers.Real, 1, None, closed="neither")], "max_inner": _POSITIVE_INT,
        "lam_rule": [Options("adaptive", "bisection")], "cubic_L": _POSITIVE,
        "boundary_fraction": [None, Interval(numbers.Real, 0, 1, closed="neither")],
        "second_order": ["boolean"], "min_eigenvalue": [None, Options("final", "every")],
        "chunk_rows": _OPTIONAL_POSITIVE_INT, "backend": [Options("auto", "local", "distributed")],
        "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, rank=None, mu="auto", n_init=1, max_iter=1000, tol=1e-6, lam=1.0,
                 kappa_plus=1.3, kappa_minus=1.1, max_inner=60, lam_rule="adaptive", cubic_L=1.0,
                 boundary_fraction=0.95, second_order=True, min_eigenvalue=None, chunk_rows=None,
                 backend="auto", random_state=None, store=None, overwrite=False, callback=None):
        self.n_clusters = n_clusters
        self.rank = rank
        self.mu = mu
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.lam = lam
        self.kappa_plus = kappa_plus
        self.kappa_minus = kappa_minus
        self.max_inner = max_inner
        self.lam_rule = lam_rule
        self.cubic_L = cubic_L
        self.boundary_fraction = boundary_fraction
        self.second_order = second_order
        self.min_eigenvalue = min_eigenvalue
        self.chunk_rows = chunk_rows
        self.backend = backend
        self.random_state = random_state
        self.store = store
        self.overwrite = overwrite
        self.callback = callback

    def _check(self):
        """What ``_parameter_constraints`` cannot say: rank against n_clusters, mu's stages."""
        from .solvers._checks import check_ints

        if self.rank is not None:
            check_ints(self, ["rank"], minimum=self.n_clusters + 1)
        if not (isinstance(self.mu, str) and self.mu == "auto"):
            rk.mu_schedule(self.mu, None, None)                   # checked before X is read

    def _solve(self, data):
        res = rk.riemannian_kmeans(
            data, self.n_clusters, rank=self.rank, mu=self.mu, n_init=self.n_init,
            random_state=self.random_state, lam=self.lam, kappa_plus=self.kappa_plus,
            kappa_minus=self.kappa_minus, max_iter=self.max_iter, max_inner=self.max_inner, gtol=self.tol,
            lam_rule=self.lam_rule, cubic_L=self.cubic_L,
            boundary_fraction=self.boundary_fraction, second_order=self.second_order,
            min_eigenvalue=self.min_eigenvalue, callback=_row_callback(self.callback))
        self.labels_ = res.labels
        self.U_, self.V_, self.Q_ = res.U, res.V, res.Q
        self.mu_, self.cost_, self.grad_norm_ = res.mu, res.cost, res.grad_norm
        self.min_eigenvalue_ = res.min_eigenvalue
        self.stop_reason_, self.n_iter_, self.history_ = res.stop_reason, res.n_iter, res.history
        self.costs_, self.curvature_steps_, self.passes_ = res.costs, res.curvature_steps, res.passes

    def _summary(self):
        return {"cost": self.cost_, "mu": self.mu_, "grad_norm": self.grad_norm_,
                "min_eigenvalue": self.min_eigenvalue_, "stop_reason": self.stop_reason_,
                "n_iter": self.n_iter_, "passes": self.passes_}


class NLR(_RowChunkEstimator):
    """K-means by NLR (Zhuang, Chen, Yang, Zhang, ICLR 2024): the same nonnegative
    low-rank K-means SDP with U >= 0 (n x 2K), by projected gradient steps on the
    augmented Lagrangian of U U^T 1 = 1 (see :mod:`dnomad.solvers.nlr`); one pass over
    the row chunks of X per iteration.  The baseline of :class:`RiemannianKMeans`.

    Parameters
    ----------
    n_clusters : int, >= 2
    rank : int, optional
        Default 2 * n_clusters (the authors').
    beta : float, default 10
        The augmented Lagrangian's penalty (the authors').
    step : float, optional
        alpha; default 1 / (2 (||X||_2^2 + beta n)).
    tol, dual_tol : default 1e-6, 1e-3
        Stop when the relative change of U and ||U U^T 1 - 1|| / sqrt(n) are below tol;
        take the dual step when the relative change is below dual_tol.
    max_iter : int, default 100000
    n_init : int, default 1
        Random starts (|N(0, 1)| entries); the largest final <X X^T, U U^T> wins.
    record_every : int, default 10
        Iterations between history rows.
    chunk_rows, backend, random_state, store, overwrite, callback
        As :class:`RiemannianKMeans`.

    Attributes
    ----------
    labels_, U_, objective_ (<X X^T, U U^T>, X centred), infeasibility_, stop_reason_,
    n_iter_, dual_steps_, history_, passes_, fit_seconds_
    """

    _method = "nlr"

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "rank": _OPTIONAL_POSITIVE_INT,
        "beta": _POSITIVE, "step": [None] + _POSITIVE, "tol": _POSITIVE, "dual_tol": _POSITIVE,
        "max_iter": _POSITIVE_INT, "n_init": _POSITIVE_INT, "record_every": _POSITIVE_INT,
        "chunk_rows": _OPTIONAL_POSITIVE_INT, "backend": [Options("auto", "local", "distributed")],
        "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, rank=None, beta=10.0, step=None, tol=1e-6, dual_tol=1e-3,
                 max_iter=100000, n_init=1, record_every=10, chunk_rows=None, backend="auto",
                 random_state=None, store=None, overwrite=False, callback=None):
        self.n_clusters = n_clusters
        self.rank = rank
        self.beta = beta
        self.step = step
        self.tol = tol
        self.dual_tol = dual_tol
        self.max_iter = max_iter
        self.n_init = n_init
        self.record_every = record_every
        self.chunk_rows = chunk_rows
        self.backend = backend
        self.random_state = random_state
        self.store = store
        self.overwrite = overwrite
        self.callback = callback

    def _check(self):
        """What ``_parameter_constraints`` cannot say: rank against n_clusters."""
        from .solvers._checks import check_ints

        if self.rank is not None:
            check_ints(self, ["rank"], minimum=self.n_clusters)

    def _solve(self, data):
        rng = np.random.default_rng(self.random_state)
        best = None
        for init in range(self.n_init):
            res = nlr_solver.nlr(data, self.n_clusters, rank=self.rank, beta=self.beta, step=self.step,
                                 tol=self.tol, dual_tol=self.dual_tol, max_iter=self.max_iter,
                                 record_every=self.record_every, random_state=rng,
                                 callback=_row_callback(self.callback))
            res.history = [dict(row, init=init) for row in res.history]
            res.objective = float(-res.history[-1]["loss"])
            if best is None or res.objective > best.objective:
                best = res
        self.U_ = best.U
        self.labels_ = rk.labels_from_u(best.U, self.n_clusters)
        self.objective_ = best.objective
        self.infeasibility_ = best.history[-1]["infeasibility"]
        self.stop_reason_, self.n_iter_, self.dual_steps_ = best.stop_reason, best.n_iter, best.dual_steps
        self.history_, self.passes_ = best.history, best.passes

    def _summary(self):
        return {"objective": self.objective_, "infeasibility": self.infeasibility_,
                "stop_reason": self.stop_reason_, "n_iter": self.n_iter_, "passes": self.passes_}


class BregmanClustering(_Clustering, _Estimator):
    """Hard clustering under a Bregman divergence by the convex relaxations of Cheng,
    Zhang and Schuurmans over normalized equivalence matrices M, rounded by spectral
    clustering and re-optimized by Bregman hard clustering (Sec. 6).

    Parameters
    ----------
    n_clusters : int, >= 2
    model : {"cond-jc", "cond", "disc", "joint"}, default "cond-jc"
        "cond-jc": min D_F(X, M X) over M in M1 by ADMM (Sec. 3.1; jointly convex
        divergences: Euclidean, KL, logistic); "cond": min D_F*(T, f(X)) + alpha/2 Xi^2(T)
        over T = M A, M in M2 (Sec. 3.2; divergences whose conjugate is finite at 0);
        "disc": the discriminative model (30) (softmax loss, gamma); "joint": the joint
        model (34) with a learned cluster prior (alpha, beta), re-optimized with the prior.
        The last three by generalized conditional gradient.
    divergence : {"euclidean", "logistic", "kl", "itakura-saito"} or BregmanDivergence
        The divergence of the model and of the re-optimization ("disc" uses it only to
        re-optimize; the paper uses the logistic one there).
    alpha, beta, gamma : float
        The regularizers (defaults: the paper's 1e-5, 1e-5 and 1e-6).  The discriminative
        loss scales V by 1/t, so gamma's effect scales as gamma t^3.
    max_iter, tol : optional
        The relaxation's iterations and tolerance (defaults: 1000 and 1e-5 for ADMM;
        300 ("cond", with App. C's local refinement after every step), 1000 ("joint")
        or 100 ("disc") and 1e-6 for conditional gradient).
    rounding_repeats : int, default 10
        Spectral-clustering roundings (k-means seeds), each re-optimized; the lowest hard
        objective wins.
    chunk_rows : int, optional
        "cond": rows per chunk when X is a Zarr array or path (T is kept in row chunks
        next to X, out of core; default the Zarr chunking).  "cond-jc": rows per chunk
        of M and Lambda (t x t; default one chunk per thread).
    store : str, optional
        A Zarr path or URL for the result (labels, the relaxation's history, a summary);
        the run keeps no checkpoints (relaxations take seconds to minutes).
    overwrite : bool, default False
    random_state

    Attributes
    ----------
    labels_ : ndarray (t,)
    objective_ : float
        The hard objective of labels_ after re-optimization: D_F(X, Y Gamma), and for
        "joint" the negative log joint likelihood -1'Y log q + D_F(X, Y Gamma).
    rounded_objectives_, reoptimized_objectives_ : list of float
        Per rounding, before and after re-optimization.
    rounded_labels_ : list of ndarray
        The roundings (before re-optimization).
    M_ : (Phi, sigma), M = Phi diag(sigma) Phi' + 1 1'/t (for "cond-jc": Z, the
        projection of ADMM's M onto M2, which equals M at convergence)
    posteriors_ : ndarray (t, d), "joint" only
        p(j | x_i) proportional to q_j exp(-D_F(x_i, mu_j)) at the final labels.
    relaxation_objective_, history_, stop_reason_, n_iter_, fit_seconds_
    """

    MODELS = ("cond-jc", "cond", "disc", "joint")

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "model": [Options(*MODELS)],
        "divergence": [Options(*DIVERGENCES), BregmanDivergence],
        "alpha": _POSITIVE, "beta": _POSITIVE, "gamma": _POSITIVE, "max_iter": _OPTIONAL_POSITIVE_INT,
        "tol": [None] + _POSITIVE, "rounding_repeats": _POSITIVE_INT, "chunk_rows": _OPTIONAL_POSITIVE_INT,
        **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=2, *, model="cond-jc", divergence="euclidean", alpha=1e-5, beta=1e-5,
                 gamma=1e-6, max_iter=None, tol=None, rounding_repeats=10, chunk_rows=None, store=None,
                 overwrite=False, random_state=None):
        self.n_clusters = n_clusters
        self.model = model
        self.divergence = divergence
        self.alpha = alpha
        self.beta = beta
        self.gamma = gamma
        self.max_iter = max_iter
        self.tol = tol
        self.rounding_repeats = rounding_repeats
        self.chunk_rows = chunk_rows
        self.store = store
        self.overwrite = overwrite
        self.random_state = random_state

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Cluster the rows of X (points x features, in the divergence's domain; NumPy,
        or for model "cond" also a Zarr array or path read by row chunks).  Returns self."""
        from .solvers import bregman

        if resume:
            raise InputValueError("BregmanClustering keeps no checkpoints to resume from: fit again")
        start = time.perf_counter()
        div = bregman.get_divergence(self.divergence)
        d = self.n_clusters
        rng = np.random.default_rng(self.random_state)
        chunked = isinstance(X, str) or hasattr(X, "__fspath__") or type(X).__module__.startswith("zarr")
        if chunked and self.model in ("disc", "joint"):
            raise InputValueError(f"X from Zarr is read by row chunks for model='cond' and 'cond-jc' only; "
                                  f"model={self.model!r} needs X in memory (np.asarray(zarr_array[:]))")
        X = check_data(X, owner="BregmanClustering", min_rows=d, not_constant=True)
        if isinstance(X, np.ndarray):
            div.check_domain(X)
        if self.store is not None:
            _start_run_without_checkpoints(self, "bregman", _jsonable_params(self.get_params()), X)
        if chunked and self.model == "cond-jc":
            # cvxCondJC's state is t x t: X (t x n) is read whole, M and Lambda are chunked
            with blocks.RowChunks(X, center=False) as whole:
                X, chunked = whole.gather(), False
        max_iter = self.max_iter if self.max_iter is not None else \
            {"cond-jc": 1000, "cond": 300, "disc": 100}.get(self.model, 1000)
        tol = self.tol if self.tol is not None else (1e-5 if self.model == "cond-jc" else 1e-6)
        chunks = None
        if chunked:
            # X stays in Zarr: the relaxation, the rounding's objectives and the
            # re-optimization all read it by row chunks
            chunks = blocks.RowChunks(X, chunk_rows=self.chunk_rows, center=False)
            try:
                with blocks.single_threaded_blas():
                    res = bregman.cond(chunks, d, div, alpha=self.alpha, max_iter=max_iter, tol=tol)
            except BaseException:
                chunks.close()
                raise
            X = chunks
        else:
            X = np.asarray(X, dtype=np.float64)
            if X.ndim != 2:
                raise InputValueError(f"X must be a 2-D array (points x features); got shape {X.shape}")
            div.check_domain(X)
            if self.model == "cond-jc":
                with blocks.single_threaded_blas():
                    res = bregman.cond_jc(X, d, div, max_iter=max_iter, tol=tol, chunk_rows=self.chunk_rows)
            elif self.model == "cond":
                res = bregman.cond(X, d, div, alpha=self.alpha, max_iter=max_iter, tol=tol)
            elif self.model == "disc":
                res = bregman.disc(X, d, gamma=self.gamma, max_iter=max_iter, tol=tol)
            else:
                res = bregman.joint(X, d, div, alpha=self.alpha, beta=self.beta, max_iter=max_iter, tol=tol)
        # SC rounding from the top d eigenvectors of M (of Z, its projection onto M2, for
        # "cond-jc"), which every model keeps factored
        self.M_ = (res.Phi, res.sigma)
        E = res.membership_eigenvectors(d)
        E = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-300)
        roundings = [kmeans_rows(E, d, rng, n_init=1) for _ in range(self.rounding_repeats)]
        joint = self.model == "joint"
        self.rounded_labels_, self.rounded_objectives_, self.reoptimized_objectives_ = roundings, [], []
        best = None
        try:
            for labels in roundings:
                self.rounded_objectives_.append(bregman.hard_objective(X, labels, d, div, joint=joint))
                final, objective, _ = bregman.hard_clustering(X, d, div, labels, joint=joint)
                self.reoptimized_objectives_.append(objective)
                if best is None or objective < best[1]:
                    best = (final, objective)
        finally:
            if chunks is not None:
                chunks.close()
        self.labels_, self.objective_ = best
        if joint:
            self.posteriors_ = bregman.cluster_posteriors(X, self.labels_, d, div)
        self.relaxation_objective_ = res.objective
        self.history_, self.stop_reason_, self.n_iter_ = res.history, res.stop_reason, res.n_iter
        self.fit_seconds_ = time.perf_counter() - start
        if self.store is not None:
            arrays = {"labels": self.labels_}
            if joint:
                arrays["posteriors"] = self.posteriors_
            _write_result(self.store, arrays, {
                "model": self.model, "divergence": div.name, "objective": self.objective_,
                "relaxation_objective": self.relaxation_objective_, "stop_reason": self.stop_reason_,
                "n_iter": self.n_iter_, "reoptimized_objectives": self.reoptimized_objectives_},
                self.history_, self.fit_seconds_)
        return self


def _start_run_without_checkpoints(est, method, id_params, X):
    """Claim ``est.store`` for a run that keeps no checkpoints: its id (from ``id_params``
    and the input) checked against the store's, then the run marker."""
    run_id = hashlib.sha1(json.dumps({"method": method, "params": id_params, "input": _describe_matrix(X)},
                                     sort_keys=True, default=str).encode()).hexdigest()[:16]
    est._claim_store(run_id)
    run_store.write_json(est.store, run_store.RUN_MARKER, {
        "method": method, "run_id": run_id,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "estimator_params": _jsonable_params(est.get_params()),
        "input": _describe_matrix(X), "versions": _versions(), "host": platform.node()})


def _describe_matrix(X):
    if isinstance(X, str) or hasattr(X, "__fspath__"):
        return {"kind": "zarr_path", "url": str(X)}
    return {"kind": type(X).__name__, "shape": list(getattr(X, "shape", ()))}


def _write_run_marker(store, method, run_id, est, source):
    """What a later ``dnomad.resume(store)`` needs: method, parameters, the input."""
    params = _jsonable_params(est.get_params())
    if isinstance(params.get("init"), (list, np.ndarray)):
        params["init"] = None          # a resumed run starts from its checkpoint, not from init
    run_store.write_json(store, run_store.RUN_MARKER, {
        "method": method, "run_id": run_id,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "estimator_params": params, "input": source.describe(), "versions": _versions(),
        "host": platform.node()})
    if source.data is not None:
        run_store.write_vector(store, "input/X", source.data)


SYMNMF_CHECKPOINT_KEY = "symnmf_checkpoint"


def _symnmf_checkpointer(store):
    checkpoints = run_store.Checkpoints(store, SYMNMF_CHECKPOINT_KEY)

    def save(state):
        record = {k: v for k, v in state.items() if k not in ("W", "M", "history")}
        with checkpoints.write(record, state["history"]) as prefix:
            run_store.write_vector(store, f"{prefix}/W", state["W"])
            run_store.write_vector(store, f"{prefix}/M", state["M"])
    return save


def _load_symnmf_checkpoint(store):
    ck = run_store.Checkpoints(store, SYMNMF_CHECKPOINT_KEY).latest()
    if ck is None:
        raise InputValueError(f"store {run_store.redact(str(store))!r} has no SymNMF checkpoint to resume from")
    return dict(ck, W=run_store.read_vector(store, f"{ck['prefix']}/W"),
                M=run_store.read_vector(store, f"{ck['prefix']}/M"))


def _write_result(store, arrays, summary, history, seconds):
    """A finished run's arrays, history table and summary (written last: ``dnomad info``
    reports a run finished only once everything else is in place)."""
    with run_store.writing(store, "the result", keep="the last checkpoint is intact"):
        for path, value in arrays.items():
            run_store.write_vector(store, f"result/{path}", value)
        run_store.write_table(store, "result/history", history)
        run_store.write_json(store, "result", dict(
            summary, fit_seconds=seconds,
            finished=datetime.datetime.now(datetime.timezone.utc).isoformat()))


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
