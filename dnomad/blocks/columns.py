"""A nonnegative f x n data matrix read by its columns (HOTTOPIXX's input, Bittorf et
al., Sec. 4.1), and the passes that stream those columns past row blocks of an f x f
(or f x r) matrix: the block-nested loop.

A task owns a block of rows of M (sized to stay in cache) and streams every column of X
past it, calling the method's kernel.  The columns live in this process (dense X^T, or
the compressed columns of a sparse X) or in Zarr as X^T in chunks of columns (out of
core: each task reads each chunk once per pass).  Rows of X are scaled to sum 1 as the
paper assumes; for Zarr the scale is applied as chunks are read, so the stored copy is
the input's values.
"""
from __future__ import annotations

import uuid

import numpy as np

from ..errors import InputTypeError, InputValueError
from . import digest
from .engine import _open_zarr_array

# Columns per chunk of the residual and row passes: about 32 MB of float64 per chunk.
_CHUNK_ENTRIES = 1 << 22
# A dask or Zarr X larger than this fraction of the free memory is staged in the store.
IN_MEMORY_FRACTION = 0.25


def columns_in_memory(f, n, memory_fraction=IN_MEMORY_FRACTION):
    """Whether :func:`feature_columns` brings a dask or Zarr X of f x n into this process
    (else it stages X^T in the store)."""
    from .matrix import available_memory

    return 8 * f * n <= memory_fraction * available_memory()


def column_pass_chunks(f, n, *, staged):
    """A streaming pass over the columns of an f x n X (the residual, the rows): (columns
    per chunk, columns in the chunks running at once in this process, one per thread).
    Staged in the store, the chunks are the staging's; in memory, views of about 32 MB
    of X^T."""
    from .rows import running_rows

    cols = _column_chunk(None, f, n) if staged else _memory_chunk(f, n)
    return cols, running_rows(n, cols)


