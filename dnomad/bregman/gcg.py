"""The generalized conditional gradient of Alg. 1 / App. C.1 for

    min_W  loss(W) + weight/2 Xi^2(W),        W t x n,

the common form of cvxCond (17), cvxDisc (30) and cvxJoint (34) with M relaxed to M2,
and those three losses.

The solver needs only a few things from a problem (a :class:`GCGProblem`): at the
current W the loss, <G, W> and the column sums and Gram matrices of G = grad loss(W)
and of W (n x n); the direction S = -(H G V V' + 1 gbar') / Xi_*(G) built from the top
d - 1 right singular vectors V of H G (the LMO of App. B.3); the loss along
eta1 W + eta2 S; the move W <- eta1 W + eta2 S.  Everything t x n stays with the
problem.  So one problem keeps W in memory and another keeps it in the row chunks of a
:class:`dnomad.blocks.RowChunks` next to X (read from Zarr in every pass), with the
same iteration.  Xi(W) and Xi_*(G) come from n x n summaries: Xi(W) from the R factor of
H W (a QR of the chunks' R factors, so that small singular values keep their accuracy)
and Xi_*(G) from the Gram matrix of H G (only its top d - 1 singular values matter).
"""
from __future__ import annotations

import abc
import dataclasses
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..errors import InputValueError, warn_convergence
from .._checks import check_numbers
from .divergences import get_divergence
from .norms import FactoredM, _alg2_weights, omega_squared_from_singular_values, xi_squared_and_gradient


@dataclass(frozen=True, eq=False)
class GCGResult(FactoredM):
    """W (t x n; T for cvxCond and cvxJoint's [sqrt(beta) u, sqrt(alpha) T], V for
    cvxDisc), the optimal M in factored form (Phi, sigma: M = Phi diag(sigma) Phi' +
    1 1' / t), the objective, history rows (iteration, objective, duality gap, xi,
    passes, seconds), stop reason, iterations, and ``extra`` (cvxDisc's offsets tau);
    the problem's own names for W's parts: ``T`` (cvxCond, cvxJoint), ``u`` (cvxJoint),
    ``V`` and ``tau`` (cvxDisc)."""

    W: np.ndarray
    objective: float
    history: list
    stop_reason: str
    n_iter: int
    extra: np.ndarray | None = None
    T: np.ndarray | None = None
    u: np.ndarray | None = None
    V: np.ndarray | None = None
    tau: np.ndarray | None = None


class GCGProblem(abc.ABC):
    """The t x n work of one GCG problem (see the module docstring).  ``extra`` holds
    unregularized variables that the line search optimizes with (eta1, eta2) (cvxDisc's
    offsets tau); None for the others."""

    t = n = None
    extra = None

    @abc.abstractmethod
    def statistics(self):
        """At the current W: dict(loss, inner=<G, W>, g_sum=G'1, g_gram=G'G, w_sum=W'1,
        w_r = an n x n R with R'R = (H W)'(H W))."""

    @abc.abstractmethod
    def set_direction(self, V, gbar, scale):
        """S <- -((G - 1 gbar') V V' + 1 gbar') / scale, G the gradient at the current W."""

    @abc.abstractmethod
    def along(self, eta, extra):
        """(loss(eta1 W + eta2 S, extra), [d/d eta1, d/d eta2], d/d extra or None)."""

    @abc.abstractmethod
    def move(self, eta, extra):
        """W <- eta1 W + eta2 S; the extra variables <- extra."""

    @abc.abstractmethod
    def left_vectors(self, V, wbar, s):
        """(W - 1 wbar') V / s: the left singular vectors of H W for its right ones V and
        singular values s (t x k)."""

    @abc.abstractmethod
    def value(self):
        """W (t x n) as an array."""

    def refine(self, d, weight, iterations):
        """App. C step 6, the local solve from the current W (the chunked problem has
        none: it keeps no t x n work space beyond W and S)."""
        return 0

    passes = 0


