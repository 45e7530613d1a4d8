"""The SymNMF estimator: simplicial symmetric NMF by Frank-Wolfe on a blocked affinity."""
from __future__ import annotations

import numbers
import time

import numpy as np

from .. import blocks
from ..base import (_NONNEGATIVE, _OPTIONAL_POSITIVE_INT, _POSITIVE, _POSITIVE_INT, _RUN_CONSTRAINTS, _Clustering,
                    _Estimator, _gated)
from ..blocks import memory, runs
from ..blocks import store as run_store
from ..blocks.cluster import BACKEND_CHOICES, choose_backend, client_context
from ..blocks.inputs import InputSource, is_precomputed
from ..errors import InputValueError
from ..rounding import kmeans_rows
from ..validation import Interval, Options
from . import solvers as symnmf


class SymNMF(_Clustering, _Estimator):
    """Simplicial symmetric NMF: min 1/4 ||P - W W^T||_F^2 over W >= 0 with rows on the
    simplex, by Frank-Wolfe (Zhao & Gordon 2018), on a blocked affinity P.

    Row i of ``components_`` is point i's cluster-membership distribution.  P is a
    Gaussian affinity built blockwise from X (by default with local scaling,
    exp(-||x_i - x_j||^2 / (s_i s_j)), s_i a multiple of the distance from x_i to a
    neighbour chosen from the data, see ``n_neighbors``; or
    exp(-||x_i - x_j||^2 / bandwidth), the paper's), or a given
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
        Lanczos estimate of ||P||_2 first; tiny steps: C grows as n^2).  Projected
        gradient: backtracking that starts from twice the last accepted step, or
        ("paper") plain backtracking from step 1 every iteration.
    stop_rule : {"gap", "objective"}, default "gap"
        "gap": stop when the FW gap <= tol ||P||_F^2 (the gap is 0 exactly at KKT points,
        Thm. 1); "objective": the paper's experiments, |f_t - f_{t-1}| < objective_tol.
    tol : float, default 1e-4
        Relative FW gap, gap / ||P||_F^2, for stop_rule="gap" (Frank-Wolfe and PGD; the
        penalty method always stops by the paper's objective rule).  Frank-Wolfe's gap is
        bounded by O(1/sqrt(t)) on nonconvex problems (Thm. 2): a smaller tol can cost
        many more iterations.
    objective_tol : float, default 1e-3
        Absolute change of f (the paper's epsilon), for stop_rule="objective".
    max_iter : int, optional
        Iterations (outer ones for the penalty method); default 1000, or 50 with
        stop_rule="objective" (the paper's setting).
    affinity : {"gaussian", "precomputed"}, default "gaussian"
    bandwidth : float, optional
        Of the Gaussian affinity.  None (the default): local scaling (Zelnik-Manor &
        Perona 2004), s_i s_j in place of the bandwidth with s_i the distance from x_i
        to its ``n_neighbors``-th nearest neighbour, which follows the data's own
        scale; a number: one bandwidth for every pair (1.0 is the paper's protocol,
        which makes P nearly the identity on data whose distances are not O(1)).
    n_neighbors : int or "auto", default "auto"
        The neighbour whose distance is a point's scale s_i (with ``bandwidth=None``).
        "auto": chosen from X so that P's mean row sum is a tenth of a mean cluster's
        size, n / (10 n_clusters) (at least 8 and at most n / 2), as W W^T's row sums are
        the cluster sizes: the smallest neighbour from the 7th to the 256th that reaches
        it, or the 7th's or 256th's distances times a common factor past either end
        (:func:`calibrated_scales`: it follows the data's dimension, where distances
        concentrate, and its clusters' extent); an int: that neighbour (7 is
        Zelnik-Manor and Perona's, for spectral clustering).
    init : {"auto", "kmeans", "random"} or ndarray (n, k), default "auto"
        "kmeans": each row 0.9 on its k-means++ cluster of X (the best of 10 seedings,
        :func:`dnomad.rounding.kmeans_rows`) and 0.1 spread evenly, as the K-means SDP
        papers start their solvers; "random": rows drawn uniformly from the simplex
        (seeded by ``random_state``); or a given feasible start.  "auto" (and None):
        "kmeans" for data X, "random" for a precomputed affinity.
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
    verbose : int, default 0
        Progress on stderr: 0 none, 1 a live line, 2 a line per iteration (:mod:`dnomad.progress`).

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
        The step rule used ("backtracking" or "plain backtracking" for pgd, "L-BFGS" for
        penalty).
    spectral_norm_ : float or None
        ||P||_2 when the paper's step needed it.
    n_neighbors_, scale_factor_ : int and float, or None
        The local scales used, s_i = scale_factor_ times the distance to the
        n_neighbors_-th neighbour (None for a bandwidth or a precomputed affinity).

    Notes
    -----
    Per Frank-Wolfe iteration: one pass over P (``BlockMatrix.label_sums``: the LMO's
    vertex is one-hot, so P S sums P's columns by label); O(n k^2) work on W and M = P W
    in this process; each block sends b x k partial sums.  Peak memory per worker: a few
    blocks.  P itself is n^2 / 2 entries (upper blocks).  Local scales cost one O(n^2 d)
    pass over X in this process, in chunks of 256 MiB; "auto" keeps an n x 256 table of
    neighbour distances and 500 x min(n, 20,000) sampled distances (80 MB at most).

    References
    ----------
    H. Zhao, G. Gordon. Frank-Wolfe optimization for symmetric-NMF under simplicial
    constraint. UAI 2018 (arXiv:1706.06348).
    H. Zhao, P. Poupart, Y. Zhang, M. Lysy. SoF: soft-cluster matrix factorization for
    probabilistic clustering. AAAI 2015.
    """

    AFFINITIES = ("gaussian", "precomputed")
    INITS = ("auto", "kmeans", "random")

    _checkpoints = True
    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "solver": [Options(*symnmf.METHODS)],
        "step_rule": [Options(*symnmf.STEP_RULES)], "stop_rule": [Options(*symnmf.STOP_RULES)],
        "tol": _NONNEGATIVE, "objective_tol": _NONNEGATIVE, "max_iter": _OPTIONAL_POSITIVE_INT,
        "affinity": [Options(*AFFINITIES)], "bandwidth": [None] + _POSITIVE,
        "n_neighbors": [Options("auto"), Interval(numbers.Integral, 1, None)],
        "init": [None, Options(*INITS), "array-like"], "dtype": ["dtype"],
        "block_size": _OPTIONAL_POSITIVE_INT, "backend": [Options(*BACKEND_CHOICES)],
        "checkpoint_every": _POSITIVE_INT, "callback": [None, "callback"], **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=8, *, solver="fw", step_rule="line_search", stop_rule="gap",
                 tol=1e-4, objective_tol=1e-3, max_iter=None, affinity="gaussian", bandwidth=None,
                 n_neighbors="auto", init="auto", random_state=None, dtype=np.float32, block_size=None,
                 backend="auto", store=None, overwrite=False, checkpoint_every=50, callback=None, verbose=0):
        self.n_clusters = n_clusters
        self.solver = solver
        self.step_rule = step_rule
        self.stop_rule = stop_rule
        self.tol = tol
        self.objective_tol = objective_tol
        self.max_iter = max_iter
        self.affinity = affinity
        self.bandwidth = bandwidth
        self.n_neighbors = n_neighbors
        self.init = init
        self.random_state = random_state
        self.dtype = dtype
        self.block_size = block_size
        self.backend = backend
        self.store = store
        self.overwrite = overwrite
        self.checkpoint_every = checkpoint_every
        self.callback = callback
        self.verbose = verbose

    def _memory_parts(self, n, d, x_kind="numpy"):
        """What a fit on n rows of d features holds (:func:`dnomad.plan`): P in blocks;
        in the client, the iterate W and the step's n x k arrays, the k-means start's
        distances, and, for local scaling, the neighbour table (n x m, m <= 256) with
        the larger of a block of squared distances and the scale calibration's sample
        of distances (500 rows, with the temporaries of its trials)."""
        from ..blocks.builders import NEIGHBOUR_BLOCK_BYTES

        k = self.n_clusters
        client = {f"W, P W and the step's n x {k} arrays (about 6)": 6 * 8 * n * k}
        if self.affinity != "precomputed" and self.init in (None, "auto", "kmeans"):
            client["the k-means start's distances (n x k, with temporaries)"] = 4 * 8 * n * k
        if self.affinity != "precomputed" and self.bandwidth is None:
            m = min(n - 1, MAX_SCALING_NEIGHBOUR if self.n_neighbors == "auto" else int(self.n_neighbors))
            client[f"the local scales' neighbour table (n x {m}) and its square roots"] = 2 * 8 * n * m
            # the trials' distances and about two temporaries (traced: 2.5 at n = 8,000)
            sample = 3 * 8 * MASS_SAMPLE_ROWS * min(n, MASS_SAMPLE_COLUMNS) if self.n_neighbors == "auto" else 0
            client["a block of squared distances, or the calibration's sample (the larger)"] = max(
                min(NEIGHBOUR_BLOCK_BYTES, 8 * n * n), sample)
        passes = {"the affinity": "one pass writing P's blocks from X's panels",
                  "each iteration": "a pass over P's blocks (P W), and the line search's products"}
        return memory.MemoryParts(matrices=1, itemsize=blocks.check_dtype(self.dtype).itemsize, client=client,
                                  passes=passes)

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
            source = InputSource(X, precomputed=True, center=False, normalize=False, owner="SymNMF",
                                  dtype=dtype, nonnegative=True)
        else:
            if is_precomputed(X):
                raise InputValueError("X is a BlockMatrix: pass affinity='precomputed' to factor it")
            source = InputSource(X, precomputed=False, center=False, normalize=False, owner="SymNMF",
                                  dtype=dtype)
        n = source.n
        params = self._params(n)
        local_scaling = source.data is not None and self.bandwidth is None
        if local_scaling and self.n_neighbors != "auto" and self.n_neighbors >= n:
            raise InputValueError(f"n_neighbors must be < n = {n} (the number of rows of X); got "
                                  f"{self.n_neighbors}: pass a smaller int or 'auto'")
        W0 = self._start(n, source.data)
        backend = source.matrix.backend if source.matrix is not None else \
            choose_backend(self.backend, n, dtype, n_matrices=1, store=self.store,
                            what="the affinity P")
        save = None
        if self.store is not None:
            # The start (init, random_state) is not part of the run's identity: a resumed
            # run continues from its checkpoint, whatever start it was given.
            run_id = runs.run_identity("symnmf", params, source, dtype, self.block_size, solver=self.solver,
                             affinity=self.affinity, bandwidth=self.bandwidth,
                             n_neighbors=self.n_neighbors if local_scaling else None)
            record = runs.run_record("symnmf", self, runs.source_input_record(source), run_id)
            self._claim_store(run_id, resume, record)
            if resume and self._load_finished(params.max_iter):
                return self
            if not resume:
                runs.write_run_record(self.store, record, source)
            save = run_store.Checkpoints(self.store, SYMNMF_CHECKPOINT_KEY).save

        self.n_neighbors_ = self.scale_factor_ = None
        scales = self._scales(source.data, resume) if local_scaling else None
        self._report_progress(f"SymNMF ({self.solver})", show=("objective",), max_iter=params.max_iter)

        def attempt(resume):
            state = _load_symnmf_checkpoint(self.store) if resume else None
            res = self._solve(source, backend, dtype, params, W0, scales, state, save)
            self._finish(res, backend, dtype, start)

        self.restarts_ = runs.with_restarts(attempt, store=self.store, resume=resume,
                                        checkpoint_key=SYMNMF_CHECKPOINT_KEY,
                                        rebuildable=source.matrix is None)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def _solve(self, source, backend, dtype, params, W0, scales, state, save):
        n = source.n
        with client_context(backend, n) as client:
            kw = dict(block_size=self.block_size, dtype=dtype, backend=backend,
                      client=client if backend != "local" else None, store=self.store)
            if source.data is not None:
                P = blocks.gaussian_affinity(source.data, self.bandwidth, scales=scales, name="P", **kw)
            elif source.matrix is not None:
                P = source.matrix
            else:
                group, _ = source.build(**kw, on_digest=source.content_check(self.store))
                P = blocks.BlockMatrix(group, "D")
            try:
                summ = P.summary()
                if summ["min"] < 0:
                    raise InputValueError(f"the affinity must be nonnegative; its smallest entry is "
                                          f"{summ['min']:.3g}")
                if params.stop_rule == "gap":
                    # The rule's target is relative to ||P||_F^2, known from here on.
                    self._fit_progress.targets = {"gap": params.tol * summ["fro"] ** 2}
                with blocks.single_threaded_blas():
                    res = symnmf.solve(self.solver, P, W0, params, fro2=summ["fro"] ** 2,
                                       callback=self._fit_callback, state=state, checkpoint=save,
                                       checkpoint_every=self.checkpoint_every)
            finally:
                if source.matrix is None:
                    P.group.close()
        return res

    def _scales(self, X, resume):
        """The local scales of P (``n_neighbors_`` and ``scale_factor_`` say which).  A
        run in a store records the ones "auto" chose, and a resumed run reads them: it
        goes on with the P it started on."""
        recorded = run_store.read_json(self.store, SCALES_RECORD) if resume else None
        if recorded is not None:
            m, c = int(recorded["n_neighbors"]), float(recorded["scale_factor"])
            s = c * local_scales(X, m)
        elif self.n_neighbors == "auto":
            s, m, c = calibrated_scales(X, self.n_clusters)
        else:
            m, c = int(self.n_neighbors), 1.0
            s = local_scales(X, m)
        if self.store is not None and recorded is None:
            run_store.write_json(self.store, SCALES_RECORD, {"n_neighbors": m, "scale_factor": c})
        self.n_neighbors_, self.scale_factor_ = m, c
        return s

    def _start(self, n, X):
        k = self.n_clusters
        if self.init is None or isinstance(self.init, str):
            init = "auto" if self.init is None else self.init
            if init not in self.INITS:
                raise InputValueError(f'init must be one of {self.INITS} or an (n, k) array; got {self.init!r}')
            if init == "auto":
                init = "random" if X is None else "kmeans"
            rng = self.random_state if isinstance(self.random_state, np.random.Generator) else \
                np.random.default_rng(self.random_state)
            if init == "random":
                return symnmf.random_simplex_rows(n, k, rng)
            if X is None:
                raise InputValueError('init="kmeans" clusters the rows of data X; a precomputed affinity has '
                                      'none: use init="random" or an (n, k) array')
            W0 = np.full((n, k), KMEANS_START_SPREAD / k)
            W0[np.arange(n), kmeans_rows(X, k, rng)] += 1.0 - KMEANS_START_SPREAD
            return W0
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
            runs.write_result(self.store, {"W": res.W, "labels": self.labels_}, {
                "n_iter": res.n_iter, "stop_reason": res.stop_reason, "objective": res.objective,
                "gap": res.gap, "passes": res.passes, "solver": res.method,
                "step_rule": res.step_rule, "dtype": np.dtype(dtype).name,
                "n_neighbors": self.n_neighbors_, "scale_factor": self.scale_factor_},
                res.history, time.perf_counter() - start)