def _memory_chunk(f, n):
    """Columns per chunk of an f x n X held in this process: about 32 MB of float64."""
    return max(1, min(n, _CHUNK_ENTRIES // max(f, 1)))


def default_row_block(f):
    """Rows of C per task: about 1 MB of float64 C (in a core's L2, as Sec. 4.1 sizes them
    to cache), 8 to 256 rows, and at least two blocks per core.  Sparse X gathers at
    scattered columns of C's rows: on the health tweets (f = 10092) a 20 MB block of 256
    rows ran an epoch in 31 s, 24 rows (1.9 MB) in 13 s; dense X streams rows and does
    not care (f = 1600: 1.8 s per epoch from 32 to 400 rows)."""
    from .engine import _n_threads

    rows = min(256, max(8, (1 << 20) // (8 * max(f, 1))))
    return max(1, min(rows, -(-f // (2 * _n_threads()))))


def _row_blocks(f, row_block):
    return [np.arange(a, min(a + row_block, f)) for a in range(0, f, row_block)]


def _over_row_blocks(M, row_block, kernel, *, client=None, remote=None):
    """Run ``kernel(block, rows)`` (in place) on each block of ``row_block`` rows of M:
    on the local thread pool, or, with ``client`` and ``remote`` = (fn, args_of), as
    ``fn(block, rows, *args_of(rows))`` tasks on the workers (the block travels, b x f
    numbers each way)."""
    blocks_ = _row_blocks(M.shape[0], row_block)
    if client is not None and remote is not None:
        fn, args_of = remote
        futs = [client.submit(fn, np.ascontiguousarray(M[rows]), rows, *args_of(rows), pure=False)
                for rows in blocks_]
        for rows, block in zip(blocks_, client.gather(futs)):
            M[rows] = block
        return

    def run(rows):
        block = np.ascontiguousarray(M[rows])
        kernel(block, rows)
        M[rows] = block

    _thread_map(run, blocks_)


def _thread_map(fn, items):
    from concurrent.futures import ThreadPoolExecutor

    from .engine import _n_threads

    with ThreadPoolExecutor(min(_n_threads(), max(1, len(items)))) as pool:
        return list(pool.map(fn, items))


def map_column_blocks(C, kernel, *, column_block=None):
    """A column-block pass over a square C: ``kernel(Ct, out, lo, hi)`` writes columns
    lo:hi of the result (rows lo:hi of its transpose ``out``) from C^T (``Ct``).  C^T is
    made once so that every column is read with unit stride (a column of a row-major
    f x f matrix is f cache lines), then column blocks run on one thread per core.
    Returns a new C-contiguous array."""
    from .engine import _n_threads

    Ct = np.ascontiguousarray(np.asarray(C, dtype=np.float64).T)
    out = np.empty_like(Ct)
    f = Ct.shape[0]
    step = column_block or max(1, -(-f // (4 * _n_threads())))
    _thread_map(lambda lo: kernel(Ct, out, lo, min(lo + step, f)), range(0, f, step))
    Ct = None                     # a copy of C freed: C, out and the result at the peak, 3 f^2 and not 4
    return np.ascontiguousarray(out.T)


class SparseColumns:
    """The columns of a sparse f x n matrix X in the layout the epoch kernel reads: each
    column's nonzeros together (CSR of X^T), sorted, int64 indices; made once per run."""

    def __init__(self, X):
        import scipy.sparse as sp

        Xt = sp.csr_matrix(X.T)
        Xt.sort_indices()
        self.n, self.f = Xt.shape
        self.indptr = Xt.indptr.astype(np.int64)
        self.indices = Xt.indices.astype(np.int64)
        self.data = Xt.data.astype(np.float64)

    def chunk(self, c0, c1):
        """Columns c0:c1 of X as a sparse (c1 - c0) x f block of X^T (CSR)."""
        import scipy.sparse as sp

        lo, hi = self.indptr[c0], self.indptr[c1]
        return sp.csr_matrix((self.data[lo:hi], self.indices[lo:hi], self.indptr[c0:c1 + 1] - lo),
                             shape=(c1 - c0, self.f))


class ZarrColumns:
    """The columns of an f x n data matrix X stored in Zarr as X^T (n x f), in chunks of
    ``chunk`` columns: what an out-of-core HOTTOPIXX epoch streams past each row block.
    ``scale`` (f,), when set, multiplies each row of X as chunks are read."""

    def __init__(self, url, path, scale=None):
        import zarr

        arr = zarr.open_array(store=str(url), path=path, mode="r")
        if arr.ndim != 2:
            from .store import redact

            raise InputValueError(f"Zarr array {path!r} at {redact(str(url))!r} must be 2-D (n x f); got "
                                  f"{arr.shape}")
        self.url, self.path = str(url), path
        self.n, self.f = arr.shape
        self.chunk = arr.chunks[0]
        self.scale = None if scale is None else np.asarray(scale, dtype=np.float64)
        self.generation = uuid.uuid4().hex        # a rewritten array gets a fresh handle

    @classmethod
    def write(cls, Xt, url, path, chunk):
        """Store X^T (n x f, dense) with ``chunk`` rows (columns of X) per Zarr chunk."""
        import zarr

        Xt = np.asarray(Xt, dtype=np.float64)
        arr = zarr.create_array(store=str(url), name=path, shape=Xt.shape, dtype=Xt.dtype,
                                chunks=(int(chunk), Xt.shape[1]), compressors=None, overwrite=True)
        arr[...] = Xt
        return cls(url, path)

    def read(self, c):
        arr = _open_zarr_array(self.url, self.path, self.generation)
        block = np.ascontiguousarray(arr[c * self.chunk:min((c + 1) * self.chunk, self.n)])
        if self.scale is not None:
            block *= self.scale
        return block

    @property
    def n_chunks(self):
        return -(-self.n // self.chunk)


def _rows_from_zarr(block, rows, cols, chunk_order, local_orders, kernel, args):
    # One task of the block-nested loop: these rows of M meet every chunk of X's columns.
    for c, local in zip(chunk_order, local_orders):
        kernel(block, rows, cols.read(c), local, *args)
    return block


def blocked_column_order(rng, n, chunk):
    """An epoch's visiting order that streams column chunks: the chunks in a random order,
    the columns of each in a random order.  Returns (chunk_order, [local orders])."""
    n_chunks = -(-n // chunk)
    chunk_order = rng.permutation(n_chunks)
    local = [rng.permutation(min(chunk, n - c * chunk)) for c in chunk_order]
    return chunk_order, local


def stream_rows(M, Xt, order, *, dense, sparse, args, row_block, client=None):
    """The block-nested loop, in place: each task owns ``row_block`` rows of M and streams
    every column of X past them, in ``order``, through the method's kernel.

    ``Xt`` holds X's columns: a dense (n, f) array (``dense(block, rows, Xt, order,
    *args(rows))``), a :class:`SparseColumns` or a scipy sparse X^T, converted once
    (``sparse(block, rows, columns, order, *args(rows))``), or a :class:`ZarrColumns` (out of
    core: ``dense`` on each chunk of columns, every chunk read once per task), with
    ``order`` = (chunk order, local orders) from :func:`blocked_column_order`.  Kernels
    update their block of M's rows in place and must not make rows interact: the tasks
    run in parallel and the result does not depend on the blocking.  Tasks run on
    ``client``'s workers when given and the columns are in Zarr (M's rows travel, b x f
    numbers each way; ``dense`` must then be importable there), else on one thread per
    core here (the kernels release the GIL).
    """
    import scipy.sparse as sp

    if sp.issparse(Xt):
        Xt = SparseColumns(Xt.T)
    remote = None
    if isinstance(Xt, ZarrColumns):
        chunk_order, local = order

        def kernel(block, rows):
            _rows_from_zarr(block, rows, Xt, chunk_order, local, dense, args(rows))
        remote = (_rows_from_zarr, lambda rows: (Xt, chunk_order, local, dense, args(rows)))
    elif isinstance(Xt, SparseColumns):
        def kernel(block, rows):
            sparse(block, rows, Xt, order, *args(rows))
    else:
        def kernel(block, rows):
            dense(block, rows, Xt, order, *args(rows))
    _over_row_blocks(M, row_block, kernel, client=client, remote=remote)


class FeatureColumns:
    """A validated f x n nonnegative matrix X, rows scaled to sum 1, held by columns.

    Made by :func:`feature_columns`.  ``columns`` is the dense X^T (n x f), a
    :class:`SparseColumns` or a :class:`ZarrColumns`; ``row_sums`` are the input's row
    sums (the scaling undone by multiplying row i by row_sums[i]); ``nnz`` the nonzeros
    per row.  The passes below read X once each.
    """

    def __init__(self, columns, row_sums, nnz, kind):
        self.columns = columns
        self.row_sums = row_sums
        self.nnz = nnz
        self.kind = kind
        self.n, self.f = (columns.shape if isinstance(columns, np.ndarray)
                          else (columns.n, columns.f))

    @property
    def shape(self):
        return self.f, self.n

    def order(self, rng):
        """An epoch's column order (blocked by chunks when X is in Zarr)."""
        if isinstance(self.columns, ZarrColumns):
            return blocked_column_order(rng, self.n, self.columns.chunk)
        return rng.permutation(self.n)

    def _chunks(self):
        """(c0, c1) ranges of columns of X for the streaming passes."""
        if isinstance(self.columns, ZarrColumns):
            step = self.columns.chunk
        else:
            step = _memory_chunk(self.f, self.n)
        return [(c0, min(c0 + step, self.n)) for c0 in range(0, self.n, step)]

    def _read(self, c0, c1):
        cols = self.columns
        if isinstance(cols, ZarrColumns):
            return cols.read(c0 // cols.chunk)
        if isinstance(cols, SparseColumns):
            return cols.chunk(c0, c1)
        return cols[c0:c1]

    def _map(self, fn, client=None, shared=()):
        """fn(chunk of columns, *shared) for each chunk; on ``client``'s workers where X is
        in Zarr, with ``shared`` sent to each worker once (not with every task)."""
        ranges = self._chunks()
        if client is not None and self.kind == "zarr":
            shared = [client.scatter(a, broadcast=True) if isinstance(a, np.ndarray) else a for a in shared]
            futs = [client.submit(_chunk_call, fn, self, c0, c1, *shared, pure=False) for c0, c1 in ranges]
            return client.gather(futs)
        return _thread_map(lambda rng_: _chunk_call(fn, self, *rng_, *shared), ranges)

    def residual_l1(self, M, hott=None, *, client=None):
        """Row l1 norms of X - M X (M: f x f), or of X - M X_hott (M: f x r)."""
        M = np.ascontiguousarray(M, dtype=np.float64)
        sel = None if hott is None else np.asarray(hott, dtype=np.int64)
        parts = self._map(_residual_chunk, client, shared=(M, sel))
        return np.sum(parts, axis=0)

    def rows(self, idx, *, client=None):
        """X[idx] as a dense len(idx) x n array (scaled rows)."""
        idx = np.asarray(idx, dtype=np.int64)
        parts = self._map(lambda Xc: _dense(Xc[:, idx].T), client)
        return np.concatenate(parts, axis=1) if parts else np.zeros((len(idx), 0))


def _chunk_call(fn, data, c0, c1, *shared):
    return fn(data._read(c0, c1), *shared)


def _dense(A):
    return A.toarray() if hasattr(A, "toarray") else np.ascontiguousarray(A)


def _residual_chunk(Xc, M, sel):
    # Xc: columns c0:c1 of X as rows (m x f, dense or CSR).  (M X)^T for these columns is
    # Xc M^T: nnz(Xc) f work when Xc is sparse.  One m x f temporary (and a sparse Xc's
    # dense copy): the residual is made in place of the product.
    residual = np.asarray(Xc @ M.T if sel is None else Xc[:, sel] @ M.T)
    np.subtract(_dense(Xc), residual, out=residual)
    return np.abs(residual, out=residual).sum(axis=0)


def _check_block(values, where):
    if not np.isfinite(values).all():
        raise InputValueError(f"X contains NaN or Inf ({where})")
    if values.size and values.min() < 0:
        raise InputValueError(f"X must be nonnegative; its smallest entry is {values.min():.3g} ({where})")


def _check_row_sums(sums):
    if (sums == 0).any():
        zero = np.flatnonzero(sums == 0)
        raise InputValueError(f"X has {len(zero)} all-zero rows (first: row {int(zero[0])}); they cannot "
                              f"be scaled to sum 1: drop them")


def feature_columns(X, *, store=None, path="input/Xt", chunk=None, memory_fraction=IN_MEMORY_FRACTION,
                    on_digest=None):
    """X (f x n, nonnegative) validated, rows scaled to sum 1, held by columns.

    X may be a NumPy array, a scipy.sparse matrix (kept sparse), a dask array, a Zarr
    array or a Zarr path.  A dask or Zarr X that fits in ``memory_fraction`` of the free
    memory is brought into this process; a larger one is copied into ``store`` as X^T in
    chunks of ``chunk`` columns (default: about 64 MB each) in one pass that also checks
    it and takes its row sums.  Bad input (negative, NaN/Inf, all-zero rows, not 2-D)
    raises before any epoch runs.  ``on_digest``: for X in Zarr, called with the digest
    of the chunks that pass read (:mod:`dnomad.blocks.digest`).
    """
    location = digest.zarr_location(X) if on_digest is not None else None
    if location is not None:
        generation = digest.new_generation()
        try:
            columns = _feature_columns(digest.open_array(*location, generation), store, path, chunk,
                                       memory_fraction)
        except BaseException:
            digest.discard(generation)
            raise
        on_digest(digest.collect(generation))
        return columns
    seen = {} if on_digest is not None and hasattr(X, "dask") else None
    columns = _feature_columns(X, store, path, chunk, memory_fraction, seen)
    if seen is not None:
        on_digest(seen)               # a dask X: the crc32c of its column blocks as computed
    return columns


def _column_chunk(chunk, f, n):
    """Columns per chunk of X staged in Zarr (default: about 64 MB each)."""
    return int(chunk) if chunk else max(1, min(n, (64 << 20) // (8 * f)))


def _note_columns(seen, block, c0, chunk):
    """The crc32c of a dask X's columns from c0 as computed, in the staging's column chunks
    (so that a resume compares the same parts whether X is staged or held in memory)."""
    if seen is None:
        return
    for start in range(0, block.shape[1], chunk):
        part = np.ascontiguousarray(block[:, start:start + chunk])
        seen[f"columns {c0 + start}:{c0 + start + part.shape[1]}"] = [digest.crc32c(part), part.nbytes]


def _feature_columns(X, store, path, chunk, memory_fraction, seen=None):
    import scipy.sparse as sp

    if isinstance(X, str) or hasattr(X, "__fspath__"):
        import zarr

        X = zarr.open_array(store=str(X), mode="r")
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        if X.ndim != 2:
            raise InputValueError(f"X must be 2-D (n_features, n_samples); got shape {X.shape}")
        _check_block(X.data, "in its stored entries")
        X.eliminate_zeros()
        sums = np.asarray(X.sum(axis=1)).ravel()
        _check_row_sums(sums)
        Xs = sp.diags(1.0 / sums) @ X
        return FeatureColumns(SparseColumns(Xs), sums, Xs.getnnz(axis=1).astype(np.float64), "sparse")
    lazy = hasattr(X, "dask") or type(X).__module__.startswith("zarr")
    shape = getattr(X, "shape", None)
    if lazy:
        if len(shape) != 2:
            raise InputValueError(f"X must be 2-D (n_features, n_samples); got shape {shape}")
        nbytes = 8 * shape[0] * shape[1]
        if not columns_in_memory(*shape, memory_fraction):
            if store is None:
                raise InputValueError(f"X ({shape[0]} x {shape[1]}, {nbytes / 2**30:.1f} GiB as float64) "
                                      f"does not fit in memory: give store= to stage its columns in Zarr")
            return _stage_in_zarr(X, store, path, chunk, seen)
        X = X.compute() if hasattr(X, "dask") else X[...]
        _note_columns(seen, np.asarray(X), 0, _column_chunk(chunk, *shape))
    try:
        A = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputTypeError(f"X must be a numeric array (numpy, scipy.sparse, dask, Zarr); got "
                             f"{type(X).__name__}") from exc
    if A.ndim != 2:
        raise InputValueError(f"X must be 2-D (n_features, n_samples); got shape {A.shape}")
    _check_block(A, "in memory")
    sums = A.sum(axis=1)
    _check_row_sums(sums)
    Xt = np.empty((A.shape[1], A.shape[0]))
    step = _memory_chunk(*A.shape)
    for c0 in range(0, A.shape[1], step):         # by column chunks: no second f x n copy
        Xt[c0:c0 + step] = (A[:, c0:c0 + step] / sums[:, None]).T
    return FeatureColumns(Xt, sums, np.count_nonzero(A, axis=1).astype(np.float64), "dense")


def _stage_in_zarr(X, store, path, chunk, seen=None):
    """Copy X (f x n, dask or Zarr) into ``store`` as X^T chunked by columns, one column
    chunk at a time, checking values and taking row sums and nonzeros on the way."""
    import zarr

    f, n = X.shape
    chunk = _column_chunk(chunk, f, n)
    arr = zarr.create_array(store=str(store), name=path, shape=(n, f), dtype=np.float64,
                            chunks=(chunk, f), compressors=None, overwrite=True)
    sums = np.zeros(f)
    nnz = np.zeros(f)
    for c0 in range(0, n, chunk):
        c1 = min(c0 + chunk, n)
        block = X[:, c0:c1]
        block = block.compute() if hasattr(block, "dask") else block
        _note_columns(seen, np.asarray(block), c0, chunk)
        block = np.asarray(block, dtype=np.float64)
        _check_block(block, f"in columns {c0}:{c1}")
        sums += block.sum(axis=1)
        nnz += np.count_nonzero(block, axis=1)
        arr[c0:c1] = block.T
    _check_row_sums(sums)
    return FeatureColumns(ZarrColumns(store, path, scale=1.0 / sums), sums, nnz, "zarr")
