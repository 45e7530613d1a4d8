"""NOMAD's low-rank form (Tepper et al., Sec. 4 and App. E) and symmetric NMF by ADMM
(App. D), over a matrix-free operator.

Burer-Monteiro replaces Q (n x n) by Y Y^T with Y >= 0 of r columns (the paper writes
Y^T Y with Y r x n):

    max Tr(D Y Y^T)  s.t.  Tr(Y^T Y) = K,  Y Y^T 1 = 1,  Y >= 0            (11)

solved by the method of multipliers on the augmented Lagrangian (32)

    L(Y, mu, lam) = -Tr(D Y Y^T) + sigma/2 ||Y Y^T 1 - 1||^2 - mu^T (Y Y^T 1 - 1)
                    + phi/2 (||Y||_F^2 - K)^2 - lam (||Y||_F^2 - K),

each step minimizing L over Y in [0, 1]^{n x r} by a bound-constrained method whose
every step is row-chunk work (:mod:`dnomad.nomad.box_optim`: projected L-BFGS in
vector-free form by default, or spectral projected gradient), so that Y can live in row
chunks beside X on a cluster's workers, then (33b, 33c) mu -= eta sigma (Y Y^T 1 - 1),
lam -= eta phi (||Y||_F^2 - K).  One evaluation of L and its gradient costs one product
D Y: a pass over D's blocks, or two passes over the rows of X when D is X's Gram
matrix; nothing n x n is ever formed.  Nonconvex: r >= K trades
speed for closeness to the SDP's solution (r = K gives hard clusterings, Kulis et al.
2007; the authors' default is r = 8K, ours 2K: see RANK_PER_K).

Symmetric NMF (App. D): min ||A - W W^T||_F, W >= 0, by ADMM on the split W = H with
sigma = eta = 1; each half step is the least-squares solution clipped at 0 (the
authors' practice), and A enters only through products A W, so it runs matrix-free.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field

import numba
import numpy as np

from ..errors import InputValueError, warn_convergence
from .._checks import check_choices, check_solver_params, check_ints, check_numbers
from ..blocks.rows import ordered_sum, random_rows, stream_key
from .box_optim import PAIR_DTYPES, STATE_FASTMATH, drop_states, output_buffer, row_blocks, solver_states, work_states

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ symmetric NMF
@dataclass(frozen=True, eq=False)
class AdmmResult:
    W: np.ndarray | None          # None where it was left in a row space (state "W")
    n_iter: int
    history: list = field(default_factory=list)
    converged: bool = False
    products: int = 0             # products D S (n x rank) made
    passes: int = 0               # passes over X (data mode)
    seconds: float = 0.0


def symnmf_admm(matmat, n, rank, *, W0=None, sigma=1.0, eta=1.0, max_iter=1000, tol=1e-5,
                random_state=None, scale=None, callback=None):
    """W >= 0 (n x rank) with A ~ W W^T, by ADMM (App. D of Tepper et al.).

    ``matmat(W)`` returns A W.  Iterates, for the augmented Lagrangian
    1/2 ||A - W H^T||^2 + sigma/2 ||W - H||^2 - <Gamma, W - H>:

        W <- [(A H + sigma H - Gamma)(H^T H + sigma I)^-1]_+
        H <- [(A W + sigma W + Gamma)(W^T W + sigma I)^-1]_+
        Gamma <- Gamma - eta sigma (H - W)

    (the paper's (31c) prints the multiplier step with the opposite sign of its (30);
    this is the ascent step for (30)).  Stops when ||W - H||_F <= tol ||W||_F (at
    ``max_iter`` with a ConvergenceWarning).  The
    start is |N(0, s^2)| with s^2 = ``scale`` / rank, ``scale`` the mean entry of A
    if not given (estimated as 1^T A 1 / n^2).  Costs two products A W per iteration.
    """
    from ..blocks import RowState

    with RowState(n) as space:         # RowState refuses an n that is not a positive int
        res = _symnmf_admm(space, rank, matmat=matmat, W0=W0, sigma=sigma, eta=eta, max_iter=max_iter,
                           tol=tol, random_state=random_state, scale=scale, callback=callback)
        return dataclasses.replace(res, W=space.get("W"))


def _symnmf_admm(space, rank, *, matmat=None, gram_scale=None, dtype=np.float64, W0=None, sigma=1.0,
                 eta=1.0, max_iter=1000, tol=1e-5, random_state=None, scale=None, callback=None):
    """:func:`symnmf_admm` over a row space, leaving W in its state ``"W"`` (and H,
    Gamma in ``"_H"``, ``"_Gamma"``).  Data mode (``matmat`` None; ``space`` a
    RowChunks): A = F F^T / ``gram_scale`` of the chunks' centred rows F, and each half
    step is one pass over X that finishes the product with the last iterate (F B, B =
    F^T S / gram_scale) and starts the one with the new iterate (F^T S), in ``dtype``.
    Operator mode: A S = ``matmat`` on S gathered from the space."""
    n = space.n
    if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= n:
        raise InputValueError(f"rank must be an integer in [1, {n}]; got {rank!r}")
    rng = np.random.default_rng(random_state)
    data = matmat is None
    t0, passes0 = time.perf_counter(), space.passes
    products = 0
    if W0 is None:
        if scale is None:          # the mean entry of A: 1^T A 1 / n^2
            if data:
                f1 = _ordered_sum([p[0] for p in space.map(_column_sums)])
                scale = float(f1 @ f1) / gram_scale / n ** 2
            else:
                scale = float(np.sum(matmat(np.ones((n, 1))))) / n ** 2
            products += 1
        # Drawn by the chunks where they live (nothing n x r in this process), the same
        # rows however the rows are chunked (see random_rows).
        space.map(_random_start, stream_key(rng), rank, math.sqrt(max(scale, 1e-12) / rank), read_x=False,
                  with_span=True)
    else:
        H = np.array(W0, dtype=np.float64)
        if H.shape != (n, rank) or H.min() < 0:
            raise InputValueError(f"W0 must be a nonnegative ({n}, {rank}) array")
        space.put("_H", H)
        space.put("_Gamma", np.zeros_like(H))
        del H

    def finish(parts, name):
        """Sum a pass's (F^T S, S^T S) parts: B for the next half step (data mode;
        operator mode leaves A S in state "_AS") and (S^T S + sigma I)^-1."""
        nonlocal products
        products += 1
        # (S^T S + sigma I)^-1 once here: each chunk's rows then cost one small GEMM
        # (a solve per chunk ran at a tenth of the GEMM rate); SPD with eigenvalues
        # >= sigma, so the inverse is as accurate as the solve
        G = np.linalg.inv(_ordered_sum([p[1] for p in parts]) + sigma * np.eye(rank))
        G = 0.5 * (G + G.T)
        if data:
            return (_ordered_sum([p[0] for p in parts]) / gram_scale).astype(dtype), G
        space.put("_AS", np.asarray(matmat(space.get(name)), dtype=np.float64))
        return None, G

    parts = space.map(_start_products, "_H", read_x=data, dtype=dtype)
    history, converged, stopped = [], False, False
    for it in range(1, max_iter + 1):
        B, G = finish(parts, "_H")
        parts = space.map(_admm_half_step, "_H", "W", B, G, sigma, -1.0, None, read_x=data, dtype=dtype)
        B, G = finish(parts, "W")
        parts = space.map(_admm_half_step, "W", "_H", B, G, sigma, 1.0, eta * sigma, read_x=data, dtype=dtype)
        gap = math.sqrt(_ordered_sum([p[2] for p in parts])) / max(
            math.sqrt(_ordered_sum([p[3] for p in parts])), 1e-300)
        history.append({"iteration": it, "split_gap": float(gap), "seconds": time.perf_counter() - t0})
        if callback is not None and callback(dict(history[-1])) is True:
            stopped = True
            break
        if gap <= tol:
            converged = True
            break
    space.map(drop_states, ["_AS", "_admm_rhs", "_admm_low"], read_x=False)
    if not (converged or stopped) and history and tol > 0:
        warn_convergence(f"symmetric NMF (ADMM) stopped at max_iter={max_iter} before meeting its tolerance: "
                         f"last ||W - H||_F / ||W||_F {history[-1]['split_gap']:.3g} > tol {tol:g}")
    return AdmmResult(W=None, n_iter=len(history), history=history, converged=converged, products=products,
                      passes=space.passes - passes0, seconds=time.perf_counter() - t0)


# Per-chunk kernels of the ADMM (module level: workers import them).
def _random_start(chunk, span, key, rank, sd):
    """The ADMM's start H = |N(0, sd^2)| and Gamma = 0 on this chunk's rows."""
    chunk["_H"] = np.abs(random_rows(key, *span, rank)) * sd
    chunk["_Gamma"] = np.zeros_like(chunk["_H"])


def _column_sums(chunk):
    return chunk["X"].sum(axis=0, dtype=np.float64), None


def _start_products(chunk, name):
    S = chunk[name]
    X = chunk.get("X")
    return (None if X is None else X.T @ S.astype(X.dtype)), S.T @ S


def _admm_half_step(chunk, src, dst, B, Ginv, sigma, sign, step):
    """dst <- [(A src + sigma src + sign Gamma) Ginv]_+ on this chunk's rows, A src from
    X B (data mode) or state "_AS"; with ``step``, then Gamma -= step (dst - src).
    Returns (F^T dst, dst^T dst) for the next half step and, with ``step``,
    (||dst - src||^2, ||src||^2).  The elementwise work is numba loops into buffers the
    states keep, not numpy temporaries and new arrays every half step (on all 70,000
    MNIST digits the start's 346 iterations took 169 s against 174 s: the four products
    with X are most of an iteration)."""
    S = chunk[src]
    X = chunk.get("X")
    AS = chunk["_AS"] if X is None else X @ B
    T = output_buffer(chunk, "_admm_rhs", S)
    _admm_rhs(AS, S, chunk["_Gamma"], sigma, sign, T)
    new = output_buffer(chunk, dst, S)
    np.matmul(T, Ginv, out=new)
    if X is None or X.dtype == new.dtype:
        _clip_below(new, None)
        low = new
    else:                               # dst in X's precision too, for F^T dst
        low = output_buffer(chunk, "_admm_low", new, dtype=X.dtype)
        _clip_below(new, low)
    out = [None if X is None else X.T @ low, new.T @ new]
    if step is not None:
        out += list(_multiplier_update(chunk["_Gamma"], new, S, step))
    return out


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _admm_rhs(AS, S, Gamma, sigma, sign, T):
    """T = A S + sigma S + sign Gamma (A S in any precision)."""
    for i in range(S.shape[0]):
        for j in range(S.shape[1]):
            T[i, j] = AS[i, j] + sigma * S[i, j] + sign * Gamma[i, j]


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _clip_below(V, low):
    """V = max(V, 0) in place; ``low`` (if not None) = V in its precision."""
    for i in range(V.shape[0]):
        for j in range(V.shape[1]):
            v = max(V[i, j], 0.0)
            V[i, j] = v
            if low is not None:
                low[i, j] = v


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _multiplier_update(Gamma, new, S, step):
    """Gamma -= step (new - S) in place; (||new - S||^2, ||S||^2)."""
    dd = ss = 0.0
    for i in range(S.shape[0]):
        for j in range(S.shape[1]):
            d = new[i, j] - S[i, j]
            Gamma[i, j] -= step * d
            dd += d * d
            ss += S[i, j] * S[i, j]
    return dd, ss


# ------------------------------------------------------------------ Burer-Monteiro
BM_OPTIMIZERS = ("lbfgs", "spg", "scipy")
# Why a multiplier step's inner solve ended, as the history's ``inner_stop`` column keeps
# it (a code: the run store's history columns are numeric): INNER_STOPS[code].
INNER_STOPS = ("gtol", "ftol", "max_iter", "line_search")


# The default r = RANK_PER_K K (the authors': 8 K).  Y and each of the optimizer's
# states are n x r, so r sets the rows a worker holds and every pass's bytes; with K
# from NOMAD's default sdp_k, 2 K ended within 1e-3 of 8 K's objective with the same
# labels (ARI within 0.02) on six data sets, in 0.18-0.34 of the time
# (graphs/nomad_bm_rank.py).  Closer to the SDP's solution takes a wider Y (the
# paper's Fig. 12; settable as rank), or solver="cgm".
RANK_PER_K = 2


@dataclass
class BurerMonteiroParams:
    """Parameters of :func:`burer_monteiro`: the paper's defaults, except r (see
    RANK_PER_K), sigma (see resolved_sigma), phi and the preconditioner.  phi = 0.1, not 1: the trace penalty's
    curvature along Y is 4 phi K, with phi = 1 the Hessian's one outlier (66 at K = 16 on
    1,000 MNIST digits, the rest <= 4), which sets L-BFGS's curvature scale; with the
    preconditioner, 7,000 and 3,500 MNIST digits (K = 16) met the stopping rule in 970
    and 989 evaluations at phi = 0.1, 1,268 and 1,608 at 0.156, 1,932 and 1,542 at 1
    (``python graphs/nomad_bm_scaling.py --only tuning``; docs/benchmark_notes.md)."""

    n_clusters: int
    rank: int | None = None          # r; None: min(RANK_PER_K K, n)
    sigma: float | None = None       # row-sum penalty; None: 10 / n (see resolved_sigma)
    phi: float = 0.1                 # trace penalty (the paper's 1: see the class docstring)
    eta: float = 1.0
    max_iter: int = 1000             # multiplier (outer) steps
    tol: float = 1e-5                # stop: ||Y - Y_prev||_F <= tol ||Y_prev||_F ...
    feasibility_tol: float = 1e-4    # ... and the constraints met to this (relative) level
    optimizer: str = "lbfgs"         # inner solver: "lbfgs", "spg" or "scipy" (L-BFGS-B)
    memory: int = 5                  # pairs kept by "lbfgs" ...
    pair_dtype: str = "float32"      # ... in this precision (see box_optim.lbfgs)
    inner_max_iter: int = 15000      # inner iterations per outer step (SciPy's default) ...
    inexact_max_iter: int = 150      # ... and per inexact step (see _step_rtol)
    inner_tol: float = 1e-10         # the inner ftol and gtol (D normalized: entries ~ 1/n)
    inner_rtol: float = 0.1          # inner solves stop at this fraction of their first projected gradient
    start: str = "symnmf"            # "symnmf" (App. E) or "random"
    start_tol: float = 1e-3          # the symmetric NMF start's ADMM stops at this split gap ...
    start_max_iter: int = 1000       # ... or after this many iterations
    balance: bool = True             # the start scaled to Y Y^T 1 = 1, and its first step inexact (see _step_rtol)
    increments: bool = False         # X's products of an evaluation by float32 increments (data mode)
    precondition: float | None = 0.1  # lbfgs: H0 = (Y^T Y + eta I)^-1 on each row, eta this times Tr(Y^T Y) / r
    random_state: object = None

    def resolved_rank(self, n):
        return min(RANK_PER_K * self.n_clusters, n) if self.rank is None else self.rank

    def resolved_sigma(self, n):
        """The row-sum penalty: ``sigma``, or 10 / n.  Its curvature along each row's
        c = Y^T 1 is sigma ||c||^2 = sigma n, against at most 2 for Tr(D Y Y^T) with D
        normalized; the paper's sigma = 1 makes the inner problems' condition number grow
        with n (no multiplier step of all 70,000 MNIST digits finished in 1,500 s) while
        10 / n keeps the penalty ten times the objective's curvature at every n."""
        return 10.0 / n if self.sigma is None else self.sigma

    def validate(self, n):
        check_ints(self, ("n_clusters", "max_iter", "inner_max_iter", "inexact_max_iter", "memory", "start_max_iter"))
        if not 1 <= self.n_clusters < n:
            raise InputValueError(f"n_clusters must be in [1, {n - 1}] for n = {n}; got {self.n_clusters}")
        r = self.resolved_rank(n)
        if not isinstance(r, (int, np.integer)) or not self.n_clusters <= r <= n:
            raise InputValueError(f"rank must be an integer in [K, n] = [{self.n_clusters}, {n}] (K: NOMAD's sdp_k); "
                                  f"got {self.rank!r}")
        check_numbers(self, ("phi", "eta", "tol", "feasibility_tol", "inner_tol", "start_tol"), positive=True)
        if self.sigma is not None:
            check_numbers(self, ("sigma",), positive=True)
        check_numbers(self, ("inner_rtol",), positive=False)
        if self.precondition is not None:
            check_numbers(self, ("precondition",), positive=True)
        check_choices(self, {"start": ("symnmf", "random"), "optimizer": BM_OPTIMIZERS, "pair_dtype": PAIR_DTYPES,
                             "increments": (True, False), "balance": (True, False)})