def _spectrum(col_sum, gram, t):
    """Singular values (descending) and right singular vectors of H A from A'1 and A'A."""
    mean = col_sum / t
    C = gram - t * np.outer(mean, mean)
    w, V = np.linalg.eigh(0.5 * (C + C.T))
    w, V = w[::-1], V[:, ::-1]
    return np.sqrt(np.maximum(w, 0.0)), V, mean


def _spectrum_r(R):
    """Singular values (descending) and right singular vectors of H A from its R factor."""
    _, s, Vt = np.linalg.svd(R)
    return s, Vt.T


def stacked_r(parts):
    """The R factor of the row-stacked matrices whose R factors are ``parts`` (TSQR)."""
    return np.linalg.qr(np.vstack(parts), mode="r")


def gcg(problem, d, weight, *, max_iter=500, tol=1e-6, refine_iter=0, callback=None, method="GCG"):
    """Minimize loss(W) + weight/2 Xi^2(W) from W = 0 by Alg. 1 with the partially
    corrective step (52): S = -LMO(grad loss(W)) (Xi(S) = 1), then (eta1, eta2) >= 0 (and
    the problem's extra variables) minimizing loss(eta1 W + eta2 S) + weight/2 (eta1 r +
    eta2)^2 with r = Xi(W) (App. C step 7: the gauge of W is Xi(W)).  Stops when the
    Fenchel duality gap <G, W> + weight/2 Xi(W)^2 + Xi_*(G)^2 / (2 weight), an upper bound
    on the distance to the optimal value, is below tol (1 + |objective|); the paper's
    (51) tests the same kind of quantity.  O(1/k) convergence.

    The line search is L-BFGS-B, over (eta1, eta2) and the extra variables: for cvxDisc
    t + 2 variables, about 130 evaluations (t x t each) per iteration on spambase
    (t = 1000); stopping it after 30 evaluations left the objective 3% higher after 60
    iterations than the full search after 30.

    ``refine_iter`` > 0: after each step, App. C step 6's local refinement, up to that
    many L-BFGS iterations on the whole objective from the current W (see
    :meth:`DenseProblem.refine`); the conditional-gradient step keeps the global
    convergence and the duality gap its certificate.

    A stop at ``max_iter`` with ``tol`` > 0 warns ConvergenceWarning, naming ``method``
    (the relaxation being solved)."""
    from scipy.optimize import minimize

    t = problem.t
    history, stop = [], "max_iter"
    t0 = time.perf_counter()
    for it in range(1, max_iter + 1):
        st = problem.statistics()
        sw, _ = _spectrum_r(st["w_r"])
        wbar = st["w_sum"] / t
        r = math.sqrt(omega_squared_from_singular_values(sw, d) + t * float(wbar @ wbar))
        sg, Vg, gbar = _spectrum(st["g_sum"], st["g_gram"], t)
        dual = math.sqrt(t * float(gbar @ gbar) + float(np.sum(sg[: d - 1] ** 2)))
        objective = st["loss"] + 0.5 * weight * r * r
        gap = st["inner"] + 0.5 * weight * r * r + dual * dual / (2 * weight)
        row = {"iteration": it, "objective": objective, "gap": gap, "xi": r, "passes": problem.passes,
               "seconds": time.perf_counter() - t0}
        history.append(row)
        if callback is not None and callback(dict(row)) is True:
            stop = "callback"
            break
        if gap <= tol * (1.0 + abs(objective)):
            stop = "tolerance"
            break
        if dual == 0:
            stop = "tolerance"          # the gradient vanishes: W = 0 is optimal
            break
        problem.set_direction(Vg[:, : d - 1], gbar, dual)
        extra0 = problem.extra
        k = 0 if extra0 is None else extra0.size

        def along(z, r=r):
            eta = z[:2]
            value, g_eta, g_extra = problem.along(eta, None if k == 0 else z[2:])
            norm = eta[0] * r + eta[1]
            grad = np.empty_like(z)
            grad[0] = g_eta[0] + weight * norm * r
            grad[1] = g_eta[1] + weight * norm
            if k:
                grad[2:] = g_extra
            return value + 0.5 * weight * norm * norm, grad

        start = np.concatenate([[1.0, 0.0] if it > 1 else [0.0, 1.0], np.zeros(0) if k == 0 else extra0])
        res = minimize(along, start, jac=True, method="L-BFGS-B",
                       bounds=[(0, None), (0, None)] + [(None, None)] * k,
                       options={"maxiter": 200, "ftol": 1e-15, "gtol": 1e-12})
        problem.move(res.x[:2], None if k == 0 else res.x[2:])
        if refine_iter:
            problem.refine(d, weight, refine_iter)
    if stop == "max_iter" and tol > 0:
        last = history[-1]
        warn_convergence(f"{method} (generalized conditional gradient) stopped at max_iter={max_iter} before "
                         f"meeting its tolerance: last duality gap {last['gap']:.3g} > tol * (1 + |objective|) "
                         f"= {tol * (1.0 + abs(last['objective'])):.3g} (tol {tol:g})")
    st = problem.statistics() if stop == "max_iter" else st
    sw, Vw = _spectrum_r(st["w_r"])
    wbar = st["w_sum"] / t
    rank = int(np.sum(sw > sw[0] * 1e-12)) if sw.size and sw[0] > 0 else 0
    sigma = _alg2_weights(sw[:rank], d)
    Phi = problem.left_vectors(Vw[:, :rank], wbar, sw[:rank])
    r = math.sqrt(omega_squared_from_singular_values(sw, d) + t * float(wbar @ wbar))
    return GCGResult(W=problem.value(), Phi=Phi, sigma=sigma, objective=st["loss"] + 0.5 * weight * r * r,
                     history=history, stop_reason=stop, n_iter=it, extra=problem.extra)


