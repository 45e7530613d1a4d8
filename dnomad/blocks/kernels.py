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
FASTMATH = True


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def dot(a, x):
    acc = 0.0
    for c in range(a.shape[0]):
        acc += a[c] * x[c]
    return acc


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _dot_axpy(a, x, y, alpha):
    # a . x, and y += alpha a, in one sweep over a
    acc = 0.0
    for c in range(a.shape[0]):
        ac = a[c]
        acc += ac * x[c]
        y[c] += ac * alpha
    return acc


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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
                YiT[m, r] += dot(arow, VjT[m])


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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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


def squared_distances(A, B, a2=None, b2=None):
    """||a_r - b_c||^2 for the rows of two panels (NumPy or CuPy), as ||a||^2 + ||b||^2
    - 2 a.b clipped at 0 (round-off), in A B^T's dtype; ``a2``, ``b2``: the rows'
    squared norms, if known."""
    a2 = (A * A).sum(1) if a2 is None else a2
    b2 = (B * B).sum(1) if b2 is None else b2
    sq = A @ B.T                    # then in place: one rows x columns array, not four
    sq *= -2.0
    sq += a2[:, None]
    sq += b2[None, :]
    return sq.clip(0.0, None, out=sq)


def gaussian_block(Xi, Xj, bandwidth, dtype):
    """exp(-||x_r - x_c||^2 / bandwidth) for the rows of two panels; ``bandwidth`` a
    number or a (rows x columns) array (local scaling: s_r s_c)."""
    sq = squared_distances(Xi, Xj)
    sq /= -bandwidth
    return np.exp(sq, out=sq).astype(dtype, copy=False)


# One-hot products A @ S (S_{jc} = 1 where labels_j = c), for Frank-Wolfe over products of
# simplices: the LMO's vertex is one-hot, so P S is a sum of P's columns by label.


# Rows per tile of the scattered-label kernel (16 measured fastest of 8, 16, 32).
LABEL_TILE = 16


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
def _sum(a):
    acc = 0.0
    for c in range(a.shape[0]):
        acc += a[c]
    return acc


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
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

CUDA_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


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