# What a run on X's row chunks holds per row of X (bytes), declared for dnomad.plan and
# checked against the chunks' states by the tests: X's centred rows in float64 (the
# multiplier steps) and float32 (the start) where X is in memory, Y and Y_prev, mu, and
# the optimizer's states
# (box_optim.solver_states: 6 + 2 memory for "lbfgs", the pairs in pair_dtype, 4 for
# "spg"; the start's fit inside them).  A task holds TASK_ROW_TEMPORARIES more
# n_chunk x r arrays while it runs.
TASK_ROW_TEMPORARIES = 4


def row_state_bytes(params, r):
    """{part: bytes per row} that a run holds in X's row chunks at its peak, beside X."""
    work = len(solver_states("Y", params.optimizer))          # less the pairs, counted apart
    pairs = 2 * params.memory if params.optimizer == "lbfgs" else 0
    parts = {"Y and the last outer step's Y": 16 * r, f"the optimizer's {work} states of r columns": 8 * r * work,
             "the row-sum multipliers mu": 8}
    if pairs:
        parts[f"L-BFGS's {pairs} pair states ({params.pair_dtype})"] = np.dtype(params.pair_dtype).itemsize * r * pairs
    return parts


def x_copy_bytes(d):
    """Bytes per row of the centred copies of X the chunks keep for a run's passes (X
    in memory): float64 for the multiplier steps, float32 for the start."""
    return {"X's centred rows (float64 and float32)": 12 * d}


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


