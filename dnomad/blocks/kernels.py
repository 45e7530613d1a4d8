"""Per-block kernels: module-level pure functions of (block, ...), no dask, no zarr.

Each kernel streams its block once (numba loops, no b x b temporaries) and returns
the small reductions that ride along with the pass.  Blocks are NumPy arrays here,
except for the CUDA kernels at the end of this module, which take CuPy blocks (CuPy
comes from :mod:`dnomad.blocks.device`, lazily).
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from .device import array_module, is_device_array

# Layout of the statistics vector returned by ``nomad_block``; sums are already
# weighted (an off-diagonal block of a symmetric layout stands for two blocks).
NOMAD_STATS = (
    "sum_DQ",        # sum_ij D_ij Q_ij = Tr(D Q) for symmetric D
    "sum_GP",        # <G, P>, for the Frank-Wolfe gap
    "neg_count",     # number of negative entries of Q = P + E_n
    "neg_sumsq",     # sum of squares of the negative entries of Q
    "min_Q",         # smallest entry of Q (reduced by min, not summed)
    "sumsq_Q",       # ||Q||_F^2
)
N_NOMAD_STATS = len(NOMAD_STATS)
MIN_Q = NOMAD_STATS.index("min_Q")
SUM_GP = NOMAD_STATS.index("sum_GP")

# Above this many features, D's block is formed by one GEMM instead of inline dots.
INLINE_GRAM_MAX_FEATURES = 8

# Full fast-math: reductions (sums, min) vectorize.  Inputs are checked finite before
# any pass, and no kernel starts a reduction at inf (min starts at the dtype's max).
_FASTMATH = True


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _nomad_row_gap(Prow, Gamrow, Grow, drow, vj, av, keep, gamma, inv_n, shift, out_p, out_g):
    # The inner pass's row: only <G, P> is reduced, so the loop vectorizes fully.
    s_gp = 0.0
    for c in range(Prow.shape[0]):
        p = keep * Prow[c] + av * vj[c]
        Prow[c] = p
        gam = Gamrow[c]
        g = min(shift * gam + gamma * (p + inv_n), 0.0) + (1.0 - shift) * gam - drow[c]
        Grow[c] = out_p * p + out_g * g
        s_gp += g * p
    return s_gp


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _nomad_row(Prow, Gamrow, Grow, drow, vj, av, keep, gamma, tau, inv_n, update_gamma, write_g,
               shift, out_p, out_g, acc):
    # One row of the fused pass with all statistics, branch-free in its body; the flags
    # are constants at each call site, so the compiler emits one loop per combination.
    s_dq = 0.0
    s_gp = 0.0
    n_neg = 0.0
    s_neg = 0.0
    s_q2 = 0.0
    for c in range(Prow.shape[0]):
        p = keep * Prow[c] + av * vj[c]
        Prow[c] = p
        q = p + inv_n
        dval = drow[c]
        s_dq += dval * q
        s_q2 += q * q
        qneg = min(q, 0.0)
        n_neg += 1.0 if q < 0.0 else 0.0
        s_neg += qneg * qneg
        if update_gamma:
            gam = min(Gamrow[c] + tau * q, 0.0)
            Gamrow[c] = gam
        else:
            gam = Gamrow[c]
        if write_g:
            g = min(shift * gam + gamma * q, 0.0) + (1.0 - shift) * gam - dval
            Grow[c] = out_p * p + out_g * g
            s_gp += g * p
    # A min reduction keeps LLVM from vectorizing the loop above (3x slower), so it
    # gets its own loop over the row, which is still in L1.
    p_min = Prow[0]
    for c in range(1, Prow.shape[0]):
        p_min = min(p_min, Prow[c])
    acc[0] += s_dq
    acc[1] += s_gp
    acc[2] += n_neg
    acc[3] += s_neg
    acc[4] = min(acc[4], p_min + inv_n)
    acc[5] += s_q2


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _nomad_block(P, Gam, G, Dblk, Xi, XjT, vi, vj, step, vv_scale, gamma, tau, inv_n,
                 use_x, update_gamma, write_g, full_stats, shift, out_p, out_g, weight, out):
    bi, bj = P.shape
    d = Xi.shape[1]
    keep = 1.0 - step
    acc = np.zeros(N_NOMAD_STATS, np.float64)
    acc[4] = np.finfo(P.dtype).max
    drow = np.empty(bj, P.dtype)
    gap_only = write_g and not update_gamma and not full_stats
    for r in range(bi):
        av = step * vv_scale * vi[r]
        if use_x:
            # D's row r from the data panels: d short axpys over a cached row buffer.
            drow[:] = 0.0
            for k in range(d):
                x = Xi[r, k]
                for c in range(bj):
                    drow[c] += x * XjT[k, c]
        else:
            drow[:] = Dblk[r]
        Grow = G[r] if write_g else drow
        if gap_only:
            acc[1] += _nomad_row_gap(P[r], Gam[r], Grow, drow, vj, av, keep, gamma, inv_n, shift, out_p, out_g)
        elif update_gamma:
            if write_g:
                _nomad_row(P[r], Gam[r], Grow, drow, vj, av, keep, gamma, tau, inv_n, True, True, shift, out_p, out_g, acc)
            else:
                _nomad_row(P[r], Gam[r], Grow, drow, vj, av, keep, gamma, tau, inv_n, True, False, shift, out_p, out_g, acc)
        elif write_g:
            _nomad_row(P[r], Gam[r], Grow, drow, vj, av, keep, gamma, tau, inv_n, False, True, shift, out_p, out_g, acc)
        else:
            _nomad_row(P[r], Gam[r], Grow, drow, vj, av, keep, gamma, tau, inv_n, False, False, shift, out_p, out_g, acc)
    out[0] = weight * acc[0]
    out[1] = weight * acc[1]
    out[2] = weight * acc[2]
    out[3] = weight * acc[3]
    out[4] = acc[4]
    out[5] = weight * acc[5]


_EMPTY_2D = {np.dtype(np.float32): np.zeros((0, 0), np.float32),
             np.dtype(np.float64): np.zeros((0, 0), np.float64)}


def nomad_block(P, Gam, G, *, D=None, Xi=None, Xj=None, vi, vj, step, vv_scale, gamma,
                tau, inv_n, update_gamma, write_g, weight, full_stats=True, shifted=False,
                out_p=0.0, out_g=1.0, lowrank=None):
    """One block of NOMAD's fused pass, in place.

    P <- (1 - step) P + step * vv_scale * vi vj^T  (or, with ``lowrank`` = (Ai, Uj),
    P <- (1 - step) P + Ai Uj^T: a rank-k step, Ai already scaled by the step);
    Q = P + inv_n;  Gam <- [Gam + tau Q]_- if ``update_gamma``;
    the gradient g = -D + Gam + gamma [Q]_- (eq. 13), or g = -D + [Gam + gamma Q]_-
    when ``shifted`` (the classical augmented Lagrangian of Q >= 0), and the block
    written is out_p P + out_g g (G itself by default; P - G / L for a projected step).
    D's block is ``D`` or, when ``D`` is None, ``Xi @ Xj.T``.  Returns the
    statistics named in ``NOMAD_STATS`` (float64; ``sum_GP`` is <g, P>); with
    ``full_stats=False`` a pass that writes G without updating Gam reduces only
    ``sum_GP`` (the others are NaN), which lets its loop vectorize (about 3x faster).
    Reads P, Gam (and D) once, writes P, G (and Gam) once; no b x b temporary unless D is
    formed by GEMM (the rank-k step is one in-place GEMM on P).
    """
    if lowrank is not None:
        lowrank_update_block(P, lowrank[0], lowrank[1], 1.0 - step)
        step = 0.0
    if is_device_array(P):
        if shifted or out_p != 0.0 or out_g != 1.0:
            return array_nomad_block(P, Gam, G, D=D, Xi=Xi, Xj=Xj, vi=vi, vj=vj, step=step, vv_scale=vv_scale,
                                     gamma=gamma, tau=tau, inv_n=inv_n, update_gamma=update_gamma,
                                     write_g=write_g, weight=weight, shifted=shifted, out_p=out_p, out_g=out_g)
        return device_nomad_block(P, Gam, G, D=D, Xi=Xi, Xj=Xj, vi=vi, vj=vj, step=step, vv_scale=vv_scale,
                                  gamma=gamma, tau=tau, inv_n=inv_n, update_gamma=update_gamma,
                                  write_g=write_g, weight=weight, full_stats=full_stats)
    dtype = P.dtype
    empty = _EMPTY_2D[dtype]
    use_x = D is None
    if use_x and Xi.shape[1] > INLINE_GRAM_MAX_FEATURES:
        D = Xi @ Xj.T
        use_x = False
    if use_x:
        Xi = np.ascontiguousarray(Xi, dtype=dtype)
        XjT = np.ascontiguousarray(Xj.T, dtype=dtype)
        D = empty
    else:
        Xi = XjT = empty
    if G is None:
        G = empty
    out = np.empty(N_NOMAD_STATS, np.float64)
    _nomad_block(P, Gam, G, D, Xi, XjT, vi.astype(dtype, copy=False), vj.astype(dtype, copy=False),
                 dtype.type(step), dtype.type(vv_scale), dtype.type(gamma), dtype.type(tau),
                 dtype.type(inv_n), use_x, update_gamma, write_g, full_stats, dtype.type(1.0 if shifted else 0.0),
                 dtype.type(out_p), dtype.type(out_g), float(weight), out)
    if write_g and not update_gamma and not full_stats:
        gp = out[SUM_GP]
        out[:] = np.nan
        out[SUM_GP] = gp
    return out


def lowrank_update_block(P, Ai, Uj, keep):
    """P <- keep P + Ai Uj^T in place (Ai: rows x k, Uj: cols x k), one GEMM: BLAS
    writes into P's memory (P^T is Fortran-ordered), so no b x b temporary is made."""
    xp = array_module(P)
    Ai = xp.asarray(Ai, dtype=P.dtype)
    Uj = xp.asarray(Uj, dtype=P.dtype)
    if xp is not np:
        P *= P.dtype.type(keep)
        P += Ai @ Uj.T
        return
    from scipy.linalg import blas

    gemm = blas.get_blas_funcs("gemm", dtype=P.dtype)
    out = gemm(1.0, Uj, Ai, beta=keep, c=P.T, trans_b=1, overwrite_c=1)
    if not np.shares_memory(out, P):        # P was not contiguous: BLAS worked on a copy
        P[...] = out.T