SYMNMF_CHECKPOINT_KEY = "symnmf_checkpoint"
# The local scales a run in a store was started with (its P, for a resume).
SCALES_RECORD = "symnmf_scales"


# n_neighbors="auto": P's mean row sum as a fraction of a mean cluster's size n / k
# (graphs/symnmf_affinity.py); W W^T's row sums are the cluster sizes at a partition.
AFFINITY_MASS = 0.1
# The neighbours "auto" chooses among: from Zelnik-Manor and Perona's 7th up to a table
# of O(n m) distances; past either end the scales shrink or grow by a common factor.
MIN_SCALING_NEIGHBOUR = 7
MAX_SCALING_NEIGHBOUR = 256
# Rows whose affinities estimate P's mean row sum, and the columns they are summed over
# where n is larger (fixed samples: P depends on X alone; 500 x 20,000 distances).
MASS_SAMPLE_ROWS = 500
MASS_SAMPLE_COLUMNS = 20000
# Pairs of points this close, relative to their squared norms, count as duplicates.
DUPLICATE_RTOL = 1e-12
# The bisection on "auto"'s common factor c stops with c known to this relative width
# (in high dimensions P's row sums move some 40 times faster than c).
SCALE_FACTOR_RTOL = 1e-6
# The weight a k-means start spreads evenly over the other clusters: a row at a vertex
# of the simplex would start on the boundary of the feasible set.
KMEANS_START_SPREAD = 0.1


