"""The K-means SDP estimators on row chunks of X: Riemannian Newton and NLR."""
from __future__ import annotations

import math
import numbers
import time

import numpy as np

from .. import blocks
from .._checks import check_ints
from ..base import (_OPTIONAL_POSITIVE_INT, _POSITIVE, _POSITIVE_INT, _RUN_CONSTRAINTS, _Clustering, _Estimator,
                    _gated)
from ..blocks import memory, runs
from ..blocks import store as run_store
from ..blocks.cluster import choose_rows_backend, client_context
from ..blocks.rows import chunk_rows_for
from ..errors import InputValueError
from ..rounding import factor_labels
from ..validation import Interval, Options, check_data
from . import nlr as nlr_solver
from . import riemannian as rk


def _labels_in_client(n, K):
    """The client's share of a row-chunk K-means fit: the labels gathered (int64, with
    their copies) and the k-means++ seeding's sample."""
    from ..rounding import SEED_SAMPLE_ROWS

    return {"the labels (int64, gathered)": 4 * 8 * n,
            "k-means++ on a sample of the rows": 4 * 8 * min(n, SEED_SAMPLE_ROWS) * K}


class _RowChunkEstimator(_Clustering, _Estimator):
    """What the K-means estimators on row chunks of X share: validation before X is
    read, the row chunks (here or on the client's workers), labels and the result in
    ``store``."""

    _method = None
    _checkpoints = True

    def _check_sizes(self, n, d):
        """The parameters against X's n and d, before any pass."""

    def _row_chunks(self, X, client):
        return blocks.RowChunks(X, chunk_rows=self.chunk_rows, client=client,
                                on_digest=runs.content_check(self.store, X))

    def _client_context(self, X):
        n = getattr(X, "shape", (0,))[0] if not isinstance(X, str) else None
        return client_context(choose_rows_backend(self.backend, n), n)

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Cluster the rows of X (n_samples, n_features): NumPy, a Zarr array or a Zarr
        path (read by row chunks).  ``resume=True`` continues the run in ``store`` from
        its last checkpoint.  Returns self."""
        self._check()
        start = time.perf_counter()
        X = check_data(X, owner=type(self).__name__, not_constant=True)
        self._check_sizes(*(int(v) for v in blocks.input_metadata(X)["shape"]))
        params = runs.jsonable_params(self.get_params())
        checkpoints = self._start_matrix_run(self._method, {k: v for k, v in params.items()
                                                            if k not in _NOT_IDENTITY}, X, resume)
        if resume and checkpoints is None:
            return self                                   # finished: its result is loaded

        attempts = []

        def attempt(resume):
            state = checkpoints.load() if resume else None
            attempts.append(resume)
            with self._client_context(X) as client, blocks.single_threaded_blas():
                if client is not None and len(attempts) == 1:
                    # Workers too small for their share are refused before any pass (on the
                    # first attempt: a restart may find fewer while a lost one comes back).
                    meta = blocks.input_metadata(X)
                    n, d = (int(v) for v in meta["shape"])
                    memory.refuse_unless_workers_hold(
                        self._memory_parts(n, d), n, self.chunk_rows or chunk_rows_for(X, n), client,
                        type(self).__name__, d=d, x_in_zarr=meta["kind"] == "zarr",
                        x_itemsize=np.dtype(meta["dtype"] or np.float64).itemsize)
                data = self._row_chunks(X, client)
                try:
                    self._solve(data, state, None if checkpoints is None else checkpoints.save)
                    self._finish(data, start)
                finally:
                    data.close()

        # A lost worker's row chunks are rebuilt from X; the run goes on from its last checkpoint.
        self.restarts_ = runs.with_restarts(attempt, store=self.store, resume=resume,
                                            checkpoint_key=f"{self._method}_checkpoint")
        return self

    def _finish(self, data, start):
        """The stored result, where the solver left it: each n-row array in this process
        or, where its attribute is None (``U_``, ``V_``), in the row chunks' state of its
        result name ("U", "V"), which write it themselves; on a cluster's workers with a
        ``store``, such an attribute is then a dask array over the store, else gathered."""
        arrays = dict({"labels": self.labels_, "U": self.U_}, **self._result_arrays())
        held = [name for name, value in arrays.items() if value is None]
        lazy = bool(held) and self.store is not None and data.backend != "local"
        self.fit_seconds_ = time.perf_counter() - start
        if self.store is not None:
            runs.write_result(self.store, {name: data.held(name) if value is None else value
                                           for name, value in arrays.items()},
                              dict(self._summary(), lazy_arrays=held if lazy else []),
                              self.history_, self.fit_seconds_)
        for name in held:
            setattr(self, f"{name}_", run_store.lazy_rows(self.store, f"result/{name}") if lazy else data.get(name))
            data.drop(name)

    def _solver_callback(self):
        """The progress report and the user's ``callback(row)``, as the solvers'
        ``callback(row, current_u)``."""
        name, targets = self._progress_report()
        report = self._report_progress(name, show=("loss",), targets=targets)
        return None if report is None else (lambda row, current_u: report(row))

    def membership(self):
        """Z = U U^T (n x n): the relaxed membership matrix, for small n only."""
        n = self.U_.shape[0]
        if n > 20000:
            raise InputValueError(f"membership() forms an n x n matrix; n = {n} is too large (at most "
                                  f"20000): use labels_ or U_")
        U = np.asarray(self.U_)                 # U_ may be a dask array over the store
        return U @ U.T


# Parameters a resumed run may change: they do not define the run.
_NOT_IDENTITY = ("checkpoint_every", "callback", "store", "overwrite", "backend", "verbose")




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
    n_components : "auto", int or None, default "auto"
        Solve on X's projection on this many principal components (computed from the
        d x d Gram of the centred rows; one more pass): a Newton step costs
        O(n r^2 d^2) and solves a system with d (r - 1) unknowns, so X with hundreds of
        features (images, text) is out of reach without it.  "auto": min(d,
        5 n_clusters), which keeps the k-means cost of every partition (and of every
        point of the SDP) within a factor 1.2 up to an additive constant, the variance the
        projection leaves out (Cohen et al., STOC 2015); None: all of X's features, the
        paper's problem.  ``cost_`` is then the projected problem's.
    mu : "auto", float or decreasing sequence of floats, default "auto"
        The barrier weight: App. F's heuristic (the barrier at 20 times the data term at
        the interior point), a value, or continuation stages (each warm-started).
    init : {"kmeans", "random"}, default "kmeans"
        The start: "kmeans", next to the k-means++ partition of the rows (refined into
        r groups and mixed with the uniform point just enough to be strictly feasible:
        :func:`dnomad.kmeans_sdp.riemannian.kmeans_start`); "random": Lemma 5's interior
        point moved along a random tangent (the paper's).
    n_init : int, default 1
        Strictly feasible starts (a new seeding or random draw each); the lowest final
        cost wins.
    max_iter : int, default 1000
        Newton iterations per stage.
    tol : float, default 1e-10
        Stop when the Riemannian gradient's norm is at most ``grad_tol_`` = tol ||X||_2^2
        (X centred) at a point whose Hessian has no eigenvalue below -sqrt(tol) ||X||_2^2:
        the cost, its gradient and Hessian grow as X's units squared, so the rule does not
        depend on them (``grad_norm_`` and the history report the norm itself).
    lam : float, default 1.0
        Alg. 1's starting regularization, in units of ||X||_2^2: the data term's
        Hessian has norm 2 ||X||_2^2, and away from a local minimum H + lam I is
        positive definite only for lam of that order.
    kappa_plus, kappa_minus, max_inner : default 1.3, 1.1, 60
        Alg. 1's adaptation of lam and its tries per iteration.
    lam_rule : {"adaptive", "bisection"}, default "adaptive"
        Alg. 1's lam (divided by kappa_minus on a taken step, multiplied by kappa_plus on
        a rejected one), or Sec. 3's bisection for 2 lam = L ||p(lam)|| with the cubic
        constant L (from ``cubic_L``, default 1.0, in units of ||X||_2^2) adapted instead
        (about ten Newton solves per iteration).
    boundary_fraction : float or None, default 0.95
        Steps cut to this fraction of the way to U = 0 (None: full steps, as printed).
    second_order : bool, default True
        Stop only at points whose Hessian has no eigenvalue below -sqrt(tol) ||X||_2^2; step along
        negative curvature otherwise.
    min_eigenvalue : {None, "final", "every"}
        Report the smallest Riemannian Hessian eigenvalue at the end / in every history
        row (shift-invert Lanczos: tens of passes each).
    chunk_rows : int, optional
        Rows per chunk (default 8192 for NumPy X, the Zarr chunking for Zarr X).
    backend : {"auto", "local", "distributed"}
        "auto": the connected cluster's workers from 200,000 rows, else this process.
    random_state, store, overwrite, callback
        ``store``: checkpoints, then labels, U, history and a summary are written there;
        ``fit(X, resume=True)`` (or ``dnomad.resume(store)`` for a Zarr X) continues a run
        from its last checkpoint.  ``callback(row)`` returning True stops a stage.
    checkpoint_every : int, default 10
        Newton iterations between checkpoints to ``store`` (the point, O(n r) numbers).
    verbose : int, default 0
        Progress on stderr: 0 none, 1 a live line, 2 a line per iteration (:mod:`dnomad.progress`).

    Attributes
    ----------
    labels_ : ndarray (n,)
        From the rows of U (Lemma 1).
    U_ : ndarray (n, r)
        U = [1/sqrt(n) 1, V] Q > 0; ``membership()`` gives Z = U U^T for small n.
    grad_tol_ : float
        The gradient norm the run stopped at or below: tol ||X||_2^2.
    n_components_ : int
        The principal components the problem was solved on (d without a projection).
    explained_variance_ratio_ : float
        The fraction of X's variance those components keep (1.0 without a projection).
    V_, Q_, mu_, cost_, grad_norm_, min_eigenvalue_, stop_reason_, n_iter_, history_,
    costs_ (every start's final cost), curvature_steps_, passes_ (over X or its projection), fit_seconds_,
    restarts_ (restarts from the last checkpoint after a lost worker)
    ``U_`` and ``V_`` (n x (r - 1)) are ndarrays, or, fitted on a cluster's workers with a
    ``store``, dask arrays over the store (the row chunks wrote them; read when computed).

    References
    ----------
    Xu, Hou, Chen, Zhang. Efficient K-means clustering via a cubic-regularized
    Riemannian Newton method (the paper in ``../shared/papers/riemannian-newton-kmeans.md``).
    """

    _method = "riemannian-kmeans"

    def _memory_parts(self, n, d, x_kind="numpy"):
        """What a fit on n rows of d features holds (:func:`dnomad.plan`): X's centred
        rows, their sketch on m principal components where m < d, V, dV and the trial
        point (n x (r - 1) each: U = [1 / sqrt(n), V] up to a rotation), the best start's
        V, and the Lanczos basis of the Hessian's eigensolve and its products where
        curvature is checked."""
        from .curvature import LANCZOS_NCV

        r = self.n_clusters + 1 if self.rank is None else self.rank
        m = rk.sketch_size(self.n_components, d, self.n_clusters)
        rows = {f"the point V, its step and the trial point (n x {r - 1} each)": 24 * (r - 1)}
        temporaries = {"temporaries": 8 * (min(m, d) + 4 * r)}
        if self.n_init > 1:
            rows["the best start's V"] = 8 * (r - 1)
        if self.second_order or self.min_eigenvalue is not None:
            # beside V and dV, in the trial point's place too: the Lanczos basis, its
            # products and its start; a restart makes its Ritz vectors chunk by chunk
            rows[f"the Hessian's eigensolve ({2 * LANCZOS_NCV} vectors of n x {r - 1})"] = \
                2 * LANCZOS_NCV * 8 * (r - 1)
            temporaries[f"a Lanczos restart's {LANCZOS_NCV // 2} Ritz vectors"] = 8 * (LANCZOS_NCV // 2) * (r - 1)
        if m < d:
            rows[f"X's sketch on {m} principal components"] = 8 * m
        return memory.MemoryParts(rows=rows, x_rows={"X's centred rows": 8 * d}, chunk_rows=temporaries,
                           client=_labels_in_client(n, self.n_clusters),
                           passes={"each Newton iteration": "a few passes over the rows (the gradient, the "
                                                            "Schur complement's products, the line search)"})

    def _check_sizes(self, n, d):
        # U > 0 needs r = rank > n_clusters columns (Lemma 3), and r <= n
        if self.n_clusters >= n:
            raise InputValueError(f"n_clusters must be below the number of samples ({n}); got {self.n_clusters}")
        if self.rank is not None and self.rank > n:
            raise InputValueError(f"rank must be at most the number of samples ({n}); got {self.rank}")
        rk.sketch_size(self.n_components, d, self.n_clusters)

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "rank": _OPTIONAL_POSITIVE_INT,
        "n_components": [Options("auto")] + _OPTIONAL_POSITIVE_INT,
        "mu": [Options("auto"), "array-like"] + _POSITIVE, "init": [Options(*rk.INITS)], "n_init": _POSITIVE_INT,
        "max_iter": _POSITIVE_INT, "tol": _POSITIVE, "lam": _POSITIVE,
        "kappa_plus": [Interval(numbers.Real, 1, None, closed="neither")],
        "kappa_minus": [Interval(numbers.Real, 1, None, closed="neither")], "max_inner": _POSITIVE_INT,
        "lam_rule": [Options("adaptive", "bisection")], "cubic_L": _POSITIVE,
        "boundary_fraction": [None, Interval(numbers.Real, 0, 1, closed="neither")],
        "second_order": ["boolean"], "min_eigenvalue": [None, Options("final", "every")],
        "chunk_rows": _OPTIONAL_POSITIVE_INT, "backend": [Options("auto", "local", "distributed")],
        "checkpoint_every": _POSITIVE_INT, "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, rank=None, n_components="auto", mu="auto", init="kmeans", n_init=1,
                 max_iter=1000, tol=1e-10, lam=1.0,
                 kappa_plus=1.3, kappa_minus=1.1, max_inner=60, lam_rule="adaptive", cubic_L=1.0,
                 boundary_fraction=0.95, second_order=True, min_eigenvalue=None, chunk_rows=None,
                 backend="auto", random_state=None, store=None, overwrite=False, checkpoint_every=10,
                 callback=None, verbose=0):
        self.n_clusters = n_clusters
        self.rank = rank
        self.n_components = n_components
        self.mu = mu
        self.init = init
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
        self.checkpoint_every = checkpoint_every
        self.callback = callback
        self.verbose = verbose

    def _check(self):
        """What ``_parameter_constraints`` cannot say: rank against n_clusters, mu's stages."""
        if self.rank is not None:
            check_ints(self, ["rank"], minimum=self.n_clusters + 1)
        if not (isinstance(self.mu, str) and self.mu == "auto"):
            rk.mu_schedule(self.mu, None, None)                   # checked before X is read

    def _solve(self, data, state, checkpoint):
        # tol, lam, cubic_L and the curvature test in units of ||X||_2^2 (see the parameters).
        curvature = rk.data_curvature(data)
        self.grad_tol_ = self.tol * curvature
        res = rk.riemannian_kmeans(
            data, self.n_clusters, rank=self.rank, n_components=self.n_components, mu=self.mu, init=self.init,
            n_init=self.n_init,
            random_state=self.random_state, lam=self.lam * curvature, kappa_plus=self.kappa_plus,
            kappa_minus=self.kappa_minus, max_iter=self.max_iter, max_inner=self.max_inner, gtol=self.grad_tol_,
            curvature_tol=math.sqrt(self.tol) * curvature, lam_rule=self.lam_rule,
            cubic_L=self.cubic_L * curvature,
            boundary_fraction=self.boundary_fraction, second_order=self.second_order,
            min_eigenvalue=self.min_eigenvalue, callback=self._solver_callback(), state=state,
            checkpoint=checkpoint, checkpoint_every=self.checkpoint_every, keep_rows=True)
        self.labels_ = res.labels
        self.n_components_ = data.d if res.sketch is None else res.sketch.components.shape[1]
        self.explained_variance_ratio_ = 1.0 if res.sketch is None else res.sketch.variance
        self.U_, self.V_, self.Q_ = None, None, res.Q           # U and V in the row chunks (_finish)
        self.mu_, self.cost_, self.grad_norm_ = res.mu, res.cost, res.grad_norm
        self.min_eigenvalue_ = res.min_eigenvalue
        self.stop_reason_, self.n_iter_, self.history_ = res.stop_reason, res.n_iter, res.history
        self.costs_, self.curvature_steps_, self.passes_ = res.costs, res.curvature_steps, res.passes

    def _progress_report(self):
        return "Riemannian K-means", {"grad_norm": self.grad_tol_}

    def _result_arrays(self):
        return {"V": self.V_, "rotation": self.Q_}

    def _summary(self):
        return {"cost": self.cost_, "mu": self.mu_, "grad_norm": self.grad_norm_, "grad_tol": self.grad_tol_,
                "n_components": int(self.n_components_),
                "explained_variance_ratio": float(self.explained_variance_ratio_),
                "min_eigenvalue": self.min_eigenvalue_, "stop_reason": self.stop_reason_,
                "n_iter": self.n_iter_, "passes": self.passes_, "costs": [float(c) for c in self.costs_],
                "curvature_steps": int(self.curvature_steps_)}