def array_nomad_block(P, Gam, G, *, D=None, Xi=None, Xj=None, vi, vj, step, vv_scale, gamma, tau,
                      inv_n, update_gamma, write_g, weight, shifted=False, out_p=0.0, out_g=1.0):
    """:func:`nomad_block` in array expressions of P's own module (NumPy or CuPy): the
    device path of the variants that have no hand-written CUDA kernel (the shifted
    Lagrangian, the projected-step output).  Makes b x b temporaries; full statistics
    (an array of P's module)."""
    xp = array_module(P)
    t = P.dtype.type
    if step != 0.0:
        P *= t(1.0 - step)
        P += t(step * vv_scale) * xp.outer(vi, vj)
    if D is None:
        D = Xi @ Xj.T
    Q = P + t(inv_n)
    if update_gamma:
        xp.minimum(Gam + t(tau) * Q, 0, out=Gam)
    qneg = xp.minimum(Q, 0)
    stats = [xp.vdot(D.astype(np.float64), Q.astype(np.float64)) * weight, xp.asarray(0.0),
             xp.asarray(float(xp.count_nonzero(Q < 0))) * weight,
             xp.vdot(qneg.astype(np.float64), qneg.astype(np.float64)) * weight,
             Q.min().astype(np.float64), xp.vdot(Q.astype(np.float64), Q.astype(np.float64)) * weight]
    if write_g:
        g = (xp.minimum(Gam + t(gamma) * Q, 0) if shifted else Gam + t(gamma) * qneg) - D
        stats[SUM_GP] = xp.vdot(g.astype(np.float64), P.astype(np.float64)) * weight
        G[...] = t(out_p) * P + t(out_g) * g
    return xp.stack([xp.asarray(x, dtype=np.float64) for x in stats])


