"""The NOMAD estimator: conditional gradient or Burer-Monteiro, one layer or several
(Sec. 3.1), the 2-D embedding and hard labels of Q."""
from __future__ import annotations

import contextlib
import numbers
import time
from functools import partial

import numpy as np

from .. import blocks
from ..base import (_NONNEGATIVE, _OPTIONAL_POSITIVE_INT, _POSITIVE, _POSITIVE_INT, _RUN_CONSTRAINTS, _Clustering,
                    _Estimator, _gated)
from ..blocks import memory, runs
from ..blocks import store as run_store
from ..blocks.cluster import BACKEND_CHOICES, choose_backend, choose_rows_backend, client_context
from ..blocks.inputs import InputSource
from ..blocks.operators import LowRankGram, ScaledMatrix
from ..blocks.rows import chunk_rows_for
from ..errors import InputValueError
from ..linalg import top_eigenvectors
from ..rounding import (SEED_SAMPLE_ROWS, component_labels, factor_sums, low_rank_embedding, low_rank_spectral_labels,
                        spectral_labels)
from ..validation import Interval, Options
from . import cgm as nomad_solver
from .bm import BurerMonteiroParams, burer_monteiro
from .cgm import CHECKPOINT_KEY as nomad_checkpoint_key
from .cgm import NomadParams, nomad_cgm