# ------------------------------------------------------------ problems held in memory
class DenseProblem(GCGProblem):
    """W in memory; a subclass gives ``loss_grad(W, extra)`` -> (loss, grad W, grad extra
    or None)."""

    def __init__(self, t, n, extra=None):
        self.t, self.n = t, n
        self.W = np.zeros((t, n))
        self.S = None
        self.extra = extra

    @abc.abstractmethod
    def loss_grad(self, W, extra):
        """(loss, its gradient in W, its gradient in extra or None)."""

    def statistics(self):
        loss, G, _ = self.loss_grad(self.W, self.extra)
        self._G = G
        self.passes += 1
        return {"loss": loss, "inner": float(np.sum(G * self.W)), "g_sum": G.sum(axis=0), "g_gram": G.T @ G,
                "w_sum": self.W.sum(axis=0), "w_r": np.linalg.qr(self.W - self.W.mean(axis=0), mode="r")}

    def set_direction(self, V, gbar, scale):
        self.S = -((self._G - gbar) @ V @ V.T + gbar) / scale

    def along(self, eta, extra):
        self.passes += 1
        loss, G, g_extra = self.loss_grad(eta[0] * self.W + eta[1] * self.S, extra)
        return loss, np.array([np.sum(G * self.W), np.sum(G * self.S)]), g_extra

    def move(self, eta, extra):
        self.W = eta[0] * self.W + eta[1] * self.S
        if extra is not None:
            self.extra = np.array(extra)

    def left_vectors(self, V, wbar, s):
        return ((self.W - wbar) @ V) / s

    def value(self):
        return self.W

    def refine(self, d, weight, iterations):
        """L-BFGS on loss(W) + weight/2 Xi^2(W) over the whole W (the extra variables
        fixed).  App. C factors T = P Q' to keep a large n x t problem small; here n is
        the number of features and W is as small as X, so it is refined as it is (P = W,
        Q = I).  Returns the evaluations used."""
        from scipy.optimize import minimize

        shape = self.W.shape

        def objective(x):
            W = x.reshape(shape)
            loss, G, _ = self.loss_grad(W, self.extra)
            reg, R = xi_squared_and_gradient(W, d)
            return loss + 0.5 * weight * reg, (G + 0.5 * weight * R).ravel()

        res = minimize(objective, self.W.ravel(), jac=True, method="L-BFGS-B",
                       options={"maxiter": iterations, "ftol": 1e-15, "gtol": 1e-12})
        self.passes += res.nfev
        if res.fun <= objective(self.W.ravel())[0]:
            self.W = res.x.reshape(shape)
        return res.nfev