# Rows of a rank-k direction formed at a time (rows x b, in cache) by the line search.
LOWRANK_ROWS = 128


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _lowrank_line_search_rows(P, Gam, V, r0, shift, inv_n, per_octave, nbins, weight, out):
    # As _line_search_block, along Delta = V - P with V's rows given, for the entries
    # R = P + inv_n + shift Gam; out[-1] accumulates <P, V>.
    last = out.shape[0] - 1
    for rr in range(V.shape[0]):
        r = r0 + rr
        for c in range(P.shape[1]):
            p = P[r, c]
            vval = V[rr, c]
            out[last] += weight * p * vval
            _bin_entry(p + inv_n + shift * Gam[r, c], vval - p, weight, per_octave, nbins, out)


def lowrank_line_search_block(P, Gam, *, Ai, Uj, shift, inv_n, weight):
    """Binned sums of :func:`line_search_block` along Delta = Ai Uj^T - P, for the
    entries R = P + inv_n + shift Gam (shift = 1/gamma for the shifted Lagrangian, 0
    for eq. 13; Gam may be None then), plus <P, Ai Uj^T> as the last entry.  Reads P
    (and Gam) once; V's rows are formed LOWRANK_ROWS at a time by GEMM."""
    out_len = 2 + 4 * (LS_BINS + 1) + 1
    if Gam is None:
        Gam, shift = P, 0.0
    if is_device_array(P):
        return array_lowrank_line_search_block(P, Gam, Ai=Ai, Uj=Uj, shift=shift, inv_n=inv_n, weight=weight)
    dtype = P.dtype
    Ai = np.asarray(Ai, dtype=dtype)
    UjT = np.ascontiguousarray(np.asarray(Uj, dtype=dtype).T)
    out = np.zeros(out_len, np.float64)
    for r0 in range(0, P.shape[0], LOWRANK_ROWS):
        V = Ai[r0:r0 + LOWRANK_ROWS] @ UjT
        _lowrank_line_search_rows(P, Gam, V, r0, float(shift), float(inv_n), float(LS_BINS_PER_OCTAVE),
                                  LS_BINS, float(weight), out)
    return out


