"""Simplicial symmetric NMF: Frank-Wolfe, and the two baselines of its paper.

H. Zhao and G. Gordon, "Frank-Wolfe Optimization for Symmetric-NMF under Simplicial
Constraint", UAI 2018, arXiv:1706.06348.

    minimize_W  f(W) = 1/4 ||P - W W^T||_F^2   s.t.  W >= 0,  W 1_k = 1_n          (1)

with P an n x n nonnegative symmetric (PSD, as the paper assumes) affinity.  The rows of
W are cluster-membership probabilities.

Symbols -> code: P -> the operator ``P`` (anything with ``shape``, ``matmat`` and
``label_sums``, e.g. a BlockMatrix), W -> ``W`` (n x k, float64, in this process),
grad f = W (W^T W) - P W (eq. 7) -> ``G``, the LMO's vertex S (Alg. 2: one 1 per row, at
the row's smallest gradient entry) -> ``labels``, the FW gap g_t (eq. 5) -> ``gap``,
gamma_t -> ``step``, C >= C_f (Thm. 3: C_f <= 2n(3n + ||P||_2)) -> ``curvature``.

Frank-Wolfe keeps M = P W.  The vertex S is one-hot, so P S is a sum of P's columns by
label (``P.label_sums``), and M <- (1 - step) M + step P S: ONE pass over P per
iteration.  Everything else (gradient, LMO, gap, the exact line search, the update of W)
is O(n k^2) work on n x k arrays in this process, between passes.

Baselines, from the same start and with the same history: projected gradient descent
with backtracking (row-wise Euclidean projection onto the simplex; one pass per trial
step), and the penalty method of Zhao et al. (AAAI 2015, "SoF") as the paper runs it
(Sec. 5): quadratic penalties on W 1 = 1 and W >= 0 whose weights double every outer
iteration, each inner problem minimized by L-BFGS for at most 50 iterations (one pass per
function evaluation); its iterates are not feasible, so its result is projected onto the
feasible set at the end.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputValueError, warn_convergence
from ..linalg import top_eigenvectors
from .._checks import check_choices, check_solver_params, check_count, check_ints, check_numbers

logger = logging.getLogger(__name__)

METHODS = ("fw", "pgd", "penalty")
STEP_RULES = ("line_search", "paper")
STOP_RULES = ("gap", "objective")
PENALTY_INNER_ITER = 50        # the paper's "maximum number of inner loops"
PENALTY_GROWTH = 2.0           # the paper's "step factor for the coefficients"
PLAIN_BACKTRACKING_FIRST_STEP = 1.0   # PGD's first trial step every iteration with step_rule="paper"


@dataclass
class SymNMFParams:
    """Parameters of the solvers (see :func:`frank_wolfe`)."""

    n_components: int
    max_iter: int = 1000
    tol: float = 1e-4
    stop_rule: str = "gap"
    objective_tol: float = 1e-3
    step_rule: str = "line_search"

    def validate(self, n):
        check_count("n_clusters", self.n_components, 2, n, "n")
        check_ints(self, ("max_iter",))
        check_numbers(self, ("tol", "objective_tol"), positive=False)
        check_choices(self, {"stop_rule": STOP_RULES, "step_rule": STEP_RULES})


@dataclass(frozen=True, eq=False)
class SymNMFResult:
    """What the solvers return.

    Attributes
    ----------
    W : ndarray (n, k)
        Rows on the simplex (the penalty method's final iterate, projected).
    history : list of dict
        One row per iteration: ``iteration``, ``objective`` (f, eq. 1), ``gap`` (FW gap
        at that iterate; NaN for the penalty method's infeasible iterates), ``step``
        (the step taken from it; NaN on the last row), ``passes`` (passes over P so far,
        the initial one included), ``seconds`` (since the start), and for the penalty
        method ``violation`` (max |W 1 - 1| and max [W]_-) and ``penalty``.
    n_iter : int
    stop_reason : {"tolerance", "objective", "max_iter", "callback"}
    converged : bool
    objective, gap : float
        f and the FW gap at ``W``.
    passes : int
        Passes over P in all.
    method, step_rule : str
    """

    W: np.ndarray
    history: list
    n_iter: int
    stop_reason: str
    converged: bool
    objective: float
    gap: float
    passes: int
    method: str
    step_rule: str = ""
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------ pieces
def objective_from(W, M, fro2, A=None):
    """f(W) = 1/4 (||P||_F^2 - 2 <W, P W> + ||W^T W||_F^2), from M = P W (and the Gram
    A = W^T W when the caller has it)."""
    A = W.T @ W if A is None else A
    return 0.25 * (fro2 - 2.0 * float(np.sum(W * M)) + float(np.sum(A * A)))


def gradient_from(W, M, A=None):
    """grad f(W) = W (W^T W) - P W (eq. 7), from M = P W (and A = W^T W if known)."""
    return W @ (W.T @ W if A is None else A) - M


def lmo(G):
    """Alg. 2: the vertex of the product of simplices minimizing <S, G> (one-hot rows at
    each row's smallest entry, as labels) and the FW gap <G, W - S> needs <G, W>."""
    labels = np.argmin(G, axis=1)
    return labels, G[np.arange(G.shape[0]), labels]


def fw_gap(G, W):
    labels, gmin = lmo(G)
    return float(np.sum(G * W) - np.sum(gmin)), labels


def quartic_coefficients(W, M, labels, N, fro2, A=None):
    """Coefficients c0..c4 of f(W + step (S - W)) = sum_m c_m step^m, with S the one-hot
    matrix of ``labels``, M = P W and N = P S: no pass over P.

    tr((W + s D)^T P (W + s D)) = t0 + t1 s + t2 s^2 (D = S - W) from <W,M>, <S,M>,
    <W,N>, <S,N>; ||(W + s D)^T (W + s D)||_F^2 from the k x k Grams W^T W, W^T S, S^T S.
    """
    n, k = W.shape
    rows = np.arange(n)
    wm = float(np.sum(W * M))
    sm = float(np.sum(M[rows, labels]))
    wn = float(np.sum(W * N))
    sn = float(np.sum(N[rows, labels]))
    t0, t1, t2 = wm, (sm - wm) + (wn - wm), sn - sm - wn + wm
    A = W.T @ W if A is None else A
    WS = np.zeros((k, k))                     # W^T S: column b sums W's rows labelled b
    for a in range(k):
        WS[a] = np.bincount(labels, weights=W[:, a], minlength=k)
    SS = np.diag(np.bincount(labels, minlength=k).astype(np.float64))
    WD = WS - A                               # W^T D
    B = WD + WD.T
    C = SS - WS - WS.T + A                    # D^T D
    a0, a1 = np.sum(A * A), 2 * np.sum(A * B)
    a2, a3, a4 = np.sum(B * B) + 2 * np.sum(A * C), 2 * np.sum(B * C), np.sum(C * C)
    return np.array([0.25 * (fro2 - 2 * t0 + a0), 0.25 * (a1 - 2 * t1), 0.25 * (a2 - 2 * t2),
                     0.25 * a3, 0.25 * a4])


def quartic_argmin(c):
    """The minimizer over [0, 1] of the quartic with coefficients c (ascending)."""
    deriv = np.array([4 * c[4], 3 * c[3], 2 * c[2], c[1]])
    cands = [0.0, 1.0]
    if np.any(deriv != 0):
        for r in np.roots(np.trim_zeros(deriv, "f")):
            if abs(r.imag) <= 1e-12 * max(1.0, abs(r.real)) and 0.0 < r.real < 1.0:
                cands.append(float(r.real))
    vals = [np.polyval(c[::-1], s) for s in cands]
    return cands[int(np.argmin(vals))]


def project_rows_to_simplex(V):
    """Row-wise Euclidean projection onto {w >= 0, sum w = 1} (sort-based, O(n k log k))."""
    V = np.asarray(V, dtype=np.float64)
    n, k = V.shape
    U = -np.sort(-V, axis=1)
    css = np.cumsum(U, axis=1) - 1.0
    idx = np.arange(1, k + 1)
    cond = U - css / idx > 0
    rho = k - 1 - np.argmax(cond[:, ::-1], axis=1)       # last index where cond holds
    theta = css[np.arange(n), rho] / (rho + 1)
    return np.maximum(V - theta[:, None], 0.0)


def random_simplex_rows(n, k, rng):
    """A start with rows drawn uniformly from the simplex (Dirichlet(1, ..., 1))."""
    return rng.dirichlet(np.ones(k), size=n)


def spectral_norm(P):
    """||P||_2 of a nonnegative symmetric P: its largest eigenvalue (Perron-Frobenius),
    by Lanczos over matmat passes.  Returns (value, passes)."""
    count = [0]

    def mm(V):
        count[0] += 1
        return P.matmat(V)

    w, _ = top_eigenvectors(mm, P.shape[0], 1, tol=1e-6)
    return float(w[0]), count[0]


class _Clock:
    def __init__(self, state=None):
        # A resumed run continues the counts of the run it resumes.
        last = state["history"][-1] if state else None
        self.t0 = time.perf_counter() - (last["seconds"] if last else 0.0)
        self.passes = state["passes"] if state else 0

    def row(self, iteration, **values):
        return dict(iteration=int(iteration), **{k: float(v) for k, v in values.items()},
                    passes=self.passes, seconds=time.perf_counter() - self.t0)


def _check_start(W0, n, k):
    W = np.array(W0, dtype=np.float64, copy=True)
    if W.shape != (n, k):
        raise InputValueError(f"the start W0 must have shape ({n}, {k}); got {W.shape}")
    if not np.isfinite(W).all() or W.min() < 0 or np.abs(W.sum(axis=1) - 1).max() > 1e-9:
        raise InputValueError("the start W0 must be finite, nonnegative, with rows summing to 1")
    return W


def _record(clock, history, t, params, prev_objective, fro2, callback, **values):
    """Append iteration t's history row; return it and why the run stops there (or None)."""
    row = clock.row(t, **values, step=float("nan"))
    history.append(row)
    if params.stop_rule == "gap" and row["gap"] <= params.tol * fro2:
        return row, "tolerance"
    if params.stop_rule == "objective" and prev_objective is not None and \
            abs(row["objective"] - prev_objective) < params.objective_tol:
        return row, "objective"
    if callback is not None and callback(dict(row)) is True:
        return row, "callback"
    return row, ("max_iter" if t == params.max_iter else None)


def _resumed_state(state, n, k):
    """W, M, the next iteration and the history from a checkpoint (see ``checkpoint_state``)."""
    W = np.array(state["W"], dtype=np.float64)
    M = np.array(state["M"], dtype=np.float64)
    if W.shape != (n, k) or M.shape != (n, k):
        raise InputValueError(f"the checkpoint holds W of shape {W.shape}, expected ({n}, {k})")
    history = [dict(r) for r in state["history"]]
    return W, M, int(state["iteration"]), history


def _resumed_callback(state, callback):
    """The callback of a resumed run.  The final checkpoint holds the last iterate with its
    history row taken back, so a resumed run recomputes that row and meets the same stop
    (tolerance, objective, max_iter) there, bit for bit; a stop by the callback, which
    is not saved, is replayed from the checkpoint's ``stop_reason``."""
    if state is not None and state.get("stop_reason") == "callback":
        return lambda row: True
    return callback


def checkpoint_state(W, M, iteration, history, passes, **extra):
    """What a run needs to continue: the iterate, M = P W, the next iteration, the history."""
    # Copies: the run goes on updating W, M and its rows in place.
    return dict(W=W.copy(), M=M.copy(), iteration=int(iteration), history=[dict(row) for row in history],
                passes=int(passes), **extra)


def _finish_warn(method, params, stop_reason, history, fro2):
    """ConvergenceWarning for a run that reached max_iter with a tolerance to meet: the
    last value of the stopping rule's quantity against its tolerance (see :func:`_record`)."""
    tol = params.tol if params.stop_rule == "gap" else params.objective_tol
    if stop_reason != "max_iter" or not tol > 0:       # tol = 0 asks for max_iter iterations
        return
    last = history[-1]
    if params.stop_rule == "gap":
        residual = (f"last FW gap {last.get('gap', float('nan')):.3g} > tol * ||P||_F^2 = "
                    f"{params.tol * fro2:.3g} (tol {params.tol:g})")
    else:
        change = abs(last["objective"] - history[-2]["objective"]) if len(history) > 1 else float("nan")
        residual = (f"last objective change {change:.3g} >= objective_tol {params.objective_tol:g}")
    warn_convergence(f"SymNMF ({method}) stopped at max_iter={params.max_iter} before meeting its "
                     f"tolerance: {residual}; objective {last['objective']:.6g}")


# ------------------------------------------------------------------ Frank-Wolfe
def frank_wolfe(P, W0, params: SymNMFParams, *, fro2, spectral=None, callback=None, state=None,
                checkpoint=None, checkpoint_every=50):
    """Alg. 1 of Zhao & Gordon with Alg. 2 as the LMO.

    Parameters
    ----------
    P : operator
        n x n, nonnegative symmetric: ``shape``, ``matmat(V)`` and ``label_sums(labels, k)``
        (each one pass over P).
    W0 : ndarray (n, k)
        Feasible start.
    params : SymNMFParams
        Checked by ``params.validate`` on entry, except inside an estimator's fit
        (which checked them before reading any data).
        ``n_components`` (k), ``max_iter``, ``stop_rule`` ("gap": stop when the FW gap
        <= ``tol`` ||P||_F^2, a scale-free form of Alg. 1's g_t <= epsilon; "objective":
        the paper's experiments, |f_t - f_{t-1}| < ``objective_tol``), ``step_rule``
        ("line_search": the exact minimizer of the quartic f along the FW direction, no
        extra pass; "paper": min(gap / C, 1) with C = 2n(3n + ||P||_2) >= C_f, Thm. 3).
    fro2 : float
        ||P||_F^2 (for the objective).
    spectral : float, optional
        ||P||_2 for the paper's step (computed by Lanczos when needed and not given).
    callback : callable, optional
        Called with each history row; returning True stops the run.
    state : dict, optional
        A state saved by ``checkpoint`` (W, M, iteration, history, passes): the run
        continues from it (``W0`` is then ignored) exactly as if it had not stopped.
    checkpoint : callable, optional
        Called with :func:`checkpoint_state` every ``checkpoint_every`` iterations and
        at the end (O(n k) numbers).

    Returns
    -------
    SymNMFResult

    Notes
    -----
    Per iteration: one pass over P (``label_sums``), O(n k^2) work in this process, and
    one gather of n x k partial sums per block row.  Every iterate is feasible: W moves
    along segments between points of the product of simplices.  With the line search f
    never increases (the step 0 is a candidate).
    """
    n, k = P.shape[0], params.n_components
    check_solver_params(params, n)
    clock = _Clock(state)
    callback = _resumed_callback(state, callback)
    curvature = None
    extra = {}
    if params.step_rule == "paper":
        if spectral is None and state is not None:
            spectral = state.get("spectral_norm")
        if spectral is None:
            spectral, used = spectral_norm(P)
            clock.passes += used
        curvature = 2.0 * n * (3.0 * n + spectral)
        extra = {"spectral_norm": spectral, "curvature_bound": curvature}
    if state is not None:
        W, M, first, history = _resumed_state(state, n, k)
        prev_obj = history[-1]["objective"] if history else None
    else:
        W = _check_start(W0, n, k)
        M = np.asarray(P.matmat(W), dtype=np.float64)
        clock.passes += 1
        first, history, prev_obj = 0, [], None
    stop_reason = "max_iter"
    for t in range(first, params.max_iter + 1):
        if checkpoint is not None and t > first and t % checkpoint_every == 0:
            checkpoint(checkpoint_state(W, M, t, history, clock.passes, **extra))
        A = W.T @ W                      # the k x k Gram, shared by f, grad f and the line search
        G = gradient_from(W, M, A)
        gap, labels = fw_gap(G, W)
        f = objective_from(W, M, fro2, A)
        row, reason = _record(clock, history, t, params, prev_obj, fro2, callback, objective=f, gap=gap)
        if reason is not None:
            stop_reason = reason
            break
        prev_obj = f
        N = P.label_sums(labels, k)
        clock.passes += 1
        if curvature is not None:
            step = min(gap / curvature, 1.0)
        else:
            step = quartic_argmin(quartic_coefficients(W, M, labels, N, fro2, A))
        row["step"] = step
        W *= 1.0 - step
        W[np.arange(n), labels] += step
        M *= 1.0 - step
        M += step * N
        logger.debug("FW it %d f %.6g gap %.3g step %.3g", t, f, gap, step)
    last = history[-1]
    if checkpoint is not None:
        # The final iterate, with the row for it taken back: resuming with a larger
        # max_iter recomputes that row and goes on.
        checkpoint(checkpoint_state(W, M, last["iteration"], history[:-1], clock.passes, stop_reason=stop_reason, **extra))
    _finish_warn("Frank-Wolfe", params, stop_reason, history, fro2)
    return SymNMFResult(W=W, history=history, n_iter=len(history) - 1, stop_reason=stop_reason,
                        converged=stop_reason in ("tolerance", "objective"),
                        objective=last["objective"], gap=last["gap"], passes=clock.passes,
                        method="fw", step_rule=params.step_rule, extra=extra)


# ------------------------------------------------------------------ projected gradient
def projected_gradient(P, W0, params: SymNMFParams, *, fro2, callback=None, state=None,
                       checkpoint=None, checkpoint_every=50, shrink=0.5, grow=2.0):
    """Projected gradient descent with backtracking (the paper's PGD baseline).

    W+ = Proj(W - eta grad f(W)) onto the product of simplices; eta shrinks by ``shrink``
    until f(W+) <= f(W) + <grad, W+ - W> + ||W+ - W||^2 / (2 eta) (the sufficient-decrease
    test of projected gradient, which any eta <= 1/L passes).  Where eta starts each
    iteration is ``params.step_rule``: "line_search" (the default) at ``grow`` times the
    last accepted step, so a steady run pays about two trials an iteration; "paper" at
    ``PLAIN_BACKTRACKING_FIRST_STEP`` = 1 every iteration, plain backtracking as in
    textbooks (the paper names backtracking and no first step), about log2(L) trials an
    iteration with L the local curvature.  Each trial costs one pass (P W+), which then
    also gives the next gradient.  Monotone.  Same stopping rules, history, ``state`` and
    ``checkpoint`` as :func:`frank_wolfe` (the gap is the FW gap at each iterate; the
    checkpoint also keeps the step eta).
    """
    n, k = P.shape[0], params.n_components
    check_solver_params(params, n)
    clock = _Clock(state)
    callback = _resumed_callback(state, callback)
    plain = params.step_rule == "paper"
    if state is not None:
        W, M, first, history = _resumed_state(state, n, k)
        prev_obj = history[-1]["objective"] if history else None
        eta = float(state["eta"])
    else:
        W = _check_start(W0, n, k)
        M = np.asarray(P.matmat(W), dtype=np.float64)
        clock.passes += 1
        first, history, prev_obj = 0, [], None
        # f is L-smooth with L <= 3n + ||P||_2 (Lemma 5), and ||P||_2 <= max row sum of P,
        # which is the max row sum of M = P W for W on the simplex: a start that passes.
        eta = 1.0 / (3.0 * n + float(M.sum(axis=1).max()))
    f = objective_from(W, M, fro2)
    stop_reason = "max_iter"
    for t in range(first, params.max_iter + 1):
        if checkpoint is not None and t > first and t % checkpoint_every == 0:
            checkpoint(checkpoint_state(W, M, t, history, clock.passes, eta=eta))
        G = gradient_from(W, M)
        gap, _ = fw_gap(G, W)
        row, reason = _record(clock, history, t, params, prev_obj, fro2, callback, objective=f, gap=gap)
        if reason is not None:
            stop_reason = reason
            break
        prev_obj = f
        eta = PLAIN_BACKTRACKING_FIRST_STEP if plain else eta * grow
        while True:
            Wn = project_rows_to_simplex(W - eta * G)
            Mn = np.asarray(P.matmat(Wn), dtype=np.float64)
            clock.passes += 1
            fn = objective_from(Wn, Mn, fro2)
            Dl = Wn - W
            if fn <= f + float(np.sum(G * Dl)) + float(np.sum(Dl * Dl)) / (2 * eta) or eta < 1e-300:
                break
            eta *= shrink
        row["step"] = eta
        W, M, f = Wn, Mn, fn
    last = history[-1]
    if checkpoint is not None:
        checkpoint(checkpoint_state(W, M, last["iteration"], history[:-1], clock.passes, stop_reason=stop_reason, eta=eta))
    _finish_warn("projected gradient", params, stop_reason, history, fro2)
    return SymNMFResult(W=W, history=history, n_iter=len(history) - 1, stop_reason=stop_reason,
                        converged=stop_reason in ("tolerance", "objective"),
                        objective=last["objective"], gap=last["gap"], passes=clock.passes,
                        method="pgd", step_rule="plain backtracking" if plain else "backtracking")


# ------------------------------------------------------------------ penalty method
def penalty_method(P, W0, params: SymNMFParams, *, fro2, callback=None, penalty0=1.0):
    """The sequential penalty method (Zhao et al. 2015) as run in Zhao & Gordon, Sec. 5.

    Outer iteration t minimizes, by L-BFGS for at most 50 iterations from the last W,

        F_t(W) = f(W) + lam_t / 2 (||W 1 - 1||^2 + ||[W]_-||_F^2),   lam_t = penalty0 2^t,

    (f as eq. 1; one pass over P per function evaluation).  Stops by the paper's rule
    whatever ``stop_rule`` says (its iterates have no FW gap): |f_t - f_{t-1}| <
    ``objective_tol``, or after ``max_iter`` outer iterations.  The history records the
    constraint violation of each outer iterate.  The iterates are infeasible; the returned W is the last one projected
    onto the product of simplices, and its objective and FW gap cost one more pass.
    """
    from scipy.optimize import minimize

    n, k = P.shape[0], params.n_components
    check_solver_params(params, n)
    clock = _Clock()
    W = _check_start(W0, n, k)
    ones = np.ones(n)
    last_f = [None]

    def fun(x, lam):
        V = x.reshape(n, k)
        Mv = np.asarray(P.matmat(V), dtype=np.float64)
        clock.passes += 1
        r = V.sum(axis=1) - ones
        neg = np.minimum(V, 0.0)
        f = objective_from(V, Mv, fro2)
        last_f[0] = f
        F = f + 0.5 * lam * (float(r @ r) + float(np.sum(neg * neg)))
        grad = gradient_from(V, Mv) + lam * (r[:, None] + neg)
        return F, grad.ravel()

    history, prev_obj, stop_reason = [], None, "max_iter"
    x = W.ravel().copy()
    f0 = fun(x, 0.0)[0]
    history.append(clock.row(0, objective=f0, gap=float("nan"), step=float("nan"), violation=0.0,
                             penalty=penalty0))
    prev_obj = f0
    for t in range(1, params.max_iter + 1):
        lam = penalty0 * PENALTY_GROWTH ** (t - 1)
        res = minimize(fun, x, args=(lam,), jac=True, method="L-BFGS-B",
                       options={"maxiter": PENALTY_INNER_ITER})
        x = res.x
        V = x.reshape(n, k)
        f = objective_from(V, np.asarray(P.matmat(V), dtype=np.float64), fro2)
        clock.passes += 1
        violation = max(float(np.abs(V.sum(axis=1) - 1).max()), float(max(0.0, -V.min())))
        row = clock.row(t, objective=f, gap=float("nan"), step=float("nan"), violation=violation,
                        penalty=lam)
        history.append(row)
        if abs(f - prev_obj) < params.objective_tol:
            stop_reason = "objective"
        elif callback is not None and callback(dict(row)) is True:
            stop_reason = "callback"
        prev_obj = f
        if stop_reason != "max_iter":
            break
    W = project_rows_to_simplex(x.reshape(n, k))
    M = np.asarray(P.matmat(W), dtype=np.float64)
    clock.passes += 1
    f = objective_from(W, M, fro2)
    gap, _ = fw_gap(gradient_from(W, M), W)
    if stop_reason == "max_iter" and params.objective_tol > 0:
        change = abs(history[-1]["objective"] - history[-2]["objective"])
        warn_convergence(f"SymNMF (penalty method) stopped at max_iter={params.max_iter} outer iterations "
                         f"before meeting its tolerance: last objective change {change:.3g} >= "
                         f"objective_tol {params.objective_tol:g} (constraint violation "
                         f"{history[-1]['violation']:.3g})")
    return SymNMFResult(W=W, history=history, n_iter=len(history) - 1, stop_reason=stop_reason,
                        converged=stop_reason == "objective", objective=f, gap=gap,
                        passes=clock.passes, method="penalty", step_rule="L-BFGS",
                        extra={"objective_unprojected": history[-1]["objective"],
                               "violation": history[-1]["violation"]})


SOLVERS = {"fw": frank_wolfe, "pgd": projected_gradient, "penalty": penalty_method}


def solve(method, P, W0, params, *, fro2, callback=None, spectral=None, state=None, checkpoint=None,
          checkpoint_every=50):
    """Run solver ``method`` ("fw", "pgd" or "penalty") from ``W0`` (or from ``state``).

    Frank-Wolfe and projected gradient checkpoint and resume (see :func:`frank_wolfe`);
    the penalty method's L-BFGS state is not kept, so it runs only from a start."""
    if method not in SOLVERS:
        raise InputValueError(f"solver must be one of {METHODS}; got {method!r}")
    if method == "penalty":
        if state is not None:
            raise InputValueError("the penalty method cannot resume (its L-BFGS memory is not kept); "
                                  "start it again, or use solver='fw' or 'pgd'")
        return penalty_method(P, W0, params, fro2=fro2, callback=callback)
    kw = {"spectral": spectral} if method == "fw" else {}
    return SOLVERS[method](P, W0, params, fro2=fro2, callback=callback, state=state,
                           checkpoint=checkpoint, checkpoint_every=checkpoint_every, **kw)


__all__ = ["SymNMFParams", "SymNMFResult", "frank_wolfe", "projected_gradient", "penalty_method",
           "solve", "objective_from", "gradient_from", "quartic_coefficients", "quartic_argmin",
           "project_rows_to_simplex", "random_simplex_rows", "spectral_norm", "METHODS",
           "STEP_RULES", "STOP_RULES"]