class _ConditionalLoss:
    """L(T) = D_F*(T, f(X)) = sum F*(T) - <T, X> + const, grad f^-1(T) - X (App. C's
    loss of cvxCond and of cvxJoint's T part)."""

    def __init__(self, X, div):
        self.X, self.div = X, div
        theta = div.f(X)
        self.const = float(np.sum(div.F_conj(theta) - theta * X))

    def __call__(self, T):
        return (float(np.sum(self.div.F_conj(T) - T * self.X)) - self.const, self.div.f_inv(T) - self.X)


class CondProblem(DenseProblem):
    """cvxCond (17) with M in M2: loss L(T) = D_F*(T, f(X)), weight alpha."""

    def __init__(self, X, div):
        super().__init__(*X.shape)
        self._L = _ConditionalLoss(X, div)

    def loss_grad(self, W, extra):
        loss, G = self._L(W)
        return loss, G, None


class JointProblem(DenseProblem):
    """cvxJoint (34) with M in M2, in W = [sqrt(beta) u, sqrt(alpha) T] (weight 1):
    loss g(u / t) - 1'u / t + L(T) / t with g = log-sum-exp (the cluster prior's
    log-partition) and L as cvxCond's."""

    def __init__(self, X, div, alpha, beta):
        t, n = X.shape
        super().__init__(t, n + 1)
        self._L = _ConditionalLoss(X, div)
        self.ra, self.rb = math.sqrt(alpha), math.sqrt(beta)

    def loss_grad(self, W, extra):
        t = self.t
        z = W[:, 0] / (self.rb * t)                     # u / t
        top = z.max()
        e = np.exp(z - top)
        lse = top + math.log(e.sum())
        L, GT = self._L(W[:, 1:] / self.ra)
        G = np.empty_like(W)
        G[:, 0] = (e / e.sum() - 1.0) / (t * self.rb)
        G[:, 1:] = GT / (t * self.ra)
        return lse - float(W[:, 0].sum()) / (self.rb * t) + L / t, G, None


