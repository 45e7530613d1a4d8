"""NOMAD's per-block kernels (Tepper et al., Alg. 2): the fused update of P, Gamma and the
gradient with the statistics of Q, the rank-k update, and the exact line search along a
Frank-Wolfe direction, for NumPy blocks (numba loops that stream each block once) and
CuPy blocks (CUDA kernels; CuPy comes from :mod:`dnomad.blocks.device`, lazily).
Module-level pure functions of (block, ...): the engine's passes call them where the
blocks live."""
from __future__ import annotations

import functools

import numba
import numpy as np

from ..blocks.device import array_module, is_device_array
from ..blocks.kernels import (CUDA_TYPES, DEVICE_PASS_MAX_GRID, DEVICE_PASS_THREADS, FASTMATH,
                              INLINE_GRAM_MAX_FEATURES)
from ..errors import InputValueError


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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _nomad_block(P, Gam, G, Dblk, Xi, XjT, vi, vj, Vblk, step, vv_scale, gamma, tau, inv_n,
                 use_x, use_v, update_gamma, write_g, full_stats, shift, out_p, out_g, weight, out):
    # use_v: the step's direction is the stored block Vblk (P <- keep P + step V), its row r
    # taking the place of the vertex step's av vj (Vblk may be G: each entry is read before
    # it is written).
    bi, bj = P.shape
    d = Xi.shape[1]
    keep = 1.0 - step
    acc = np.zeros(N_NOMAD_STATS, np.float64)
    acc[4] = np.finfo(P.dtype).max
    drow = np.empty(bj, P.dtype)
    gap_only = write_g and not update_gamma and not full_stats
    for r in range(bi):
        av = step if use_v else step * vv_scale * vi[r]
        vrow = Vblk[r] if use_v else vj
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
            acc[1] += _nomad_row_gap(P[r], Gam[r], Grow, drow, vrow, av, keep, gamma, inv_n, shift, out_p, out_g)
        elif update_gamma:
            if write_g:
                _nomad_row(P[r], Gam[r], Grow, drow, vrow, av, keep, gamma, tau, inv_n, True, True, shift, out_p, out_g, acc)
            else:
                _nomad_row(P[r], Gam[r], Grow, drow, vrow, av, keep, gamma, tau, inv_n, True, False, shift, out_p, out_g, acc)
        elif write_g:
            _nomad_row(P[r], Gam[r], Grow, drow, vrow, av, keep, gamma, tau, inv_n, False, True, shift, out_p, out_g, acc)
        else:
            _nomad_row(P[r], Gam[r], Grow, drow, vrow, av, keep, gamma, tau, inv_n, False, False, shift, out_p, out_g, acc)
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
                out_p=0.0, out_g=1.0, lowrank=None, direction=None):
    """One block of NOMAD's fused pass, in place.

    P <- (1 - step) P + step * vv_scale * vi vj^T  (or, with ``lowrank`` = (Ai, Uj),
    P <- (1 - step) P + Ai Uj^T: a rank-k step, Ai already scaled by the step; or, with
    ``direction`` = V, the direction's block as the line search stored it,
    P <- (1 - step) P + step V, read in the same pass: ``direction`` may be G itself);
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
    if lowrank is not None and direction is not None:
        raise InputValueError("nomad_block takes the rank-k step as lowrank = (Ai, Uj) or as its stored "
                              "direction, not both")
    if lowrank is not None:
        lowrank_update_block(P, lowrank[0], lowrank[1], 1.0 - step)
        step = 0.0
    if is_device_array(P):
        return device_nomad_block(P, Gam, G, D=D, Xi=Xi, Xj=Xj, vi=vi, vj=vj, step=step, vv_scale=vv_scale,
                                  gamma=gamma, tau=tau, inv_n=inv_n, update_gamma=update_gamma,
                                  write_g=write_g, weight=weight, full_stats=full_stats, shifted=shifted,
                                  out_p=out_p, out_g=out_g, direction=direction)
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
    use_v = direction is not None
    _nomad_block(P, Gam, G, D, Xi, XjT, vi.astype(dtype, copy=False),
                 np.ascontiguousarray(vj, dtype=dtype), np.ascontiguousarray(direction, dtype=dtype) if use_v else empty,
                 dtype.type(step), dtype.type(vv_scale), dtype.type(gamma), dtype.type(tau),
                 dtype.type(inv_n), use_x, use_v, update_gamma, write_g, full_stats,
                 dtype.type(1.0 if shifted else 0.0),
                 dtype.type(out_p), dtype.type(out_g), float(weight), out)
    if write_g and not update_gamma and not full_stats:
        gp = out[SUM_GP]
        out[:] = np.nan
        out[SUM_GP] = gp
    return out


def lowrank_update_block(P, Ai, Uj, keep):
    """P <- keep P + Ai Uj^T in place (Ai: rows x k, Uj: cols x k), one GEMM that BLAS
    (cuBLAS for a CuPy block) writes into P's memory: no b x b temporary, one read and
    one write of P."""
    xp = array_module(P)
    Ai = xp.ascontiguousarray(xp.asarray(Ai, dtype=P.dtype))
    Uj = xp.ascontiguousarray(xp.asarray(Uj, dtype=P.dtype))
    if xp is not np:
        if P.flags.c_contiguous or P.flags.f_contiguous:
            from ..blocks.device import cupy

            cupy().cublas.gemm("N", "T", Ai, Uj, out=P, alpha=1.0, beta=float(keep))
        else:
            P *= P.dtype.type(keep)
            P += Ai @ Uj.T
        return
    from scipy.linalg import blas

    gemm = blas.get_blas_funcs("gemm", dtype=P.dtype)
    out = gemm(1.0, Uj, Ai, beta=keep, c=P.T, trans_b=1, overwrite_c=1)
    if not np.shares_memory(out, P):        # P was not contiguous: BLAS worked on a copy
        P[...] = out.T


# Rows of a rank-k direction formed at a time (rows x b, in cache) by the line search.
LOWRANK_ROWS = 128


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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


def lowrank_line_search_block(P, Gam, *, Ai, Uj, shift, inv_n, weight, store=None):
    """Binned sums of :func:`line_search_block` along Delta = Ai Uj^T - P, for the
    entries R = P + inv_n + shift Gam (shift = 1/gamma for the shifted Lagrangian, 0
    for eq. 13; Gam may be None then), plus <P, Ai Uj^T> as the last entry.  Reads P
    (and Gam) once; V's rows are formed LOWRANK_ROWS at a time by GEMM, into ``store``
    (a block of P's shape and dtype) when given, so a later pass can read V instead of
    forming it again."""
    out_len = 2 + 4 * (LS_BINS + 1) + 1
    if Gam is None:
        Gam, shift = P, 0.0
    if is_device_array(P):
        return device_lowrank_line_search_block(P, Gam, Ai=Ai, Uj=Uj, shift=shift, inv_n=inv_n, weight=weight,
                                                store=store)
    dtype = P.dtype
    Ai = np.asarray(Ai, dtype=dtype)
    UjT = np.ascontiguousarray(np.asarray(Uj, dtype=dtype).T)
    out = np.zeros(out_len, np.float64)
    for r0 in range(0, P.shape[0], LOWRANK_ROWS):
        if store is None:
            V = Ai[r0:r0 + LOWRANK_ROWS] @ UjT
        else:
            V = np.matmul(Ai[r0:r0 + LOWRANK_ROWS], UjT, out=store[r0:r0 + LOWRANK_ROWS])
        _lowrank_line_search_rows(P, Gam, V, r0, float(shift), float(inv_n), float(LS_BINS_PER_OCTAVE),
                                  LS_BINS, float(weight), out)
    return out


# Line search along a Frank-Wolfe direction: breakpoints of [Q + alpha Delta]_- binned on
# a geometric grid alpha_m = 2^(-m / LS_BINS_PER_OCTAVE), m = 0..LS_BINS.
LS_BINS_PER_OCTAVE = 8
LS_BINS = 8 * 30


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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
// V_ROWS: the step's direction is a stored block V (P <- keep P + v_step V), which may be G
// itself (each entry is read before it is written, by the same thread): G and V are then
// not restrict-qualified.
#if V_ROWS
#define G_RESTRICT
#else
#define G_RESTRICT __restrict__
#endif
extern "C" __global__ void nomad_fused(real_t* __restrict__ P, real_t* __restrict__ Gam, real_t* G_RESTRICT G,
        const real_t* __restrict__ D, const real_t* __restrict__ Xi, const real_t* __restrict__ Xj, const int d,
        const real_t* __restrict__ vi, const real_t* __restrict__ vj, const int nr, const int nc,
        const real_t keep, const real_t step_scale, const real_t gamma, const real_t tau, const real_t inv_n,
        const real_t shift, const real_t out_p, const real_t out_g, const real_t* G_RESTRICT V,
        const real_t v_step, double* __restrict__ partial) {
    double s_dq = 0, s_gp = 0, n_neg = 0, s_neg = 0, s_q2 = 0, q_min = 1e300;
    for (int r = blockIdx.x; r < nr; r += gridDim.x) {
        const real_t av = step_scale * vi[r];
        const size_t base = (size_t)r * nc;
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
#if V_ROWS
            const real_t p = keep * P[base + c] + v_step * V[base + c];
#else
            const real_t p = keep * P[base + c] + av * vj[c];
#endif
            P[base + c] = p;
            const real_t q = p + inv_n;
#if FULL_STATS
            const real_t qneg = q < (real_t)0 ? q : (real_t)0;
#endif
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
            // shift = 0: eq. 13's gam + gamma [q]_-; shift = 1: [gam + gamma q]_-
            const real_t sg = shift * gam + gamma * q;
            const real_t g = (sg < (real_t)0 ? sg : (real_t)0) + ((real_t)1 - shift) * gam - dval;
            G[base + c] = out_p * p + out_g * g;
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


@functools.lru_cache(maxsize=64)
def _nomad_kernel(dtype, d_from_x, update_gamma, write_g, full_stats, v_rows=False):
    from ..blocks.device import cupy

    options = (f"-Dreal_t={CUDA_TYPES[np.dtype(dtype)]}", f"-DD_FROM_X={int(d_from_x)}",
               f"-DUPDATE_GAMMA={int(update_gamma)}", f"-DWRITE_G={int(write_g)}",
               f"-DFULL_STATS={int(full_stats)}", f"-DV_ROWS={int(v_rows)}")
    return cupy().RawKernel(_NOMAD_CUDA, "nomad_fused", options=options)


def device_nomad_block(P, Gam, G, *, D=None, Xi=None, Xj=None, vi, vj, step, vv_scale, gamma, tau,
                       inv_n, update_gamma, write_g, weight, full_stats=True, shifted=False, out_p=0.0,
                       out_g=1.0, direction=None):
    """:func:`nomad_block` for CuPy blocks, in place, on the GPU.  Returns the statistics as
    a CuPy float64 vector (``NOMAD_STATS``; NaN where the gap-only pass skips them), so a
    pass gathers them once.  D's block is ``D``, else formed from the panels: inline for
    up to INLINE_GRAM_MAX_FEATURES features, else by one cuBLAS GEMM into a b x b buffer."""
    from ..blocks.device import cupy

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
    v_rows = direction is not None
    _nomad_kernel(dtype, d_from_x, bool(update_gamma), bool(write_g), full, v_rows)(
        (grid,), (DEVICE_PASS_THREADS,),
        (P, Gam, G if write_g else null, null if d_from_x else D,
         Xi if d_from_x else null, Xj if d_from_x else null, np.int32(Xi.shape[1] if d_from_x else 0),
         vi, vj, np.int32(nr), np.int32(nc), t(1.0 - step), t(step * vv_scale), t(gamma), t(tau),
         t(inv_n), t(1.0 if shifted else 0.0), t(out_p), t(out_g), direction if v_rows else null,
         t(step), partial))
    sums = partial.sum(axis=0) * weight
    if gap_only:
        out = cp.full(N_NOMAD_STATS, np.nan)
        out[SUM_GP] = sums[SUM_GP]
        return out
    sums[MIN_Q] = partial[:, MIN_Q].min()
    return sums


# The line searches' binned sums (``line_search_block``, ``lowrank_line_search_block``) on a
# CuPy block: each thread block bins into a shared-memory histogram (in double), then adds
# it to the output once.  The rank-k direction's rows come formed by cuBLAS, a slab at a time.
_LINE_SEARCH_CUDA = r"""
__device__ __forceinline__ void bin_entry(double* hist, const double q, const double dl, const double weight,
                                          const double per_octave, const int nbins) {
    const double qe = q + dl;
    if (q >= 0.0 && qe >= 0.0) return;
    const int m1 = nbins + 1;
    const double a = weight * q * dl, b = weight * dl * dl;
    if (q < 0.0 && qe < 0.0) {
        atomicAdd(&hist[0], a);
        atomicAdd(&hist[1], b);
        return;
    }
    const double beta = -q / dl;
    int k = nbins;
    if (beta > 0.0) k = min((int)(-per_octave * log2(beta)), nbins);
    const int off = q < 0.0 ? 2 : 2 + 2 * m1;
    atomicAdd(&hist[off + k], a);
    atomicAdd(&hist[off + m1 + k], b);
}
__device__ __forceinline__ void zero_hist(double* hist, const int nh) {
    for (int i = threadIdx.x; i < nh; i += blockDim.x) hist[i] = 0.0;
    __syncthreads();
}
__device__ __forceinline__ void flush_hist(const double* hist, const int nh, double* out) {
    __syncthreads();
    for (int i = threadIdx.x; i < nh; i += blockDim.x)
        if (hist[i] != 0.0) atomicAdd(&out[i], hist[i]);
}
extern "C" __global__ void nomad_line_search(const real_t* __restrict__ P, const real_t* __restrict__ vi,
        const real_t* __restrict__ vj, const int nr, const int nc, const double vv_scale,
        const double inv_n, const double per_octave, const int nbins, const double weight,
        double* __restrict__ out) {
    extern __shared__ double hist[];
    const int nh = 2 + 4 * (nbins + 1);
    zero_hist(hist, nh);
    for (int r = blockIdx.x; r < nr; r += gridDim.x) {
        const double sv = vv_scale * (double)vi[r];
        const size_t base = (size_t)r * nc;
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const double p = (double)P[base + c];
            bin_entry(hist, p + inv_n, sv * (double)vj[c] - p, weight, per_octave, nbins);
        }
    }
    flush_hist(hist, nh, out);
}
// Rows r0 .. r0 + nv of the block against V = the direction's rows there (nv x nc, C order):
// entries R = P + inv_n + shift Gam, Delta = V - P; out[nh] accumulates <P, V>.
extern "C" __global__ void nomad_lowrank_line_search(const real_t* __restrict__ P,
        const real_t* __restrict__ Gam, const real_t* __restrict__ V, const int r0, const int nv, const int nc,
        const double shift, const double inv_n, const double per_octave, const int nbins, const double weight,
        double* __restrict__ out) {
    extern __shared__ double hist[];
    const int nh = 2 + 4 * (nbins + 1);
    zero_hist(hist, nh + 1);
    double pv = 0.0;
    for (int rr = blockIdx.x; rr < nv; rr += gridDim.x) {
        const size_t base = (size_t)(r0 + rr) * nc, vbase = (size_t)rr * nc;
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            const double p = (double)P[base + c], v = (double)V[vbase + c];
            pv += p * v;
            bin_entry(hist, p + inv_n + shift * (double)Gam[base + c], v - p, weight, per_octave, nbins);
        }
    }
    atomicAdd(&hist[nh], weight * pv);
    flush_hist(hist, nh + 1, out);
}
"""


@functools.lru_cache(maxsize=8)
def _line_search_kernel(dtype, name="nomad_line_search"):
    from ..blocks.device import cupy

    return cupy().RawKernel(_LINE_SEARCH_CUDA, name, options=(f"-Dreal_t={CUDA_TYPES[np.dtype(dtype)]}",))


def device_line_search_block(P, *, vi, vj, vv_scale, inv_n, weight):
    """:func:`line_search_block` for a CuPy block (a CuPy float64 result)."""
    from ..blocks.device import cupy

    cp = cupy()
    nh = 2 + 4 * (LS_BINS + 1)
    out = cp.zeros(nh, np.float64)
    grid = min(P.shape[0], 1024)
    _line_search_kernel(P.dtype)((grid,), (DEVICE_PASS_THREADS,),
                                 (P, vi, vj, np.int32(P.shape[0]), np.int32(P.shape[1]), float(vv_scale),
                                  float(inv_n), float(LS_BINS_PER_OCTAVE), np.int32(LS_BINS),
                                  float(weight), out), shared_mem=8 * nh)
    return out


# Entries of the rank-k direction a GPU forms at a time for its line search (float32: 512 MiB).
DEVICE_LOWRANK_SLAB = 1 << 27


def device_lowrank_line_search_block(P, Gam, *, Ai, Uj, shift, inv_n, weight, store=None):
    """:func:`lowrank_line_search_block` for a CuPy block (a CuPy float64 result): the
    direction's rows formed by cuBLAS in slabs of about DEVICE_LOWRANK_SLAB entries in P's
    dtype (as the host forms them), each binned by one kernel launch that reads P (and Gam)
    once; with ``store``, formed by one GEMM into it and binned from there."""
    from ..blocks.device import cupy

    cp = cupy()
    nr, nc = P.shape
    nh = 2 + 4 * (LS_BINS + 1)
    out = cp.zeros(nh + 1, np.float64)
    Ai = cp.ascontiguousarray(cp.asarray(Ai, dtype=P.dtype))
    UjT = cp.ascontiguousarray(cp.asarray(Uj, dtype=P.dtype).T)
    rows = max(1, min(nr, DEVICE_LOWRANK_SLAB // max(nc, 1)))
    if store is not None:
        if store.flags.c_contiguous:
            cp.cublas.gemm("N", "N", Ai, UjT, out=store)
        else:
            store[...] = Ai @ UjT
        rows = nr
    kernel = _line_search_kernel(P.dtype, "nomad_lowrank_line_search")
    for r0 in range(0, nr, rows):
        V = store if store is not None else Ai[r0:r0 + rows] @ UjT
        nv = V.shape[0]
        kernel((min(nv, 1024),), (DEVICE_PASS_THREADS,),
               (P, Gam, V, np.int32(r0), np.int32(nv), np.int32(nc), float(shift), float(inv_n),
                float(LS_BINS_PER_OCTAVE), np.int32(LS_BINS), float(weight), out), shared_mem=8 * (nh + 1))
    return out