def array_lowrank_line_search_block(P, Gam, *, Ai, Uj, shift, inv_n, weight):
    """:func:`lowrank_line_search_block` in array expressions of P's module (NumPy or
    CuPy; the device path).  Same bins; makes b x b temporaries."""
    xp = array_module(P)
    m1 = LS_BINS + 1
    P64 = P.astype(np.float64)
    V = xp.asarray(Ai, dtype=np.float64) @ xp.asarray(Uj, dtype=np.float64).T
    q = P64 + inv_n + shift * Gam.astype(np.float64)
    dl = V - P64
    qe = q + dl
    a, b = weight * q * dl, weight * dl * dl
    both = (q < 0) & (qe < 0)
    cross = (q < 0) != (qe < 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = xp.where(cross, -q / xp.where(dl == 0, 1.0, dl), 1.0)
    k = xp.where(beta > 0, xp.minimum((-LS_BINS_PER_OCTAVE * xp.log2(xp.where(beta > 0, beta, 1.0))).astype(np.int64),
                                      LS_BINS), LS_BINS)
    k = xp.maximum(k, 0)
    dec = cross & (q < 0)
    rise = cross & (q >= 0)
    out = xp.zeros(2 + 4 * m1 + 1, np.float64)
    out[0] = a[both].sum()
    out[1] = b[both].sum()
    out[2:2 + m1] = xp.bincount(k[dec], weights=a[dec], minlength=m1)
    out[2 + m1:2 + 2 * m1] = xp.bincount(k[dec], weights=b[dec], minlength=m1)
    out[2 + 2 * m1:2 + 3 * m1] = xp.bincount(k[rise], weights=a[rise], minlength=m1)
    out[2 + 3 * m1:2 + 4 * m1] = xp.bincount(k[rise], weights=b[rise], minlength=m1)
    out[-1] = weight * xp.vdot(P64, V)
    return out


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _dot(a, x):
    acc = 0.0
    for c in range(a.shape[0]):
        acc += a[c] * x[c]
    return acc


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _dot_axpy(a, x, y, alpha):
    # a . x, and y += alpha a, in one sweep over a
    acc = 0.0
    for c in range(a.shape[0]):
        ac = a[c]
        acc += ac * x[c]
        y[c] += ac * alpha
    return acc


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _symv_block(A, ViT, VjT, YiT, YjT, mirror):
    # V and Y are transposed (k x b): for every right-hand side the innermost loop runs
    # along A's contiguous row, which stays in L1 across the k sweeps, and vectorizes.
    bi = A.shape[0]
    k = ViT.shape[0]
    for r in range(bi):
        arow = A[r]
        for m in range(k):
            if mirror:
                YiT[m, r] += _dot_axpy(arow, VjT[m], YjT[m], ViT[m, r])
            else:
                YiT[m, r] += _dot(arow, VjT[m])


def matmat_block(A, Vi, Vj, *, mirror):
    """Products of one block with slices of a tall V, reading the block once.

    Returns (Yi, Yj) with Yi = A @ Vj and, when ``mirror`` (an off-diagonal block of a
    symmetric layout), Yj = A.T @ Vi; otherwise Yj is None.  Accumulates in the
    block's dtype; V's columns are few (k small), so the block is the only large read.
    """
    dtype = A.dtype
    if Vi.shape[1] > 8:
        # Many right-hand sides: BLAS GEMM is compute-bound there, not bandwidth-bound.
        Vj = np.asarray(Vj, dtype=dtype)
        return A @ Vj, (A.T @ np.asarray(Vi, dtype=dtype) if mirror else None)
    ViT = np.ascontiguousarray(Vi.T, dtype=dtype)
    VjT = np.ascontiguousarray(Vj.T, dtype=dtype)
    k = ViT.shape[0]
    YiT = np.zeros((k, A.shape[0]), dtype)
    YjT = np.zeros((k, A.shape[1] if mirror else 0), dtype)
    _symv_block(A, ViT, VjT, YiT, YjT, mirror)
    return YiT.T, (YjT.T if mirror else None)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _block_stats(A, weight, out):
    s = 0.0
    s2 = 0.0
    amin = np.finfo(A.dtype).max
    amax = -amin
    for r in range(A.shape[0]):
        for c in range(A.shape[1]):
            a = A[r, c]
            s += a
            s2 += a * a
            amin = min(amin, a)
            amax = max(amax, a)
    out[0] = weight * s
    out[1] = weight * s2
    out[2] = amin
    out[3] = amax


def block_stats(A, weight):
    """(weighted sum, weighted sum of squares, min, max) of one block, one read."""
    if is_device_array(A):
        return device_block_stats(A, float(weight))
    out = np.empty(4, np.float64)
    _block_stats(A, float(weight), out)
    return out


def gram_block(Xi, Xj, dtype):
    """D's block X_i X_j^T from two row panels of the (prepared) data."""
    return np.asarray(Xi @ Xj.T, dtype=dtype)


def gaussian_block(Xi, Xj, bandwidth, dtype):
    """exp(-||x_r - x_c||^2 / bandwidth) for the rows of two panels."""
    sq = (Xi * Xi).sum(1)[:, None] + (Xj * Xj).sum(1)[None, :] - 2.0 * (Xi @ Xj.T)
    np.maximum(sq, 0.0, out=sq)
    sq *= -1.0 / bandwidth
    return np.exp(sq, out=sq).astype(dtype, copy=False)


# Line search along a Frank-Wolfe direction: breakpoints of [Q + alpha Delta]_- binned on
# a geometric grid alpha_m = 2^(-m / LS_BINS_PER_OCTAVE), m = 0..LS_BINS.
LS_BINS_PER_OCTAVE = 8
LS_BINS = 8 * 30


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _bin_entry(q, dl, weight, per_octave, nbins, out):
    # One entry's share of h(alpha) = <[Q + alpha Delta]_-, Delta>: q and dl are its Q and
    # Delta.  out: [A0, B0, A_dec[0..nbins], B_dec[...], A_rise[...], B_rise[...]]
    qe = q + dl                                 # Q + Delta: the entry at alpha = 1
    if q >= 0.0 and qe >= 0.0:
        return
    m1 = nbins + 1
    a = weight * q * dl
    b = weight * dl * dl
    if q < 0.0 and qe < 0.0:
        out[0] += a
        out[1] += b
        return
    beta = -q / dl
    k = nbins
    if beta > 0.0:
        k = min(int(-per_octave * np.log2(beta)), nbins)
    if q < 0.0:                                  # active for alpha < beta
        out[2 + k] += a
        out[2 + m1 + k] += b
    else:                                        # active for alpha > beta
        out[2 + 2 * m1 + k] += a
        out[2 + 3 * m1 + k] += b


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _line_search_block(P, vi, vj, vv_scale, inv_n, per_octave, nbins, weight, out):
    # out: the bins of _bin_entry
    for r in range(P.shape[0]):
        sv = vv_scale * vi[r]
        for c in range(P.shape[1]):
            p = P[r, c]
            q = p + inv_n
            dl = sv * vj[c] - p
            _bin_entry(q, dl, weight, per_octave, nbins, out)


def line_search_block(P, *, vi, vj, vv_scale, inv_n, weight):
    """Binned sums for the exact line search of NOMAD's augmented Lagrangian along
    Delta = vv_scale vi vj^T - P (see ``passes.line_search_pass``).  Reads P once."""
    if is_device_array(P):
        return device_line_search_block(P, vi=vi, vj=vj, vv_scale=vv_scale, inv_n=inv_n, weight=weight)
    dtype = P.dtype
    out = np.zeros(2 + 4 * (LS_BINS + 1), np.float64)
    _line_search_block(P, vi.astype(dtype, copy=False), vj.astype(dtype, copy=False),
                       float(vv_scale), float(inv_n), float(LS_BINS_PER_OCTAVE), LS_BINS,
                       float(weight), out)
    return out


# One-hot products A @ S (S_{jc} = 1 where labels_j = c), for Frank-Wolfe over products of
# simplices: the LMO's vertex is one-hot, so P S is a sum of P's columns by label.


# Rows per tile of the scattered-label kernel (16 measured fastest of 8, 16, 32).
LABEL_TILE = 16


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _label_sum_block(A, li, lj, k, YiT, YjT, mirror):
    # A S_j with unordered column labels.  A tile of LABEL_TILE rows is swept column by
    # column: each column's LABEL_TILE entries add into one row of a small (k, tile)
    # buffer that stays in L1, so the adds vectorize across the tile's rows.  (A scatter
    # of each row's entries by label measured 1.6x slower: every add is a dependent
    # load-store on a few slots.)  The tile's rows, still in cache, then feed A^T S_i.
    bi, bj = A.shape
    T = LABEL_TILE
    buf = np.zeros((k, T), np.float64)
    full = bi - bi % T
    for r0 in range(0, full, T):
        buf[:] = 0.0
        for c in range(bj):
            bb = buf[lj[c]]
            for t in range(T):
                bb[t] += A[r0 + t, c]
        for m in range(k):
            for t in range(T):
                YiT[m, r0 + t] = buf[m, t]
        if mirror:
            for t in range(T):
                _add_into(YjT[li[r0 + t]], A[r0 + t])
    for r in range(full, bi):
        arow = A[r]
        for m in range(k):
            YiT[m, r] = 0.0
        for c in range(bj):
            YiT[lj[c], r] += arow[c]
        if mirror:
            _add_into(YjT[li[r]], arow)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _sum(a):
    acc = 0.0
    for c in range(a.shape[0]):
        acc += a[c]
    return acc


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _label_sum_runs(A, li, run_bounds, run_labels, k, Yi, YjT, mirror):
    # Columns come in runs of equal labels (data ordered by cluster): each run's sum is
    # a contiguous reduction, which vectorizes like a matvec (written inline in the loop
    # over runs, it measured 10x slower: LLVM did not vectorize it there).
    bi, bj = A.shape
    for r in range(bi):
        arow = A[r]
        for m in range(k):
            Yi[r, m] = 0.0
        for q in range(run_labels.shape[0]):
            Yi[r, run_labels[q]] += _sum(arow[run_bounds[q]:run_bounds[q + 1]])
        if mirror:
            _add_into(YjT[li[r]], arow)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _add_into(y, a):
    for c in range(a.shape[0]):
        y[c] += a[c]


# Mean run length of equal column labels above which the run kernel is used.
LABEL_RUN_MIN = 16


def label_sum_block(A, li, lj, k, *, mirror):
    """Products of one block with one-hot slices: (A @ S_j, A.T @ S_i if ``mirror``).

    ``li`` and ``lj`` are the labels (0..k-1) of the block's rows and columns; S is the
    n x k one-hot matrix they define.  Reads the block once, no b x b temporary;
    accumulates in float64.  Returns (Yi (b_i x k), Yj (b_j x k) or None).
    """
    if is_device_array(A):
        return device_label_sum_block(A, li, lj, k, mirror=mirror)
    bi, bj = A.shape
    li = np.ascontiguousarray(li, dtype=np.int64)
    lj = np.ascontiguousarray(lj, dtype=np.int64)
    YjT = np.zeros((k, bj if mirror else 0), np.float64)
    changes = np.flatnonzero(lj[1:] != lj[:-1]) + 1
    if bj >= LABEL_RUN_MIN * (len(changes) + 1):
        bounds = np.concatenate([[0], changes, [bj]]).astype(np.int64)
        Yi = np.empty((bi, k), np.float64)
        _label_sum_runs(A, li, bounds, lj[bounds[:-1]], k, Yi, YjT, mirror)
    else:
        YiT = np.empty((k, bi), np.float64)
        _label_sum_block(A, li, lj, k, YiT, YjT, mirror)
        Yi = YiT.T
    return Yi, (YjT.T if mirror else None)


# ------------------------------------------------------------------ HOTTOPIXX
# Bittorf, Recht, Re, Tropp, "Factoring nonnegative matrices with linear programs"
# (NIPS 2012), Alg. 4 and 5.


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _hott_epoch_rows(C, rows, Xt, order, step, diag_step):
    # C: (b, f) rows ``rows`` of the localizing matrix; Xt: (n, f), Xt[k] = column k of X.
    # For each visited column k and each row i of the block: the subgradient step of
    # |X_ik - C_i X_k| and, when X_ik != 0, the diagonal term of the Lagrangian.
    b = C.shape[0]
    for q in range(order.shape[0]):
        xk = Xt[order[q]]
        for a in range(b):
            i = rows[a]
            ci = C[a]
            resid = xk[i] - _dot(ci, xk)
            if resid > 0.0:
                for j in range(xk.shape[0]):
                    ci[j] += step * xk[j]
            elif resid < 0.0:
                for j in range(xk.shape[0]):
                    ci[j] -= step * xk[j]
            if xk[i] != 0.0:
                ci[i] -= diag_step[a]


def hottopixx_epoch_block(C, rows, Xt, order, step, diag_step):
    """One epoch of HOTTOPIXX's incremental subgradient steps (Alg. 4, line 6) for the
    rows ``rows`` of C, in place, visiting the columns of X (rows of ``Xt``) in ``order``.

    Rows of C do not interact within an epoch, so any partition of the rows gives the
    same result.  Cost: b f per visited column (dense X).
    """
    _hott_epoch_rows(C, np.ascontiguousarray(rows, dtype=np.int64), Xt,
                     np.ascontiguousarray(order, dtype=np.int64), float(step),
                     np.ascontiguousarray(diag_step, dtype=np.float64))


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _hott_epoch_rows_sparse(C, rows, indptr, indices, data, order, step, diag_step, scratch):
    # X in compressed columns: column k's nonzeros are indices/data[indptr[k]:indptr[k+1]].
    # Work per visited column: b x nnz(X_k).  ``scratch`` (f zeros) holds the column densely
    # for the rows' own entries X_ik and is cleared after each column.
    b = C.shape[0]
    for q in range(order.shape[0]):
        k = order[q]
        lo, hi = indptr[k], indptr[k + 1]
        for t in range(lo, hi):
            scratch[indices[t]] = data[t]
        for a in range(b):
            i = rows[a]
            ci = C[a]
            acc = 0.0
            for t in range(lo, hi):
                acc += ci[indices[t]] * data[t]
            resid = scratch[i] - acc
            if resid != 0.0:
                s = step if resid > 0.0 else -step
                for t in range(lo, hi):
                    ci[indices[t]] += s * data[t]
            if scratch[i] != 0.0:
                ci[i] -= diag_step[a]
        for t in range(lo, hi):
            scratch[indices[t]] = 0.0


def hottopixx_epoch_block_sparse(C, rows, indptr, indices, data, order, step, diag_step):
    """:func:`hottopixx_epoch_block` for X given by compressed columns (CSC arrays of X,
    i.e. CSR of X^T); the same result as the dense kernel, in b nnz(X_k) per column."""
    scratch = np.zeros(C.shape[1], np.float64)
    _hott_epoch_rows_sparse(C, np.ascontiguousarray(rows, dtype=np.int64), indptr, indices, data,
                            np.ascontiguousarray(order, dtype=np.int64), float(step),
                            np.ascontiguousarray(diag_step, dtype=np.float64), scratch)


@numba.njit(nogil=True, cache=True)
def _squish_rows(Ct, out, lo, hi):
    # Row j of Ct is column j of C (contiguous, so each column is read with unit stride).
    f = Ct.shape[0]
    z = np.empty(f - 1, Ct.dtype)
    for j in range(lo, hi):
        # Column j: the diagonal entry plays x_1 of Alg. 5; the others are sorted descending.
        row = Ct[j]
        m = 0
        for i in range(f):
            if i != j:
                z[m] = row[i]
                m += 1
        srt = -np.sort(-z)
        mu = row[j]
        kc = f - 1                         # how many sorted entries join the diagonal's level
        for k in range(f - 1):
            level = min(max(mu, 0.0), 1.0)
            if srt[k] <= level:
                kc = k
                break
            mu = (mu * (k + 1) + srt[k]) / (k + 2)
        level = min(max(mu, 0.0), 1.0)
        cut = srt[kc - 1] if kc > 0 else np.inf   # entries >= cut were averaged in
        dst = out[j]
        dst[j] = level
        taken = 0
        for i in range(f):
            if i == j:
                continue
            v = row[i]
            # Ties at the cut: exactly kc entries take the level, the rest keep (v)_+.
            if v > cut or (v == cut and taken < kc and kc > 0):
                dst[i] = level
                taken += 1
            else:
                dst[i] = max(v, 0.0)


def squish_rows_block(Ct, out, lo, hi):
    """Alg. 5 on columns lo:hi of C, given C^T (``Ct``, C-contiguous); results into the
    same rows of ``out`` (the projection's transpose)."""
    _squish_rows(Ct, out, int(lo), int(hi))


def squish_columns(C):
    """Euclidean projection of C onto Phi_0 = {C >= 0, diag C <= 1, C_ij <= C_jj} by
    column squishing (Alg. 5 of Bittorf et al.), column by column, in this thread (the
    engine's ``blocks.squish_columns`` runs column blocks in parallel).  Returns a new
    array."""
    Ct = np.ascontiguousarray(np.asarray(C).T)
    out = np.empty_like(Ct)
    _squish_rows(Ct, out, 0, Ct.shape[0])
    return np.ascontiguousarray(out.T)


def clip_phi(C):
    """The cheaper projection when the factorization is assumed unique (Sec. 4): negative
    entries to 0 and diagonal entries above 1 to 1 (drops C_ij <= C_jj)."""
    out = np.maximum(C, 0.0)
    d = np.diagonal(out).copy()
    np.fill_diagonal(out, np.minimum(d, 1.0))
    return out


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH, inline="always")
def _clean_column(Z, rows, xk, hott, step):
    # One column's projected subgradient step of sum_k |X_ik - Z_i W_k| over Z_i >= 0 for
    # rows ``rows``, with W = X_hott: column k of W is xk[hott] (xk: X's column k, dense).
    b, r = Z.shape
    for a in range(b):
        zi = Z[a]
        acc = 0.0
        for j in range(r):
            acc += zi[j] * xk[hott[j]]
        resid = xk[rows[a]] - acc
        if resid != 0.0:
            s = step if resid > 0.0 else -step
            for j in range(r):
                zi[j] = max(zi[j] + s * xk[hott[j]], 0.0)


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _clean_rows(Z, rows, Xt, hott, order, step):
    for q in range(order.shape[0]):
        _clean_column(Z, rows, Xt[order[q]], hott, step)


