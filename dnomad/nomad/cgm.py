"""NOMAD by conditional gradient inside the method of multipliers.

Tepper, Sengupta, Chklovskii, "Clustering is semidefinitely not that hard:
Nonnegative SDP for manifold disentangling", JMLR 19 (2018), arXiv:1706.06028,
Sec. 5, Alg. 1 and 2.

    max Tr(D Q)  s.t.  Q 1 = 1, Tr Q = K, Q PSD, Q >= 0                    (NOMAD)

with P = Q - E_n, E_n = 1 1^T / n (eq. 12), the augmented Lagrangian (13)

    g(P, Gamma) = -Tr(D P) + Tr(Gamma (P + E_n)) + gamma/2 ||[P + E_n]_-||_F^2,

the multiplier step (15b) Gamma <- [Gamma + tau (P + E_n)]_-, and the inner problem
(15a) by Frank-Wolfe over {P PSD, Tr P = K - 1, P 1 = 0} (Alg. 1): the vertex is
(K - 1) v v^T with v the smallest algebraic eigenvector of grad g restricted to 1^perp.

Symbols -> code: D -> matrix "D" (or data panels F with D = F F^T), P -> "P",
Gamma -> "Gamma" (<= 0: the paper writes Gamma >= 0 but its update (15b) and the
gradient only make sense with Gamma <= 0), grad g -> "G", gamma -> ``penalty``,
tau -> ``tau``, N_inner -> ``n_inner``, alpha -> the step.

Only the engine's named passes and matmats touch n x n data: the solver never sees
a task graph or a Zarr array.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from .. import blocks
from .._checks import check_choices, check_ints, check_solver_params
from ..blocks.device import array_module, to_device, to_host
from ..errors import InputValueError, warn_convergence
from ..linalg import extreme_eigenvector
from ..linalg.lobpcg import lobpcg_top
from . import passes as nomad_passes


logger = logging.getLogger(__name__)

STEP_RULES = ("global", "paper", "line_search")
DIRECTIONS = ("block", "vertex")
LAGRANGIANS = ("shifted", "paper")
# The block direction's eigensolver: LOBPCG iterations per call (each one product M U,
# one pass) and the residual tolerance of the pairs the step keeps (and the first it
# cuts); warm-started from the last call's vectors.
BLOCK_EIG_ITERS = 4
BLOCK_EIG_TOL = 1e-3
BLOCK_EIG_FIRST_ITERS = 30          # the first call starts from random vectors
# penalty="scale" and tau="scale" resolve to PENALTY_SCALE * n * rms(J D J) / K (see
# ``resolve_penalty``).  0.15 is what the authors' gamma = tau = 1 amounts to on two rings
# with n = 120 and K = 8; held in these units, the outer iterations to the stopping rule
# no longer grow with n.
PENALTY_SCALE = 0.15
# The client's share of a block step: the dense path holds J M J, D (where its factor is
# given), eigh's vectors and workspace, about DENSE_STEP_MATRICES n x n float64; LOBPCG
# about LOBPCG_BLOCKS blocks of n x k (X, R, P, their products, the Rayleigh-Ritz
# basis).  A step may use CLIENT_MEMORY_FRACTION of the memory available at the start.
DENSE_STEP_MATRICES = 4
LOBPCG_BLOCKS = 10
CLIENT_MEMORY_FRACTION = 0.5
PENALTY_SCHEDULES = ("sqrt", "constant")
EIGEN_TOL_RULES = ("inner", "outer")


@dataclass
class NomadParams:
    """Parameters of :func:`nomad_cgm` (see its docstring)."""

    n_clusters: int
    max_iter: int = 2000
    n_inner: int = 2
    penalty: float | str = "scale"
    penalty_schedule: str = "sqrt"
    tau: float | str = "auto"
    direction: str = "block"
    block_rank: int | None = None
    lagrangian: str = "shifted"
    step_rule: str = "global"
    eigen_tol: str = "inner"
    eigen_ncv: int | None = 4
    rmse_tol: float = 1e-4
    min_tol: float = 1e-2
    objective_tol: float = 1e-3

    def validate(self, n):
        K = self.n_clusters
        if not isinstance(K, (int, np.integer)) or isinstance(K, bool) or not 1 < K < n:
            raise InputValueError(f"n_clusters must be an integer with 1 < n_clusters < n = {n}; got {K!r}")
        check_ints(self, ("max_iter", "n_inner"))
        for name in ("penalty", "tau"):
            val = getattr(self, name)
            if isinstance(val, str):
                allowed = ("scale", "auto", "penalty") if name == "tau" else ("scale",)
                if val not in allowed:
                    raise InputValueError(f'{name} must be one of {allowed} or a number > 0; got {val!r}')
            elif isinstance(val, bool) or not isinstance(val, (int, float, np.integer, np.floating)) \
                    or not val > 0 or not math.isfinite(val):
                raise InputValueError(f'{name} must be "scale" or a finite number > 0; got {val!r}')
        for name in ("rmse_tol", "min_tol", "objective_tol"):
            if not getattr(self, name) >= 0:
                raise InputValueError(f"{name} must be >= 0; got {getattr(self, name)!r}")
        check_choices(self, {"step_rule": STEP_RULES, "penalty_schedule": PENALTY_SCHEDULES,
                             "eigen_tol": EIGEN_TOL_RULES, "direction": DIRECTIONS,
                             "lagrangian": LAGRANGIANS})
        if self.direction == "vertex" and self.step_rule == "line_search" and self.lagrangian != "paper":
            # The vertex line search's pass bins the entries of Q alone (eq. 13's penalty).
            raise InputValueError('step_rule="line_search" with direction="vertex" needs lagrangian="paper"')
        if self.block_rank is not None and (not isinstance(self.block_rank, (int, np.integer))
                                            or isinstance(self.block_rank, bool)
                                            or not 1 <= self.block_rank <= n - 2):
            raise InputValueError(f"block_rank must be None or an integer in [1, n - 2] = [1, {n - 2}]; "
                                  f"got {self.block_rank!r}")
        if self.eigen_ncv is not None and (not isinstance(self.eigen_ncv, (int, np.integer))
                                           or self.eigen_ncv < 3):
            raise InputValueError(f"eigen_ncv must be None or an integer >= 3; got {self.eigen_ncv!r}")


@dataclass(frozen=True, eq=False)
class NomadResult:
    """What every NOMAD solver returns (:func:`nomad_cgm`,
    :func:`dnomad.nomad.bm.burer_monteiro`).

    Attributes
    ----------
    Q : operator
        The solution: a BlockMatrix (conditional gradient) or a
        :class:`dnomad.blocks.operators.LowRankGram` Y Y^T (Burer-Monteiro).  Both have
        ``matmat``, ``shape``, ``diag`` and ``np.asarray(Q)`` (dense; small n).
    history : list of dict
        One row per outer iteration; both solvers write ``iteration``, ``objective``
        (Tr(D Q) with the solver's D) and ``seconds``.  Conditional gradient adds
        ``rmse_neg`` (RMSE of [Q]_- over its negative entries), ``max_violation``
        (|min Q| n / K), ``neg_fro_ratio`` (||[Q]_-||_F / ||Q||_F), ``fw_gap`` (the last
        inner Frank-Wolfe gap), ``eig_matvecs``, ``passes``, ``bytes_read``,
        ``bytes_written``; Burer-Monteiro ``lagrangian``, ``row_sum_violation``,
        ``trace_violation``, ``change``, ``q_change``, ``inner_iterations``, ``inner_stop`` (a code:
        ``dnomad.nomad.bm.INNER_STOPS[code]``), ``matmats``.
    n_iter : int
        Outer iterations done.
    stop_reason : str
        "tolerance", "max_iter" or "callback".
    params : NomadParams or BurerMonteiroParams
    converged : bool
    solver : str
        "cgm" or "bm".
    P : BlockMatrix
        (cgm) Q's centered part Q - 1 1^T / n, for embeddings.
    penalty, tau : float
        (cgm) The values used (``params`` may say "scale").
    Y, mu, lam, matmats
        (bm) The factor Q = Y Y^T (n x r), the multipliers of Y Y^T 1 = 1 and of
        Tr(Y^T Y) = K, and the products D Y made by the multiplier steps.
    start : dict or None
        (bm) The symmetric NMF start, where one was run: method, iterations, converged,
        products, passes (over X), seconds.
    """

    Q: object
    history: list
    n_iter: int
    stop_reason: str
    params: object
    converged: bool = False
    solver: str = "cgm"
    P: object = None
    penalty: float | None = None
    tau: float | None = None
    Y: np.ndarray | None = None
    mu: np.ndarray | None = None
    lam: float | None = None
    matmats: int = 0
    start: dict | None = None


def _penalty(penalty, params, t):
    return penalty * (math.sqrt(t + 1) if params.penalty_schedule == "sqrt" else 1.0)


def centered_gram_rms(group, data=None):
    """rms(J D J) = ||J D J||_F / n, J = I - 1 1^T / n: the size of D's entries as NOMAD
    sees them (Q 1 = 1 makes the constant part of D irrelevant).  From the data panels
    F (D = F F^T) it is ||F_c^T F_c||_F / n, O(n d^2); from a stored D, one summary
    pass and one matvec."""
    n = group.layout.n
    if data is not None:
        F = np.asarray(data.X, dtype=np.float64)
        F = F - F.mean(axis=0)
        return float(np.linalg.norm(F.T @ F)) / n
    summ = blocks.summary(group, "D")
    rows = np.asarray(blocks.matmat(group, "D", np.ones(n)), dtype=np.float64)
    sq = summ["fro"] ** 2 - 2.0 / n * float(rows @ rows) + (summ["sum"] / n) ** 2
    return math.sqrt(max(sq, 0.0)) / n


def resolve_penalty(params, group, data=None):
    """(gamma, tau) for ``params``: numbers as given; "scale" as PENALTY_SCALE n rms(J D J)/K;
    tau None when the multiplier step follows the penalty (tau = "penalty", and "auto"
    with the shifted Lagrangian: the classical method of multipliers, tau_t = gamma_t).

    Why these units: Q's entries are about K/n and D's about rms(J D J), so the penalty
    and multiplier terms keep the same weight against Tr(D Q) at every n only when
    gamma and tau grow as n rms(J D J) / K.  Fixed gamma = tau = 1 (the paper) makes the
    multiplier move O(K/n) per outer iteration, and the iterations grow about as n."""
    tau = params.tau
    if tau == "auto":
        tau = "penalty" if params.lagrangian == "shifted" else "scale"
    if params.penalty != "scale" and tau != "scale":
        return float(params.penalty), (None if tau == "penalty" else float(tau))
    rms = centered_gram_rms(group, data)
    if not rms > 0:
        raise InputValueError("the Gram matrix is constant after centering (all points equal?): "
                              "NOMAD's objective is flat; give penalty and tau as numbers")
    unit = PENALTY_SCALE * group.layout.n * rms / params.n_clusters
    return (unit if params.penalty == "scale" else float(params.penalty),
            unit if tau == "scale" else None if tau == "penalty" else float(tau))


def _step(params, t, s, k):
    """Frank-Wolfe step for inner step s (1-based) of outer iteration t (0-based), the
    k-th step of the run (0-based).  The first step is 1: P_0 = 0 lies outside the set
    {Tr P = K - 1}, and only a full first step puts P on it, so that Tr Q = K holds
    exactly from then on instead of approaching it as a product of (1 - step)."""
    if k == 0:
        return 1.0
    if params.step_rule == "paper":
        return 2.0 / (t + 1 + s + 2)         # Alg. 2, line 8, with t counted from 1
    return 2.0 / (k + 2)                      # 2/(k+2) over all FW steps (the authors' code)


def _line_search_step(alphas, h, h0, gap, gamma):
    """Minimizer over [0, 1] of phi(alpha) = g(P + alpha Delta) from its slope
    phi'(alpha) = -gap + gamma (h(alpha) - h(0)), which is nondecreasing and piecewise
    linear; ``alphas`` descend from 1.  Linear interpolation between the grid points
    that bracket the root (each a factor 2^(1/8) apart)."""
    if not gap > 0:
        return 0.0
    slope = -gap + gamma * (h - h0)
    if slope[0] <= 0:
        return 1.0
    below = np.flatnonzero(slope < 0)            # alphas where phi still decreases
    if len(below) == 0:
        lo, s_lo, hi, s_hi = 0.0, -gap, alphas[-1], slope[-1]
    else:
        j = below[0]
        lo, s_lo, hi, s_hi = alphas[j], slope[j], alphas[j - 1], slope[j - 1]
    return float(lo + (hi - lo) * (-s_lo) / (s_hi - s_lo))


def _eig_tol(params, t, s):
    return 1.0 / (s + 1) if params.eigen_tol == "inner" else 1.0 / (t + 2)


def _stats_row(stats, n, K):
    neg = stats["neg_count"]
    rmse = math.sqrt(stats["neg_sumsq"] / neg) if neg > 0 else 0.0
    max_violation = max(0.0, -stats["min_Q"]) * n / K
    ratio = math.sqrt(stats["neg_sumsq"] / stats["sumsq_Q"]) if stats["sumsq_Q"] > 0 else 0.0
    return {"objective": stats["sum_DQ"], "rmse_neg": rmse, "max_violation": max_violation,
            "neg_fro_ratio": ratio}


CHECKPOINT_KEY = "nomad_checkpoint"


def nomad_cgm(group, params: NomadParams, *, data=None, state=None, callback=None, checkpoint=None,
              checkpoint_every=20):
    """Solve NOMAD by Alg. 2 (conditional gradient in the method of multipliers).

    Parameters
    ----------
    group : blocks.BlockGroup
        Holds D as matrix "D", or, with ``data``, nothing yet; P, Gamma and G are
        added to it.
    params : NomadParams
        Checked by ``params.validate`` on entry, except inside an estimator's fit
        (which checked them before reading any data).
        ``n_clusters`` (K), ``max_iter`` (outer iterations), ``n_inner`` (Frank-Wolfe
        steps per multiplier update; the paper uses 10), ``penalty`` (gamma of eq. 13;
        "scale" or a number, see :func:`resolve_penalty`; the paper's is 1)
        and ``penalty_schedule`` ("sqrt": gamma sqrt(t + 1) at outer iteration t, as
        the authors' code; "constant": gamma as Alg. 2), ``tau`` (multiplier step of
        15b; "scale" or a number), ``step_rule`` ("global": 2/(k + 2) over all k Frank-Wolfe steps, as the
        authors' code; "paper": 2/(t + t_inner + 2) as Alg. 2 line 8; "line_search": the
        exact minimizer of g along the Frank-Wolfe direction, one extra pass reading P),
        ``eigen_tol`` (ARPACK relative
        tolerance 1/(t_inner + 1) for "inner", as the authors' code, or 1/(t + 1) for
        "outer"), ``eigen_ncv`` (Lanczos basis; small with the warm start costs fewest
        passes), stopping tolerances ``rmse_tol`` (RMSE of [Q]_-), ``min_tol``
        (|min Q| <= min_tol K / n) and ``objective_tol`` (relative change of Tr(D Q)
        between outer iterations): the run stops when all three hold.
    data : blocks.DataPanels, optional
        D = F F^T given by its factor: no pass reads or forms D; the solver adds its
        low-rank part (``_FactoredGram``), and "D" need not be in ``group``.
    state : dict, optional
        A state handed to ``checkpoint`` earlier: the run goes on from it exactly as
        if it had not stopped.  Its ``blocks`` (P and Gamma) must be in ``group``
        already (``blocks.store.Checkpoints.load(group=group)`` puts them there).
    callback : callable, optional
        Called with each history row (a dict); returning True stops the run.
    checkpoint : callable, optional
        Called with the run's state every ``checkpoint_every`` outer iterations and at
        the last: the scalars, the history, the eigensolver's warm start ``v`` and
        ``blocks``, the names of the n x n matrices in ``group`` to keep (P, Gamma).

    Returns
    -------
    NomadResult

    Notes
    -----
    Precision: the n x n blocks (P, Gamma, G or M, D) are in the group's dtype, float32
    by default (each entry's update is local and the stopping rule's tolerances, 1e-4
    and 1e-2 K / n, sit far above float32's round-off); every reduction over a pass,
    the eigensolvers' vectors, the line search's bins and the multipliers' scalars are
    float64 (sums over n^2 entries and eigenvector differences would lose digits).
    Per inner step: one fused pass (reads P, Gamma, and D when it is stored; writes
    P, G, and Gamma once per outer iteration) plus the eigensolver's matvecs over G
    (about ncv - 2 with the warm start, each plus O(n d) for a factored D); one gather
    per pass.  On device blocks (``group.device == "cuda"``) the eigensolver's vectors
    stay on the GPU.
    Peak memory per worker: a few blocks plus O(n) vectors.  Q 1 = 1 and Tr Q = K
    hold by construction (to round-off); Q >= 0 is met to the stopping tolerances.
    """
    with blocks.single_threaded_blas():
        return _nomad_cgm(group, params, data, state, callback, checkpoint, checkpoint_every)


def _nomad_cgm(group, params, data, state, callback, checkpoint, checkpoint_every):
    layout = group.layout
    n, K = layout.n, params.n_clusters
    check_solver_params(params, n)
    # On device blocks the eigensolver's vectors stay on the GPU with the blocks.
    ones = to_device(np.ones(n) / math.sqrt(n), group.device)
    vv_scale = float(K - 1)

    start_t, k_total, v, history, gram_p = 0, 0, None, [], 0.0
    if state is not None:
        missing = [name for name in STATE_BLOCKS if name not in group.names]
        if missing:
            raise InputValueError(f"resuming NOMAD needs the checkpoint's {missing} in the block group")
        start_t, k_total, history = int(state["iteration"]), int(state["k_total"]), list(state["history"])
        penalty, tau = state["penalty"], state["tau"]
        v = to_device(state["v"], group.device) if state.get("v") is not None else None
        gram_p, block_k, final = state.get("gram_inner_p"), state.get("block_k"), state.get("stop_reason")
        logger.info("resuming NOMAD from outer iteration %d", start_t)
    else:
        penalty, tau = resolve_penalty(params, group, data)
        blocks.zeros_like_layout(group, list(STATE_BLOCKS))
        final, block_k = None, None
    logger.info("NOMAD penalty gamma = %.4g, multiplier step tau = %s", penalty,
                "gamma" if tau is None else f"{tau:.4g}")

    stop_reason, converged = "max_iter", False
    end_t = params.max_iter
    if final in ("tolerance", "callback"):
        # The checkpoint is the run's last state: it stopped there (a crash came before
        # its result was written).  Finish from it, as the uninterrupted run did; a run
        # that stopped at max_iter goes on when resumed with a larger max_iter.
        stop_reason, converged, end_t = final, final == "tolerance", start_t
    prev_obj = history[-1]["objective"] if history else None
    gram = _FactoredGram(data, group, ones, gram_p) if data is not None else None
    inner = _BlockDirection(group, gram, params, v, block_k) if params.direction == "block" else \
        _VertexDirection(group, gram, params, v, ones)
    shifted = params.lagrangian == "shifted"
    for t in range(start_t, end_t):
        t0 = time.perf_counter()
        rec0 = group.passes.mark()
        gamma = _penalty(penalty, params, t)
        pending, k_total = inner.outer_iteration(t, gamma, k_total)
        # Close the outer iteration: last step, then the multiplier update (15b).
        stats = _fused_pass(group, gram, pending=pending, vv_scale=vv_scale, gamma=gamma,
                            tau=gamma if tau is None else tau, update_gamma=True, write_g=False,
                            shifted=shifted)
        _append_history(history, _stats_row(stats, n, K), t, inner, group, rec0, t0)
        stop_reason, converged = _check_stop(history[-1], prev_obj, params)
        prev_obj = history[-1]["objective"]
        if callback is not None and callback(dict(history[-1])) is True and not converged:
            stop_reason = "callback"
        last = stop_reason != "max_iter" or t + 1 == params.max_iter
        if checkpoint is not None and ((t + 1) % checkpoint_every == 0 or last):
            checkpoint(_state(t + 1, k_total, inner, history, penalty, tau, gram, stop_reason if last else None))
        if stop_reason != "max_iter":
            break
    if not converged and stop_reason == "max_iter" and history:
        _warn_max_iter(history, params)
    # G (or M) is the solver's scratch: freed before Q takes its place (on one GPU, P,
    # Gamma, G and Q of n = 70,000 would not fit together).
    group.drop(["G", "M"])
    blocks.shifted_copy(group, "P", "Q", 1.0 / n)
    return NomadResult(Q=blocks.BlockMatrix(group, "Q"), P=blocks.BlockMatrix(group, "P"),
                       history=history, n_iter=len(history), stop_reason=stop_reason,
                       params=params, penalty=penalty, tau=tau, converged=converged, solver="cgm")


class _VertexDirection:
    """The paper's inner loop (Alg. 1): n_inner Frank-Wolfe steps toward the vertex
    (K - 1) v v^T, v the smallest eigenvector of G on 1^perp (Lanczos, warm-started),
    with the open-loop step 2/(k + 2) or an exact line search."""

    def __init__(self, group, gram, params, v, ones):
        self.group, self.gram, self.params, self.state, self.ones = group, gram, params, v, ones
        n = group.layout.n
        self.matvec = (lambda x: blocks.matmat(group, "G", x)) if gram is None else gram.gradient_matvec
        self.n, self.vv_scale = n, float(params.n_clusters - 1)
        self.eig_matvecs, self.fw_gap, self.rank, self.step = 0, float("nan"), 1, float("nan")

    def outer_iteration(self, t, gamma, k_total):
        params, group, gram, vv_scale = self.params, self.group, self.gram, self.vv_scale
        self.eig_matvecs, self.fw_gap = 0, float("nan")
        pending = None
        shifted = params.lagrangian == "shifted"
        for s in range(1, params.n_inner + 1):
            # Apply the previous Frank-Wolfe step and form the gradient G, in one pass.
            stats = _fused_pass(group, gram, pending=pending, vv_scale=vv_scale, gamma=gamma, tau=0.0,
                                update_gamma=False, full_stats=False, shifted=shifted)
            eig = extreme_eigenvector(self.matvec, self.n, which="SA", deflate=self.ones, v0=self.state,
                                      tol=_eig_tol(params, t, s), ncv=params.eigen_ncv)
            self.eig_matvecs += eig.matvecs
            v = self.state = eig.vector
            self.fw_gap = stats["sum_GP"] - vv_scale * eig.value
            if params.step_rule == "line_search" and k_total > 0:
                alphas, h, h0 = nomad_passes.line_search_pass(group, v=v, vv_scale=vv_scale)
                step = _line_search_step(alphas, h, h0, self.fw_gap, gamma)
            else:
                step = _step(params, t, s, k_total)
            self.step = step
            pending = ("vertex", v, step)
            k_total += 1
        return pending, k_total


class _BlockDirection:
    """Projected (block) Frank-Wolfe steps over the spectraplex {P PSD, Tr P = K - 1,
    P 1 = 0}: V = argmin_{V in the set} <G, V> + L/2 ||V - P||_F^2 restricted to rank k,
    i.e. the top-k eigenpairs (on 1^perp) of M = P - G / L with their eigenvalues
    projected onto the simplex {lambda >= 0, sum = K - 1}; then P <- P + a (V - P) with a
    the exact minimizer of the augmented Lagrangian along the segment.  (Allen-Zhu,
    Hazan, Hu, Li, "Linear convergence of a Frank-Wolfe type algorithm over trace-norm
    balls", NeurIPS 2017.)  One step costs a fused pass (which writes M instead of G),
    a few products M U (LOBPCG, warm-started: each one pass, whatever k) and one
    line-search pass; the step removes the mass that Frank-Wolfe's rank-one steps leave
    on stale directions, which is what made the paper's loop need 10^4 outer
    iterations on MNIST.  L = gamma (the Lipschitz constant of the penalty's gradient).

    k: ``block_rank``, or automatic: 2K + 8 to start, grown by half whenever every
    Ritz value survives the simplex projection (the solution may need more)."""

    def __init__(self, group, gram, params, U, k=None):
        n, K = group.layout.n, params.n_clusters
        self.group, self.gram, self.params = group, gram, params
        self.n, self.K = n, K
        # The dense path where its n x n matrices fit the client's budget (LOBPCG with k
        # below its switch, (n - 1) / 5, then fits too); else LOBPCG with at most as many
        # directions as the budget holds: k stays at that cap, as at n - 2.
        self.client_budget = CLIENT_MEMORY_FRACTION * blocks.available_memory()
        self.dense_fits = DENSE_STEP_MATRICES * 8 * n * n <= self.client_budget
        memory_cap = n if self.dense_fits else int(self.client_budget // (LOBPCG_BLOCKS * 8 * n))
        self.k_cap = max(1, min(n - 2, memory_cap))
        wanted = min(params.block_rank or 2 * K + 8, max(1, n - 2))
        if memory_cap < wanted:
            raise InputValueError(
                f"CGM's block step needs {wanted} eigenvectors of length n = {n} ({LOBPCG_BLOCKS} blocks "
                f"of n x k float64: {LOBPCG_BLOCKS * 8 * n * wanted / 2**30:.3g} GiB), more than "
                f"{CLIENT_MEMORY_FRACTION:g} of this process's available memory "
                f"({blocks.available_memory() / 2**30:.3g} GiB): use solver='bm', whose client holds O(n r) "
                f"numbers, or a smaller sdp_k or block_rank")
        self.k = min(wanted, self.k_cap)
        # C order throughout: LOBPCG's BLAS calls sum in an order that depends on the
        # layout, so a resumed run (vectors read back C-ordered) must see the layout the
        # uninterrupted run saw to retrace it bit for bit.
        self.state = None if U is None else np.ascontiguousarray(to_host(U), dtype=np.float64).reshape(n, -1)
        if self.state is not None:
            # k as checkpointed: it may have grown past the saved vectors' count, which the
            # next call extends, as the uninterrupted run does.
            self.k = int(k) if k is not None else self.state.shape[1]
        self.eig_matvecs, self.fw_gap, self.rank, self.step = 0, float("nan"), 0, float("nan")
        self.stores_direction = _stores_direction(group)
        self._gram_dense = None                     # D in full, once the dense path needs it
        self.capped = False                         # warned that k stopped at the memory cap

    def _start(self, k, have=None):
        """k orthonormal columns orthogonal to 1: ``have``'s, then deterministic random ones."""
        rng = np.random.default_rng(12345 + k)
        cols = rng.standard_normal((self.n, k))
        if have is not None:
            cols[:, :have.shape[1]] = have
        cols -= cols.mean(axis=0)
        return np.ascontiguousarray(np.linalg.qr(cols)[0])

    def _eigs(self, L, first):
        """Top-k eigenpairs of J M J on 1^perp, M = P - G / L (stored as "M"), by LOBPCG
        (:func:`dnomad.linalg.lobpcg.lobpcg_top`) on the blocks' device: on a GPU its
        vectors and its Rayleigh-Ritz work stay there (the Ritz values come back to the
        host at each iteration for the stopping test, the vectors once per call).  Only
        the pairs that enter the step must meet the tolerance (``wanted`` below).  It took
        24-31% fewer passes to the stopping rule than SciPy's lobpcg on the convergence
        benchmark's rings and MNIST subsets (SciPy's spends a product on A X at every
        call and another after its last iteration)."""
        n, group, gram = self.n, self.group, self.gram

        def mm(X):
            X = X.reshape(n, -1).astype(np.float64, copy=False)
            X = X - X.mean(axis=0)
            Y = blocks.matmat(group, "M", X).astype(np.float64, copy=False).reshape(n, -1)
            if gram is not None:            # M = M' + D / L: D's part from its factor
                Y += gram.data.gram_product(X).astype(np.float64, copy=False) / L
            return Y - Y.mean(axis=0)

        if self._dense():
            # Small enough for a dense eigendecomposition, cheaper here than LOBPCG's
            # iterations: J M J in full, read from M's blocks (one pass; it was formed by a
            # product with the identity, an n^3 GEMM: 6.3 of 38.6 s a dense step at
            # n = 6,903 on 2 cores, 28.3 s now: graphs/gpu_nomad.json's dense_step_cpu),
            # with 1 pushed to the bottom.  Decomposed where the blocks are (cuSOLVER on a
            # GPU): with the decomposition on the H200 machine's host (47b9087) the 6,903
            # MNIST zeros' outer iterations took 58-101 s from the first one that went
            # dense (k = 2,004), 1.3 s just before.
            Md = self._centred_dense(L)
            xp = array_module(Md)
            Md -= (2.0 * xp.abs(Md).sum(axis=1).max() + 1.0) / n
            # Every pair (syevd): LAPACK's syevr for only the k wanted took 1.3-1.4x longer
            # at n = 6,903, k = 2,004 (the same benchmark).
            w, U = xp.linalg.eigh(Md)
            return to_host(w[::-1][:self.k]), to_host(U[:, ::-1][:, :self.k]), 1
        ones = to_device(np.ones((n, 1)) / math.sqrt(n), group.device)

        def wanted(w):
            # Only the pairs the simplex projection keeps enter the step, and the first one
            # it cuts decides the cut: those must meet the tolerance; the rest of the block
            # widens the search without having to converge.  With K = 128 on the 6,903
            # MNIST zeros only 1-6 pairs of k = 264 survive in the first outer iterations,
            # which then took 3-6 s instead of 12-14 (2 cores); to the stopping rule it cut
            # the passes by 3-19% on the convergence benchmark's instances, the outer
            # iterations and the objective unchanged (to 1e-5).
            if not np.isfinite(w).all():
                return len(w)
            return int((_simplex_projection(w, self.K - 1.0) > 0).sum()) + 1
        w, U, products = lobpcg_top(mm, to_device(self.state, group.device), constraint=ones, tol=BLOCK_EIG_TOL,
                                    maxiter=BLOCK_EIG_FIRST_ITERS if first else BLOCK_EIG_ITERS, wanted=wanted)
        return to_host(w), to_host(U), products          # in decreasing order of w

    def _dense(self):
        """Whether the step's eigenproblem is solved densely: k >= (n - 1) / 5, where
        DENSE_STEP_MATRICES n x n float64 fit the client's budget."""
        return 5 * self.k >= self.n - 1 and self.dense_fits

    def _centred_dense(self, L):
        """J M J in full, float64, on the blocks' device (J = I - 1 1^T / n), with D / L
        added from D's factor when the blocks leave D out; symmetrized."""
        Md = blocks.dense(self.group, "M").astype(np.float64, copy=False)
        if self.gram is not None:
            # D never changes: formed once (n^2 d flops, 75 GFLOP on the zeros), on the
            # blocks' device, which a run keeps.
            if self._gram_dense is None:
                self._gram_dense = self.gram.data.gram_matrix(Md)
            Md += self._gram_dense / L
        Md = 0.5 * (Md + Md.T)
        Md -= Md.mean(axis=0)
        Md -= Md.mean(axis=1)[:, None]
        return Md

    def outer_iteration(self, t, gamma, k_total):
        params, group, gram, K = self.params, self.group, self.gram, self.K
        L = gamma
        shifted = params.lagrangian == "shifted"
        self.eig_matvecs, self.fw_gap = 0, float("nan")
        pending = None
        for s in range(1, params.n_inner + 1):
            stats = _fused_pass(group, gram, pending=pending, vv_scale=0.0, gamma=gamma, tau=0.0,
                                update_gamma=False, full_stats=False, shifted=shifted,
                                out_p=1.0, out_g=-1.0 / L, out_name="M")
            first = self.state is None or self.state.shape[1] < self.k
            if first and not self._dense():         # the dense path needs no start
                self.state = self._start(self.k, self.state)
            theta, U, matmats = self._eigs(L, first)
            self.eig_matvecs += matmats
            lam = _simplex_projection(theta, K - 1.0)
            keep = lam > 0
            if keep.all() and params.block_rank is None:
                if self.k < self.k_cap:
                    self.k = min(self.k_cap, self.k + max(1, self.k // 2))     # grown for the next call
                elif self.k_cap < self.n - 2 and not self.capped:
                    self.capped = True
                    logger.warning("CGM's block step needs more than the k = %d directions this process's "
                                   "memory holds at n = %d: it goes on with them and converges slowly; "
                                   "solver='bm' holds O(n r) numbers", self.k, self.n)
            self.state = np.ascontiguousarray(U)
            Uk, lamk = U[:, keep], lam[keep]
            self.rank = int(keep.sum())
            A = Uk * lamk
            shift = 1.0 / gamma if shifted else 0.0
            store = "M" if self.stores_direction else None
            alphas, h, h0, pv = nomad_passes.lowrank_line_search_pass(group, A=A, U=Uk, shift=shift, store=store)
            # <G, V> = L (<P, V> - sum_j lambda_j u_j^T M u_j); the Ritz values are u^T M u.
            gv = L * (pv - float(lamk @ theta[keep]))
            self.fw_gap = stats["sum_GP"] - gv
            step = 1.0 if k_total == 0 else _line_search_step(alphas, h, h0, self.fw_gap, gamma)
            self.step = step
            pending = ("block", step * A, Uk, step, store)
            k_total += 1
        return pending, k_total


def _stores_direction(group):
    """Whether the block steps keep their direction A U^T in M between the line search
    and the next fused pass: the line search writes it into M (free once LOBPCG is done
    with it) and the fused pass reads it there, one rank-k GEMM per step instead of two,
    for one more write and read of M.  Wherever the blocks are in memory the GEMM costs
    more: 2 n^2 k flops against 8 n^2 bytes moved in float32.  On an H100 at MNIST's
    k = 520 the step's two passes took 35.7 ms instead of 64.8 (12.3 -> 8.2 ms at k = 40;
    n = 20,000, `graphs/gpu_nomad.py --parts blocksteps`); on 2 host cores 250 outer
    iterations on 3,501 MNIST digits (K = 13, k 34 -> 114) took 75 s instead of 88, the
    same passes.  Blocks in a Zarr store form it twice: there the extra write and read
    of M go to disk."""
    return group.device != "cpu" or group.backend != "zarr"


def _simplex_projection(x, total):
    """Euclidean projection of x onto {y >= 0, sum y = total}."""
    u = np.sort(x)[::-1]
    css = np.cumsum(u) - total
    idx = np.arange(1, len(u) + 1)
    rho = np.flatnonzero(u - css / idx > 0)[-1]
    return np.maximum(x - css[rho] / (rho + 1), 0.0)


class _FactoredGram:
    """D = F F^T kept as its factor (``data`` panels): the passes leave D out, and its
    part of every quantity is added here.  G x = G' x - F (F^T x) for the eigensolver
    (O(n d) beside the pass over G' = Gamma + gamma [Q]_-), and <D, P> follows the
    Frank-Wolfe steps exactly: P <- (1 - a) P + a c v v^T gives
    <D, P> <- (1 - a) <D, P> + a c ||F^T v||^2.  So no pass reads or forms an n x n D:
    at d = 784 (MNIST) that is n^2 d flops per pass saved (a GEMM per block)."""

    def __init__(self, data, group, ones, inner_p):
        self.data, self.group = data, group
        self.d_mean = data.gram_quadratic(ones)         # 1^T D 1 / n, for Tr(D Q) = <D, P> + 1^T D 1 / n
        if inner_p is None:                              # a checkpoint from before this was kept
            F = np.asarray(data.X, dtype=np.float64)
            inner_p = float(np.sum(F * np.asarray(blocks.matmat(group, "P", F))))
        self.inner_p = float(inner_p)

    def gradient_matvec(self, x):
        return blocks.matmat(self.group, "G", x) - self.data.gram_product(x)


def _fused_pass(group, gram, *, pending, vv_scale, **kw):
    """NOMAD's fused pass (``nomad_passes.nomad_pass``) applying the ``pending`` step
    (("vertex", v, step): P <- (1 - step) P + step (K - 1) v v^T; ("block", A, U, step,
    stored): P <- (1 - step) P + A U^T, A = step U diag(lambda), A U^T / step read from
    the matrix named ``stored`` where the line search wrote it; None: no step) over the stored
    D, or, when ``gram`` holds D's factor, leaving D out and adding its part:
    <G, P> -= <D, P> and Tr(D Q) = <D, P> + 1^T D 1 / n."""
    v, step, lowrank, stored = None, 0.0, None, None
    if pending is not None and pending[0] == "vertex":
        v, step = pending[1], pending[2]
    elif pending is not None:
        lowrank, step, stored = (pending[1], pending[2]), pending[3], pending[4]
    # A direction the line search stored is read from there rather than formed again.
    step_kw = dict(v=v, step=step, vv_scale=vv_scale, lowrank=None if stored else lowrank, direction=stored)
    if gram is None:
        return nomad_passes.nomad_pass(group, **step_kw, **kw)
    stats = nomad_passes.nomad_pass(group, **step_kw, exclude_d=True, **kw)
    if v is not None:
        gram.inner_p = (1.0 - step) * gram.inner_p + step * vv_scale * gram.data.gram_quadratic(v)
    elif lowrank is not None:
        # <D, A U^T> = sum_j a_j^T D u_j, from F^T A and F^T U (O(n d k), no pass), where
        # the blocks are: A and U come from the host, and there these two GEMMs took 56 s
        # of 128 in a profile of the 6,903 MNIST zeros on the H200 machine (136 outer
        # iterations, k up to 1,119).
        A, U = (to_device(a, group.device) for a in lowrank)
        gram.inner_p = (1.0 - step) * gram.inner_p + gram.data.gram_bilinear(A, U)
    stats["sum_GP"] -= gram.inner_p
    if not math.isnan(stats["sum_DQ"]):
        stats["sum_DQ"] = gram.inner_p + gram.d_mean
    return stats


def _append_history(history, row, t, inner, group, rec0, t0):
    tot = group.passes.since(rec0)
    row = dict(iteration=int(t) + 1, **row, fw_gap=float(inner.fw_gap), eig_matvecs=int(inner.eig_matvecs),
               step=float(inner.step), rank=int(inner.rank), passes=tot["passes"],
               seconds=time.perf_counter() - t0, bytes_read=tot["bytes_read"], bytes_written=tot["bytes_written"])
    history.append(row)
    logger.debug("NOMAD it %d  obj %.6g  rmse_neg %.2e  max_viol %.2e  gap %.2e  matvecs %d  rank %d  %.2fs",
                row["iteration"], row["objective"], row["rmse_neg"], row["max_violation"],
                row["fw_gap"], row["eig_matvecs"], row["rank"], row["seconds"])


def _warn_max_iter(history, params):
    """ConvergenceWarning for a run that reached max_iter: each stopping quantity of the
    last outer iteration against its tolerance (see :func:`_check_stop`)."""
    row = history[-1]
    change = (abs(row["objective"] - history[-2]["objective"]) / max(abs(row["objective"]), 1e-300)
              if len(history) > 1 else float("nan"))
    warn_convergence(f"NOMAD (conditional gradient, K={params.n_clusters}) stopped at max_iter={params.max_iter} "
                     f"before meeting its tolerances: last rmse_neg {row['rmse_neg']:.3g} "
                     f"(rmse_tol {params.rmse_tol:g}), max_violation {row['max_violation']:.3g} "
                     f"(min_tol {params.min_tol:g}), relative objective change {change:.3g} "
                     f"(objective_tol {params.objective_tol:g}); raise max_iter or loosen the tolerances")


def _check_stop(row, prev_obj, params):
    feasible = row["rmse_neg"] <= params.rmse_tol and row["max_violation"] <= params.min_tol
    if prev_obj is None:
        return "max_iter", False
    change = abs(row["objective"] - prev_obj) / max(abs(row["objective"]), 1e-300)
    if feasible and change <= params.objective_tol:
        return "tolerance", True
    return "max_iter", False


# The n x n matrices a checkpoint keeps: the iterate and the multipliers (G is rebuilt).
STATE_BLOCKS = ("P", "Gamma")


def _state(t, k_total, inner, history, penalty, tau, gram, stop_reason):
    """The run's state after outer iteration t, for ``checkpoint``: ``stop_reason`` is set on
    the run's last state (None before), so that a resume from it finishes instead of
    iterating on."""
    state = {"iteration": int(t), "k_total": int(k_total), "history": [dict(row) for row in history],
             "penalty": penalty, "tau": tau,
             "gram_inner_p": gram.inner_p if gram is not None else None, "stop_reason": stop_reason,
             "block_k": getattr(inner, "k", None), "blocks": list(STATE_BLOCKS)}
    if inner.state is not None:
        state["v"] = np.asarray(to_host(inner.state))
    return state
