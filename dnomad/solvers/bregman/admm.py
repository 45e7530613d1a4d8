"""cvxCondJC (Sec. 3.1): min D_F(X, M X) over M in M1 by ADMM, for jointly convex
divergences."""
from __future__ import annotations

import math

import numpy as np

from ...errors import InputValueError
from .divergences import get_divergence
from .norms import project_m2


# ------------------------------------------------------------ cvxCondJC (Sec. 3.1)
class CondJCResult:
    """M (t x t, rows on the simplex), Z (its projection onto M2), objective D_F(X, M X)
    of M, history rows (iteration, objective, primal residual ||M - Z||_F / sqrt(t),
    dual residual ||Z - Z_prev||_F / sqrt(t), seconds), stop reason, iterations."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def cond_jc(X, d, divergence="euclidean", *, admm_mu=None, max_iter=500, tol=1e-5, inner_iter=5, partial=False,
            callback=None):
    """min D_F(X, M X) over M in M1 = {M : 0 <= M <= I, tr M <= d, rows of M on the
    simplex} (Sec. 3.1) by the ADMM of Sec. 3.1.1 for a jointly convex D_F:

    1. M <- argmin over rows on the simplex of D_F(X, M X) - <Lambda, M> + ||M - Z||^2 / (2 mu)
       (row-separable; ``inner_iter`` steps of accelerated projected gradient with
       backtracking, warm-started: ADMM tolerates the inexact step, and on the heart data
       5 steps reach the same iterates' objective as 50 in a tenth of the time);
    2. Z <- the projection of M - mu Lambda onto M2 (:func:`project_m2`);
    3. Lambda <- Lambda + (Z - M) / mu.

    Stops when both residuals (divided by sqrt(t)) fall below ``tol``.  ``admm_mu``:
    default 1 / (the mean of F''(X) times ||X||_2^2), balancing the two terms.
    """
    import time

    div = get_divergence(divergence)
    if not div.jointly_convex:
        raise InputValueError(f"the ADMM of cvxCondJC needs a jointly convex divergence; {div.name} is not "
                              f"(use model='cond', which takes any Bregman divergence)")
    X = div.check_domain(X)
    if X.ndim != 2:
        raise InputValueError(f"X must be a 2-D array (points x features); got shape {X.shape}")
    t = X.shape[0]
    if not (isinstance(d, (int, np.integer)) and 2 <= d < t):
        raise InputValueError(f"d (n_clusters) must be an integer with 2 <= d < t = {t}; got {d!r}")
    scale = float(np.mean(div.curvature(X))) * float(np.linalg.norm(X, 2)) ** 2
    mu = 1.0 / scale if admm_mu is None else float(admm_mu)
    M = np.full((t, t), 1.0 / t)
    Z = M.copy()
    Lam = np.zeros((t, t))
    step = 1.0 / (scale + 1.0 / mu)
    history, stop = [], "max_iter"
    t0 = time.perf_counter()
    for it in range(1, max_iter + 1):
        M, step = _row_step(X, div, M, Z, Lam, mu, step, inner_iter)
        Z_prev = Z
        Z = project_m2(M - mu * Lam, d, partial=partial, check=False)
        Lam = Lam + (Z - M) / mu
        primal = float(np.linalg.norm(M - Z)) / math.sqrt(t)
        dual = float(np.linalg.norm(Z - Z_prev)) / math.sqrt(t)
        row = {"iteration": it, "objective": float(np.sum(div(X, M @ X))), "primal_residual": primal,
               "dual_residual": dual, "seconds": time.perf_counter() - t0}
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
    return CondJCResult(M=M, Z=Z, objective=history[-1]["objective"], history=history, stop_reason=stop,
                        n_iter=it, admm_mu=mu)


def _row_step(X, div, M, Z, Lam, mu, step, iters):
    """Step 1 of the ADMM: FISTA over the rows of M (each on the simplex) for
    phi(M) = D_F(X, M X) - <Lambda, M> + ||M - Z||^2 / (2 mu), from the current M, with
    a backtracking step shared by all rows (the rows are independent, so one step that
    decreases the sum's quadratic model is valid for each)."""
    def value(A):
        return float(np.sum(div(X, A @ X))) - float(np.sum(Lam * A)) + float(np.sum((A - Z) ** 2)) / (2 * mu)

    def grad(A):
        Y = A @ X
        return -(div.curvature(Y) * (X - Y)) @ X.T - Lam + (A - Z) / mu

    x_prev = M
    y = M
    theta = 1.0
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
        step *= 1.5                  # let the step grow back
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