SOLVERS = ("cgm", "bm")
_OPTIONAL_SDP_K = [None, Interval(numbers.Integral, 2, None)]
LABEL_METHODS = ("auto", "components", "spectral")


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
    n_clusters : int, default 8
        The number of clusters in ``labels_`` (see ``label_method``).
    sdp_k : int, optional
        K, the trace of Q (the SDP's resolution: Q links each point to about n / K
        neighbours, and a K larger than the number of clusters lets NOMAD follow
        manifolds; the paper uses K = 8 to 128); n_clusters <= K < n.  Default:
        :func:`default_sdp_k` of n and n_clusters.
    solver : {"cgm", "bm"}, default "cgm"
        Conditional gradient in the method of multipliers (Sec. 5, Alg. 2; converges
        to the SDP's solution), or Burer-Monteiro (Sec. 4, App. E: the augmented
        Lagrangian (32) minimized over Y in [0, 1]^{n x r} by projected L-BFGS over Y's
        row chunks, multipliers by (33b, 33c), D divided by its Frobenius norm,
        symmetric-NMF start).
    rank : int, optional
        (bm) r, Y's columns, K <= r <= n; default 2 K (the authors' is 8 K): r = K
        returns hard clusterings (Kulis et al.), larger r comes closer to the SDP's
        solution (graphs/nomad_solvers.py: relative distance 0.9 at r = K, 0.06-0.09
        at 8 K on two rings) at r's cost in memory and time; 2 K gave 8 K's labels
        (graphs/nomad_bm_rank.py).  In multi-layer runs the same r serves every
        layer (default 2 K_l).
    layers : list of int or "halving", optional
        Multi-layer NOMAD (Sec. 3.1): Q_1 = NOMAD(D, K_1), Q_l = NOMAD(Q_{l-1}, K_l) for a
        strictly decreasing schedule K_1 > ... > K_L >= n_clusters (``sdp_k`` is then
        not used); the labels come from the last layer's Q.  "halving": sdp_k,
        sdp_k / 2, ... while above n_clusters, then n_clusters.
        Q_l of the inner layers is kept in ``store`` (``layers/<l>/Q``, or ``/Y`` for
        bm) and in ``layers_``.  A layer's D is the previous Q as it is (bm: divided by
        its Frobenius norm).
    solver_options : dict, optional
        (bm) sigma (the row-sum penalty; default 10 / n, the paper's 1 is
        ill-conditioned at large n), phi (the trace penalty, 0.1; the paper's 1 makes
        the trace the stiffest direction), eta (default 1), tol (1e-5: stop when Y
        changes by less, relative, and the constraints hold to feasibility_tol, 1e-4),
        optimizer of each multiplier step ("lbfgs": projected L-BFGS over Y's row
        chunks, the default; "spg": spectral projected gradient; "scipy": SciPy's
        L-BFGS-B in this process), memory (5 pairs, lbfgs), pair_dtype ("float32":
        the pairs' precision, a quarter less state a row than "float64"),
        precondition (0.1:
        lbfgs starts each recursion from (Y^T Y + eta I)^-1 on every row, eta = 0.1
        Tr(Y^T Y) / r; None: the identity), inner_max_iter (15000),
        inner_tol (1e-10: ftol and gtol), inner_rtol (0.1: a multiplier step stops
        once its projected gradient has fallen to this fraction of where it started,
        or after inexact_max_iter (150) iterations, except one confirming the stopping
        rule, solved to inner_tol; 0: every step to inner_tol; not "scipy"), start
        ("symnmf" or "random"), balance (True: the start's rows scaled so that
        Y Y^T 1 = 1, and its first step inexact; False: the paper's start as it is,
        its first step solved to inner_tol), start_tol (1e-3) and start_max_iter (1000) of the
        symmetric NMF start,
        increments (False; True: after the first evaluation of each inner solve, X's
        products in float32 on the step only, D Y_new = D Y + F F^T (Y_new - Y) /
        ||F^T F||_F with D Y kept in float64: 1.43x fewer seconds per evaluation on all
        70,000 MNIST digits, but a noise floor that tolerances tighter than the
        defaults may not get under; data X only).
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
    label_method : {"auto", "components", "spectral"}, default "auto"
        Hard labels from Q, the same rule for cgm, bm and every layer.  "components":
        the paper's (Sec. 3), connected components of the graph that links i and j
        where Q_ij > component_threshold * max(Q_ii, Q_jj)
        (:func:`dnomad.rounding.component_labels`): on separated groups the SDP's Q
        is block diagonal with entries 1 / |group| and the components are the
        groups; with K larger than the number of groups Q is a band along each
        manifold and the components are the manifolds; their number need not be
        n_clusters (a manifold sampled too sparsely for its band to connect comes out
        in pieces, two that touch come out as one).  "spectral": n_clusters groups by
        normalized spectral clustering of Q as an affinity
        (:func:`dnomad.rounding.spectral_labels`: Q's top n_clusters eigenvectors, by
        Lanczos over Q's blocks, or the thin SVD of Y for bm).  "auto": the
        components where there are exactly n_clusters of them, else "spectral" (bm
        above 100,000 points: "spectral", as finding the components of Y Y^T costs
        O(n^2 r) time).
    component_threshold : float, default 0.5
        The fraction in (0, 1) above.  On the exact solution any value in (0, 1) gives
        the groups; conditional-gradient iterates stopped by the stopping rule keep
        Frank-Wolfe residue between groups of up to 0.17 of the larger diagonal and
        links above 0.76 of it inside each group (blobs with sizes up to 20:1, two
        rings), hence 0.5.
    n_components : int, default 2
        Dimensions of ``embedding_``.
    random_state : int or Generator, optional
        Seeds the k-means of spectral labels (and bm's start).
    callback : callable, optional
        Called with each history row; returning True stops the run.
    verbose : int, default 0
        Progress on stderr: 0 none, 1 a live line, 2 a line per iteration (:mod:`dnomad.progress`).

    Parameters n_inner to eigen_ncv, the stopping tolerances, dtype and block_size are
    conditional gradient's; Burer-Monteiro runs in this process in float64 (D Y over
    X's row chunks on a thread per core, or over the blocks of a precomputed D
    wherever they live).

    Attributes
    ----------
    Q_ : BlockMatrix (cgm) or LowRankGram (bm)
        Both have ``matmat``, ``diag`` and ``np.asarray(Q_)`` (dense; small n).
    Y_ : ndarray or dask array (n, r)
        (bm) The factor: Q = Y Y^T (in the store: ``result/Y``, row-chunked).  A dask
        array over the store where a single-layer fit on data ran its row chunks on a
        cluster's workers with a ``store`` (the chunks wrote it; nothing n x r came to
        this process), and so is ``embedding_`` then: they read the store when
        computed, so a later fit that overwrites that store changes them (compute them
        first to keep them).
    layers_ : list of dict
        Per layer: sdp_k, n_iter, stop_reason, objective, seconds, start (bm: the
        symmetric NMF start's method, iterations, converged, products, passes and
        seconds, and the balancing's balance_sweeps, balanced and balance_seconds;
        None where the layer resumed from a checkpoint), and Q (the inner layers' Q when
        kept, else None; the last layer's is ``Q_``).
    embedding_ : ndarray or dask array (n, n_components)
        Leading eigenvectors of Q (after the constant one) scaled by sqrt(eigenvalue),
        each signed so that its entry of largest magnitude is positive.
    labels_ : ndarray (n,)
    label_method_used_ : {"components", "spectral"}
        The rule that gave ``labels_``.
    sdp_k_ : int
        The K solved for (the first layer's, in a multi-layer run).
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
                      "objective_tol")

    _checkpoints = True
    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "sdp_k": _OPTIONAL_SDP_K,
        "solver": [Options(*SOLVERS)],
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
        "n_components": _POSITIVE_INT,
        "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, sdp_k=None, solver="cgm", rank=None, layers=None, solver_options=None,
                 max_iter=None, n_inner=2, penalty="scale",
                 penalty_schedule="sqrt", tau="auto", direction="block", block_rank=None,
                 lagrangian="shifted", step_rule="global", eigen_tol="inner",
                 eigen_ncv=4, rmse_tol=1e-4, min_tol=1e-2, objective_tol=1e-3, precomputed=False,
                 center=True, normalize=True, dtype=np.float32, block_size=None, backend="auto",
                 device=None, store=None, overwrite=False, checkpoint_every=None,
                 label_method="auto", component_threshold=0.5, n_components=2,
                 random_state=None, callback=None, verbose=0):
        self.n_clusters = n_clusters
        self.sdp_k = sdp_k
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
        self.n_components = n_components
        self.random_state = random_state
        self.callback = callback
        self.verbose = verbose

    # ---------------------------------------------------------------- fit
    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Solve NOMAD for data X (n_samples, n_features), or a Gram matrix when
        ``precomputed``.  Returns self."""
        start = time.perf_counter()
        dtype = blocks.check_dtype(self.dtype)
        self._check_options()
        source = InputSource(X, precomputed=self.precomputed, center=self.center,
                              normalize=self.normalize, keep_zarr=self.solver == "bm", owner="NOMAD",
                              dtype=dtype, not_constant=True)
        n = source.n
        if self.n_clusters >= n:
            raise InputValueError(f"n_clusters must be below the number of samples ({n}); got {self.n_clusters}")
        if self.n_components > n - 2:
            # the embedding: Q's top eigenvectors orthogonal to the constant vector
            raise InputValueError(f"n_components must be at most the number of samples less 2 ({n - 2}); got "
                                  f"{self.n_components}")
        schedule = self._schedule(n)
        self.sdp_k_ = schedule[0]
        params_list = [self._solver_params_for(K) for K in schedule]
        for params in params_list:
            params.validate(n)
        if self.store is None and resume:
            raise InputValueError("resume=True needs the run's store")
        if self.store is not None:
            extra = {} if self.solver == "cgm" and len(schedule) == 1 else \
                {"solver": self.solver, "layers": schedule}
            # The labels are part of the result a finished store hands back.
            extra["labels"] = [int(self.n_clusters), self.label_method, float(self.component_threshold)]
            run_id = runs.run_identity("nomad", params_list[0], source, dtype, self.block_size, **extra)
            record = runs.run_record("nomad", self, runs.source_input_record(source), run_id)
            self._claim_store(run_id, resume, record)
            if resume and self._load_finished(params_list[-1].max_iter):
                return self
            if not resume:
                runs.write_run_record(self.store, record, source)

        self.layers_ = []
        last = params_list[-1]
        if self.solver == "bm":
            self._report_progress("NOMAD (Burer-Monteiro)", show=("objective",), targets={
                "row_sum_violation": last.feasibility_tol, "trace_violation": last.feasibility_tol,
                "change": last.tol})
            self._fit_bm(source, params_list, dtype, resume, start)
        else:
            self._report_progress("NOMAD (conditional gradient)", show=("objective",), passes="per_row",
                                  targets={"rmse_neg": last.rmse_tol, "max_violation": last.min_tol})
            self._fit_cgm(source, params_list, dtype, resume, start)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def _load_finished(self, max_iter=None):
        if not super()._load_finished(max_iter):
            return False
        done = finished_layers(self.store)
        summary = run_store.read_result(self.store)
        try:
            last = {"sdp_k": summary["layers"][-1], "n_iter": summary["n_iter"],
                    "stop_reason": summary["stop_reason"], "objective": summary["objective"]}
            self.layers_ = _layer_records(self.store, done) + [
                dict(last, seconds=summary.get("fit_seconds"), Q=self.Q_)]
        except (KeyError, TypeError, IndexError) as exc:
            raise run_store.damaged(self.store, "the result record or a layer's record",
                                    f"lacks what NOMAD wrote there ({type(exc).__name__}: {exc})") from None
        self.label_method_used_ = summary.get("label_method_used")
        return True

    def _check_options(self):
        """What ``_parameter_constraints`` cannot say: parameters that depend on each other."""
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

    def _memory_parts(self, n, d, x_kind="numpy"):
        """What a fit on n rows of d features holds (:func:`dnomad.plan`)."""
        from . import bm

        self._check_options()
        params_list = [self._solver_params_for(K) for K in self._schedule(n)]
        for params in params_list:
            params.validate(n)
        first = params_list[0]
        labels = {"the labels (int64, gathered, numbered)": 4 * 8 * n,
                  "k-means++ on a sample of the spectral rows": 4 * 8 * min(n, SEED_SAMPLE_ROWS) * self.n_clusters}
        if self.solver == "bm" and not self.precomputed:
            r = first.resolved_rank(n)
            client = dict(labels)
            if self.label_method == "components" or (self.label_method == "auto" and n <= AUTO_COMPONENTS_MAX_N):
                client["Y, gathered to look for Q's components"] = 8 * n * r
            if first.optimizer == "scipy":
                client["SciPy's L-BFGS-B on Y gathered (the reference optimizer)"] = 8 * n * r * 24
            if len(params_list) > 1:             # a later layer's D is the last Y Y^T, in this process
                client["the later layers' Y and states (in this process, one layer at a time)"] = max(
                    sum(bm.row_state_bytes(params, params.resolved_rank(n)).values()) * n + 8 * n * r
                    for params in params_list[1:])
            passes = {"start": f"symmetric NMF by ADMM: 2 passes over X an iteration, at most "
                               f"{first.start_max_iter}",
                      "each evaluation of L": "2 passes over X (X^T Y, then X B), each task also reading and "
                                              f"writing its rows of the optimizer's states (r = {r})",
                      "outer steps": f"at most {first.max_iter}; each an inner solve of up to "
                                     f"{first.inexact_max_iter} iterations (inexact) or {first.inner_max_iter}"}
            return memory.MemoryParts(rows=bm.row_state_bytes(first, r), x_rows=bm.x_copy_bytes(d),
                               chunk_rows={"temporaries": 8 * r * bm.TASK_ROW_TEMPORARIES}, client=client,
                               passes=passes)
        itemsize = blocks.check_dtype(self.dtype).itemsize
        if self.solver == "bm":             # D given as a matrix, stored in blocks; Y in this process
            r = first.resolved_rank(n)
            return memory.MemoryParts(matrices=1, itemsize=itemsize, client=dict(labels, **{
                "Y and the optimizer's states (in this process)": sum(bm.row_state_bytes(first, r).values()) * n}),
                passes={"each evaluation of L": "a pass over D's blocks (D Y)"})
        K = first.n_clusters
        k = min(first.block_rank or 2 * K + 8, max(1, n - 2))
        client = dict(labels, **{f"the block step's eigenvectors ({nomad_solver.LOBPCG_BLOCKS} blocks of n x {k} "
                                 f"to start; k grows with Q's rank up to half the memory here)":
                                 nomad_solver.LOBPCG_BLOCKS * 8 * n * k})
        matrices = 3 + (1 if self.precomputed else 0)
        return memory.MemoryParts(matrices=matrices, itemsize=itemsize, client=client, passes={
            "each outer step": "inner Frank-Wolfe steps, each a few passes over the blocks of P, Gamma and G "
                               "(and X's rows for D's products)"})

    def _schedule(self, n):
        """The K of each layer: [sdp_k] for one layer."""
        layers, last = self.layers, int(self.n_clusters)
        if layers is None or isinstance(layers, str):
            K = default_sdp_k(n, last) if self.sdp_k is None else int(self.sdp_k)
            if K >= n:
                raise InputValueError(f"sdp_k must be below the number of samples ({n}); got {K}")
            if K < last:
                raise InputValueError(f"sdp_k ({K}) must be at least n_clusters ({last}): Q, of trace K, "
                                      f"holds about K groups; set sdp_k >= n_clusters or leave it unset")
            if layers is None:
                return [K]
            schedule = []                                 # "halving" (_parameter_constraints)
            while K > last:
                schedule.append(K)
                K //= 2
            return schedule + [last]
        if self.sdp_k is not None:
            raise InputValueError(f"give the SDP's K either as sdp_k or as layers, not both; got "
                                  f"sdp_k={self.sdp_k!r}, layers={layers!r}")
        values = list(layers) if not isinstance(layers, np.ndarray) else layers.tolist()
        if not values or any(isinstance(K, (bool, np.bool_)) or not isinstance(K, (int, np.integer))
                             for K in values):
            raise InputValueError(f"layers must be a non-empty list of integers (the K of each layer); got "
                                  f"{layers!r}")
        schedule = [int(K) for K in values]
        if any(a <= b for a, b in zip(schedule, schedule[1:])):
            raise InputValueError(f"layers must be strictly decreasing (K_1 > K_2 > ...); got {schedule}")
        if schedule[0] >= n:
            raise InputValueError(f"the first layer's K ({schedule[0]}) must be below the number of samples ({n})")
        if schedule[-1] < last:
            raise InputValueError(f"the last layer's K ({schedule[-1]}) must be at least n_clusters ({last}); "
                                  f"got layers={schedule}")
        return schedule

    def _solver_params_for(self, K):
        if self.solver == "bm":
            max_iter = BM_MAX_ITER if self.max_iter is None else self.max_iter
            return BurerMonteiroParams(n_clusters=K, rank=self.rank, max_iter=max_iter,
                                       random_state=self.random_state, **(self.solver_options or {}))
        max_iter = CGM_MAX_ITER if self.max_iter is None else self.max_iter
        return NomadParams(n_clusters=K, max_iter=max_iter,
                           **{k: getattr(self, k) for k in self._solver_params if k != "max_iter"})

    # ------------------------------------------------ conditional gradient
    def _fit_cgm(self, source, params_list, dtype, resume, start):
        n, store, last = source.n, self.store, len(params_list) - 1
        device = blocks.device.resolve_device(self.device)
        backend = "local" if device == "cuda" and self.backend == "auto" else \
            self._resolve_backend(source, dtype)

        def attempt(resume):
            done = finished_layers(store) if resume else 0
            self.layers_ = _layer_records(store, done)
            with client_context(backend, n) as client:
                kw = dict(backend=backend, client=client if backend != "local" else None, store=store,
                          dtype=dtype, block_size=self.block_size, device=device)
                if done:
                    # Layers 0..done-1 finished: the next one starts from the last one's Q.
                    group = blocks.from_zarr(store, f"layers/{done - 1}/Q", **kw).group
                    data = None
                else:
                    group, data = source.build(**kw, on_digest=source.content_check(store))
                try:
                    for layer in range(done, last + 1):
                        checkpoints = None if store is None else run_store.Checkpoints(
                            store, layer_checkpoint_key(layer))
                        state = checkpoints.load(group=group) if resume and checkpoints is not None else None
                        save = None if checkpoints is None else partial(checkpoints.save, group=group)
                        res = nomad_cgm(group, params_list[layer], data=data, state=state,
                                        callback=self._fit_callback, checkpoint=save,
                                        checkpoint_every=self.checkpoint_every or CGM_CHECKPOINT_EVERY)
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

        self.restarts_ = runs.with_restarts(attempt, store=store, resume=resume,
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
                                           store=self.store, check=False)       # just written
        elif group.backend == "local":
            blocks.shifted_copy(group, "Q", f"layer{layer}", 0.0)
            record["Q"] = blocks.BlockMatrix(group, f"layer{layer}")
        else:
            record["Q"] = None
        self.layers_.append(record)

    def _resolve_backend(self, source, dtype):
        if source.matrix is not None:
            return source.matrix.backend
        return choose_backend(self.backend, source.n, dtype, n_matrices=3, store=self.store,
                               what="NOMAD's state (P, Gamma, G)")

    def _finish(self, res, group, start):
        self.passes_ = group.passes.since()
        self._finish_common(res, lambda Y: res.P.matmat(Y))
        if self.store is not None:
            with run_store.writing(self.store, "the result Q", keep="the last checkpoint is intact"):
                group.save(["Q"], self.store, "result", mirror=True)
            self._write_result({"embedding": self.embedding_, "labels": self.labels_}, res,
                               {"penalty": res.penalty, "tau": res.tau, "passes": self.passes_}, start)
            self.Q_ = blocks.from_zarr(self.store, "result/Q", dtype=group.dtype,
                                       block_size=group.layout.block_size, backend="zarr",
                                       store=self.store, check=False)           # just written
        else:
            self.Q_ = res.Q
            if group.backend == "distributed":
                # Keep a usable Q after the cluster call ends: bring it into this process.
                self.Q_ = blocks.from_array(np.asarray(res.Q), dtype=group.dtype,
                                            block_size=group.layout.block_size, check=False)
        self.layers_[-1]["Q"] = self.Q_

    def _record_solution(self, res):
        self.history_ = res.history
        self.penalty_ = res.penalty
        self.tau_ = res.tau
        self.n_iter_ = res.n_iter
        self.stop_reason_ = res.stop_reason
        self.objective_ = res.history[-1]["objective"] if res.history else float("nan")
        self.layers_.append(_layer_record(res))

    def _finish_common(self, res, centered_matmat):
        """History, embedding and labels of a solution Q in blocks (conditional gradient)."""
        n = res.Q.shape[0]
        self._record_solution(res)
        ones = np.ones(n) / np.sqrt(n)
        with blocks.single_threaded_blas():
            w, V = top_eigenvectors(centered_matmat, n, self.n_components, deflate=ones, tol=1e-8)
            self.labels_, self.label_method_used_ = nomad_labels(
                res.Q, self.n_clusters, self.label_method, self.component_threshold, self.random_state)
        self.embedding_ = V * np.sqrt(np.clip(w, 0, None))
        self.eigenvalues_ = w

    def _write_result(self, arrays, res, extra, start):
        runs.write_result(self.store, arrays, dict({
            "solver": self.solver, "n_iter": res.n_iter, "stop_reason": res.stop_reason,
            "objective": self.objective_, "layers": [r["sdp_k"] for r in self.layers_],
            "label_method_used": self.label_method_used_}, **extra),
            res.history, time.perf_counter() - start)

    # ------------------------------------------------ Burer-Monteiro
    def _fit_bm(self, source, params_list, dtype, resume, start):
        n, store, last = source.n, self.store, len(params_list) - 1
        if source.is_data:
            # Y in row chunks beside X: on the workers when asked or when a connected
            # cluster's rows threshold is met, else in this process.
            backend = choose_rows_backend(self.backend, n)
        elif source.matrix is not None:
            backend = source.matrix.backend
        else:
            backend = choose_backend(self.backend, n, dtype, n_matrices=1, store=store, what="the matrix D")

        attempts = []

        def attempt(resume):
            client_ctx = client_context(backend, n) if source.matrix is None else contextlib.nullcontext(None)
            with client_ctx as client:
                # The workers' room is checked on the first attempt only: a restart may
                # find fewer workers while the nanny brings a lost one back.
                attempts.append(resume)
                D, group = self._bm_operator(source, backend, client, dtype, check_workers=len(attempts) == 1)
                try:
                    done = finished_layers(store) if resume else 0
                    self.layers_ = _layer_records(store, done)
                    if done:
                        D = _normalized_low_rank(run_store.read_vector(store, f"layers/{done - 1}/Y"))
                    for layer in range(done, last + 1):
                        key = layer_checkpoint_key(layer)
                        checkpoints = None if store is None else run_store.Checkpoints(store, key)
                        state = checkpoints.load() if resume and checkpoints is not None else None
                        # The last layer's Y stays in X's row chunks (on the workers when
                        # they hold them): the labels, embedding and stored result are
                        # taken there.
                        keep_rows = layer == last and isinstance(D, blocks.RowChunks)
                        res = burer_monteiro(D, params_list[layer], callback=self._fit_callback,
                                             state=state,
                                             checkpoint=None if checkpoints is None else checkpoints.save,
                                             checkpoint_every=self.checkpoint_every or 1,  # default 1
                                             keep_rows=keep_rows)
                        if layer < last:
                            record = _layer_record(res)
                            if store is not None:
                                with run_store.writing(store, f"layer {layer}'s Y",
                                                       keep="the last checkpoint is intact"):
                                    run_store.write_rows(store, f"layers/{layer}/Y", res.Y)
                                    run_store.write_json(store, f"layers/{layer}", record)
                            record["Q"] = res.Q
                            self.layers_.append(record)
                            D = _normalized_low_rank(res.Y)                # D_{l+1} = Q_l / ||Q_l||_F
                    if keep_rows:
                        self._finish_bm(res, D, start)
                    else:
                        with blocks.RowState(n) as space:
                            space.put("Y", res.Y)
                            self._finish_bm(res, space, start, Y=res.Y)
                finally:
                    if group is not None and source.matrix is None:
                        group.close()

        # A lost worker's row chunks (Y beside X) are rebuilt from X; the run goes on from
        # its last checkpoint.
        self.restarts_ = runs.with_restarts(attempt, store=store, resume=resume,
                                            checkpoint_key=layer_checkpoint_key(0),
                                            rebuildable=source.matrix is None)
        self.backend_used_ = backend

    def _bm_operator(self, source, backend, client, dtype, check_workers=True):
        """D / ||D||_F as an operator (Burer-Monteiro's normalization), and the block
        group holding D if there is one; for data, X's row chunks (here or on the
        client's workers) for both: D is their rows' normalized Gram matrix."""
        if source.is_data:
            X = source.zarr_data if source.zarr_data is not None else source.data
            if backend == "distributed" and check_workers:
                # Workers too small for their share of Y's states are refused before any pass.
                meta = blocks.input_metadata(X)
                n, d = (int(v) for v in meta["shape"])
                memory.refuse_unless_workers_hold(self._memory_parts(n, d), n, chunk_rows_for(X, n), client,
                                                  "NOMAD (Burer-Monteiro)", d=d, x_in_zarr=meta["kind"] == "zarr",
                                                  x_itemsize=np.dtype(meta["dtype"]).itemsize)
            chunks = blocks.RowChunks(X, client=client if backend == "distributed" else None,
                                      center=self.center, on_digest=source.content_check(self.store))
            return chunks, chunks
        if source.matrix is not None:
            D = source.matrix
        else:
            group, _ = source.build(backend=backend, client=client if backend != "local" else None,
                                    store=self.store, dtype=dtype, block_size=self.block_size,
                                    on_digest=source.content_check(self.store))
            D = blocks.BlockMatrix(group, "D")
        fro = D.summary()["fro"]
        if fro == 0:
            raise InputValueError("the input matrix is zero")
        return ScaledMatrix(D, fro, fro), D.group

    def _finish_bm(self, res, space, start, Y=None):
        """Labels, embedding and the stored result from Y in state "Y" of ``space`` (X's
        row chunks, or a RowState holding ``Y``, the solver's): every pass is over the
        chunks, so Y is gathered here only where the components are looked for
        (label_method "components", or "auto" with n <= AUTO_COMPONENTS_MAX_N) or the
        result is kept in this process.  On a cluster's workers with a ``store``, the
        chunks write Y and the embedding to it and ``Y_``, ``embedding_`` are dask arrays
        over the store (``Q_`` reads Y when first used): the client holds O(r^2) numbers
        and the labels."""
        self.passes_ = {"matmats": res.matmats}
        self._record_solution(res)
        sums = factor_sums(space, "Y")
        with blocks.single_threaded_blas():
            self.eigenvalues_ = low_rank_embedding(space, "Y", self.n_components, "embedding", sums=sums)
            self.labels_, self.label_method_used_ = nomad_labels(
                None, self.n_clusters, self.label_method, self.component_threshold, self.random_state,
                rows=(space, "Y"), sums=sums)
        lazy = self.store is not None and space.backend != "local"
        if self.store is not None:
            self._write_result({"Y": space.held("Y"), "embedding": space.held("embedding"),
                                "labels": self.labels_}, res,
                               {"rank": int(sums[1].shape[0]), "lam": res.lam, "matmats": res.matmats,
                                "lazy_arrays": ["Y", "embedding"] if lazy else []}, start)
        if lazy:
            self.Y_ = run_store.lazy_rows(self.store, "result/Y")
            self.embedding_ = run_store.lazy_rows(self.store, "result/embedding")
        else:
            self.Y_ = space.get("Y") if Y is None else Y
            self.embedding_ = space.get("embedding")
        space.drop("embedding")
        self.Q_ = LowRankGram(self.Y_)
        self.layers_[-1]["Q"] = self.Q_


CGM_MAX_ITER = 2000
CGM_CHECKPOINT_EVERY = 20
BM_MAX_ITER = 1000
# Burer-Monteiro settings passed through ``solver_options`` (see BurerMonteiroParams).
BM_OPTIONS = ("sigma", "phi", "eta", "tol", "feasibility_tol", "optimizer", "memory", "pair_dtype", "inner_max_iter",
              "inexact_max_iter", "inner_tol", "inner_rtol", "start", "start_tol", "start_max_iter", "balance",
              "increments", "precondition")


def default_sdp_k(n, n_clusters):
    """NOMAD's K when ``sdp_k`` is not given: max(n_clusters, min(max(4 n_clusters, 24), n // 10)).

    K sets the SDP's resolution: each point's row of Q spreads over about n / K
    neighbours.  K = n_clusters makes Q a hard clustering, which mixes manifolds (noisy
    rings, half-moons); a K a few times the number of clusters makes Q a band along each
    manifold, which spectral labels separate, and a finer Q is a better affinity on
    real data, at a cost that grows faster than K.  4 n_clusters is the smallest multiple
    that passed k-means and kNN spectral clustering on scikit-learn's digits, and 24 the
    smallest K that separated noisy rings, half-moons and swiss-roll sections at n =
    3,000; at most n / 10, so that a local group keeps about ten points.
    graphs/quality.py measures the rule on data sets it was not chosen on.
    """
    return int(max(n_clusters, min(max(SDP_K_PER_CLUSTER * n_clusters, SDP_K_MIN), n // SDP_K_MIN_GROUP)))


SDP_K_PER_CLUSTER = 4
SDP_K_MIN = 24
SDP_K_MIN_GROUP = 10


# Above this n, "auto" labels a low-rank Q (bm) by spectral clustering alone: its components
# would scan Q's n^2 / 2 pairs in tiles of Y Y^T in this process, O(n^2 r) (17 s at n = 50,000,
# r = 32 on 2 cores; quadratic: 2 hours at 10^6), against the spectral labels' O(n r^2), which
# are the components too where Q's groups are separated.
AUTO_COMPONENTS_MAX_N = 100_000


def nomad_labels(Q, n_clusters, label_method="auto", threshold=0.5, random_state=None, *, rows=None,
                 sums=None):
    """Hard labels of a NOMAD solution Q and the rule that gave them (``label_method``
    of :class:`NOMAD`): the components of Q where there are ``n_clusters`` of them (or
    where asked for), else ``n_clusters`` groups by spectral clustering of Q; "auto"
    does not look for the components of a low-rank Q of more than AUTO_COMPONENTS_MAX_N
    rows.  ``rows``: (space, name), Q = Y Y^T with Y that state of row chunks, in place
    of Q (None): spectral labels are taken where Y is held
    (:func:`dnomad.rounding.low_rank_spectral_labels`; ``sums``: its factor sums), and
    Y is gathered only to look for the components."""
    n = rows[0].n if rows is not None else Q.shape[0]
    too_large = (rows is not None or isinstance(Q, LowRankGram)) and n > AUTO_COMPONENTS_MAX_N
    if label_method == "components" or (label_method == "auto" and not too_large):
        labels = component_labels(Q if rows is None else LowRankGram(rows[0].get(rows[1])), threshold)
        if label_method == "components" or int(labels.max(initial=-1)) + 1 == n_clusters:
            return labels, "components"
    if rows is not None:
        return low_rank_spectral_labels(*rows, n_clusters, random_state, sums=sums), "spectral"
    return spectral_labels(Q, n_clusters, random_state), "spectral"


def layer_checkpoint_key(layer):
    return nomad_checkpoint_key if layer == 0 else f"{nomad_checkpoint_key}_layer{layer}"



def finished_layers(store):
    """How many inner layers of a multi-layer run in ``store`` have finished."""
    done = 0
    while store is not None and run_store.read_json(store, f"layers/{done}") is not None:
        done += 1
    return done


def _layer_record(res):
    return {"sdp_k": int(res.params.n_clusters), "n_iter": res.n_iter, "stop_reason": res.stop_reason,
            "objective": res.history[-1]["objective"] if res.history else float("nan"),
            "seconds": res.history[-1]["seconds"] if res.history else 0.0, "start": res.start}


def _layer_records(store, done):
    return [dict(run_store.read_json(store, f"layers/{layer}"), Q=None) for layer in range(done)]


def _normalized_low_rank(Y):
    Q = LowRankGram(Y)
    return ScaledMatrix(Q, Q.fro_norm, Q.fro_norm)

