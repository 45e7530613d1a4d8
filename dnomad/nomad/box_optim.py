"""Bound-constrained minimization over a row space: every step is row-chunk work.

The iterate x (n x r, lo <= x <= hi) and every vector the methods keep are named state
arrays of a row space -- :class:`dnomad.blocks.RowChunks` (row chunks beside X, in this
process or on a cluster's workers) or :class:`dnomad.blocks.RowState` -- and each
vector operation is one pass over that state (``space.map(kernel, ..., read_x=False)``)
whose per-chunk results are summed in chunk order.  The client holds only scalars and
small matrices.  The objective is a ``problem`` with ``evaluate(x, g) -> f`` that
writes the gradient at state ``x`` into state ``g``.

Two methods:

* :func:`spg` -- spectral projected gradient (Birgin, Martinez and Raydan, "Nonmonotone
  spectral projected gradient methods on convex sets", SIAM J. Optim. 10, 2000; SPG2):
  x+ = P(x - alpha g) with the Barzilai-Borwein step alpha = s's / s'y and Grippo-
  Lampariello-Lucidi's nonmonotone line search over the last M values.  One evaluation
  and two O(n r) passes per iteration when the step is taken whole.
* :func:`lbfgs` -- projected L-BFGS in vector-free form (Chen et al., "Large-scale
  L-BFGS using MapReduce", NIPS 2014): the two-loop recursion runs on the (2m+1)^2 Gram
  matrix of the stored pairs and the gradient, so its only vector work is dot products
  and one linear combination.  The pass that forms a new pair also forms the next
  gradient's dots (it reads the stored pairs once for both), so an iteration taken
  whole is one evaluation and two passes over the state.  Bounds as in Kim, Sra and Dhillon
  ("Tackling box-constrained optimization via a new projected quasi-Newton approach",
  SIAM J. Sci. Comput. 32, 2010): the quasi-Newton direction is computed from the
  gradient with its binding entries (at a bound, pointing out) zeroed, zeroed there
  too, then projected, with an Armijo search along the projection arc.

``lbfgs(precondition=P)`` starts the recursion from H0 = gamma P on each row instead of
gamma I (P an r x r SPD matrix; on a row's free entries, P restricted to them, so the
directions still descend); gamma = s'y / y'H0y of the newest pair.  This costs one more
pass an iteration (q = g less the first loop's y's, times P, and its dots with the y's).

Both stop on the projected gradient, ||P(x - g) - x||_inf <= max(gtol, rtol times its
value at the start) (``rtol`` makes the solve inexact in proportion to how far from
optimal it starts: an augmented Lagrangian method's inner solves), or on the relative
decrease of f, (f_old - f) <= ftol max(|f|, |f_old|, 1) (per iteration for L-BFGS, as
SciPy's L-BFGS-B; averaged over the nonmonotone window for SPG), or at max_iter.
The first step has unit length, or the scale ``scale0`` a previous solve returned if
that is shorter (a sequence of nearby problems).
States are 2-D (rows x columns) and the bounds lo, hi scalars (possibly infinite).
Float64 throughout (the multipliers' updates difference nearly equal sums), except the
products with a preconditioner (see :func:`_precondition`) and, with
``lbfgs(pair_dtype="float32")``, L-BFGS's stored pairs (see :func:`lbfgs`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

SPG_MEMORY = 10                 # M: the nonmonotone line search's window
ARMIJO = 1e-4                   # sufficient decrease constant (both methods)
MAX_BACKTRACKS = 40
STEP_BOUNDS = (1e-30, 1e30)     # BB steps are clipped to this range (SPG2)
PAIR_DTYPES = ("float64", "float32")    # lbfgs's stored pairs


@dataclass(frozen=True, eq=False)
class OptimResult:
    x: str              # state name holding the solution
    g: str              # state name holding the gradient there
    f: float
    nit: int
    nfev: int
    reason: str         # "gtol", "ftol", "max_iter" or "line_search"
    scale: float | None = None  # the last curvature scale (BB step / s'y / y'y): a warm start's scale0


# ------------------------------------------------------------ per-chunk kernels
# The kernels stream their states in row blocks of about BLOCK_ENTRIES entries (1 MiB
# in float64), so a block written by one step is still in cache for the next, and a
# state is read (or written) once per kernel: on all 70,000 MNIST digits (r = 128)
# whole-array temporaries made the optimizer's state passes cost more than the products
# with X.  (Blocks sized when the elementwise work was numpy expressions: two threads, a
# chunk of 35,000 x 128 each, 5 pairs: the trial step took 142 ms with blocks of 2^15
# entries, 88 ms with 2^17, 98 ms with 2^19.)  Outputs are written into the buffer the
# state already has where its shape allows (no new arrays to fault in).
BLOCK_ENTRIES = 1 << 17


def row_blocks(A):
    """Slices of A's rows, each about BLOCK_ENTRIES entries."""
    width = int(np.prod(A.shape[1:], dtype=np.int64)) or 1
    step = max(1, BLOCK_ENTRIES // width)
    return [slice(i, i + step) for i in range(0, A.shape[0], step)]


def output_buffer(chunk, name, like, dtype=None):
    """chunk[name]'s array to be overwritten (a new one if it has another shape or dtype),
    stored as chunk[name]: ``like``'s shape, and its dtype or ``dtype``."""
    dtype = like.dtype if dtype is None else np.dtype(dtype)
    out = chunk.get(name)
    if out is None or out.shape != like.shape or out.dtype != dtype or not out.flags.writeable:
        out = np.empty(like.shape, dtype=dtype)
    chunk[name] = out
    return out


# The elementwise work of each kernel is one numba loop over a row block (no numpy
# temporaries: at r = 64 and 500,000 rows a chunk, the masks, clips and products as
# numpy expressions made the kernels 2-4x slower than the memory traffic they need);
# the dots with the stored pairs stay BLAS calls on the block while it is in cache
# (float32 pairs: numba loops with a float64 accumulator, :func:`_block_dot`).
# Not full fast-math: the bounds may be infinite.
STATE_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH, inline="always")
def _is_binding(x, g, lo, hi):
    """An entry at a bound whose gradient points out of the box."""
    return (x <= lo and g > 0.0) or (x >= hi and g < 0.0)


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH, inline="always")
def _projected_step(x, g, lo, hi):
    """|P(x - g) - x| of one entry: the projected gradient's."""
    return abs(min(max(x - g, lo), hi) - x)


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _add_scaled(out, c, A, first):
    """out = c A (``first``) or out += c A, on 2-D blocks."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = c * A[i, j] if first else out[i, j] + c * A[i, j]


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _mixed_dot(A, B):
    """sum(A * B) of two 2-D blocks, accumulated in float64 whatever their dtypes (no
    upcast copy of either)."""
    total = 0.0
    for i in range(A.shape[0]):
        for j in range(A.shape[1]):
            total += np.float64(A[i, j]) * np.float64(B[i, j])    # float() of a float32 stays float32 in numba
    return total


def _block_dot(A, B):
    """<A, B> of two blocks: BLAS where both are float64, else :func:`_mixed_dot`."""
    if A.dtype == np.float64 and B.dtype == np.float64:
        return float(np.vdot(A, B))
    return _mixed_dot(A, B)


def _combine_into(out, terms, b):
    """out = sum c * A[b] over ``terms`` of (c, A) (``out``: a block of b's rows)."""
    for k, (c, a) in enumerate(terms):
        _add_scaled(out, c, a[b], k == 0)


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _clip_block(V, lo, hi):
    """V = clip(V, lo, hi) in place."""
    for i in range(V.shape[0]):
        for j in range(V.shape[1]):
            V[i, j] = min(max(V[i, j], lo), hi)


def _combine(chunk, out, terms, lo, hi, dots):
    """chunk[out] = clip(sum c * chunk[name]); the dots of the named pairs."""
    arrays = [(c, chunk[name]) for c, name in terms]
    assert out not in {name for _, name in terms}
    V = output_buffer(chunk, out, arrays[0][1])
    for b in row_blocks(V):
        _combine_into(V[b], arrays, b)
        if lo is not None:
            _clip_block(V[b], lo, hi)
    return _dots(chunk, dots)


def _dots(chunk, pairs):
    return [float(np.vdot(chunk[a], chunk[b])) for a, b in pairs]


def swap_states(chunk, a, b):
    """Exchange the arrays of states a and b (a kernel for ``space.map``): b's buffer
    stays in the chunk under a's name, for the next solve to write into."""
    chunk[a], chunk[b] = chunk[b], chunk.get(a)
    if chunk[b] is None:
        del chunk[b]


R0 = "_r0"      # the state of H0 times the first loop's vector (preconditioned L-BFGS)


def pair_states(memory):
    """The names of :func:`lbfgs`'s ``memory`` stored pairs: (s's, y's)."""
    return [f"_s{i}" for i in range(memory)], [f"_y{i}" for i in range(memory)]


def solver_states(x, optimizer, memory=0):
    """The states ``optimizer`` ("spg" or "lbfgs" with ``memory`` pairs) keeps beside
    ``x`` with ``release=False``."""
    if optimizer == "spg":
        xt, g, gt, _, d, _ = work_states(x)
        return [xt, g, gt, d]
    return work_states(x, memory)


def work_states(x, memory=0):
    """The states :func:`spg` and :func:`lbfgs` (``memory`` pairs) keep beside ``x``
    with ``release=False``, in this order: the trial point, the gradients at x and at
    the trial point, the free gradient, the direction, H0 times the first loop's
    vector, then the pairs' s's and y's."""
    s_names, y_names = pair_states(memory)
    return [x + "_t", "_g", "_gt", "_gh", "_d", R0] + s_names + y_names


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _spg_block(X, G, alpha, lo, hi, D, XT):
    """D = P(X - alpha G) - X, XT = X + D; (g'd, d'd, ||P(x - g) - x||_inf, ||g free||^2)."""
    gd = dd = free2 = pginf = 0.0
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            x, g = X[i, j], G[i, j]
            d = min(max(x - alpha * g, lo), hi) - x
            D[i, j] = d
            XT[i, j] = x + d
            gd += g * d
            dd += d * d
            if not _is_binding(x, g, lo, hi):
                free2 += g * g
            pginf = max(pginf, _projected_step(x, g, lo, hi))
    return gd, dd, pginf, free2


def _spg_trial(chunk, x, g, alpha, lo, hi, d, xt):
    """d = P(x - alpha g) - x, xt = x + d; (g'd, d'd, ||P(x - g) - x||_inf, ||g free||^2)
    with "g free" the gradient less its binding entries."""
    X, G = chunk[x], chunk[g]
    D, XT = output_buffer(chunk, d, X), output_buffer(chunk, xt, X)
    gd = dd = free2 = pginf = 0.0
    for b in row_blocks(X):
        a, c, e, f = _spg_block(X[b], G[b], alpha, lo, hi, D[b], XT[b])
        gd, dd, pginf, free2 = gd + a, dd + c, max(pginf, e), free2 + f
    return gd, dd, pginf, free2


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _free_block(X, G, lo, hi, GH):
    """GH = G with its binding entries zeroed; (GH'GH, ||P(X - G) - X||_inf)."""
    hh = pginf = 0.0
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            x, g = X[i, j], G[i, j]
            h = 0.0 if _is_binding(x, g, lo, hi) else g
            GH[i, j] = h
            hh += h * h
            pginf = max(pginf, _projected_step(x, g, lo, hi))
    return hh, pginf


def _free_gradient(chunk, x, g, lo, hi, out, names):
    """chunk[out] = g with its binding entries zeroed; its dots with ``names`` and
    itself, and ||P(x - g) - x||_inf."""
    X, G = chunk[x], chunk[g]
    others = [chunk[n] for n in names]
    GH = output_buffer(chunk, out, G)
    dots = [0.0] * (len(names) + 1)
    pginf = 0.0
    for b in row_blocks(X):
        hh, pg = _free_block(X[b], G[b], lo, hi, GH[b])
        gh = GH[b]
        for k, other in enumerate(others):
            dots[k] += _block_dot(gh, other[b])
        dots[-1] += hh
        pginf = max(pginf, pg)
    return dots, pginf


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _trial_block(X, G, D, lo, hi, step, XT, mask):
    """Zero D on the binding set (``mask``), XT = P(X + step D); returns G'(XT - X)."""
    slope = 0.0
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            x, g = X[i, j], G[i, j]
            d = D[i, j]
            if mask and _is_binding(x, g, lo, hi):
                d = 0.0
                D[i, j] = 0.0
            t = min(max(x + step * d, lo), hi)
            XT[i, j] = t
            slope += g * (t - x)
    return slope


def _lbfgs_trial(chunk, x, g, terms, lo, hi, d, xt, step):
    """d = sum c * chunk[name], zeroed on the binding set; xt = P(x + step d);
    returns g'(xt - x)."""
    X, G = chunk[x], chunk[g]
    arrays = [(c, chunk[name]) for c, name in terms]
    D, XT = output_buffer(chunk, d, X), output_buffer(chunk, xt, X)
    slope = 0.0
    for b in row_blocks(X):
        _combine_into(D[b], arrays, b)
        slope += _trial_block(X[b], G[b], D[b], lo, hi, step, XT[b], True)
    return slope


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _masked_copy(X, G, lo, hi, src, dst):
    """dst = src with the entries where (X, G) is binding zeroed (dst may have another
    dtype)."""
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            dst[i, j] = 0.0 if _is_binding(X[i, j], G[i, j], lo, hi) else src[i, j]


def _precondition(chunk, x, g, lo, hi, terms, P, out, y_names, last):
    """chunk[out] = M ((M q) P) row by row, with q = sum c * chunk[name] over ``terms``
    and M zeroing the binding entries at x; its dots with the ``y_names`` and with
    itself, and (M y)' ((M y) P) for y = chunk[last] (None: 0).

    The products with P are float32 GEMMs (twice float64's rate; they were most of this
    pass's time).  P is an approximate inverse Hessian: its round-off perturbs H0 by
    about cond(P) sqrt(r) 6e-8 relative to H0's smallest eigenvalue (1e-3 for
    Burer-Monteiro's P, whose condition number is at most 10 r + 1), so H0 stays SPD
    and the recursion stays exact for the H0 applied (the dots with r0 are taken with
    its float64 result); y'H0y, which only scales gamma, is summed in float32.  An
    ill-conditioned P (cond near 1e6 / sqrt(r)) would need float64 here."""
    X, G = chunk[x], chunk[g]
    arrays = [(c, chunk[name]) for c, name in terms]
    R = output_buffer(chunk, out, X)
    ys = [chunk[name] for name in y_names]
    Ylast = None if last is None else chunk[last]
    dots = np.zeros(len(ys) + 2)
    blocks = row_blocks(X)
    if not blocks:
        return [float(v) for v in dots]
    P32 = np.asarray(P, dtype=np.float32)
    Q = np.empty_like(X[blocks[0]])                   # q's block
    Q32 = np.empty(Q.shape, dtype=np.float32)         # M q, then M y, in float32
    R32 = np.empty_like(Q32)
    for b in blocks:
        Xb, Gb, Rb = X[b], G[b], R[b]
        rows = Rb.shape[0]
        q, q32, r32 = Q[:rows], Q32[:rows], R32[:rows]
        _combine_into(q, arrays, b)
        _masked_copy(Xb, Gb, lo, hi, q, q32)
        np.matmul(q32, P32, out=r32)
        _masked_copy(Xb, Gb, lo, hi, r32, Rb)
        for k, y in enumerate(ys):
            dots[k] += _block_dot(y[b], Rb)
        dots[-2] += np.vdot(Rb, Rb)
        if Ylast is not None:
            _masked_copy(Xb, Gb, lo, hi, Ylast[b], q32)
            dots[-1] += np.vdot(P, (q32.T @ q32).astype(np.float64))    # (M y) P (M y)'s sum: a SYRK
    return [float(v) for v in dots]


def _arc(chunk, x, g, d, step, lo, hi, xt):
    X, G, D = chunk[x], chunk[g], chunk[d]
    XT = output_buffer(chunk, xt, X)
    slope = 0.0
    for b in row_blocks(X):
        slope += _trial_block(X[b], G[b], D[b], lo, hi, step, XT[b], False)
    return slope


@numba.njit(nogil=True, cache=True, fastmath=STATE_FASTMATH)
def _difference_block(xn, xo, gn, go, S, Y):
    """S = xn - xo, Y = gn - go (in S's and Y's dtype); (s's, s'y, y'y) of the stored
    values."""
    ss = sy = yy = 0.0
    for i in range(S.shape[0]):
        for j in range(S.shape[1]):
            S[i, j] = xn[i, j] - xo[i, j]
            Y[i, j] = gn[i, j] - go[i, j]
            s = np.float64(S[i, j])
            y = np.float64(Y[i, j])
            ss += s * s
            sy += s * y
            yy += y * y
    return ss, sy, yy


def _pair(chunk, x_new, x_old, g_new, g_old, s, y, others, lo, hi, gh, pair_dtype="float64"):
    """s = x_new - x_old, y = g_new - g_old, stored in ``pair_dtype``; their dots with
    each other and ``others``; and the next iteration's free gradient (as
    :func:`_free_gradient` at x_new, into ``gh``) with its dots with ``others``, s, y and
    itself, and ||P(x - g) - x||_inf there.  One pass by row blocks: the stored pairs
    are read once for all their dots."""
    S = output_buffer(chunk, s, chunk[x_new], dtype=pair_dtype)
    Y = output_buffer(chunk, y, chunk[g_new], dtype=pair_dtype)
    xn, xo, gn, go = chunk[x_new], chunk[x_old], chunk[g_new], chunk[g_old]
    GH = output_buffer(chunk, gh, gn)
    rest = [chunk[o] for o in others]
    m = len(rest)
    dots = np.zeros(3 + 3 * m + 3)
    pginf = 0.0
    for b in row_blocks(S):
        Sb, Yb, Hb = S[b], Y[b], GH[b]
        dots[:3] += _difference_block(xn[b], xo[b], gn[b], go[b], Sb, Yb)
        hh, pg = _free_block(xn[b], gn[b], lo, hi, Hb)
        pginf = max(pginf, pg)
        for k, other in enumerate(rest):
            ob = other[b]
            dots[3 + k] += _block_dot(Sb, ob)
            dots[3 + m + k] += _block_dot(Yb, ob)
            dots[3 + 2 * m + k] += _block_dot(Hb, ob)
        dots[-3:] += (_block_dot(Hb, Sb), _block_dot(Hb, Yb), hh)
    return [float(v) for v in dots], pginf


# ------------------------------------------------------------ helpers
def _sum(parts):
    """Per-chunk results summed in chunk order (so the sum does not depend on where the
    chunks ran)."""
    return np.sum(np.asarray(parts, dtype=np.float64), axis=0)


def _ftol_met(f_old, f, ftol, steps=1):
    return (f_old - f) <= ftol * steps * max(abs(f), abs(f_old), 1.0)


def _quadratic_backtrack(step, f0, slope, f_trial):
    """The minimizer of the quadratic through f(0), f'(0) = slope and f(step),
    safeguarded to [0.1 step, 0.5 step]."""
    denom = 2.0 * (f_trial - f0 - step * slope)
    new = -slope * step * step / denom if denom > 0 else 0.5 * step
    return float(np.clip(new, 0.1 * step, 0.5 * step))


# ------------------------------------------------------------ SPG
def spg(space, problem, x, *, lo=0.0, hi=1.0, max_iter=1000, ftol=1e-10, gtol=1e-10, rtol=0.0,
        scale0=None, memory=SPG_MEMORY, release=True):
    """Minimize ``problem`` over lo <= x <= hi from state ``x`` (feasible) by spectral
    projected gradient with a nonmonotone line search (see the module docstring).
    Uses states ``x``, ``x + "_t"``, ``"_g"``, ``"_gt"``, ``"_d"``; returns an
    :class:`OptimResult` naming the state that holds the solution.  ``release``: drop
    the work states at the end (False: keep them, so a sequence of solves on one space
    writes into the same buffers instead of faulting in new ones; the caller drops
    :func:`work_states` when done)."""
    xt, g, gt, _, d, _ = work_states(x)
    f = problem.evaluate(x, g)
    nfev, history = 1, [f]
    alpha = None
    reason, it = "max_iter", 0
    for it in range(1, max_iter + 1):
        if alpha is None:
            # The first step moves by at most unit length, 1 / ||g free||_2, as L-BFGS-B's
            # (SPG2's 1 / ||P(x - g) - x||_inf is about 1 whenever the gradient dwarfs the
            # box, and jumps to its faces).
            parts = space.map(_spg_trial, x, g, 0.0, lo, hi, d, xt, read_x=False)
            gtol = max(gtol, rtol * max(p[2] for p in parts))
            if max(p[2] for p in parts) <= gtol:
                reason = "gtol"
                break
            alpha = float(np.clip(_first_scale(_sum([p[3] for p in parts]), scale0), *STEP_BOUNDS))
        parts = space.map(_spg_trial, x, g, alpha, lo, hi, d, xt, read_x=False)
        gd, dd = _sum([p[:2] for p in parts])[:2]
        pginf = max(p[2] for p in parts)
        if pginf <= gtol or gd >= 0:
            reason = "gtol"
            break
        f_ref = max(history[-memory:])
        step, backtracks = 1.0, 0
        while True:
            ft = problem.evaluate(xt, gt)
            nfev += 1
            if ft <= f_ref + ARMIJO * step * gd:
                break
            backtracks += 1
            if backtracks > MAX_BACKTRACKS:
                reason = "line_search"
                break
            step = _quadratic_backtrack(step, history[-1], gd, ft)
            space.map(_combine, xt, [(1.0, x), (step, d)], None, None, (), read_x=False)
        if reason == "line_search":
            break
        # s = step d, y = gt - g: s's = step^2 d'd, s'y = step (d'gt - d'g).
        d_gt = _sum(space.map(_dots, [(d, gt)], read_x=False))[0]
        sty = step * (d_gt - gd)
        sts = step * step * dd
        # Without curvature (s'y <= 0) keep the last step: SPG2's alpha_max would jump to
        # the box's faces whenever the gradient dwarfs the box.
        if sty > 0:
            alpha = float(np.clip(sts / sty, *STEP_BOUNDS))
        x, xt, g, gt = xt, x, gt, g
        f = ft
        history.append(f)
        if len(history) > memory and _ftol_met(history[-1 - memory], f, ftol, memory):
            reason = "ftol"
            break
    if release:
        space.map(drop_states, [xt, gt, d], read_x=False)
    return OptimResult(x=x, g=g, f=f, nit=it, nfev=nfev, reason=reason, scale=alpha)


def _first_scale(g_dot_g, scale0):
    """The first step's scale: at most unit length, 1 / ||g||_2, and at most ``scale0``
    (the curvature a previous, nearby solve ended with: a warm start's unit-length first
    step is far too long and ends in a backtracked sliver that trips ftol)."""
    unit = 1.0 / np.sqrt(g_dot_g) if g_dot_g > 0 else 1.0
    return unit if scale0 is None else min(unit, scale0)


def drop_states(chunk, names):
    """Forget the named states of a chunk (a kernel for ``space.map``)."""
    for name in names:
        chunk.pop(name, None)


# ------------------------------------------------------------ projected L-BFGS
def lbfgs(space, problem, x, *, lo=0.0, hi=1.0, max_iter=1000, ftol=1e-10, gtol=1e-10, rtol=0.0,
          scale0=None, memory=5, precondition=None, release=True, pair_dtype="float64"):
    """Minimize ``problem`` over lo <= x <= hi from state ``x`` (feasible) by projected
    L-BFGS in vector-free form (see the module docstring); ``memory`` pairs (s, y) kept
    as states ``"_s0"``, ``"_y0"``, ... in ``pair_dtype`` ("float32" halves their bytes
    and their share of the passes that read them; every dot is taken of the stored
    values in float64, so the recursion is L-BFGS for the rounded pairs, whose
    curvature s'y > 0 is checked as for any pair); ``precondition``: an r x r SPD matrix P, the
    initial inverse Hessian gamma P on each row (None: gamma I; the returned ``scale``
    is then gamma relative to P); ``release`` as for :func:`spg` (on 10^6 rows, r = 64,
    the pair pass took 3-4x as long while its buffers were new).  Returns an
    :class:`OptimResult`."""
    if pair_dtype not in PAIR_DTYPES:
        raise ValueError(f"pair_dtype must be one of {PAIR_DTYPES}; got {pair_dtype!r}")
    xt, g, gt, gh, d, r0 = work_states(x)
    s_names, y_names = pair_states(memory)
    slots = []                          # ring of slot indices, oldest first
    SY = np.zeros((memory, memory))     # SY[i, j] = s_i'y_j (slots)
    SS = np.zeros((memory, memory))
    YY = np.zeros((memory, memory))
    f = problem.evaluate(x, g)
    nfev, reason, it = 1, "max_iter", 0
    gamma0 = gamma = None
    free = None                         # from the last pair pass: (gh's dots by state name, pginf)
    for it in range(1, max_iter + 1):
        names = [s_names[i] for i in slots] + [y_names[i] for i in slots]
        if free is None:
            parts = space.map(_free_gradient, x, g, lo, hi, gh, names, read_x=False)
            dots = _sum([p[0] for p in parts])
            pginf = max(p[1] for p in parts)
        else:
            gh_dots, pginf = free
            dots = [gh_dots[name] for name in names] + [gh_dots[gh]]
        if it == 1:
            gtol = max(gtol, rtol * pginf)
        if pginf <= gtol:
            reason = "gtol"
            break
        if gamma0 is None:              # the first step: at most unit length (see spg)
            gamma0 = _first_scale(dots[-1], scale0)
        if precondition is not None:
            terms, gamma = _preconditioned_direction(space, x, g, lo, hi, gh, slots, SY, dots, precondition,
                                                     s_names, y_names, gamma, scale0)
        else:
            coef = _two_loop(slots, SY, SS, YY, dots, gamma0)
            terms = [(-coef[0], gh)] + [(-c, n) for c, n in zip(coef[1:], names) if c != 0.0]
        step = 1.0
        slope = _sum(space.map(_lbfgs_trial, x, g, terms, lo, hi, d, xt, step, read_x=False))
        if not slope < 0:
            # Not a descent direction along the arc: forget the pairs, take a gradient step.
            slots = []
            coef = _two_loop(slots, SY, SS, YY, dots[-1:], gamma0)
            slope = _sum(space.map(_lbfgs_trial, x, g, [(-coef[0], gh)], lo, hi, d, xt, step, read_x=False))
            if not slope < 0:
                reason = "gtol"
                break
        backtracks = 0
        while True:
            ft = problem.evaluate(xt, gt)
            nfev += 1
            if ft <= f + ARMIJO * slope:
                break
            backtracks += 1
            if backtracks > MAX_BACKTRACKS:
                reason = "line_search"
                break
            step = _quadratic_backtrack(step, f, slope / step, ft)
            slope = _sum(space.map(_arc, x, g, d, step, lo, hi, xt, read_x=False))
        if reason == "line_search":
            break
        # The new pair in the oldest slot (or a free one); its dots with the others; the
        # next iteration's free gradient and its dots.
        slot = len(slots) if len(slots) < memory else slots[0]
        others_s = [s_names[i] for i in slots if i != slot]
        others_y = [y_names[i] for i in slots if i != slot]
        others = others_s + others_y
        parts = space.map(_pair, xt, x, gt, g, s_names[slot], y_names[slot], others, lo, hi, gh, pair_dtype,
                          read_x=False)
        out = _sum([p[0] for p in parts])
        sts, sty, yty = out[:3]
        m = len(others_s)
        s_dot_s, s_dot_y = out[3:3 + m], out[3 + m:3 + 2 * m]
        y_dot_s, y_dot_y = out[3 + 2 * m:3 + 3 * m], out[3 + 3 * m:3 + 4 * m]
        gh_dots = dict(zip(others + [s_names[slot], y_names[slot], gh], out[3 + 4 * m:]))
        free = (gh_dots, max(p[1] for p in parts))
        if slot in slots:                   # its vectors are overwritten, kept or not
            slots.remove(slot)
        if sty > 1e-12 * yty and sty > 0:
            for k, j in enumerate(i for i in slots if i != slot):
                SS[slot, j] = SS[j, slot] = s_dot_s[k]
                SY[slot, j] = s_dot_y[k]
                SY[j, slot] = y_dot_s[k]
                YY[slot, j] = YY[j, slot] = y_dot_y[k]
            SS[slot, slot], SY[slot, slot], YY[slot, slot] = sts, sty, yty
            slots.append(slot)
        f_old, f = f, ft
        x, xt, g, gt = xt, x, gt, g
        if _ftol_met(f_old, f, ftol):
            reason = "ftol"
            break
    if release:
        space.map(drop_states, [xt, gt, gh, d, r0] + s_names + y_names, read_x=False)
    if precondition is not None:
        scale = gamma
    else:
        scale = SY[slots[-1], slots[-1]] / YY[slots[-1], slots[-1]] if slots else gamma0
    return OptimResult(x=x, g=g, f=f, nit=it, nfev=nfev, reason=reason, scale=scale)


def _two_loop(slots, SY, SS, YY, gdots, gamma0):
    """The coefficients of H g over the basis [g, s_slots..., y_slots...] from the Gram
    matrix of that basis (``gdots``: g's dots with the s's, the y's, then itself)."""
    m = len(slots)
    idx = np.asarray(slots, dtype=int)
    n_basis = 1 + 2 * m
    Gm = np.empty((n_basis, n_basis))
    Gm[0, 0] = gdots[-1]
    Gm[0, 1:1 + m] = Gm[1:1 + m, 0] = gdots[:m]
    Gm[0, 1 + m:] = Gm[1 + m:, 0] = gdots[m:2 * m]
    Gm[1:1 + m, 1:1 + m] = SS[np.ix_(idx, idx)]
    Gm[1:1 + m, 1 + m:] = SY[np.ix_(idx, idx)]
    Gm[1 + m:, 1:1 + m] = SY[np.ix_(idx, idx)].T
    Gm[1 + m:, 1 + m:] = YY[np.ix_(idx, idx)]
    q = np.zeros(n_basis)
    q[0] = 1.0
    rho = [1.0 / SY[i, i] for i in slots]
    alphas = [0.0] * m
    for k in reversed(range(m)):
        alphas[k] = rho[k] * (Gm[1 + k] @ q)
        q[1 + m + k] -= alphas[k]
    gamma = SY[slots[-1], slots[-1]] / YY[slots[-1], slots[-1]] if m else gamma0
    r = gamma * q
    for k in range(m):
        beta = rho[k] * (Gm[1 + m + k] @ r)
        r[1 + k] += alphas[k] - beta
    return r


def _preconditioned_direction(space, x, g, lo, hi, gh, slots, SY, dots, P, s_names, y_names, gamma, scale0):
    """The two-loop recursion with H0 = gamma M P M (M: the free entries; P an r x r SPD
    matrix applied to every row): the first loop on the Gram matrix of [g, s, y], one
    pass to form r0 = M P M q and its dots with the y's, the second loop on those.
    gamma = s'y / (y' M P M y) of the newest pair; with no pair yet, the previous gamma,
    or the first step's: r0 to unit length, at most ``scale0``.  Returns the
    direction's terms for :func:`_lbfgs_trial` and gamma."""
    m = len(slots)
    sg = dots[:m]
    rho = [1.0 / SY[i, i] for i in slots]
    # q = gh - sum_k alpha_k y_k, newest first
    qy = np.zeros(m)                    # q's coefficients on the y's
    alphas = np.zeros(m)
    for k in reversed(range(m)):
        i = slots[k]
        s_q = sg[k] + sum(qy[j] * SY[i, slots[j]] for j in range(m))
        alphas[k] = rho[k] * s_q
        qy[k] -= alphas[k]
    terms = [(1.0, gh)] + [(c, y_names[i]) for c, i in zip(qy, slots) if c != 0.0]
    last = y_names[slots[-1]] if m else None
    out = _sum(space.map(_precondition, x, g, lo, hi, terms, P, R0, [y_names[i] for i in slots], last,
                         read_x=False))
    y_r0, r0r0, yPy = out[:m], out[m], out[m + 1]
    if m and yPy > 0:
        gamma = SY[slots[-1], slots[-1]] / yPy
    elif gamma is None:                 # the first step: r0 at most unit length (see spg)
        gamma = _first_scale(r0r0, scale0)
    # r = gamma r0 + sum_k (alpha_k - beta_k) s_k, oldest first
    sc = np.zeros(m)
    for k in range(m):
        i = slots[k]
        y_r = gamma * y_r0[k] + sum(sc[j] * SY[slots[j], i] for j in range(m))
        beta = rho[k] * y_r
        sc[k] += alphas[k] - beta
    terms = [(-gamma, R0)] + [(-c, s_names[i]) for c, i in zip(sc, slots) if c != 0.0]
    return terms, gamma