class NLR(_RowChunkEstimator):
    """K-means by NLR (Zhuang, Chen, Yang, Zhang, ICLR 2024): the same nonnegative
    low-rank K-means SDP with U >= 0 (n x 2K), by projected gradient steps on the
    augmented Lagrangian of U U^T 1 = 1 (see :mod:`dnomad.kmeans_sdp.nlr`); one pass over
    the row chunks of X per iteration.  The baseline of :class:`RiemannianKMeans`.

    Parameters
    ----------
    n_clusters : int, >= 2
    rank : int, optional
        Default 2 * n_clusters (the authors'), at most the number of samples.
    beta : "scale" or float, default "scale"
        The augmented Lagrangian's penalty.  "scale": 10 ||X||_2^2 / n (X centred), the
        authors' 10 on X scaled to ||X||_2^2 = n, so that the run does not depend on
        X's units; a number: as given (the authors' protocol: 10).
    step : float, optional
        alpha; default 1 / (2 (||X||_2^2 + beta n)).
    tol, dual_tol : default 1e-6, 1e-3
        Stop when the relative change of U and ||U U^T 1 - 1|| / sqrt(n) are below tol;
        take the dual step when the relative change is below dual_tol.
    max_iter : int, default 100000
    init : {"kmeans", "random"}, default "kmeans"
        The start: "kmeans", the partition of k-means++ and Lloyd's iterations over the
        row chunks (:func:`dnomad.rounding.kmeans_partition`), each group's
        indicator over the square root of its size (a feasible point); "random":
        |N(0, 1)| entries, projected (the authors').
    n_init : int, default 1
        Starts (a new k-means++ seeding or random draw each); the largest final
        <X X^T, U U^T> wins.
    record_every : int, default 10
        Iterations between history rows.
    chunk_rows, backend, random_state, store, overwrite, callback
        As :class:`RiemannianKMeans`.
    checkpoint_every : int, default 1000
        Iterations between checkpoints to ``store`` (U and y, and the best start's U when
        ``n_init`` > 1: O(n r) numbers, written by the row chunks where they are held).
    verbose : int, default 0
        Progress on stderr: 0 none, 1 a live line, 2 a line per iteration (:mod:`dnomad.progress`).

    Attributes
    ----------
    labels_, U_, objective_ (<X X^T, U U^T> of U_, X centred), infeasibility_ (||U U^T 1 - 1||
    / sqrt(n) at the last history row, the iterate one step before U_), stop_reason_,
    n_iter_, dual_steps_, history_, passes_, fit_seconds_, beta_ (the penalty used), restarts_.
    ``U_`` (n x r) is an ndarray, or, fitted on a cluster's workers with a ``store``, a dask
    array over the store (the row chunks wrote it; read when computed).
    """

    _method = "nlr"

    def _memory_parts(self, n, d, x_kind="numpy"):
        """What a fit on n rows of d features holds (:func:`dnomad.plan`): X's centred
        rows, U (n x r) and the multipliers y (the labels once y is dropped), and the best
        start's U where there are several starts."""
        r = nlr_solver.checked_rank(n, self.n_clusters, self.rank)
        rows = {f"U (r = {r})": 8 * r, "the multipliers y, then the labels": 8}
        if self.n_init > 1:
            rows["the best start's U"] = 8 * r
        return memory.MemoryParts(rows=rows,
                                  x_rows={"X's centred rows": 8 * d},
                           chunk_rows={"temporaries": 8 * (d + 4 * r)}, client=_labels_in_client(n, self.n_clusters),
                           passes={"each iteration": "one pass over X (X^T U, then X B)"})

    def _check_sizes(self, n, d):
        nlr_solver.checked_rank(n, self.n_clusters, self.rank)

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "rank": _OPTIONAL_POSITIVE_INT,
        "beta": [Options("scale")] + _POSITIVE, "step": [None] + _POSITIVE, "tol": _POSITIVE,
        "dual_tol": _POSITIVE, "max_iter": _POSITIVE_INT, "init": [Options(*nlr_solver.INITS)],
        "n_init": _POSITIVE_INT, "record_every": _POSITIVE_INT,
        "chunk_rows": _OPTIONAL_POSITIVE_INT, "backend": [Options("auto", "local", "distributed")],
        "checkpoint_every": _POSITIVE_INT, "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, rank=None, beta="scale", step=None, tol=1e-6, dual_tol=1e-3,
                 max_iter=100000, init="kmeans", n_init=1, record_every=10, chunk_rows=None, backend="auto",
                 random_state=None, store=None, overwrite=False, checkpoint_every=1000, callback=None,
                 verbose=0):
        self.n_clusters = n_clusters
        self.rank = rank
        self.beta = beta
        self.step = step
        self.tol = tol
        self.dual_tol = dual_tol
        self.max_iter = max_iter
        self.init = init
        self.n_init = n_init
        self.record_every = record_every
        self.chunk_rows = chunk_rows
        self.backend = backend
        self.random_state = random_state
        self.store = store
        self.overwrite = overwrite
        self.checkpoint_every = checkpoint_every
        self.callback = callback
        self.verbose = verbose

    def _check(self):
        """What ``_parameter_constraints`` cannot say: rank against n_clusters."""
        if self.rank is not None:
            check_ints(self, ["rank"], minimum=self.n_clusters)

    def _solve(self, data, state, checkpoint):
        best = nlr_solver.nlr_kmeans(data, self.n_clusters, init=self.init, n_init=self.n_init,
                                     random_state=self.random_state, rank=self.rank, beta=self.beta,
                                     step=self.step, tol=self.tol,
                                     dual_tol=self.dual_tol, max_iter=self.max_iter,
                                     record_every=self.record_every, callback=self._solver_callback(),
                                     state=state, checkpoint=checkpoint, checkpoint_every=self.checkpoint_every,
                                     keep_rows=True)
        self.U_ = None                                      # in the row chunks' state "U"
        self.labels_ = factor_labels(data, "U", self.n_clusters)
        self.objective_ = best.objective
        self.infeasibility_ = best.history[-1]["infeasibility"]
        self.stop_reason_, self.n_iter_, self.dual_steps_ = best.stop_reason, best.n_iter, best.dual_steps
        self.history_, self.passes_, self.beta_ = best.history, best.passes, best.beta

    def _progress_report(self):
        return "NLR", {"change": self.tol, "infeasibility": self.tol}

    def _result_arrays(self):
        return {}

    def _summary(self):
        return {"objective": self.objective_, "infeasibility": self.infeasibility_,
                "stop_reason": self.stop_reason_, "n_iter": self.n_iter_, "passes": self.passes_,
                "dual_steps": int(self.dual_steps_), "beta": self.beta_}
