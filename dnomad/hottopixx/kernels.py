"""HOTTOPIXX's per-block kernels (Bittorf, Recht, Re, Tropp, "Factoring nonnegative
matrices with linear programs", NIPS 2012): the incremental subgradient step of Alg. 4
over rows of C as X's columns stream past, the projection onto Phi_0 by column squishing
(Alg. 5) or by clipping (Sec. 4), and the cleaning of F = argmin_{Z >= 0}
||X - Z X_hott||_{inf,1}; and the passes that hand them to the engine's column streams
(:func:`dnomad.blocks.columns.stream_rows`, :func:`dnomad.blocks.columns.map_column_blocks`).
Numba loops over NumPy arrays; no dask, no zarr."""
from __future__ import annotations

import numba
import numpy as np

from ..blocks import columns
from ..blocks.kernels import FASTMATH, dot


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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
            resid = xk[i] - dot(ci, xk)
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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


def squish_columns_serial(C):
    """Euclidean projection of C onto Phi_0 = {C >= 0, diag C <= 1, C_ij <= C_jj} by
    column squishing (Alg. 5 of Bittorf et al.), column by column, in this thread (the
    :func:`squish_columns` runs column blocks on every core).  Returns a new
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH, inline="always")
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


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
def _clean_rows(Z, rows, Xt, hott, order, step):
    for q in range(order.shape[0]):
        _clean_column(Z, rows, Xt[order[q]], hott, step)


def clean_rows_block(Z, rows, Xt, order, hott, step):
    """One cleaning epoch (projected incremental subgradient, in place) for rows ``rows``
    of F = argmin_{Z >= 0} ||X - Z X_hott||_{inf,1}, visiting the columns of X (rows of
    ``Xt``, n x f) in ``order``.  Cost: b r per column."""
    _clean_rows(Z, np.ascontiguousarray(rows, dtype=np.int64), Xt,
                np.ascontiguousarray(hott, dtype=np.int64),
                np.ascontiguousarray(order, dtype=np.int64), float(step))


@numba.njit(nogil=True, cache=True, fastmath=FASTMATH)
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


# ------------------------------------------------------------------ passes
# The sparse kernels take the engine's SparseColumns (CSR of X^T): these adapters give the
# stream one signature per layout, (block, rows, columns, order, *args).
def _epoch_rows_sparse(C, rows, cols, order, step, diag_step):
    hottopixx_epoch_block_sparse(C, rows, cols.indptr, cols.indices, cols.data, order, step, diag_step)


def _clean_rows_sparse_columns(Z, rows, cols, order, hott, step):
    clean_rows_block_sparse(Z, rows, cols.indptr, cols.indices, cols.data, cols.f, hott, order, step)


def epoch(C, Xt, order, step, diag_step, *, row_block, client=None):
    """One HOTTOPIXX epoch in place: the block-nested loop of Bittorf et al., Sec. 4.1.

    Each task owns ``row_block`` rows of C (sized to stay in cache) and streams every
    column of X past them; rows of C do not interact within an epoch, so the tasks run in
    parallel and the result does not depend on the blocking.  ``diag_step[i]`` is the
    diagonal step of row i.  ``Xt`` and ``order``: X's columns and their visiting order,
    as :func:`dnomad.blocks.columns.stream_rows` takes them (dense X^T, sparse, or Zarr
    chunks with (chunk order, local orders)); ``client`` runs the tasks on its workers
    when the columns are in Zarr.
    """
    columns.stream_rows(C, Xt, order, dense=hottopixx_epoch_block, sparse=_epoch_rows_sparse,
                        args=lambda rows: (step, diag_step[rows]), row_block=row_block, client=client)


def clean_epoch(data, Z, hott, rng, step, *, row_block, client=None):
    """One cleaning epoch of F = argmin_{Z >= 0} ||X - Z X_hott||_{inf,1} in place
    (``data``: the engine's FeatureColumns): the rows of Z are independent, so tasks own
    row blocks and stream X's columns."""
    hott = np.ascontiguousarray(hott, dtype=np.int64)
    columns.stream_rows(Z, data.columns, data.order(rng), dense=clean_rows_block,
                        sparse=_clean_rows_sparse_columns, args=lambda rows: (hott, step), row_block=row_block,
                        client=client)


def squish_columns(C, *, column_block=None):
    """The projection of C onto Phi_0 by column squishing (Alg. 5): a column-block pass
    (each column is projected whole) on one thread per core.  Returns a new array."""
    return columns.map_column_blocks(C, squish_rows_block, column_block=column_block)
