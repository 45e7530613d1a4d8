"""NOMAD's low-rank form (Tepper et al., Sec. 4 and App. E) and symmetric NMF by ADMM
(App. D), over a matrix-free operator.

Burer-Monteiro replaces Q (n x n) by Y Y^T with Y >= 0 of r columns (the paper writes
Y^T Y with Y r x n):

    max Tr(D Y Y^T)  s.t.  Tr(Y^T Y) = K,  Y Y^T 1 = 1,  Y >= 0            (11)

solved by the method of multipliers on the augmented Lagrangian (32)

    L(Y, mu, lam) = -Tr(D Y Y^T) + sigma/2 ||Y Y^T 1 - 1||^2 - mu^T (Y Y^T 1 - 1)
                    + phi/2 (||Y||_F^2 - K)^2 - lam (||Y||_F^2 - K),

each step minimizing L over Y in [0, 1]^{n x r} by L-BFGS-B (SciPy), then (33b, 33c)
mu -= eta sigma (Y Y^T 1 - 1), lam -= eta phi (||Y||_F^2 - K).  One evaluation of L and
its gradient costs one product D Y: a pass over D's blocks, or two passes over the rows
of X when D is X's Gram matrix; nothing n x n is ever formed.  Nonconvex: r >= K trades
speed for closeness to the SDP's solution (r = K gives hard clusterings, Kulis et al.
2007; the authors' default is r = 8K).

Symmetric NMF (App. D): min ||A - W W^T||_F, W >= 0, by ADMM on the split W = H with
sigma = eta = 1; each half step is the least-squares solution clipped at 0 (the
authors' practice), and A enters only through products A W, so it runs matrix-free.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputValueError, warn_convergence
from ._checks import check_choices, check_ints, check_numbers

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ symmetric NMF
@dataclass
class AdmmResult:
    W: np.ndarray
    n_iter: int
    history: list = field(default_factory=list)
    converged: bool = False


def symnmf_admm(matmat, n, rank, *, W0=None, sigma=1.0, eta=1.0, max_iter=1000, tol=1e-5,
                random_state=None, scale=None, callback=None):
    """W >= 0 (n x rank) with A ~ W W^T, by ADMM (App. D of Tepper et al.).

    ``matmat(W)`` returns A W.  Iterates, for the augmented Lagrangian
    1/2 ||A - W H^T||^2 + sigma/2 ||W - H||^2 - <Gamma, W - H>:

        H <- [(A W + sigma W + Gamma)(W^T W + sigma I)^-1]_+
        W <- [(A H + sigma H - Gamma)(H^T H + sigma I)^-1]_+
        Gamma <- Gamma - eta sigma (W - H)

    (the paper's (31c) prints the multiplier step with the opposite sign of its (30);
    this is the ascent step for (30)).  Stops when ||W - H||_F <= tol ||W||_F (at
    ``max_iter`` with a ConvergenceWarning).  The
    start is |N(0, s^2)| with s^2 = ``scale`` / rank, ``scale`` the mean entry of A
    if not given (estimated as 1^T A 1 / n^2).  Costs two products A W per iteration.
    """
    if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= n:
        raise InputValueError(f"rank must be an integer in [1, {n}]; got {rank!r}")
    rng = random_state if isinstance(random_state, np.random.Generator) else \
        np.random.default_rng(random_state)
    if W0 is None:
        if scale is None:
            scale = float(np.sum(matmat(np.ones((n, 1))))) / n ** 2
        H = np.abs(rng.standard_normal((n, rank))) * math.sqrt(max(scale, 1e-12) / rank)
    else:
        H = np.array(W0, dtype=np.float64)
        if H.shape != (n, rank) or H.min() < 0:
            raise InputValueError(f"W0 must be a nonnegative ({n}, {rank}) array")
    W = H
    Gamma = np.zeros_like(H)
    eye = sigma * np.eye(rank)
    history, converged, stopped = [], False, False
    t0 = time.perf_counter()
    for it in range(1, max_iter + 1):
        W = np.maximum(np.linalg.solve(H.T @ H + eye, (matmat(H) + sigma * H - Gamma).T).T, 0)
        H = np.maximum(np.linalg.solve(W.T @ W + eye, (matmat(W) + sigma * W + Gamma).T).T, 0)
        Gamma -= eta * sigma * (H - W)
        gap = np.linalg.norm(W - H) / max(np.linalg.norm(W), 1e-300)
        history.append({"iteration": it, "split_gap": float(gap), "seconds": time.perf_counter() - t0})
        if callback is not None and callback(dict(history[-1])) is True:
            stopped = True
            break
        if gap <= tol:
            converged = True
            break
    if not (converged or stopped) and history and tol > 0:
        warn_convergence(f"symmetric NMF (ADMM) stopped at max_iter={max_iter} before meeting its tolerance: "
                         f"last ||W - H||_F / ||W||_F {history[-1]['split_gap']:.3g} > tol {tol:g}")
    return AdmmResult(W=W, n_iter=len(history), history=history, converged=converged)


# ------------------------------------------------------------------ Burer-Monteiro
@dataclass
class BurerMonteiroParams:
    """Parameters of :func:`burer_monteiro` (the paper's defaults)."""

    n_clusters: int
    rank: int | None = None          # r; None: min(8 K, n)
    sigma: float = 1.0
    phi: float = 1.0
    eta: float = 1.0
    max_iter: int = 1000             # multiplier (outer) steps
    tol: float = 1e-5                # stop: ||Y - Y_prev||_F <= tol ||Y_prev||_F ...
    feasibility_tol: float = 1e-4    # ... and the constraints met to this (relative) level
    inner_max_iter: int = 15000      # L-BFGS-B iterations per outer step (SciPy's default)
    inner_tol: float = 1e-10         # L-BFGS-B's ftol and gtol (D normalized: entries ~ 1/n)
    start: str = "symnmf"            # "symnmf" (App. E) or "random"
    random_state: object = None

    def resolved_rank(self, n):
        return min(8 * self.n_clusters, n) if self.rank is None else self.rank

    def validate(self, n):
        check_ints(self, ("n_clusters", "max_iter", "inner_max_iter"))
        if not 1 <= self.n_clusters < n:
            raise InputValueError(f"n_clusters must be in [1, {n - 1}] for n = {n}; got {self.n_clusters}")
        r = self.resolved_rank(n)
        if not isinstance(r, (int, np.integer)) or not self.n_clusters <= r <= n:
            raise InputValueError(f"rank must be an integer in [n_clusters, n] = [{self.n_clusters}, {n}]; "
                                  f"got {self.rank!r}")
        check_numbers(self, ("sigma", "phi", "eta", "tol", "feasibility_tol", "inner_tol"), positive=True)
        check_choices(self, {"start": ("symnmf", "random")})


def lagrangian(Y, DY, mu, lam, K, sigma, phi):
    """L(Y, mu, lam) of (32) and its gradient in Y, given DY = D Y."""
    c = Y.sum(axis=0)                       # Y^T 1
    s = Y @ c - 1.0                         # Y Y^T 1 - 1
    t = float(np.vdot(Y, Y)) - K            # Tr(Y^T Y) - K
    value = (-float(np.vdot(Y, DY)) + 0.5 * sigma * float(s @ s) - float(mu @ s)
             + 0.5 * phi * t * t - lam * t)
    w = sigma * s - mu
    grad = -2.0 * DY + np.outer(w, c) + (w @ Y)[None, :] + 2.0 * (phi * t - lam) * Y
    return value, grad


def constraint_residuals(Y, K):
    """(max_i |(Y Y^T 1)_i - 1|, |Tr(Y^T Y) - K| / K)."""
    return float(np.abs(Y @ Y.sum(axis=0) - 1).max()), abs(float(np.vdot(Y, Y)) - K) / K


def burer_monteiro(D, params: BurerMonteiroParams, *, Y0=None, callback=None, state=None,
                   checkpoint=None, checkpoint_every=1):
    """See :func:`_burer_monteiro`; runs with BLAS on one thread (L-BFGS-B and the
    O(n r) vector work make many small BLAS calls, on which OpenBLAS's threads spin:
    measured 29x slower per evaluation at n r = 12,800 on 2 cores)."""
    from ..blocks import single_threaded_blas

    with single_threaded_blas():
        return _burer_monteiro(D, params, Y0=Y0, callback=callback, state=state,
                               checkpoint=checkpoint, checkpoint_every=checkpoint_every)


def _burer_monteiro(D, params, *, Y0=None, callback=None, state=None, checkpoint=None,
                    checkpoint_every=1):
    """Solve (11) for the operator D (``D.matmat(Y)``, ``D.shape``; normalize it first,
    e.g. :class:`dnomad.blocks.operators.DataGram` with scale "frobenius").

    The start Y0 defaults to symmetric NMF of D at rank r by ADMM (App. E), clipped to
    [0, 1].  Stops when Y changes by less than ``tol`` (relative) between outer steps
    with the constraints met within ``feasibility_tol`` ("tolerance"), or at
    ``max_iter`` ("max_iter", with a ConvergenceWarning), or when ``callback`` returns
    True ("callback").
    History rows: iteration, objective Tr(D Y Y^T), lagrangian, row_sum_violation,
    trace_violation, change, inner_iterations, matmats, seconds.

    ``state`` (a dict Y, mu, lam, history, matmats, as passed to ``checkpoint``)
    resumes a run exactly where it was saved; ``checkpoint(state)`` is called every
    ``checkpoint_every`` outer steps and at the end.  Returns a
    :class:`dnomad.solvers.nomad.NomadResult` with Q = Y Y^T as a LowRankGram.
    """
    from scipy.optimize import Bounds, minimize

    from ..blocks.operators import LowRankGram
    from .nomad import NomadResult

    n = D.shape[0]
    params.validate(n)
    K, r = params.n_clusters, params.resolved_rank(n)
    matmats = [0 if state is None else int(state["matmats"])]

    def DY_of(Y):
        matmats[0] += 1
        return D.matmat(Y)

    if state is not None:
        Y0 = state["Y"]
    elif Y0 is None:
        if params.start == "symnmf":
            Y0 = symnmf_admm(DY_of, n, r, random_state=params.random_state).W
        else:
            rng = np.random.default_rng(params.random_state)
            Y0 = rng.random((n, r)) * math.sqrt(K / (n * r))
    Y = np.clip(np.array(Y0, dtype=np.float64), 0.0, 1.0)
    if Y.shape != (n, r):
        raise InputValueError(f"Y0 must have shape ({n}, {r}); got {Y.shape}")
    mu, lam = (np.zeros(n), 0.0) if state is None else (np.array(state["mu"], dtype=np.float64),
                                                        float(state["lam"]))
    sigma, phi = params.sigma, params.phi

    last = {}        # the last point L-BFGS-B evaluated and D Y there

    def fun(x, mu, lam):
        Yx = x.reshape(n, r)
        last["x"], last["DY"] = x.copy(), DY_of(Yx)
        value, grad = lagrangian(Yx, last["DY"], mu, lam, K, sigma, phi)
        return value, grad.ravel()

    history = [] if state is None else list(state["history"])
    stop_reason = "max_iter"
    end = params.max_iter
    if state is not None and state.get("stop_reason") in ("tolerance", "callback"):
        # Saved when the run stopped (a crash came before its result was written): finish
        # from it as the uninterrupted run did.
        stop_reason, end = state["stop_reason"], len(history)
    t0 = time.perf_counter() - (history[-1]["seconds"] if history else 0.0)

    def save(final):
        if checkpoint is not None:
            checkpoint({"Y": Y, "mu": mu, "lam": lam, "history": history, "matmats": matmats[0],
                        "stop_reason": stop_reason if final else None})

    for it in range(len(history) + 1, end + 1):
        Y_prev = Y
        res = minimize(fun, Y.ravel(), args=(mu, lam), jac=True, method="L-BFGS-B",
                       bounds=Bounds(0.0, 1.0),
                       options={"maxiter": params.inner_max_iter, "ftol": params.inner_tol,
                                "gtol": params.inner_tol})
        Y = res.x.reshape(n, r)
        row_sums = Y @ Y.sum(axis=0)
        trace = float(np.vdot(Y, Y))
        mu = mu - params.eta * sigma * (row_sums - 1.0)
        lam = lam - params.eta * phi * (trace - K)
        change = np.linalg.norm(Y - Y_prev) / max(np.linalg.norm(Y_prev), 1e-300)
        row_violation, trace_violation = constraint_residuals(Y, K)
        # L-BFGS-B returns the point it evaluated last (almost always): its D Y is known.
        DY = last["DY"] if np.array_equal(last.get("x"), res.x) else DY_of(Y)
        history.append({"iteration": it, "objective": float(np.vdot(Y, DY)), "lagrangian": float(res.fun),
                        "row_sum_violation": row_violation, "trace_violation": trace_violation,
                        "change": float(change), "inner_iterations": int(res.nit),
                        "matmats": matmats[0], "seconds": time.perf_counter() - t0})
        logger.info("BM it %d  obj %.6g  row viol %.2e  trace viol %.2e  change %.2e  inner %d",
                    it, history[-1]["objective"], row_violation, trace_violation, change, res.nit)
        if change <= params.tol and max(row_violation, trace_violation) <= params.feasibility_tol:
            stop_reason = "tolerance"
        elif callback is not None and callback(dict(history[-1])) is True:
            stop_reason = "callback"
        final = stop_reason != "max_iter" or it == params.max_iter
        if final or it % checkpoint_every == 0:
            save(final)
        if stop_reason != "max_iter":
            break
    if stop_reason == "max_iter" and history:
        last = history[-1]
        violation = max(last["row_sum_violation"], last["trace_violation"])
        warn_convergence(f"NOMAD (Burer-Monteiro, K={params.n_clusters}) stopped at max_iter={params.max_iter} "
                         f"before meeting its tolerances: last relative change of Y {last['change']:.3g} "
                         f"(tol {params.tol:g}), constraint violation {violation:.3g} "
                         f"(feasibility_tol {params.feasibility_tol:g})")
    return NomadResult(Q=LowRankGram(Y), history=history, n_iter=len(history), stop_reason=stop_reason,
                       params=params, converged=stop_reason == "tolerance", solver="bm", Y=Y, mu=mu,
                       lam=lam, matmats=matmats[0])
