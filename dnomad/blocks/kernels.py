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

from .device import is_device_array


# Above this many features, D's block is formed by one GEMM instead of inline dots.
INLINE_GRAM_MAX_FEATURES = 8

# Full fast-math: reductions (sums, min) vectorize.  Inputs are checked finite before
# any pass, and no kernel starts a reduction at inf (min starts at the dtype's max).
_FASTMATH = True


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


# 256 threads per row; up to 4096 thread blocks, each taking every 4096-th row.
DEVICE_PASS_THREADS = 256
DEVICE_PASS_MAX_GRID = 4096

_CUDA_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


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
