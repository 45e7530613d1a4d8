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
``dual_step``, mu_j -> nnz(X_j) / n, Phi_0 -> ``blocks.squish_columns`` (Alg. 5) or
``blocks.clip_phi`` (Sec. 4's clipping), ||.||_{inf,1} -> ``metrics.inf1_norm`` (the
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
(``blocks.hottopixx_epoch``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .. import blocks
from ..errors import InputValueError
from ..metrics import inf1_norm
from ._checks import check_choices, check_count, check_ints, check_numbers

logger = logging.getLogger(__name__)

PROJECTIONS = ("squish", "clip")
COMPONENT_FITS = ("subgradient", "lp")


@dataclass
class HottopixxParams:
    """Parameters of :func:`hottopixx` (defaults: the paper's runs, Sec. 5)."""

    rank: int
    n_epochs: int = 50
    primal_step: float = 1e-1
    dual_step: float = 1e-2
    projection: str = "squish"
    clean_epochs: int = 2
    clean_step: float | None = None
    fit_components: str = "subgradient"
    row_block: int = 256
    cost_scale: float = 1e-1

    def validate(self, f):
        check_count("rank", self.rank, 1, f, "n_features")
        check_ints(self, ("n_epochs", "row_block"))
        check_ints(self, ("clean_epochs",), minimum=0)
        check_numbers(self, ("primal_step", "dual_step", "cost_scale"), positive=True)
        check_choices(self, {"projection": PROJECTIONS, "fit_components": COMPONENT_FITS})


@dataclass
class HottopixxResult:
    """What :func:`hottopixx` returns.

    Attributes
    ----------
    hott_rows : ndarray (r,)
        Indices of the hott rows, by decreasing diagonal of C.
    F : ndarray (f, r)
        Nonnegative weights with X ~ F X_I.
    diag : ndarray (f,)
        Diagonal of C after the last epoch.
    C : ndarray (f, f)
    history : list of dict
        Per epoch: ``epoch``, ``trace`` (Tr C), ``beta``, ``error`` (||X - C X||_{inf,1}),
        ``seconds``.
    error : float
        ||X - F X_I||_{inf,1}.
    """

    hott_rows: np.ndarray
    F: np.ndarray
    diag: np.ndarray
    C: np.ndarray
    history: list
    error: float
    cost: np.ndarray
    extra: dict = field(default_factory=dict)


def check_data(X):
    """X as float64 f x n (dense, or scipy.sparse CSR), finite, nonnegative, rows scaled to
    sum 1 (the paper's assumption); a zero row cannot be scaled and is refused."""
    import scipy.sparse as sp

    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        values = X.data
    else:
        X = np.asarray(X, dtype=np.float64)
        values = X
    if X.ndim != 2:
        raise InputValueError(f"X must be 2-D (n_features, n_samples); got shape {X.shape}")
    if not np.isfinite(values).all():
        raise InputValueError("X contains NaN or Inf")
    if values.size and values.min() < 0:
        raise InputValueError(f"X must be nonnegative; its smallest entry is {values.min():.3g}")
    sums = np.asarray(X.sum(axis=1)).ravel()
    if (sums == 0).any():
        raise InputValueError(f"X has all-zero rows (first: row {int(np.flatnonzero(sums == 0)[0])}); "
                              f"they cannot be scaled to sum 1: drop them")
    if sp.issparse(X):
        return sp.diags(1.0 / sums) @ X
    return X / sums[:, None]


def residual_inf1(X, C):
    """||X - C X||_{inf,1} for dense or sparse X."""
    import scipy.sparse as sp

    if sp.issparse(X):
        CX = np.asarray((X.T @ C.T).T)
        return inf1_norm(X.toarray() - CX)
    return inf1_norm(X - C @ X)


def hottopixx(X, params: HottopixxParams, *, random_state=None, callback=None):
    """Alg. 4 (HOTTOPIXX) on a dense f x n matrix X held in this process.

    Parameters
    ----------
    X : array or scipy.sparse matrix (f, n)
        Nonnegative; rows are scaled to sum 1 (:func:`check_data`).  Sparse X is
        streamed by its nonzeros (per column, b nnz(X_k) work per task).
    params : HottopixxParams
        ``rank`` r, ``n_epochs`` (50; 4 is the paper's "fast" setting), ``primal_step``
        s_p (0.1), ``dual_step`` s_d (0.01), ``projection`` ("squish": the exact
        projection onto Phi_0 after every epoch; "clip": Sec. 4's clipping, enough when
        the factorization is unique), ``clean_epochs`` (2, as the paper) and
        ``fit_components`` ("subgradient": that many incremental-subgradient epochs on F
        from C's columns; "lp": the exact LP of eq. 2 per row, scipy HiGHS, small sizes),
        ``row_block`` (rows of C per task), ``cost_scale`` (the cost p is drawn with
        distinct entries in [0, cost_scale)).
    random_state : int or Generator
        Seeds the cost p (distinct entries, uniform on [0, 1)) and each epoch's column order.
    callback : callable, optional
        Called with each history row; returning True stops after that epoch.

    Returns
    -------
    HottopixxResult

    Notes
    -----
    Per epoch: f^2 n multiply-adds for dense X (b rows of C stream all of X per task),
    the projection (f columns of length f sorted: f^2 log f), and the history's
    ||X - C X||_{inf,1} (one f x f by f x n product).
    """
    X = check_data(X)
    f, n = X.shape
    params.validate(f)
    rng = random_state if isinstance(random_state, np.random.Generator) else \
        np.random.default_rng(random_state)
    # Distinct costs in [0, cost_scale).  The Lagrangian keeps the residual weights w = 1
    # (Sec. 4 updates only beta), which is an exact penalty for the LP only when the costs
    # spread little against them: minimized exactly (HiGHS) at the beta where Tr C = r,
    # it picked the hott rows on 24 of 24 noiseless instances of the grid with
    # costs in [0, 0.01), 23 of 24 in [0, 0.1), and failed in [0, 1).  Smaller costs
    # break ties more slowly, though: 50 incremental epochs found them on 10 of 24 at
    # 0.01 and 16 of 24 at 0.1, hence 0.1.
    cost = params.cost_scale * (rng.permutation(f) + rng.random(f) / 2) / f
    import scipy.sparse as sp

    sparse = sp.issparse(X)
    nnz = (X.getnnz(axis=1) if sparse else np.count_nonzero(X, axis=1)).astype(np.float64)
    columns = blocks.prepare_columns(X)
    C = np.zeros((f, f))
    beta = 0.0
    project = blocks.squish_columns if params.projection == "squish" else blocks.clip_phi
    history, t0 = [], time.perf_counter()
    for epoch in range(1, params.n_epochs + 1):
        order = rng.permutation(n)
        diag_step = params.primal_step * (cost + beta) / nnz
        blocks.hottopixx_epoch(C, columns, order, params.primal_step, diag_step,
                               row_block=params.row_block)
        C = project(C)
        trace = float(np.trace(C))
        beta += params.dual_step * (trace - params.rank)
        row = {"epoch": epoch, "trace": trace, "beta": beta, "error": residual_inf1(X, C),
               "seconds": time.perf_counter() - t0}
        history.append(row)
        logger.debug("HOTTOPIXX epoch %d  Tr C %.4g  beta %.4g  err %.3g", epoch, trace, beta, row["error"])
        if callback is not None and callback(dict(row)) is True:
            break
    diag = np.diagonal(C).copy()
    hott = hott_rows_from_diagonal(diag, params.rank)
    Xd = X.toarray() if sparse else X          # F's fit reads rows of X densely (f x n)
    F = fit_components(Xd, hott, params, C=C, rng=rng)
    error = inf1_norm(Xd - F @ Xd[hott])
    return HottopixxResult(hott_rows=hott, F=F, diag=diag, C=C, history=history, error=error,
                           cost=cost)


def hott_rows_from_diagonal(diag, r):
    """The r largest diagonal entries (ties broken by index), by decreasing value."""
    return np.argsort(-diag, kind="stable")[:r]


def fit_components(X, hott, params, *, C=None, rng=None):
    """F = argmin_{Z >= 0} ||X - Z X_I||_{inf,1} (eq. 2) for the hott rows I."""
    if params.fit_components == "lp":
        return exact_components(X, hott)
    W = X[hott]
    f, r = X.shape[0], len(hott)
    Z = np.ascontiguousarray(C[:, hott]) if C is not None else np.zeros((f, r))
    Z[hott, np.arange(r)] = 1.0          # a hott row is itself
    Wt = np.ascontiguousarray(W.T)
    rng = rng if rng is not None else np.random.default_rng(0)
    step = params.clean_step if params.clean_step is not None else params.primal_step
    for _ in range(params.clean_epochs):
        blocks.clean_epoch(Z, X, Wt, rng.permutation(X.shape[1]), step, row_block=params.row_block)
    return Z


def exact_components(X, hott):
    """Eq. 2 solved exactly, one LP per row (scipy HiGHS): min_{z >= 0} ||X_i - z^T W||_1."""
    from scipy.optimize import linprog

    W = X[hott]
    r, n = W.shape
    F = np.zeros((X.shape[0], r))
    c = np.r_[np.zeros(r), np.ones(n)]
    eye = np.eye(n)
    A_ub = np.block([[-W.T, -eye], [W.T, -eye]])
    for i, x in enumerate(X):
        res = linprog(c, A_ub=A_ub, b_ub=np.r_[-x, x], bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"LP for row {i} of F failed: {res.message}")
        F[i] = res.x[:r]
    return F


def exact_lp(X, rank, tau, cost):
    """The LP of Alg. 3 solved exactly by scipy's HiGHS (the reference for small f):

        min cost^T diag C  s.t.  C >= 0, ||C X - X||_{inf,1} <= tau, Tr C = rank,
                                 diag C <= 1, C_ij <= C_jj.

    Variables C (f^2) and the residual bounds E (f n); for small f and n only.
    Returns C (f x f).
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, eye, hstack, kron, vstack

    X = np.asarray(X, dtype=np.float64)
    f, n = X.shape
    nc = f * f
    # vec(C) row-major: C_ij at i f + j.  (C X)_ik = sum_j C_ij X_jk -> kron(I_f, X^T).
    CX = kron(eye(f), X.T, format="csr")                          # (f n) x (f f)
    I_fn = eye(f * n, format="csr")
    res_rows = vstack([hstack([CX, -I_fn]), hstack([-CX, -I_fn])])   # |C X - X| <= E
    b_res = np.r_[X.ravel(), -X.ravel()]
    # sum_k E_ik <= tau for every row i.
    rows_sum = hstack([coo_matrix((f, nc)), kron(eye(f), np.ones((1, n)))])
    # C_ij - C_jj <= 0 for i != j.
    ii, jj = np.where(~np.eye(f, dtype=bool))
    m = len(ii)
    data = np.r_[np.ones(m), -np.ones(m)]
    rr = np.r_[np.arange(m), np.arange(m)]
    cc = np.r_[ii * f + jj, jj * f + jj]
    dom = hstack([coo_matrix((data, (rr, cc)), shape=(m, nc)), coo_matrix((m, f * n))])
    A_ub = vstack([res_rows, rows_sum, dom]).tocsr()
    b_ub = np.r_[b_res, np.full(f, tau), np.zeros(m)]
    diag_idx = np.arange(f) * f + np.arange(f)
    A_eq = coo_matrix((np.ones(f), (np.zeros(f), diag_idx)), shape=(1, nc + f * n))
    c = np.zeros(nc + f * n)
    c[diag_idx] = cost
    bounds = [(0, None)] * (nc + f * n)
    for d in diag_idx:
        bounds[d] = (0, 1)
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[rank], bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"the LP of Alg. 3 failed: {res.message}")
    return res.x[:nc].reshape(f, f)