def burer_monteiro(D, params: BurerMonteiroParams, *, Y0=None, callback=None, state=None,
                   checkpoint=None, checkpoint_every=1, keep_rows=False):
    """See :func:`_burer_monteiro`; runs with BLAS on one thread (the optimizers make
    many small BLAS calls, on which OpenBLAS's threads spin: measured 29x slower per
    evaluation at n r = 12,800 on 2 cores; row chunks spread the work instead)."""
    from ..blocks import single_threaded_blas

    with single_threaded_blas():
        return _burer_monteiro(D, params, Y0=Y0, callback=callback, state=state,
                               checkpoint=checkpoint, checkpoint_every=checkpoint_every, keep_rows=keep_rows)


# Evaluations by increments re-form D Y in float64 from scratch at least this often, so
# the float32 round-off of the increments cannot pile up along a long inner solve.
ANCHOR_EVERY = 50


class _AugmentedLagrangian:
    """L(., mu, lam) of (32) over a row space, for :mod:`dnomad.nomad.box_optim`.

    Data mode (``D`` None; the space is a RowChunks): D = F F^T / ||F^T F||_F of the
    chunks' centred rows F, and an evaluation is two passes over X (F^T Y, then
    F (F^T Y)) plus two over the state.  Operator mode: D Y from ``D.matmat`` on Y
    gathered from the space.  mu is the state ``"mu"``, lam an attribute.

    Increments (data mode, inside a solve begun with ``begin_solve(True)``): the
    optimizers evaluate a trial point x beside a point b they evaluated last and left
    unchanged, so D Y_x = D Y_b + F (F^T (Y_x - Y_b)) / scale, with both products of
    the step in float32 (half the time of float64 GEMMs) and D Y_b kept in float64 in
    the chunks (state ``"_DY@" + b``).  The round-off is then float32's relative to
    the step, not to D Y: the value differences the line search compares and the
    gradient stay accurate to about 1e-7 of what the step changed, and D Y is formed
    afresh in float64 at the start of each solve and every ``ANCHOR_EVERY``
    evaluations."""

    def __init__(self, space, D, K, sigma, phi):
        self.space, self.D, self.K, self.sigma, self.phi = space, D, K, sigma, phi
        self.scale = float(np.linalg.norm(space.gram)) if D is None else None
        if self.scale == 0:
            raise InputValueError("X is constant after centering: its Gram matrix is zero")
        self.lam, self.matmats = 0.0, 0
        self.objective = {}          # state name -> Tr(D Y Y^T) at its last evaluation
        self.increments = False      # evaluations by float32 increments in this solve
        self.incremental_evaluations = 0
        self._evaluated = []         # [(name, B, ||Y||^2)], the last evaluated first (at most 2)
        self._since_anchor = 0

    def begin_solve(self, increments):
        """A new inner solve: forget the kept D Y's (the states may have changed since)
        and evaluate by increments from here on if ``increments`` (data mode only)."""
        if self._evaluated:
            self.space.map(drop_states, ["_DY@" + e[0] for e in self._evaluated], read_x=False)
        self._evaluated = []
        self.increments = bool(increments) and self.D is None

    def products(self, x):
        """(B, c, ||Y||^2): B = F^T Y / scale (data mode; None in operator mode, where
        D Y is left in state "_DY"), c = Y^T 1, for Y the state ``x``."""
        space = self.space
        self.matmats += 1
        if self.D is None:
            parts = space.map(_ft_step, x)
            B = _ordered_sum([p[0] for p in parts]) / self.scale
        else:
            space.put("_DY", np.asarray(self.D.matmat(space.get(x)), dtype=np.float64))
            parts = space.map(_column_stats, x, read_x=False)
            B = None
        return B, _ordered_sum([p[1] for p in parts]), _ordered_sum([p[2] for p in parts])

    def _base_for(self, x):
        """The point to step from: the last evaluated state other than ``x``, if D Y
        may be formed by an increment now."""
        if not self.increments or self._since_anchor >= ANCHOR_EVERY:
            return None
        return next((e for e in self._evaluated if e[0] != x), None)

    def evaluate(self, x, g):
        base = self._base_for(x)
        step = None
        if base is not None:
            name, B_base, trace_base = base
            parts = self.space.map(_ft_step, x, name, dtype=np.float32)
            if _ordered_sum([p[3] for p in parts]) != trace_base:
                # The base changed after its evaluation (no optimizer here does that):
                # this evaluation starts afresh in float64 instead.
                logger.debug("state %r changed after its evaluation; D Y formed afresh", name)
                base = None
        if base is not None:
            self.matmats += 1
            dB = _ordered_sum([p[0] for p in parts]) / self.scale
            B = B_base + dB
            c, trace = _ordered_sum([p[1] for p in parts]), _ordered_sum([p[2] for p in parts])
            step = (name, dB.astype(np.float32))
            self._since_anchor += 1
            self.incremental_evaluations += 1
        else:
            B, c, trace = self.products(x)
            self._since_anchor = 0
        t = trace - self.K
        keep = None
        drop = []
        if self.increments:
            keep = "_DY@" + x
            self._evaluated = [(x, B, trace)] + [e for e in self._evaluated if e[0] != x]
            drop = ["_DY@" + e[0] for e in self._evaluated[2:]]
            self._evaluated = self._evaluated[:2]
        parts = self.space.map(_lagrangian_rows, x, g, B, c, self.sigma, self.phi * t - self.lam, step, keep, drop,
                               read_x=self.D is None, dtype=np.float32 if step is not None else np.float64)
        ydy, ss, mus = (_ordered_sum([p[k] for p in parts]) for k in range(3))
        self.space.map(_add_to_rows, g, _ordered_sum([p[3] for p in parts]), read_x=False)
        self.objective[x] = float(ydy)
        return float(-ydy + 0.5 * self.sigma * ss - mus + 0.5 * self.phi * t * t - self.lam * t)