def clean_rows_block(Z, rows, Xt, hott, order, step):
    """One cleaning epoch (projected incremental subgradient, in place) for rows ``rows``
    of F = argmin_{Z >= 0} ||X - Z X_hott||_{inf,1}, visiting the columns of X (rows of
    ``Xt``, n x f) in ``order``.  Cost: b r per column."""
    _clean_rows(Z, np.ascontiguousarray(rows, dtype=np.int64), Xt,
                np.ascontiguousarray(hott, dtype=np.int64),
                np.ascontiguousarray(order, dtype=np.int64), float(step))


@numba.njit(nogil=True, cache=True, fastmath=_FASTMATH)
def _clean_rows_sparse(Z, rows, indptr, indices, data, hott, order, step, scratch):
    # ``scratch`` (f zeros) holds column k densely while its step runs; cleared after.
    for q in range(order.shape[0]):
        k = order[q]
        lo, hi = indptr[k], indptr[k + 1]
        for t in range(lo, hi):
            scratch[indices[t]] = data[t]
        _clean_column(Z, rows, scratch, hott, step)
        for t in range(lo, hi):
            scratch[indices[t]] = 0.0


def clean_rows_block_sparse(Z, rows, indptr, indices, data, n_features, hott, order, step):
    """:func:`clean_rows_block` for X in compressed columns (CSR of X^T, f = n_features)."""
    _clean_rows_sparse(Z, np.ascontiguousarray(rows, dtype=np.int64), indptr, indices, data,
                       np.ascontiguousarray(hott, dtype=np.int64),
                       np.ascontiguousarray(order, dtype=np.int64), float(step),
                       np.zeros(int(n_features), np.float64))


