"""cvxCondJC (Sec. 3.1): min D_F(X, M X) over M in M1 by ADMM, for jointly convex
divergences."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import numpy as np

from ..blocks.rows import running_rows
from ..errors import InputValueError, warn_convergence
from .divergences import get_divergence
from .gcg import _check_clusters
from .norms import FactoredM, project_m2_factor


# ------------------------------------------------------------ cvxCondJC (Sec. 3.1)
@dataclass(frozen=True, eq=False)
class CondJCResult(FactoredM):
    """The ADMM's answer: Z, the projection onto M2 of its last iterate, factored as
    Phi diag(sigma) Phi' + 1 1' / t (``Phi``, ``sigma``; :meth:`membership_eigenvectors`
    for rounding); M (t x t, rows on the simplex) when X was given in memory, else None
    (it stays in the row chunks as state "M"); the objective D_F(X, M X); history rows
    (iteration, objective, primal residual ||M - Z||_F / sqrt(t), dual residual
    ||Z - Z_prev||_F / sqrt(t), rank of Z - 1 1'/t, eigensolver passes, seconds); stop
    reason; iterations; the final ADMM parameter ``admm_mu``."""

    objective: float
    history: list
    stop_reason: str
    n_iter: int
    admm_mu: float
    M: np.ndarray | None = None

    @property
    def Z(self):
        """Z as a dense t x t matrix."""
        return (self.Phi * self.sigma) @ self.Phi.T + 1.0 / self.Phi.shape[0]


def row_step_chunking(t, chunk_rows=None):
    """(rows per chunk of M and Lambda, rows whose row step runs at once): by default one
    chunk per thread, at most 64 MiB per chunk row block (the row step holds about ten
    r x t temporaries per chunk of r rows); the row chunks' pool runs one per thread."""
    rows = chunk_rows or max(16, min(-(-t // len(os.sched_getaffinity(0))), (64 << 20) // (8 * t)))
    return rows, running_rows(t, rows)


def cond_jc(X, d, divergence="euclidean", *, admm_mu=None, max_iter=500, tol=1e-5, inner_iter=5,
            projection="auto", eig_tol=None, chunk_rows=None, callback=None):
    """min D_F(X, M X) over M in M1 = {M : 0 <= M <= I, tr M <= d, rows of M on the
    simplex} (Sec. 3.1) by the ADMM of Sec. 3.1.1 for a jointly convex D_F:

    1. M <- argmin over rows on the simplex of D_F(X, M X) - <Lambda, M> + ||M - Z||^2 / (2 mu)
       (row-separable; ``inner_iter`` steps of accelerated projected gradient with
       backtracking, warm-started: ADMM tolerates the inexact step, and on the heart data
       5 steps reach the same iterates' objective as 50 in a tenth of the time);
    2. Z <- the projection of M - mu Lambda onto M2 (:func:`project_m2_factor`), kept
       factored (its rank above 1 1'/t is small: 14-17 for 3 clusters at t = 1000);
    3. Lambda <- Lambda + (Z - M) / mu.

    M and Lambda (t x t) live in row chunks of X: ``X`` is a t x n array (cut into
    ``chunk_rows``-row chunks, by default one per thread and at most 64 MiB of M each) or a
    :class:`dnomad.blocks.RowChunks` built with ``center=False`` (its chunks may sit in
    dask.distributed workers' memory; X itself is gathered once, t x n, as every row
    of M X needs all of it).  Steps 1 and 3 are one pass each; step 2 is one pass per
    block of the Krylov method (``projection="partial"``; 5 to 6 per iteration once Z's
    rank has settled), or one pass gathering M - mu Lambda
    for a dense eigendecomposition (``"dense"``, O(t^3)); ``"auto"`` is dense up to
    t = 2000 (graphs/bregman_scaling.py, iterations 21-40 on one thread per chunk: the
    dense projection takes 0.36, 0.72 and 0.81 of the Krylov one's time per iteration at
    t = 500, 1000, 2000, where the first iterations' Z has rank up to 2t/3 and the
    Krylov path falls back to dense).

    Stops when both residuals (divided by sqrt(t)) fall below ``tol`` (at ``max_iter``
    with a ConvergenceWarning when tol > 0).  ``eig_tol``: the
    partial projection's error bound (default tol / 10; 1e-7 for tol = 0).  ``admm_mu``:
    default 1 / (the mean of F''(X) times ||X||_2^2), balancing the two terms.
    """
    from ..blocks.rows import RowChunks

    div = get_divergence(divergence)
    if not div.jointly_convex:
        raise InputValueError(f"the ADMM of cvxCondJC needs a jointly convex divergence; {div.name} is not "
                              f"(use model='cond', which takes any Bregman divergence)")
    if projection not in ("auto", "dense", "partial"):
        raise InputValueError(f"projection must be 'auto', 'dense' or 'partial'; got {projection!r}")
    if isinstance(X, RowChunks):
        if np.any(X.mean != 0):
            raise InputValueError("the row chunks for cvxCondJC must be built with center=False")
        _check_clusters(d, X.n)
        data, owned, Xall = X, False, None
    else:
        Xall = np.asarray(X, dtype=np.float64)
        if Xall.ndim != 2:
            raise InputValueError(f"X must be a 2-D array (points x features); got shape {Xall.shape}")
        Xall = div.check_domain(Xall)
        t = Xall.shape[0]
        _check_clusters(d, t)
        data, owned = RowChunks(Xall, chunk_rows=row_step_chunking(t, chunk_rows)[0], center=False), True
    try:
        if Xall is None:
            Xall = div.check_domain(data.gather())
        res = _admm(data, Xall, d, div, admm_mu, max_iter, tol, inner_iter, projection, eig_tol, callback)
        return dataclasses.replace(res, M=data.get("M") if owned else None)
    finally:
        if owned:
            data.close()


def _admm(data, X, d, div, admm_mu, max_iter, tol, inner_iter, projection, eig_tol, callback):
    import time

    t = X.shape[0]
    dense = projection == "dense" or (projection == "auto" and t <= 2000)
    # the projection's error bound, in the units of the residuals (tol = 0 runs max_iter)
    eig_tol = eig_tol or (0.1 * tol if tol > 0 else 1e-7)
    scale = float(np.mean(div.curvature(X))) * float(np.linalg.norm(X, 2)) ** 2
    mu = 1.0 / scale if admm_mu is None else float(admm_mu)
    data.put("row", np.arange(t)[:, None])
    data.map(_init_kernel, t, 1.0 / (scale + 1.0 / mu))
    Phi, sigma = np.zeros((t, 0)), np.zeros(0)            # Z = 1 1' / t
    history, stop = [], "max_iter"
    t0 = time.perf_counter()

    def products(V):                    # sym(M - mu Lambda) V, one pass
        parts = data.map(_matmat_kernel, mu, V)
        return 0.5 * (np.concatenate([p[0] for p in parts]) + sum(p[1] for p in parts))

    def assemble():                     # sym(M - mu Lambda), one pass
        A = np.concatenate(data.map(_rows_kernel, mu))
        return 0.5 * (A + A.T)

    for it in range(1, max_iter + 1):
        objective = sum(data.map(_row_step_kernel, div, X, Phi, sigma, mu, inner_iter))
        Phi_prev, sigma_prev = Phi, sigma
        Phi, sigma, eig_passes = project_m2_factor(None if dense else products, t, d, start=Phi_prev,
                                                   tol=eig_tol, dense=assemble)
        primal = math.sqrt(sum(data.map(_multiplier_kernel, Phi, sigma, mu))) / math.sqrt(t)
        dual = _factored_distance(Phi, sigma, Phi_prev, sigma_prev) / math.sqrt(t)
        row = {"iteration": it, "objective": objective, "primal_residual": primal, "dual_residual": dual,
               "rank": int(sigma.size), "eig_passes": eig_passes, "seconds": time.perf_counter() - t0}
        history.append(row)
        if callback is not None and callback(dict(row)) is True:
            stop = "callback"
            break
        if primal <= tol and dual <= tol:
            stop = "tolerance"
            break
        # Residual balancing (Boyd et al. 2011, Sec. 3.4.1): keep the primal residual and
        # the dual one, ||Z - Z_prev|| / mu, within a factor 10 of each other.
        # Adapted every 10 iterations during the first 300 (later changes keep ADMM from
        # settling).
        if it % 10 == 0 and it <= 300:
            if primal > 10 * dual / mu:
                mu /= 2
            elif dual / mu > 10 * primal:
                mu *= 2
    if stop == "max_iter" and tol > 0:
        last = history[-1]
        warn_convergence(f"cvxCondJC (ADMM) stopped at max_iter={max_iter} before meeting its tolerance: last "
                         f"primal residual {last['primal_residual']:.3g} and dual residual "
                         f"{last['dual_residual']:.3g} (both must fall below tol {tol:g})")
    return CondJCResult(Phi=Phi, sigma=sigma, objective=history[-1]["objective"], history=history,
                        stop_reason=stop, n_iter=it, admm_mu=mu)


def _factored_distance(P, p, Q, q):
    """||P diag(p) P' - Q diag(q) Q'||_F for P, Q with orthonormal columns."""
    C = P.T @ Q
    value = float(p @ p) + float(q @ q) - 2.0 * float(p @ (C * C) @ q)
    return math.sqrt(max(value, 0.0))


# ------------------------------------------------------------ the chunks' kernels
# Module-level so that dask.distributed workers import them.  A chunk holds its rows of
# X ("X"), of M and Lambda, their global indices ("row") and its own FISTA step.
def _z_rows(chunk, Phi, sigma, t):
    return (Phi[chunk["row"][:, 0]] * sigma) @ Phi.T + 1.0 / t


def _init_kernel(chunk, t, step):
    r = chunk["X"].shape[0]
    chunk["M"], chunk["Lam"], chunk["step"] = np.full((r, t), 1.0 / t), np.zeros((r, t)), np.array(step)


def _row_step_kernel(chunk, div, X, Phi, sigma, mu, inner_iter):
    """Step 1 on this chunk's rows; returns their part of D_F(X, M X)."""
    M, step = _row_step(chunk["X"], X, div, chunk["M"], _z_rows(chunk, Phi, sigma, X.shape[0]), chunk["Lam"],
                        mu, float(chunk["step"]), inner_iter)
    chunk["M"], chunk["step"] = M, np.array(step)
    return float(np.sum(div(chunk["X"], M @ X)))


def _matmat_kernel(chunk, mu, V):
    """(A_r V, A_r' V_r) for this chunk's rows A_r of A = M - mu Lambda."""
    A = chunk["M"] - mu * chunk["Lam"]
    return A @ V, A.T @ V[chunk["row"][:, 0]]


def _rows_kernel(chunk, mu):
    return chunk["M"] - mu * chunk["Lam"]


def _multiplier_kernel(chunk, Phi, sigma, mu):
    """Step 3 on this chunk's rows; returns their part of ||Z - M||_F^2."""
    R = _z_rows(chunk, Phi, sigma, chunk["M"].shape[1]) - chunk["M"]
    chunk["Lam"] = chunk["Lam"] + R / mu
    return float(np.sum(R * R))


def _row_step(Xr, X, div, M, Z, Lam, mu, step, iters):
    """Step 1 of the ADMM on some rows (of X: Xr; of M, Z, Lambda: M, Z, Lam): FISTA for
    phi(M) = D_F(Xr, M X) - <Lambda, M> + ||M - Z||^2 / (2 mu) over rows on the simplex,
    from the current M, with a backtracking step shared by these rows (the rows are
    independent, so one step that decreases the sum's quadratic model is valid for each)."""
    def value(A):
        return float(np.sum(div(Xr, A @ X))) - float(np.sum(Lam * A)) + float(np.sum((A - Z) ** 2)) / (2 * mu)

    def grad(A):
        Y = A @ X
        return -(div.curvature(Y) * (Xr - Y)) @ X.T - Lam + (A - Z) / mu

    x_prev = M
    y = M
    theta = 1.0
    step *= 1.5                      # let the step grow back, once per call (Beck-Teboulle's
                                     # steps then only shrink: each shrink is one more value)
    for _ in range(iters):
        g = grad(y)
        fy = value(y)
        while True:
            x = project_simplex_rows(y - step * g)
            diff = x - y
            if value(x) <= fy + float(np.sum(g * diff)) + float(np.sum(diff * diff)) / (2 * step) + 1e-12 * abs(fy):
                break
            step /= 2
        theta_next = 0.5 * (1 + math.sqrt(1 + 4 * theta * theta))
        y = x + ((theta - 1) / theta_next) * (x - x_prev)
        y = project_simplex_rows(y) if (y < 0).any() else y
        x_prev, theta = x, theta_next
    return x_prev, step


def project_simplex_rows(A):
    """Each row of A projected onto the probability simplex (sort-based, O(t log t) per row)."""
    A = np.asarray(A, dtype=np.float64)
    n = A.shape[1]
    S = -np.sort(-A, axis=1)
    css = np.cumsum(S, axis=1) - 1.0
    idx = np.arange(1, n + 1)
    cond = S - css / idx > 0
    rho = n - 1 - np.argmax(cond[:, ::-1], axis=1)
    tau = css[np.arange(A.shape[0]), rho] / (rho + 1)
    return np.maximum(A - tau[:, None], 0.0)