def _ordered_sum(parts):
    """Per-chunk results added in chunk order (:func:`dnomad.blocks.rows.ordered_sum`), in
    float64 whatever the kernels' precision."""
    return ordered_sum(np.asarray(p, dtype=np.float64) for p in parts)


# Per-chunk kernels (module level: workers import them).
# Those that read X take the chunk's rows in blocks (box_optim.row_blocks), as the
# optimizer's kernels do: whole-chunk temporaries (X B is 30.5 MiB on a 62,500-row chunk
# at r = 64) and a pass over Y for each sum made these passes a third slower on large
# chunks (docs/benchmark_notes.md, "Scale on a cluster").
def _gram(chunk, x):
    Y = chunk[x]
    return Y.T @ Y


def _column_stats(chunk, x):
    Y = chunk[x]
    return None, Y.sum(axis=0), float(np.vdot(Y, Y))


def _ft_step(chunk, x, base=None):
    """F^T (Y - Y_base) (F^T Y without a base), each row block's product in X's
    precision (float32: an increment) and their sum in float64, c = Y^T 1, ||Y||^2,
    and ||Y_base||^2 (the caller checks that the base is the point it evaluated)."""
    Y, X = chunk[x], chunk["X"]
    Y_base = None if base is None else chunk[base]
    FtS, c, trace, trace_base = np.zeros((X.shape[1], Y.shape[1])), np.zeros(Y.shape[1]), 0.0, 0.0
    for b in row_blocks(Y):
        Yb = Y[b]
        S = Yb if Y_base is None else Yb - Y_base[b]
        FtS += X[b].T @ S.astype(X.dtype, copy=False)
        c += Yb.sum(axis=0)
        trace += float(np.vdot(Yb, Yb))
        if Y_base is not None:
            trace_base += float(np.vdot(Y_base[b], Y_base[b]))
    return FtS, c, trace, trace_base