# ------------------------------------------------------------------ CUDA (CuPy blocks)
# y += A v for one float32 block: each warp streams RPW rows with 16-byte loads, so the
# block is read once at close to the copy bandwidth (a matmat pass at 87% of an H100's
# copy bandwidth, against 76% with cuBLAS per block; graphs/gpu_matmat.py).
_ROW_DOT_CUDA = r"""
extern "C" __global__ void row_dot_acc(const float* __restrict__ A, const float* __restrict__ v,
                                       float* __restrict__ y, const int nr, const int nc) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * RPW;
    float acc[RPW];
    #pragma unroll
    for (int r = 0; r < RPW; ++r) acc[r] = 0.f;
    const float4* v4 = reinterpret_cast<const float4*>(v);
    for (int q = lane; q < nc / 4; q += 32) {
        const float4 b = __ldg(v4 + q);
        #pragma unroll
        for (int r = 0; r < RPW; ++r) {
            const int row = min(row0 + r, nr - 1);     // rows past the end are read, never written
            const float4 a = __ldg(reinterpret_cast<const float4*>(A + (size_t)row * nc) + q);
            acc[r] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
    }
    #pragma unroll
    for (int r = 0; r < RPW; ++r) {
        float s = acc[r];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
        if (lane == 0 && row0 + r < nr) y[row0 + r] += s;
    }
}
"""
ROW_DOT_ROWS_PER_WARP = 2
ROW_DOT_WARPS = 16


