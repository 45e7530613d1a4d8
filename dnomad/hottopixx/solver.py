"""HOTTOPIXX: separable NMF by a linear program solved with incremental subgradients.

V. Bittorf, B. Recht, C. Re, J. A. Tropp, "Factoring nonnegative matrices with linear
programs", NIPS 2012 (arXiv:1206.1270), Alg. 3, 4, 5 and Sec. 4.1.

X is f x n (features x examples), nonnegative, rows summing to 1.  A factorization
localizing matrix C (f x f) solves

    min p^T diag C  s.t.  C in Phi_tau(X) = {C >= 0, ||C X - X||_{inf,1} <= tau, Tr C = r,
                                             diag C <= 1, C_ij <= C_jj}           (Alg. 3)

and the r largest diagonal entries of C name the hott rows I; W = X_I and
F = argmin_{Z >= 0} ||X - Z W||_{inf,1} (eq. 2).

Symbols -> code: p -> ``cost``, beta -> ``beta``, s_p / s_d -> ``primal_step`` /
``dual_step``, mu_j -> nnz(X_j) / n, Phi_0 -> ``kernels.squish_columns`` (Alg. 5) or
``kernels.clip_phi`` (Sec. 4's clipping), ||.||_{inf,1} -> ``metrics.inf1_norm`` (the
largest row l1 norm).

The diagonal term.  The Lagrangian of Sec. 4 is
    L = sum_k ( sum_i |X_ik - C_i X_k| + sum_{j in supp X_k} mu_j (p_j + beta) C_jj ) + ...
and its subgradient step for column k lowers C_jj by s_p mu_j (p_j + beta); the printed
Alg. 4 writes diag(mu o (beta 1 - p)), whose sign on p is the opposite.  We follow the
Lagrangian (p_j + beta).  The weight mu_j must also make the per-column terms add up to
the objective's (p_j + beta) C_jj over an epoch: with mu_j = nnz(X_j) / n applied at the
nnz(X_j) columns where X_jk != 0 they would add up to nnz(X_j)^2 / n times it (n times,
for dense X, which drives every C_jj to 0 at the paper's steps).  We take the step
s_p (p_j + beta) / nnz(X_j) at each column where X_jk != 0, i.e. the paper's mu_j with
the 1/n of the incremental method's averaging made explicit: summed over an epoch, each
diagonal entry moves by exactly s_p (p_j + beta).

Solvers never see Zarr or a task graph: the epoch is the engine's block-nested loop
(``kernels.epoch``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .. import blocks
from .._checks import (check_choices, check_solver_params, generator_from_state, check_count, check_ints,
                       check_numbers, check_time_limit)
from ..errors import InputValueError, LPFailedError, TimeLimitError
from ..linalg.lp import linprog_highs
from ..metrics import l1_fits
from . import kernels


logger = logging.getLogger(__name__)

PROJECTIONS = ("squish", "clip")
COMPONENT_FITS = ("subgradient", "lp")
SELECTIONS = ("clusters", "diagonal")
FAST_EPOCHS = 4          # the paper's "hott (fast)" setting (Sec. 5, Fig. 2)


@dataclass
class HottopixxParams:
    """Parameters of :func:`hottopixx` (defaults: the paper's runs, Sec. 5)."""

    rank: int
    n_epochs: int = 50
    primal_step: float = 1e-1
    dual_step: float = 1e-2
    projection: str = "squish"
    clean_epochs: int = 10
    clean_step: float = 1.0
    clean_decay: float = 0.6
    fit_components: str = "subgradient"
    selection: str = "clusters"
    cluster_threshold: float = 0.8
    row_block: int | None = None
    cost_scale: float = 1e-1
    error_every: int = 1

    def validate(self, f):
        check_count("rank", self.rank, 1, f, "n_features")
        check_ints(self, ("n_epochs", "error_every"))
        if self.row_block is not None:
            check_ints(self, ("row_block",))
        check_ints(self, ("clean_epochs",), minimum=0)
        check_numbers(self, ("primal_step", "dual_step", "cost_scale", "clean_step"), positive=True)
        if not 0 < self.clean_decay <= 1:
            raise InputValueError(f"clean_decay must be in (0, 1]; got {self.clean_decay!r}")
        check_choices(self, {"projection": PROJECTIONS, "fit_components": COMPONENT_FITS,
                             "selection": SELECTIONS})
        if not 0 < self.cluster_threshold <= 1:
            raise InputValueError(f"cluster_threshold must be in (0, 1]; got {self.cluster_threshold!r}")


@dataclass(frozen=True, eq=False)
class HottopixxResult:
    """What :func:`hottopixx` returns.

    Attributes
    ----------
    hott_rows : ndarray (r,)
        Indices of the hott rows, by decreasing diagonal of C.
    F : ndarray (f, r)
        Nonnegative weights with X ~ F X_I (X with rows scaled to sum 1).
    diag : ndarray (f,)
        Diagonal of C after the last epoch.
    C : ndarray (f, f)
    history : list of dict
        Per epoch: ``epoch``, ``trace`` (Tr C), ``beta``, ``error`` (||X - C X||_{inf,1};
        None between every ``error_every``-th epoch), ``seconds``.
    error : float
        ||X - F X_I||_{inf,1}.
    clusters : list of ndarray
        The candidate groups the hott rows were picked from (``selection="clusters"``).
    stop_reason : str
        "max_iter" (all ``n_epochs`` ran) or "callback".
    """

    hott_rows: np.ndarray
    F: np.ndarray
    diag: np.ndarray
    C: np.ndarray
    history: list
    error: float
    cost: np.ndarray
    clusters: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    stop_reason: str = "max_iter"


def check_data(X):
    """X as float64 f x n (dense, or scipy.sparse CSR), finite, nonnegative, rows scaled to
    sum 1 (the paper's assumption); a zero row cannot be scaled and is refused."""
    import scipy.sparse as sp

    data = blocks.feature_columns(X)
    if data.kind == "sparse":
        cols = data.columns
        return sp.csc_matrix((cols.data, cols.indices, cols.indptr), shape=(data.f, data.n)).tocsr()
    return np.ascontiguousarray(data.columns.T)


def hottopixx(X, params: HottopixxParams, *, random_state=None, callback=None, client=None, state=None,
              checkpoint=None, checkpoint_every=10):
    """Alg. 4 (HOTTOPIXX): the hott rows of X and F with X ~ F X_hott.

    Parameters
    ----------
    X : array, scipy.sparse matrix, dask or Zarr array (f, n), or blocks.FeatureColumns
        Nonnegative; rows are scaled to sum 1 (``blocks.feature_columns``, which also
        stages a large dask/Zarr X in a store).  Sparse X is streamed by its nonzeros
        (per column, b nnz(X_k) work per task).
    params : HottopixxParams
        Checked by ``params.validate`` on entry, except inside an estimator's fit
        (which checked them before reading any data).
        ``rank`` r, ``n_epochs`` (50; 4 is the paper's "fast" setting), ``primal_step``
        s_p (0.1), ``dual_step`` s_d (0.01), ``projection`` ("squish": the exact
        projection onto Phi_0 after every epoch; "clip": Sec. 4's clipping, enough when
        the factorization is unique), ``selection`` (how the hott rows are read off C,
        see Notes), ``fit_components`` ("subgradient": ``clean_epochs`` incremental-
        subgradient epochs on F from C's columns, the step ``clean_step`` times
        ``clean_decay`` per epoch; "lp": the exact LP of eq. 2 per row, scipy HiGHS,
        small sizes), ``row_block``
        (rows of C per task; None: ``blocks.default_row_block``, about 1 MB of C), ``cost_scale`` (the cost p is drawn with distinct entries
        in [0, cost_scale)), ``error_every`` (epochs between the history's
        ||X - C X||_{inf,1}, a pass over X; None in the rows between, always at the end).
    random_state : int or Generator
        Seeds the cost p and each epoch's column order.
    callback : callable, optional
        Called with each history row; returning True stops after that epoch.
    client : dask.distributed.Client, optional
        Runs the row-block tasks on its workers when X's columns are in Zarr.
    state : dict, optional
        A state handed to ``checkpoint`` earlier: the epochs go on from it exactly as if
        the run had not stopped (``random_state`` is then not used).
    checkpoint : callable, optional
        Called every ``checkpoint_every`` epochs and after the last with the run's state:
        C (f x f), the costs, beta, the generator's state, the history, the stop reason.

    Returns
    -------
    HottopixxResult

    Notes
    -----
    Reading the hott rows off C.  Alg. 4 takes I = {i : C_ii = 1}, i.e. the r largest
    diagonal entries (``selection="diagonal"``).  After 50 epochs the diagonal is far
    from the LP's 0/1 solution (hott entries 0.2-0.5 on the issue's grid: incremental
    subgradients converge slowly on this ill-conditioned L1 problem), and two failure
    modes remain: the copies of a duplicated topic split their mass (the cost p breaks
    the tie only slowly), and a row that is 99% one topic sits level with that topic.
    ``selection="clusters"`` (default) groups rows that express each other in C
    (C_jh >= theta C_hh and C_hj >= theta C_jj, theta = ``cluster_threshold``), walking
    the diagonal downwards until there are r groups, and keeps in each group the member
    farthest (in l1) from the convex hull of the other candidates, eliminating the
    most interior member first (one small LP per test, HiGHS).  On the noiseless grid
    f in {40, 80}, n = 10 f, r in {3, 5}, d in {0, 1}, 8 seeds: "diagonal" recovers the
    hott rows on 16 of 24 (first 3 seeds), "clusters" on 64 of 64.

    Per epoch: f^2 n multiply-adds for dense X (b rows of C stream all of X per task),
    the projection (f columns of length f sorted: f^2 log f), and the history's
    ||X - C X||_{inf,1} (one more pass over X, f^2 n).
    """
    data = X if isinstance(X, blocks.FeatureColumns) else blocks.feature_columns(X)
    f, n = data.shape
    check_solver_params(params, f)
    if state is None:
        rng = np.random.default_rng(random_state)
        # Distinct costs in [0, cost_scale).  The Lagrangian keeps the residual weights w = 1
        # (Sec. 4 updates only beta), which is an exact penalty for the LP only when the costs
        # spread little against them: minimized exactly (HiGHS) at the beta where Tr C = r,
        # it picked the hott rows on 24 of 24 noiseless instances of the grid with
        # costs in [0, 0.01), 23 of 24 in [0, 0.1), and failed in [0, 1).  Smaller costs
        # break ties more slowly, though: 50 incremental epochs found them on 10 of 24 at
        # 0.01 and 16 of 24 at 0.1, hence 0.1.
        cost = params.cost_scale * (rng.permutation(f) + rng.random(f) / 2) / f
        C, beta, history, stop_reason = np.zeros((f, f)), 0.0, [], "max_iter"
    else:
        rng, cost, C, beta, history, stop_reason = _resumed(state, f)
    row_block = params.row_block or blocks.default_row_block(f)
    project = kernels.squish_columns if params.projection == "squish" else kernels.clip_phi
    t0 = time.perf_counter() - (history[-1]["seconds"] if history else 0.0)
    # A run saved when its callback stopped it ends there, as it did.
    end = len(history) if stop_reason == "callback" else params.n_epochs
    for epoch in range(len(history) + 1, end + 1):
        order = data.order(rng)
        diag_step = params.primal_step * (cost + beta) / data.nnz
        kernels.epoch(C, data.columns, order, params.primal_step, diag_step, row_block=row_block, client=client)
        C = project(C)
        trace = float(np.trace(C))
        beta += params.dual_step * (trace - params.rank)
        # The error costs one more pass over X (as much as the epoch for dense X).
        error = float(data.residual_l1(C, client=client).max()) \
            if epoch % params.error_every == 0 or epoch == params.n_epochs else None
        row = {"epoch": epoch, "trace": trace, "beta": beta, "error": error,
               "seconds": time.perf_counter() - t0}
        history.append(row)
        logger.debug("HOTTOPIXX epoch %d  Tr C %.4g  beta %.4g  err %s", epoch, trace, beta, error)
        if callback is not None and callback(dict(row)) is True:
            stop_reason = "callback"
        last = stop_reason == "callback" or epoch == params.n_epochs
        if checkpoint is not None and (epoch % checkpoint_every == 0 or last):
            # The generator's state too: the next epoch's column order and the cleaning's
            # draws continue as in a run that did not stop.
            checkpoint({"C": C.copy(), "cost": cost, "beta": beta, "rng": rng.bit_generator.state,
                        "history": [dict(row) for row in history], "stop_reason": stop_reason})
        if stop_reason == "callback":
            break
    diag = np.diagonal(C).copy()
    if params.selection == "clusters":
        hott, clusters = select_hott_rows(C, params.rank, lambda idx: data.rows(idx, client=client),
                                          theta=params.cluster_threshold)
    else:
        hott, clusters = hott_rows_from_diagonal(diag, params.rank), []
    F = fit_components(data, hott, params, C=C, rng=rng, client=client)
    error = float(data.residual_l1(F, hott, client=client).max())
    return HottopixxResult(hott_rows=hott, F=F, diag=diag, C=C, history=history, error=error,
                           cost=cost, clusters=clusters, stop_reason=stop_reason)


def _resumed(state, f):
    """The generator, costs, C, beta, history and stop reason of a checkpointed run."""
    C = np.array(state["C"], dtype=np.float64)
    if C.shape != (f, f):
        raise InputValueError(f"the checkpoint holds C of shape {C.shape}, expected ({f}, {f}) for this X")
    rng = generator_from_state(state["rng"])
    return (rng, np.array(state["cost"], dtype=np.float64), C, float(state["beta"]),
            [dict(r) for r in state["history"]], state.get("stop_reason") or "max_iter")


def hott_rows_from_diagonal(diag, r):
    """The r largest diagonal entries (ties broken by index), by decreasing value."""
    return np.argsort(-diag, kind="stable")[:r]


def candidate_groups(C, r, theta=0.8):
    """Rows grouped by mutual use in C, walking the diagonal downwards: row j joins the
    group of an earlier head h when C_jh >= theta C_hh and C_hj >= theta C_jj (each row
    expresses the other: copies of one topic, or a near-pure mixture and its topic); a
    row that joins none heads a new group while fewer than r exist.  Returns the groups,
    each ordered by decreasing diagonal."""
    d = np.diagonal(C)
    heads, groups = [], []
    for j in np.argsort(-d, kind="stable"):
        if d[j] <= 0:
            break
        for h, group in zip(heads, groups):
            if C[j, h] >= theta * d[h] and C[h, j] >= theta * d[j]:
                group.append(int(j))
                break
        else:
            if len(heads) < r:
                heads.append(j)
                groups.append([int(j)])
    return [np.array(g) for g in groups]


def select_hott_rows(C, r, rows, *, theta=0.8, tol=1e-9, max_group=6):
    """One hott row per candidate group (:func:`candidate_groups`): within a group,
    repeatedly drop the member nearest (l1) to the convex hull of the other candidates
    (ties within ``tol``: the smaller diagonal), until one is left.  ``rows(idx)`` returns
    X[idx] densely.  Groups keep their ``max_group`` members of largest diagonal (a group
    of m members costs up to m^2 / 2 hull tests; on real data such as the health tweets
    groups reach hundreds of rows).  Returns (hott rows by decreasing diagonal, groups)."""
    d = np.diagonal(C)
    groups = [g[:max_group] for g in candidate_groups(C, r, theta)]
    if len(groups) < r:
        # Fewer than r rows with a positive diagonal: fill up by the diagonal.
        taken = set(np.concatenate(groups).tolist()) if groups else set()
        rest = [j for j in np.argsort(-d, kind="stable") if j not in taken]
        groups += [np.array([j]) for j in rest[:r - len(groups)]]
    members = np.concatenate(groups)
    Xc = rows(members)
    where = {int(j): a for a, j in enumerate(members)}
    hott = []
    for q, group in enumerate(groups):
        alive = list(group)
        others = [where[int(j)] for p, g in enumerate(groups) if p != q for j in g]
        while len(alive) > 1:
            dist = np.array([hull_distance(Xc[where[j]], Xc[others + [where[i] for i in alive if i != j]])
                             for j in alive])
            near = np.flatnonzero(dist <= dist.min() + tol)
            alive.pop(min(near, key=lambda a: (d[alive[a]], -a)))
        hott.append(alive[0])
    hott = np.array(hott, dtype=np.int64)
    return hott[np.argsort(-d[hott], kind="stable")], groups


# Above this many columns the hull test runs projected incremental subgradient epochs
# instead of an LP: HiGHS takes seconds per test at n = 63,000 (the health tweets), and a
# group of m candidates needs up to m^2 / 2 tests.
HULL_LP_MAX_COLUMNS = 4000


def hull_distance(x, W, *, epochs=20, rng=None):
    """min_{z >= 0} ||x - z^T W||_1: the l1 distance from x to the cone of W's rows (for
    rows on the simplex, the convex hull up to the sum constraint).  An LP (HiGHS) up to
    ``HULL_LP_MAX_COLUMNS`` columns; above, ``epochs`` cleaning epochs (the kernel that
    fits F, step 1.0 shrinking by 0.7 per epoch), an upper bound close to it."""
    if x.shape[0] <= HULL_LP_MAX_COLUMNS:
        return l1_fits(x, W)[1][0]
    m = W.shape[0]
    Xt = np.ascontiguousarray(np.vstack([x, W]).T)
    z = np.zeros((1, m))
    rng = rng if rng is not None else np.random.default_rng(0)
    step = 1.0
    for _ in range(epochs):
        kernels.clean_rows_block(z, np.array([0]), Xt, rng.permutation(len(x)), np.arange(1, m + 1), step)
        step *= 0.7
    return float(np.abs(x - z[0] @ W).sum())


def fit_components(data, hott, params, *, C=None, rng=None, client=None):
    """F = argmin_{Z >= 0} ||X - Z X_I||_{inf,1} (eq. 2) for the hott rows I; ``data`` is
    a blocks.FeatureColumns or anything :func:`blocks.feature_columns` takes."""
    if not isinstance(data, blocks.FeatureColumns):
        data = blocks.feature_columns(data)
    hott = np.asarray(hott, dtype=np.int64)
    if params.fit_components == "lp":
        Xr = data.rows(np.arange(data.f), client=client)
        return exact_components(Xr, hott)
    f, r = data.f, len(hott)
    Z = np.ascontiguousarray(C[:, hott]) if C is not None else np.zeros((f, r))
    Z[hott, np.arange(r)] = 1.0          # a hott row is itself
    rng = rng if rng is not None else np.random.default_rng(0)
    # A constant step leaves a noise floor of its own size: the paper's 2 epochs at 0.1
    # from C's columns left ||X - F W||_{inf,1} at 0.15-0.45 on noiseless instances
    # where the LP's is 0.  Geometric decay from 1.0 by 0.6 per epoch reaches the LP's
    # error to 3 digits in 10 epochs (noiseless and eta = 0.95, f = 40..80).
    step = params.clean_step
    for _ in range(params.clean_epochs):
        kernels.clean_epoch(data, Z, hott, rng, step, row_block=params.row_block or blocks.default_row_block(f),
                            client=client)
        step *= params.clean_decay
    return Z


def exact_components(X, hott):
    """Eq. 2 solved exactly, one LP per row (scipy HiGHS): min_{z >= 0} ||X_i - z^T W||_1."""
    X = np.asarray(X, dtype=np.float64)
    return l1_fits(X, X[hott])[0]


def exact_lp(X, rank, tau, cost, *, time_limit=None):
    """The LP of Alg. 3 solved exactly by scipy's HiGHS (the reference for small f):

        min cost^T diag C  s.t.  C >= 0, ||C X - X||_{inf,1} <= tau, Tr C = rank,
                                 diag C <= 1, C_ij <= C_jj.

    Variables C (f^2) and a split of the residual into E+, E- >= 0 (f n each):
    C X - E+ + E- = X with sum_k (E+ + E-)_ik <= tau (the same feasible C as with
    |C X - X| <= E: E = E+ + E- bounds the residual).  Written so, the residual takes f n
    equality rows instead of 2 f n inequalities, and HiGHS runs 1.4-1.8x faster (40 -> 23 s
    at f = 80, n = 800); for small f and n only.  ``time_limit``: seconds HiGHS may take
    (default none); past them it raises :class:`dnomad.errors.TimeLimitError`.  Raises
    InputValueError where no C fits X within tau, and :class:`dnomad.errors.LPFailedError`
    where HiGHS gives up (by simplex and by interior point).  Returns C (f x f).
    """
    check_time_limit(time_limit)
    from scipy.sparse import coo_matrix, eye, hstack, kron, vstack

    X = np.asarray(X, dtype=np.float64)
    f, n = X.shape
    nc, ne = f * f, f * n
    # vec(C) row-major: C_ij at i f + j.  (C X)_ik = sum_j C_ij X_jk -> kron(I_f, X^T).
    CX = kron(eye(f), X.T, format="csr")                          # (f n) x (f f)
    I_fn = eye(ne, format="csr")
    residual = hstack([CX, -I_fn, I_fn])                          # C X - E+ + E- = X
    # sum_k (E+ + E-)_ik <= tau for every row i.
    row_sums = kron(eye(f), np.ones((1, n)))
    rows_sum = hstack([coo_matrix((f, nc)), row_sums, row_sums])
    # C_ij - C_jj <= 0 for i != j.
    ii, jj = np.where(~np.eye(f, dtype=bool))
    m = len(ii)
    data = np.r_[np.ones(m), -np.ones(m)]
    rr = np.r_[np.arange(m), np.arange(m)]
    cc = np.r_[ii * f + jj, jj * f + jj]
    dom = hstack([coo_matrix((data, (rr, cc)), shape=(m, nc)), coo_matrix((m, 2 * ne))])
    A_ub = vstack([rows_sum, dom]).tocsr()
    b_ub = np.r_[np.full(f, tau), np.zeros(m)]
    diag_idx = np.arange(f) * f + np.arange(f)
    trace = coo_matrix((np.ones(f), (np.zeros(f), diag_idx)), shape=(1, nc + 2 * ne))
    A_eq = vstack([residual, trace]).tocsr()
    b_eq = np.r_[X.ravel(), rank]
    c = np.zeros(nc + 2 * ne)
    c[diag_idx] = cost
    bounds = np.zeros((nc + 2 * ne, 2))
    bounds[:, 1] = np.inf
    bounds[diag_idx, 1] = 1
    res = linprog_highs(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds,
                        time_limit=None if time_limit is None else float(time_limit))
    if res.status == 1 and time_limit is not None:
        raise TimeLimitError(f"the LP of Alg. 3 (f = {f}, n = {n}) did not finish in {time_limit:g} s: {res.message}")
    if res.status == 2:
        raise InputValueError(f"the LP of Alg. 3 (f = {f}, n = {n}) is infeasible: no C of trace {rank} "
                              f"fits X within tau = {tau:g}; give a larger tau ({res.message})")
    if res.status != 0:
        raise LPFailedError(f"the LP of Alg. 3 (f = {f}, n = {n}) failed: {res.message}")
    return res.x[:nc].reshape(f, f)