def _lagrangian_rows(chunk, x, g, B, c, sigma, trace_coef, step=None, keep=None, drop=()):
    """The rows' share of L and of its gradient, less the gradient's rank-one term
    1 (w^T Y) (added when w^T Y is summed: :func:`_add_to_rows`).  D Y is F B, or,
    with ``step`` = (base, dB), D Y_base + F dB in X's precision (an increment), made
    a row block at a time; kept whole as state ``keep`` when given (always, with
    ``step``); the states ``drop`` are forgotten."""
    Y, mu = chunk[x], chunk["mu"]
    for name in drop:
        chunk.pop(name, None)
    X = chunk.get("X")
    if B is None and step is None:      # operator mode: D Y given
        DY = chunk["_DY"]
        if keep is not None:
            chunk[keep] = DY
    else:                               # made a row block at a time, kept whole or in a scratch block
        DY = None if keep is None else output_buffer(chunk, keep, Y)
    blocks = row_blocks(Y)
    scratch = np.empty((min(blocks[0].stop, len(Y)), Y.shape[1])) if DY is None and blocks else None
    G = output_buffer(chunk, g, Y)
    ydy = ss = mus = 0.0
    wy = np.zeros(Y.shape[1])
    for b in blocks:
        Yb = Y[b]
        DYb = scratch[:len(Yb)] if DY is None else DY[b]
        if step is not None:
            np.add(chunk["_DY@" + step[0]][b], X[b] @ step[1], out=DYb)
        elif B is not None:
            np.matmul(X[b], B, out=DYb)
        sb = Yb @ c - 1.0
        wb = sigma * sb - mu[b]
        ydy += _gradient_block(DYb, Yb, wb, c, 2.0 * trace_coef, G[b])
        ss += float(sb @ sb)
        mus += float(mu[b] @ sb)
        wy += wb @ Yb
    return ydy, ss, mus, wy


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _gradient_block(DY, Y, w, c, coef, G):
    """G = -2 D Y + w c^T + coef Y on a row block (one loop, no temporaries); returns
    <Y, D Y>."""
    ydy = 0.0
    for i in range(Y.shape[0]):
        wi = w[i]
        for j in range(Y.shape[1]):
            dy, y = DY[i, j], Y[i, j]
            G[i, j] = -2.0 * dy + wi * c[j] + coef * y
            ydy += y * dy
    return ydy


def _add_to_rows(chunk, g, h):
    chunk[g] += h


def _multiplier_step(chunk, c, step):
    """mu -= step (Y Y^T 1 - 1) (33b); (max |Y Y^T 1 - 1|, ||Y - Y_prev||^2, ||Y_prev||^2,
    Y^T Y, Y_prev^T Y_prev, Y_prev^T Y): the last three give Q's change."""
    Y, prev = chunk["Y"], chunk["Y_prev"]
    s = Y @ c - 1.0
    chunk["mu"] = chunk["mu"] - step * s
    return (float(np.abs(s).max(initial=0.0)), float(np.vdot(Y - prev, Y - prev)), float(np.vdot(prev, prev)),
            Y.T @ Y, prev.T @ prev, prev.T @ Y)


def q_change(YtY, PtP, PtY):
    """||Y Y^T - P P^T||_F / ||P P^T||_F from r x r products, with no n x n matrix:
    ||Y Y^T - P P^T||_F^2 = ||Y^T Y||_F^2 + ||P^T P||_F^2 - 2 ||P^T Y||_F^2 (resolved
    down to about 1e-7: the terms cancel in float64)."""
    sq = float(np.vdot(YtY, YtY) + np.vdot(PtP, PtP) - 2.0 * np.vdot(PtY, PtY))
    return math.sqrt(max(sq, 0.0)) / max(float(np.linalg.norm(PtP)), 1e-300)


def _random_y(chunk, span, key, r, scale):
    chunk["Y"] = random_rows(key, *span, r, draw="random") * scale


def _start_y(chunk):
    """Y = W clipped to [0, 1], from the symmetric NMF start's states."""
    chunk["Y"] = np.clip(chunk.pop("W"), 0.0, 1.0)
    del chunk["_H"], chunk["_Gamma"]


# The start's symmetric scaling stops when every row sum of Y Y^T is this close to 1,
# or after BALANCE_MAX_SWEEPS sweeps (each one pass over Y alone).
BALANCE_TOL = 1e-3
BALANCE_MAX_SWEEPS = 100


def _balance_start(space):
    """Y <- diag(d) Y with Y Y^T 1 = 1 on every row that has mass: the symmetric
    Sinkhorn iteration d <- sqrt(d / (Y Y^T d)) on the nonnegative Q = Y Y^T, each
    sweep one pass over Y (Y Y^T d = Y (Y^T d), and the pass that updates d returns
    Y^T d for the next).  Returns (sweeps, converged).  A start on the row-sum
    constraint leaves the multiplier steps the trace alone to settle.  Where the
    scaling does not stay finite (a row with mass too small to scale), Y is left as
    it was."""
    c = _ordered_sum(space.map(_init_scaling, read_x=False))
    converged = False
    for sweep in range(1, BALANCE_MAX_SWEEPS + 1):
        parts = space.map(_scaling_sweep, c, read_x=False)
        worst = np.array([p[0] for p in parts])
        c = _ordered_sum([p[1] for p in parts])
        if not (np.isfinite(worst).all() and np.isfinite(c).all()):
            space.map(drop_states, ["_d", "_live"], read_x=False)
            return sweep, False
        if worst.max() <= BALANCE_TOL:
            converged = True
            break
    space.map(_apply_scaling, read_x=False)
    return sweep, converged