def calibrated_scales(X, n_clusters):
    """SymNMF's local scales for ``n_neighbors="auto"``: s_i = c d_m(x_i), d_m the
    distance to the m-th nearest neighbour (floored as :func:`local_scales` floors it),
    with the smallest m in [7, 256] (and c = 1) for which P's mean row sum over x_i and
    the points apart from it, 1 + sum_{x_j != x_i} exp(-||x_i - x_j||^2 / (s_i s_j))
    (duplicates add 1 whatever the scale), reaches ``AFFINITY_MASS`` n / n_clusters
    (at least 8, the point itself and 7 others, and at most n / 2); where m = 7 already
    exceeds it (high-dimensional data, whose distances concentrate) c < 1 at m = 7
    meets it, where m = 256 falls short c > 1 does.  The mean row sum is estimated on a
    fixed sample of rows, against a fixed sample of columns where n is large.
    Returns (s, m, c).  Cost: one O(n^2 d) pass for the neighbour table (n x m
    numbers) and O(rows x columns) work per trial."""
    n = len(X)
    target = min(max(AFFINITY_MASS * n / n_clusters, 1.0 + MIN_SCALING_NEIGHBOUR), n / 2)
    low = min(MIN_SCALING_NEIGHBOUR, n - 1)
    high = max(low, min(MAX_SCALING_NEIGHBOUR, n - 1))
    table = blocks.neighbour_distance_table(X, high)
    rng = np.random.default_rng(0)
    columns = np.arange(n) if n <= MASS_SAMPLE_COLUMNS else \
        np.sort(rng.choice(n, MASS_SAMPLE_COLUMNS, replace=False))
    rows = np.sort(rng.choice(columns, min(len(columns), MASS_SAMPLE_ROWS), replace=False))
    d2 = blocks.squared_distances_from(X, rows, columns)
    # The row's own 1 is added below, and duplicates add 1 at any scale: pairs at a
    # distance within round-off of ||x_i||^2 + ||x_j||^2 - 2 x_i.x_j's are left out.
    norms2 = np.einsum("ij,ij->i", X, X)
    d2[d2 <= DUPLICATE_RTOL * (norms2[rows, None] + norms2[None, columns])] = np.inf
    others = (n - 1) / (len(columns) - 1)                                  # column sample -> all n - 1 others

    def scales(m, c=1.0):
        return c * _floored(table[:, m - 1])

    def mass(s):
        return 1.0 + others * float(np.exp(-d2 / (s[rows, None] * s[None, columns])).sum(axis=1).mean())

    over, short = mass(scales(low)) >= target, mass(scales(high)) < target
    if over or short:
        m, (lo, hi) = (low, (1e-3, 1.0)) if over else (high, (1.0, 1e3))
        while hi / lo > 1.0 + SCALE_FACTOR_RTOL:                           # bisection on log c
            mid = np.sqrt(lo * hi)
            lo, hi = (mid, hi) if mass(scales(m, mid)) < target else (lo, mid)
        c = float(np.sqrt(lo * hi))
        return scales(m, c), m, c
    lo, hi = low, high                             # mass(lo) < target <= mass(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if mass(scales(mid)) < target else (lo, mid)
    return scales(hi), hi, 1.0


def local_scales(X, n_neighbors):
    """s_i: the distance from x_i to its ``n_neighbors``-th nearest neighbour (at most
    n - 1), floored as :func:`_floored` floors it."""
    return _floored(blocks.neighbour_distances(X, min(n_neighbors, len(X) - 1)))


def _floored(s):
    """Scales floored at the smallest positive one, so that duplicated points (a scale
    of 0) get a finite affinity."""
    positive = s[s > 0]
    return np.maximum(s, positive.min() if positive.size else 1.0)


def _load_symnmf_checkpoint(store):
    state = run_store.Checkpoints(store, SYMNMF_CHECKPOINT_KEY).load()
    if state is None:
        raise InputValueError(f"store {run_store.redact(str(store))!r} has no SymNMF checkpoint to resume from")
    return state