@functools.lru_cache(maxsize=1)
def _row_dot_kernel():
    from .device import cupy

    return cupy().RawKernel(_ROW_DOT_CUDA, "row_dot_acc", options=(f"-DRPW={ROW_DOT_ROWS_PER_WARP}",))


def device_matvec_fits(A, v):
    """Whether :func:`device_matvec_accumulate` takes this block: float32, C-contiguous,
    a column count divisible by 4 (16-byte row loads)."""
    return (A.dtype == np.float32 and v.dtype == np.float32 and A.flags.c_contiguous
            and v.flags.c_contiguous and A.shape[1] % 4 == 0)


def device_matvec_accumulate(A, v, y):
    """y += A @ v for a float32 CuPy block A (r x c) and CuPy vectors v (c,), y (r,)."""
    rows = ROW_DOT_ROWS_PER_WARP * ROW_DOT_WARPS
    _row_dot_kernel()(((A.shape[0] + rows - 1) // rows,), (32 * ROW_DOT_WARPS,),
                      (A, v, y, np.int32(A.shape[0]), np.int32(A.shape[1])))


# NOMAD's fused pass on one CuPy block (the same update and statistics as ``nomad_block``).
# One thread block per row (grid-stride over rows), threads along the row: coalesced
# reads of P, Gamma and D.  Statistics are summed in double per thread, reduced per
# thread block, and the per-block partials reduced on the device by the caller.  The
# flags are compile-time: each combination is its own kernel, with no branch per entry.
_NOMAD_CUDA = r"""
#define NSTAT 6
__device__ __forceinline__ double warp_sum(double s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
    return s;
}
__device__ __forceinline__ double warp_min(double s) {
    for (int o = 16; o > 0; o >>= 1) s = fmin(s, __shfl_down_sync(0xffffffff, s, o));
    return s;
}
extern "C" __global__ void nomad_fused(real_t* __restrict__ P, real_t* __restrict__ Gam, real_t* __restrict__ G,
        const real_t* __restrict__ D, const real_t* __restrict__ Xi, const real_t* __restrict__ Xj, const int d,
        const real_t* __restrict__ vi, const real_t* __restrict__ vj, const int nr, const int nc,
        const real_t keep, const real_t step_scale, const real_t gamma, const real_t tau, const real_t inv_n,
        double* __restrict__ partial) {
    double s_dq = 0, s_gp = 0, n_neg = 0, s_neg = 0, s_q2 = 0, q_min = 1e300;
    for (int r = blockIdx.x; r < nr; r += gridDim.x) {
        const real_t av = step_scale * vi[r];
        const size_t base = (size_t)r * nc;
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const real_t p = keep * P[base + c] + av * vj[c];
            P[base + c] = p;
            const real_t q = p + inv_n;
            const real_t qneg = q < (real_t)0 ? q : (real_t)0;
#if D_FROM_X
            real_t dval = 0;
            for (int k = 0; k < d; ++k) dval += Xi[(size_t)r * d + k] * Xj[(size_t)c * d + k];
#else
            const real_t dval = D[base + c];
#endif
#if UPDATE_GAMMA
            real_t gam = Gam[base + c] + tau * q;
            gam = gam < (real_t)0 ? gam : (real_t)0;
            Gam[base + c] = gam;
#else
            const real_t gam = Gam[base + c];
#endif
#if WRITE_G
            const real_t g = gam + gamma * qneg - dval;
            G[base + c] = g;
            s_gp += (double)g * (double)p;
#endif
#if FULL_STATS
            s_dq += (double)dval * (double)q;
            s_q2 += (double)q * (double)q;
            n_neg += q < (real_t)0 ? 1.0 : 0.0;
            s_neg += (double)qneg * (double)qneg;
            q_min = fmin(q_min, (double)q);
#endif
        }
    }
    __shared__ double red[NSTAT][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    double vals[NSTAT] = {s_dq, s_gp, n_neg, s_neg, q_min, s_q2};
    #pragma unroll
    for (int s = 0; s < NSTAT; ++s) {
        const double w = s == 4 ? warp_min(vals[s]) : warp_sum(vals[s]);
        if (lane == 0) red[s][warp] = w;
    }
    __syncthreads();
    if (warp == 0) {
        #pragma unroll
        for (int s = 0; s < NSTAT; ++s) {
            double w = lane < nwarps ? red[s][lane] : (s == 4 ? 1e300 : 0.0);
            w = s == 4 ? warp_min(w) : warp_sum(w);
            if (lane == 0) partial[(size_t)blockIdx.x * NSTAT + s] = w;
        }
    }
}
"""
# 256 threads per row; up to 4096 thread blocks, each taking every 4096-th row.
DEVICE_PASS_THREADS = 256
DEVICE_PASS_MAX_GRID = 4096

_CUDA_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


@functools.lru_cache(maxsize=64)
def _nomad_kernel(dtype, d_from_x, update_gamma, write_g, full_stats):
    from .device import cupy

    options = (f"-Dreal_t={_CUDA_TYPES[np.dtype(dtype)]}", f"-DD_FROM_X={int(d_from_x)}",
               f"-DUPDATE_GAMMA={int(update_gamma)}", f"-DWRITE_G={int(write_g)}",
               f"-DFULL_STATS={int(full_stats)}")
    return cupy().RawKernel(_NOMAD_CUDA, "nomad_fused", options=options)


def device_nomad_block(P, Gam, G, *, D=None, Xi=None, Xj=None, vi, vj, step, vv_scale, gamma, tau,
                       inv_n, update_gamma, write_g, weight, full_stats=True):
    """:func:`nomad_block` for CuPy blocks, in place, on the GPU.  Returns the statistics as
    a CuPy float64 vector (``NOMAD_STATS``; NaN where the gap-only pass skips them), so a
    pass gathers them once.  D's block is ``D``, else formed from the panels: inline for
    up to INLINE_GRAM_MAX_FEATURES features, else by one cuBLAS GEMM into a b x b buffer."""
    from .device import cupy

    cp = cupy()
    dtype = P.dtype
    d_from_x = D is None and Xi.shape[1] <= INLINE_GRAM_MAX_FEATURES
    if D is None and not d_from_x:
        D = cp.matmul(Xi, Xj.T)
    gap_only = write_g and not update_gamma and not full_stats
    full = not gap_only
    nr, nc = P.shape
    grid = min(nr, DEVICE_PASS_MAX_GRID)
    partial = cp.empty((grid, N_NOMAD_STATS), np.float64)
    null = P[:0]
    t = dtype.type
    _nomad_kernel(dtype, d_from_x, bool(update_gamma), bool(write_g), full)(
        (grid,), (DEVICE_PASS_THREADS,),
        (P, Gam, G if write_g else null, null if d_from_x else D,
         Xi if d_from_x else null, Xj if d_from_x else null, np.int32(Xi.shape[1] if d_from_x else 0),
         vi, vj, np.int32(nr), np.int32(nc), t(1.0 - step), t(step * vv_scale), t(gamma), t(tau),
         t(inv_n), partial))
    sums = partial.sum(axis=0) * weight
    if gap_only:
        out = cp.full(N_NOMAD_STATS, np.nan)
        out[SUM_GP] = sums[SUM_GP]
        return out
    sums[MIN_Q] = partial[:, MIN_Q].min()
    return sums


# The line search's binned sums (``line_search_block``) on a CuPy block: each thread
# block bins into a shared-memory histogram, then adds it to the output once.
_LINE_SEARCH_CUDA = r"""
extern "C" __global__ void nomad_line_search(const real_t* __restrict__ P, const real_t* __restrict__ vi,
        const real_t* __restrict__ vj, const int nr, const int nc, const double vv_scale,
        const double inv_n, const double per_octave, const int nbins, const double weight,
        double* __restrict__ out) {
    extern __shared__ double hist[];
    const int m1 = nbins + 1, nh = 2 + 4 * m1;
    for (int i = threadIdx.x; i < nh; i += blockDim.x) hist[i] = 0.0;
    __syncthreads();
    for (int r = blockIdx.x; r < nr; r += gridDim.x) {
        const double sv = vv_scale * (double)vi[r];
        const size_t base = (size_t)r * nc;
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const double p = (double)P[base + c];
            const double q = p + inv_n;
            const double dl = sv * (double)vj[c] - p;
            const double qe = q + dl;
            if (q >= 0.0 && qe >= 0.0) continue;
            const double a = weight * q * dl, b = weight * dl * dl;
            if (q < 0.0 && qe < 0.0) {
                atomicAdd(&hist[0], a);
                atomicAdd(&hist[1], b);
                continue;
            }
            const double beta = -q / dl;
            int k = nbins;
            if (beta > 0.0) k = min((int)(-per_octave * log2(beta)), nbins);
            const int off = q < 0.0 ? 2 : 2 + 2 * m1;
            atomicAdd(&hist[off + k], a);
            atomicAdd(&hist[off + m1 + k], b);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh; i += blockDim.x)
        if (hist[i] != 0.0) atomicAdd(&out[i], hist[i]);
}
"""


@functools.lru_cache(maxsize=4)
def _line_search_kernel(dtype):
    from .device import cupy

    return cupy().RawKernel(_LINE_SEARCH_CUDA, "nomad_line_search",
                            options=(f"-Dreal_t={_CUDA_TYPES[np.dtype(dtype)]}",))


def device_line_search_block(P, *, vi, vj, vv_scale, inv_n, weight):
    """:func:`line_search_block` for a CuPy block (a CuPy float64 result)."""
    from .device import cupy

    cp = cupy()
    nh = 2 + 4 * (LS_BINS + 1)
    out = cp.zeros(nh, np.float64)
    grid = min(P.shape[0], 1024)
    _line_search_kernel(P.dtype)((grid,), (DEVICE_PASS_THREADS,),
                                 (P, vi, vj, np.int32(P.shape[0]), np.int32(P.shape[1]), float(vv_scale),
                                  float(inv_n), float(LS_BINS_PER_OCTAVE), np.int32(LS_BINS),
                                  float(weight), out), shared_mem=8 * nh)
    return out


@functools.lru_cache(maxsize=1)
def _sumsq_kernel():
    from .device import cupy

    return cupy().ReductionKernel("T x", "float64 y", "(double)x * (double)x", "a + b", "y = a", "0",
                                  "dnomad_sumsq")


def device_block_stats(A, weight):
    """:func:`block_stats` for a CuPy block: a CuPy float64 vector (sum, sum of squares,
    min, max), the sums weighted."""
    from .device import cupy

    cp = cupy()
    return cp.stack([A.sum(dtype=np.float64) * weight, _sumsq_kernel()(A) * weight,
                     A.min().astype(np.float64), A.max().astype(np.float64)])


def device_label_sum_block(A, li, lj, k, *, mirror):
    """:func:`label_sum_block` for a CuPy block: one GEMM with the one-hot slice, in
    float64 (the host kernel's accumulation), so a float32 block is widened first."""
    from .device import cupy

    cp = cupy()
    A64 = A.astype(np.float64, copy=False)
    Sj = cp.eye(k, dtype=np.float64)[cp.asarray(lj)]
    Yj = A64.T @ cp.eye(k, dtype=np.float64)[cp.asarray(li)] if mirror else None
    return A64 @ Sj, Yj