class DiscProblem(DenseProblem):
    """cvxDisc (30) with M in M2: loss (1/t) sum_i [lse_j(x_i v_j / t + tau_j) - x_i v_i / t
    - tau_i] (the softmax F of (24) over the t "classes"), weight gamma; the offsets tau
    are the unregularized extra variables.  A t x t matrix per evaluation: O(t^2 n)."""

    def __init__(self, X):
        t, n = X.shape
        super().__init__(t, n, extra=np.zeros(t))
        self.X = X

    def loss_grad(self, W, extra):
        t, X = self.t, self.X
        Z = (X @ W.T) / t + extra[None, :]
        top = Z.max(axis=1, keepdims=True)
        P = np.exp(Z - top)
        s = P.sum(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(s[:, 0])
        P /= s
        diag = np.einsum("ij,ij->i", X, W) / t + extra
        loss = float(np.sum(lse - diag)) / t
        P[np.diag_indices(t)] -= 1.0                    # d loss / dZ = (P - I) / t
        return loss, (P.T @ X) / (t * t), (P.sum(axis=0)) / t


# ------------------------------------------------------------ W in row chunks
class ChunkedCondProblem(GCGProblem):
    """cvxCond's problem with T kept in the row chunks of ``data`` (a
    :class:`dnomad.blocks.RowChunks` built with ``center=False``) next to X: every pass
    reads X's chunks (from Zarr when X is there) and the t x n state never gathers.  A
    pending move and a pending direction are applied by the next pass, so an iteration
    costs one statistics pass plus one pass per line-search evaluation."""

    def __init__(self, data, div):
        if np.any(data.mean != 0):
            raise InputValueError("the row chunks for cvxCond must be built with center=False")
        self.data, self.div = data, div
        self.t, self.n = data.n, data.d
        self._pending = {}
        # The column means of T, known before a pass computes T (S's are -gbar / scale):
        # each chunk centres its T at them for the QR of H T.
        self._tbar, self._sbar = np.zeros(data.d), None
        data.put("T", np.zeros((data.n, data.d)))
        self.const = sum(data.map(_cond_const, div))

    @property
    def passes(self):
        return self.data.passes

    def _run(self, want, *args):
        pending, self._pending = self._pending, {}
        return self.data.map(_cond_kernel, self.div, pending.get("move"), pending.get("direction"), want, args)

    def statistics(self):
        parts = self._run("statistics", self._tbar)
        total = {k: sum(p[k] for p in parts) for k in parts[0] if k != "w_r"}
        total["loss"] -= self.const
        total["w_r"] = stacked_r([p["w_r"] for p in parts])
        return total

    def set_direction(self, V, gbar, scale):
        self._pending["direction"] = (V, gbar, scale)
        self._sbar = -gbar / scale

    def along(self, eta, extra):
        parts = self._run("along", float(eta[0]), float(eta[1]))
        # the direction was built by this pass: later evaluations reuse it
        return (sum(p[0] for p in parts) - self.const, np.array([sum(p[1] for p in parts), sum(p[2] for p in parts)]),
                None)

    def move(self, eta, extra):
        self._pending["move"] = (float(eta[0]), float(eta[1]))
        self._tbar = eta[0] * self._tbar + eta[1] * self._sbar

    def left_vectors(self, V, wbar, s):
        return np.concatenate(self._run("left", V, wbar, s), axis=0)

    def value(self):
        if self._pending:
            self._run("none")
        return self.data.get("T")


def _cond_const(chunk, div):
    """This chunk's part of L's constant, after checking that its rows lie in F's domain."""
    X = div.check_domain(chunk["X"])
    theta = div.f(X)
    return float(np.sum(div.F_conj(theta) - theta * X))


def _cond_kernel(chunk, div, move, direction, want, args):
    """One pass of the chunked cvxCond: apply the pending move and direction to this
    chunk's T and S, then compute what ``want`` asks for."""
    X, T = chunk["X"], chunk["T"]
    if move is not None:
        T = move[0] * T + move[1] * chunk["S"]
        chunk["T"] = T
    if direction is not None:
        V, gbar, scale = direction
        G = div.f_inv(T) - X
        chunk["S"] = -((G - gbar) @ V @ V.T + gbar) / scale
    if want == "statistics":
        G = div.f_inv(T) - X
        return {"loss": float(np.sum(div.F_conj(T) - T * X)), "inner": float(np.sum(G * T)),
                "g_sum": G.sum(axis=0), "g_gram": G.T @ G, "w_sum": T.sum(axis=0),
                "w_r": np.linalg.qr(T - args[0], mode="r")}
    if want == "along":
        S = chunk["S"]
        C = args[0] * T + args[1] * S
        G = div.f_inv(C) - X
        return float(np.sum(div.F_conj(C) - C * X)), float(np.sum(G * T)), float(np.sum(G * S))
    if want == "left":
        V, wbar, s = args
        return ((T - wbar) @ V) / s
    return None


# ------------------------------------------------------------ the three models
def _check(X, d, div, name):
    X = div.check_domain(X)
    if X.ndim != 2:
        raise InputValueError(f"X must be a 2-D array (points x features); got shape {X.shape}")
    _check_clusters(d, X.shape[0])
    _check_conjugate_at_zero(div, name)
    return X


def _check_clusters(d, t):
    if not (isinstance(d, (int, np.integer)) and 2 <= d < t):
        raise InputValueError(f"d (n_clusters) must be an integer with 2 <= d < t = {t}; got {d!r}")


def _check_conjugate_at_zero(div, name):
    with np.errstate(all="ignore"):
        finite = np.all(np.isfinite(div.F_conj(np.zeros(1))))
    if not finite:
        raise InputValueError(f"{name} starts at T = 0, outside the domain of the {div.name} divergence's "
                              f"conjugate (use a divergence whose conjugate is finite at 0: euclidean, "
                              f"logistic, kl)")


def _check_weight(name, value):
    check_numbers(SimpleNamespace(**{name: value}), [name], positive=True)


def cond(X, d, divergence="euclidean", *, alpha=1e-5, max_iter=500, tol=1e-6, refine_iter=20, callback=None):
    """cvxCond (Sec. 3.2 with M relaxed to M2, App. C.1): min over T of
    L(T) + alpha/2 Xi^2(T), L(T) = D_F*(T, f(X)), T = M A, by :func:`gcg`.  X is a t x n
    array, or a :class:`dnomad.blocks.RowChunks` (``center=False``) whose chunks hold T
    (out of core for Zarr X).  Any divergence whose conjugate is finite at 0 (the start
    T = 0): Euclidean, logistic, KL.  M is recovered from the optimal T by (45).

    ``refine_iter`` (T in memory only): App. C's local refinement after every step.  On
    spambase (t = 1000) it ends the Euclidean run at gap 1e-6 in 2 iterations (0.4 s),
    where 300 plain iterations leave a gap of 0.13 (3.2 s); logistic: gap 5e-5 against
    0.9 after 300 iterations."""
    from ..blocks.rows import RowChunks

    div = get_divergence(divergence)
    _check_weight("alpha", alpha)
    if isinstance(X, RowChunks):
        _check_clusters(d, X.n)
        _check_conjugate_at_zero(div, "cvxCond")
        problem = ChunkedCondProblem(X, div)
    else:
        problem = CondProblem(_check(np.asarray(X, dtype=np.float64), d, div, "cvxCond"), div)
    res = gcg(problem, d, alpha, max_iter=max_iter, tol=tol, refine_iter=refine_iter, callback=callback,
              method="cvxCond")
    return dataclasses.replace(res, T=res.W)


def joint(X, d, divergence="euclidean", *, alpha=1e-5, beta=1e-5, max_iter=500, tol=1e-6, refine_iter=0,
          callback=None):
    """cvxJoint (Sec. 5, (34) with M in M2): min over (u, T) of g(u/t) - 1'u/t + L(T)/t +
    1/2 Xi^2([sqrt(beta) u, sqrt(alpha) T]) by :func:`gcg`; g = log-sum-exp (the prior's
    log-partition), L as cvxCond's.  Returns the result with ``u`` and ``T`` split out.
    ``refine_iter``: as :func:`cond`, off by default: on heart it reaches the tolerance in
    24-28 iterations (a gap of 5e-3 after 300 without), but on spambase (t = 1000) 300
    refined iterations took 287 s against 14 s for 1000 plain ones, with the same
    labels after re-optimization."""
    div = get_divergence(divergence)
    _check_weight("alpha", alpha)
    _check_weight("beta", beta)
    X = _check(np.asarray(X, dtype=np.float64), d, div, "cvxJoint")
    res = gcg(JointProblem(X, div, alpha, beta), d, 1.0, max_iter=max_iter, tol=tol, refine_iter=refine_iter,
              callback=callback, method="cvxJoint")
    return dataclasses.replace(res, u=res.W[:, 0] / math.sqrt(beta), T=res.W[:, 1:] / math.sqrt(alpha))


def disc(X, d, *, gamma=1e-3, max_iter=500, tol=1e-6, refine_iter=0, callback=None):
    """cvxDisc (Sec. 4, (30) with M in M2): min over (V, tau) of gamma/2 Xi^2(V) +
    (1/t) sum_i [F(x_i V' / t + tau') - x_i v_i / t - tau_i], F the log-sum-exp of (24),
    by :func:`gcg` with tau optimized in every line search.  Any real X (no
    divergence: the model is logistic).  Returns the result with ``V`` and ``tau``.
    ``refine_iter`` defaults to 0 here: with tau held fixed during the refinement, 30
    iterations on heart ended at a slightly higher objective than without it."""
    _check_weight("gamma", gamma)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or not np.all(np.isfinite(X)):
        raise InputValueError(f"X must be a finite 2-D array (points x features); got shape {X.shape}")
    _check_clusters(d, X.shape[0])
    res = gcg(DiscProblem(X), d, gamma, max_iter=max_iter, tol=tol, refine_iter=refine_iter, callback=callback,
              method="cvxDisc")
    return dataclasses.replace(res, V=res.W, tau=res.extra)