def _init_scaling(chunk):
    Y = chunk["Y"]
    chunk["_d"] = np.ones(Y.shape[0])
    chunk["_live"] = Y.any(axis=1)
    return Y.sum(axis=0)


def _scaling_sweep(chunk, c):
    """d <- sqrt(d / (Y c)) on rows with mass; (the largest |d_i (Y c)_i - 1| before
    it, Y^T d after it)."""
    Y, d, live = chunk["Y"], chunk["_d"], chunk["_live"]
    q = Y[live] @ c
    worst = float(np.abs(d[live] * q - 1.0).max(initial=0.0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d[live] = np.sqrt(d[live] / q)
    return worst, Y.T @ d


def _apply_scaling(chunk):
    del chunk["_live"]
    chunk["Y"] = np.clip(chunk["Y"] * chunk.pop("_d")[:, None], 0.0, 1.0)


def _copy(chunk, src, dst):
    np.copyto(output_buffer(chunk, dst, chunk[src]), chunk[src])


def _burer_monteiro(D, params, *, Y0=None, callback=None, state=None, checkpoint=None,
                    checkpoint_every=1, keep_rows=False):
    """Solve (11) for D: a :class:`dnomad.blocks.RowChunks` (D = F F^T / ||F^T F||_F of
    its centred rows: Y is kept in row chunks beside X, on the workers when the chunks
    are, and every optimizer step is row-chunk work), or any operator with ``matmat``
    and ``shape`` (normalize it first, e.g. :class:`dnomad.blocks.operators.DataGram`
    with scale "frobenius"; Y is then kept in this process).

    Each multiplier step minimizes L(., mu, lam) over [0, 1]^{n x r} by
    ``params.optimizer``: "spg" (spectral projected gradient, nonmonotone) or "lbfgs"
    (projected L-BFGS, vector-free) from :mod:`dnomad.nomad.box_optim`, or "scipy"
    (SciPy's L-BFGS-B on Y gathered into this process: the reference).  "lbfgs" is
    preconditioned by default (``params.precondition``; None: gamma I): its initial
    inverse Hessian is gamma (Y^T Y + eta I)^-1 applied to each row's free entries,
    eta = ``precondition`` Tr(Y^T Y) / r, Y^T Y taken at the start of each multiplier
    step (an r x r sum over the row chunks); it costs two n x r x r GEMMs an iteration
    and cut the evaluations to the stopping rule on 7,000 MNIST digits (K = 16) from
    3,200-5,000 to 970-1,900.  "spg" and "scipy" take no preconditioner.

    Precision.  Y, mu, the gradient, L and D Y are float64: the multiplier steps
    difference nearly equal row sums, and the line searches compare values of L that
    agree to 8 or more digits.  X's products are float32 where that is exact enough:
    in the start (below), and, with ``params.increments`` (opt-in, data mode), in
    every evaluation but the first of each inner solve and one in ``ANCHOR_EVERY``,
    which form D Y in float64 from X.  The others form the change of D Y from the
    step, D Y_new = D Y + F (F^T (Y_new - Y)) / scale, in float32, so its round-off
    is float32's relative to the step, not to D Y: the value differences and the
    gradient the optimizer sees agree with float64's to about 1e-7 of what the step
    changed (measured 3e-10 of the value difference and 1e-9 of the gradient change on
    3,000 MNIST digits; the tests hold it to 1e-5), and a solve ending on small steps
    ends on float64's gradient to round-off.  An evaluation then costs about 0.7 of a
    float64 one on all 70,000 MNIST digits (float32 GEMMs take half the time; the
    state passes do not shrink).  Not the default: the round-off is relative to the
    gross sums |F|^T |Y_new - Y|, not to F^T (Y_new - Y), and where those cancel
    (centred X, the rows of a cluster moving together) it sets a noise floor that tight
    tolerances do not get under (separated blobs with tol 1e-7 and feasibility_tol 1e-6
    hovered at a change of 5e-6 and a violation of 5e-5 for 60 outer steps, where the
    float64 run met them in 276); at the default tolerances 7,000 MNIST digits met the
    rule with it, 0.0055 from the float64 run's Q.

    The start Y0 defaults to symmetric NMF of D at rank r by ADMM (App. E), clipped to
    [0, 1], run in the row space (in data mode with X's products in float32: a start
    needs no more; the multiplier steps are float64) and reported in the result's
    ``start``.  With ``params.balance`` the start's rows (of Y0 too) are then scaled so
    that Y Y^T 1 = 1 (:func:`_balance_start`; its sweeps, whether it met BALANCE_TOL and
    its seconds in ``start``); mu and lam start at 0, as in the paper.
    Multiplier steps are solved inexactly, to ``inner_rtol`` of their starting
    projected gradient or ``inexact_max_iter`` iterations (the far steps need little
    accuracy), except a step confirming the stopping rule and, from a start not
    balanced, the first, solved to ``inner_tol`` (see :func:`_step_rtol`).  Stops when Y
    changes by less than ``tol`` (relative) between outer steps with the constraints
    met within ``feasibility_tol``, in a step solved to ``inner_tol`` ("tolerance"), or at
    ``max_iter`` ("max_iter", with a ConvergenceWarning), or when ``callback`` returns
    True ("callback").
    History rows: iteration, rtol (the step's relative tolerance), exact (solved to
    inner_tol), objective Tr(D Y Y^T),
    lagrangian, row_sum_violation,
    trace_violation, change (of Y, relative), q_change (of Q = Y Y^T, relative),
    inner_iterations, inner_stop (why the inner solve ended:
    ``INNER_STOPS[code]``, 0 gtol, 1 ftol, 2 max_iter, 3 line_search), evaluations,
    incremental_evaluations
    (those of the evaluations made by float32 increments), matmats, passes (over X,
    data mode), inner_scale (the optimizer's last curvature scale: the next step's
    first step), seconds.

    ``params`` are checked by ``params.validate`` on entry, except inside an estimator's
    fit (which checked them before reading any data).
    ``state`` (a dict Y, mu, lam, history, matmats, as passed to ``checkpoint`` and
    saved by :meth:`dnomad.blocks.store.Checkpoints.save`; Y and mu are held rows, which
    ``np.asarray`` copies) resumes a run exactly where it was saved; ``checkpoint(state)``
    is called every ``checkpoint_every`` outer steps and at the end.  Returns a
    :class:`dnomad.nomad.cgm.NomadResult` with Q = Y Y^T as a LowRankGram; with
    ``keep_rows`` (data mode) Y is not gathered but left in the row chunks' state "Y"
    for the caller (the result's Y, mu and Q are None).
    """
    from ..blocks import RowChunks, RowState
    from ..blocks.operators import LowRankGram
    from .cgm import NomadResult

    data_mode = isinstance(D, RowChunks)
    if keep_rows and not data_mode:
        raise InputValueError("keep_rows needs D as row chunks (the rows Y is kept beside)")
    n = D.n if data_mode else D.shape[0]
    check_solver_params(params, n)
    K, r = params.n_clusters, params.resolved_rank(n)
    space = D if data_mode else RowState(n)
    sigma, phi = params.resolved_sigma(n), params.phi
    problem = _AugmentedLagrangian(space, None if data_mode else D, K, sigma, phi)
    start = None
    start_method = "Y0" if Y0 is not None else params.start
    if state is not None:
        problem.matmats = int(state["matmats"])
        if tuple(np.shape(state["Y"])) != (n, r):
            raise InputValueError(f"the saved Y has shape {tuple(np.shape(state['Y']))}, not ({n}, {r})")
        space.put("Y", state["Y"], dtype=np.float64)    # read by the chunks, where they live
    else:
        if Y0 is None and params.start == "random":
            space.map(_random_y, stream_key(np.random.default_rng(params.random_state)), r, math.sqrt(K / (n * r)),
                      read_x=False, with_span=True)
        elif Y0 is None:
            # Symmetric NMF in the row space; in float32 in data mode (the start needs no
            # more, and X's products cost half): on all 70,000 MNIST digits at r = 128 this
            # start was a third of the run in float64 with Y gathered into this process.
            admm = _symnmf_admm(space, r, matmat=None if data_mode else D.matmat, gram_scale=problem.scale,
                                dtype=np.float32 if data_mode else np.float64, random_state=params.random_state,
                                max_iter=params.start_max_iter, tol=params.start_tol)
            space.map(_start_y, read_x=False)
            start = {"method": "symnmf", "iterations": admm.n_iter, "converged": admm.converged,
                     "products": admm.products, "passes": admm.passes, "seconds": admm.seconds}
        else:
            Y0 = np.clip(np.array(Y0, dtype=np.float64), 0.0, 1.0)
            if Y0.shape != (n, r):
                raise InputValueError(f"Y0 must have shape ({n}, {r}); got {Y0.shape}")
            space.put("Y", Y0)
            del Y0
    if state is None and params.balance:
        t_balance = time.perf_counter()
        sweeps, balanced = _balance_start(space)
        start = dict(start or {"method": start_method},
                     balance_sweeps=sweeps, balanced=balanced, balance_seconds=time.perf_counter() - t_balance)
    space.put("mu", np.zeros(n) if state is None else state["mu"], dtype=np.float64)
    problem.lam = 0.0 if state is None else float(state["lam"])

    history = [] if state is None else list(state["history"])
    stop_reason = "max_iter"
    end = params.max_iter
    if state is not None and state.get("stop_reason") in ("tolerance", "callback"):
        # Saved when the run stopped (a crash came before its result was written): finish
        # from it as the uninterrupted run did.
        stop_reason, end = state["stop_reason"], len(history)
    t0 = time.perf_counter() - (history[-1]["seconds"] if history else 0.0)
    passes0 = space.passes - (history[-1].get("passes", 0) if history else 0)

    def save(final):
        if checkpoint is not None:
            # Y and mu are written by the chunks that hold them, not gathered here.
            checkpoint({"Y": space.held("Y"), "mu": space.held("mu"), "lam": problem.lam,
                        "history": [dict(row) for row in history],
                        "matmats": problem.matmats, "stop_reason": stop_reason if final else None})

    kept = []                 # the states left in the row chunks: Y, once the run has ended
    try:
        for it in range(len(history) + 1, end + 1):
            rtol = _step_rtol(history, params)
            exact = rtol == 0
            space.map(_copy, "Y", "Y_prev", read_x=False)
            scale0 = history[-1].get("inner_scale") if history else None
            incremental0 = problem.incremental_evaluations
            nit, nfev, lagr, objective, scale, inner_stop = _minimize(space, problem, params, n, r, rtol=rtol,
                                                                      scale0=scale0)
            parts = space.map(_column_stats, "Y", read_x=False)
            c, trace = _ordered_sum([p[1] for p in parts]), _ordered_sum([p[2] for p in parts])
            parts = space.map(_multiplier_step, c, params.eta * sigma, read_x=False)
            row_violation = max(p[0] for p in parts)
            change = math.sqrt(_ordered_sum([p[1] for p in parts])) / max(
                math.sqrt(_ordered_sum([p[2] for p in parts])), 1e-300)
            change_q = q_change(*(_ordered_sum([p[k] for p in parts]) for k in (3, 4, 5)))
            problem.lam = problem.lam - params.eta * phi * (float(trace) - K)
            trace_violation = abs(float(trace) - K) / K
            history.append({"iteration": it, "rtol": rtol, "exact": exact, "objective": objective,
                            "lagrangian": lagr, "row_sum_violation": row_violation, "trace_violation": trace_violation,
                            "change": float(change), "q_change": change_q, "inner_iterations": nit,
                            "inner_stop": INNER_STOPS.index(inner_stop), "evaluations": nfev,
                            "incremental_evaluations": problem.incremental_evaluations - incremental0,
                            "matmats": problem.matmats, "passes": space.passes - passes0,
                            "inner_scale": scale, "seconds": time.perf_counter() - t0})
            logger.debug("BM it %d  obj %.6g  row viol %.2e  trace viol %.2e  change %.2e  inner %d",
                        it, objective, row_violation, trace_violation, change, nit)
            # The callback sees every row, the last too; the rule met outranks its stop.
            stop_asked = callback is not None and callback(dict(history[-1])) is True
            if _rule_met(history[-1], params) and exact:
                stop_reason = "tolerance"
            elif stop_asked:
                stop_reason = "callback"
            final = stop_reason != "max_iter" or it == params.max_iter
            if final or it % checkpoint_every == 0:
                save(final)
            if stop_reason != "max_iter":
                break
        Y, mu = (None, None) if keep_rows else (space.get("Y"), space.get("mu"))
        kept = ["Y"] if keep_rows else []
    finally:
        if data_mode:
            work = ["Y", "Y_prev", "mu", "_DY"] + work_states("Y", params.memory)
            space.map(drop_states, [name for name in work if name not in kept], read_x=False)
        else:
            space.close()
    if stop_reason == "max_iter" and history:
        last = history[-1]
        violation = max(last["row_sum_violation"], last["trace_violation"])
        warn_convergence(f"NOMAD (Burer-Monteiro, K={params.n_clusters}) stopped at max_iter={params.max_iter} "
                         f"before meeting its tolerances: last relative change of Y {last['change']:.3g} "
                         f"(tol {params.tol:g}), constraint violation {violation:.3g} "
                         f"(feasibility_tol {params.feasibility_tol:g})")
    return NomadResult(Q=None if keep_rows else LowRankGram(Y), history=history, n_iter=len(history),
                       stop_reason=stop_reason,
                       params=params, converged=stop_reason == "tolerance", solver="bm", Y=Y, mu=mu,
                       lam=problem.lam, matmats=problem.matmats, start=start)


def _step_rtol(history, params):
    """The next multiplier step's relative tolerance: ``inner_rtol`` (an inexact step,
    also cut at ``inexact_max_iter`` iterations), or 0 (to ``inner_tol``) for SciPy's
    solver, with inner_rtol = 0, after a step that met the stopping rule inexactly (a
    small change may be only a short inexact solve: the rule holds when it holds
    again), and for the first step from a start not balanced (from zero multipliers it
    leaps far from the row sums, and inexact it sent r = K runs on separated blobs to
    merged clusters).  The cut stops the drift along nearly flat directions of L that
    an inexact step's tolerance, a tenth of a small starting gradient, otherwise allows
    after a step that ended near the row sums (docs/benchmark_notes.md,
    graphs/nomad_bm_steps.py)."""
    if (params.inner_rtol == 0 or params.optimizer == "scipy" or (not history and not params.balance)
            or (history and _rule_met(history[-1], params))):
        return 0.0
    return float(params.inner_rtol)


def _rule_met(row, params):
    return (row["change"] <= params.tol
            and max(row["row_sum_violation"], row["trace_violation"]) <= params.feasibility_tol)


def _minimize(space, problem, params, n, r, rtol=0.0, scale0=None):
    """One multiplier step's inner minimization from state "Y", leaving its solution in
    "Y": (iterations, evaluations, L there, Tr(D Y Y^T) there, the optimizer's last
    curvature scale, why it stopped: one of INNER_STOPS).  ``rtol``: stop at this
    fraction of the starting projected gradient (0: to ``inner_tol``; see
    :func:`_step_rtol`).  ``scale0``: the previous step's scale, so a warm start's first
    step is not a unit-length leap that backtracks to a sliver and stops on ftol (the
    steps then cycled, Y moving by the same 5e-7 each time)."""
    from . import box_optim

    if params.optimizer == "scipy":
        from scipy.optimize import Bounds, minimize

        last = {}

        def fun(x):
            space.put("_x", x.reshape(n, r))
            value = problem.evaluate("_x", "_gx")
            last["x"], last["objective"] = x.copy(), problem.objective["_x"]
            return value, space.get("_gx").ravel()

        res = minimize(fun, space.get("Y").ravel(), jac=True, method="L-BFGS-B", bounds=Bounds(0.0, 1.0),
                       options={"maxiter": params.inner_max_iter, "ftol": params.inner_tol,
                                "gtol": params.inner_tol})
        space.put("Y", res.x.reshape(n, r))
        if not np.array_equal(last.get("x"), res.x):      # L-BFGS-B almost always ends on its last point
            problem.evaluate("Y", "_gx")
            last["objective"] = problem.objective["Y"]
        space.map(drop_states, ["_x", "_gx"], read_x=False)
        return int(res.nit), int(res.nfev), float(res.fun), last["objective"], None, _scipy_stop(res)
    method = box_optim.spg if params.optimizer == "spg" else box_optim.lbfgs
    kw = {} if params.optimizer == "spg" else {"memory": params.memory, "pair_dtype": params.pair_dtype}
    if params.precondition is not None and params.optimizer == "lbfgs":
        # H0 = (Y^T Y + eta I)^-1 on every row (as PrecGD, Zhang et al. 2021), fixed for
        # the solve: with r = 8K a cluster is spread over several similar columns, and
        # moving a row's mass among them barely changes Y Y^T, so those directions are
        # nearly flat (the Hessian's smallest eigenvalues 1e-4..1e-2 against 4 on 1,000
        # MNIST digits) and L-BFGS from gamma I chased them for hundreds of evaluations
        # a multiplier step; Y^T Y is small exactly along them.
        YtY = _ordered_sum(space.map(_gram, "Y", read_x=False))
        eta = params.precondition * float(np.trace(YtY)) / r
        P = np.linalg.inv(YtY + eta * np.eye(r))
        kw["precondition"] = 0.5 * (P + P.T)
    problem.begin_solve(params.increments)
    try:
        # The work states stay between multiplier steps (dropped when the run ends): each
        # step would otherwise fault in up to 17 new n x r buffers.
        max_iter = params.inner_max_iter if rtol == 0 else min(params.inner_max_iter, params.inexact_max_iter)
        res = method(space, problem, "Y", lo=0.0, hi=1.0, max_iter=max_iter, ftol=params.inner_tol,
                     gtol=params.inner_tol, rtol=rtol, scale0=scale0, release=False, **kw)
    finally:
        problem.begin_solve(False)      # drops the kept D Y's
    objective = problem.objective[res.x]
    if res.x != "Y":
        space.map(box_optim.swap_states, res.x, "Y", read_x=False)
    return res.nit, res.nfev, res.f, objective, None if res.scale is None else float(res.scale), res.reason


def _scipy_stop(res):
    """L-BFGS-B's ending as one of INNER_STOPS: status 1 is a cap (its iterations, or its
    evaluations, maxfun), 2 an abnormal line search or a warning such as round-off
    stopping it; a converged run (0) says in its message which test it met."""
    if res.status == 1:
        return "max_iter"
    if res.status != 0:
        return "line_search"
    return "gtol" if "PGTOL" in str(res.message).upper() else "ftol"
