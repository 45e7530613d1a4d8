"""Matrix-free n x n operators built from tall data: D = F F^T applied as F (F^T Y).

The low-rank solvers need only products D Y with a thin Y (n x r).  When D is the
Gram matrix of data X (n x d, d small), two passes over row chunks of X give it in
O(n d r) work and O(chunk d + n r) memory; no n x n matrix, nor block of one, is
formed.  X may be a NumPy array or a Zarr array (read chunk by chunk, out of core).
"""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError

# Rows of X per chunk when X is read from Zarr (its own chunking is used when larger).
DEFAULT_CHUNK_ROWS = 65536


# Rows per tile when a factored Gram is scanned entry by entry (its smallest entry, its
# components): a tile is TILE_ROWS x TILE_ROWS float64, 32 MB.
TILE_ROWS = 2048


class _TiledGram:
    """What a Gram G = F F^T offers beyond its products, from its factor's rows alone
    (``_factor_rows(r0, r1)``: F[r0:r1] as float64): G is PSD, so its largest entry is
    on its diagonal; its norm comes from F^T F; the summary and the components scan the
    upper triangle tile by tile, O(n^2 r) work in O(TILE_ROWS^2) memory."""

    tile_rows = TILE_ROWS

    def _tiles(self):
        """(r0, c0, tile) over the upper triangle of G, tile = G[r0:r0+T, c0:c0+T]."""
        n, T = self.shape[0], self.tile_rows
        for r0 in range(0, n, T):
            Fr = self._factor_rows(r0, min(n, r0 + T))
            for c0 in range(r0, n, T):
                Fc = Fr if c0 == r0 else self._factor_rows(c0, min(n, c0 + T))
                yield r0, c0, Fr @ Fc.T

    def summary(self):
        """sum, Frobenius norm, min and max of G's entries (as ``BlockMatrix.summary``), in
        one scan of the upper triangle (off-diagonal tiles count twice)."""
        total, low, high = 0.0, np.inf, -np.inf
        for r0, c0, tile in self._tiles():
            total += float(tile.sum()) * (1 if r0 == c0 else 2)
            low = min(low, float(tile.min()))
            if r0 == c0:
                high = max(high, float(np.diagonal(tile).max()))     # G is PSD: its largest entry
        return {"sum": total, "fro": self.fro_norm, "min": low, "max": high}

    def threshold_components(self, threshold):
        """Labels of the connected components of the graph G_ij > ``threshold``
        (numbered by first appearance).  ``threshold``: a number, or per-node
        thresholds t (length n), an edge then needing G_ij > max(t_i, t_j) (as
        ``BlockMatrix.threshold_components``)."""
        from .passes import block_component_edges, join_component_edges

        n = self.shape[0]
        t = np.asarray(threshold, dtype=np.float64)
        if t.ndim and t.shape != (n,):
            raise InputValueError(f"threshold must be a number or a vector of length {n}; got shape {t.shape}")
        edges = []
        for r0, c0, tile in self._tiles():
            tr = t[r0:r0 + tile.shape[0], None] if t.ndim else t
            tc = t[None, c0:c0 + tile.shape[1]] if t.ndim else t
            idx, root = block_component_edges((tile > tr) & (tile > tc))
            edges.append((r0, c0, tile.shape[0], idx, root))
        return join_component_edges(n, edges)


class DataGram(_TiledGram):
    """D = F F^T / scale with F = X - mean(X) (``center``), as a linear operator.

    ``scale`` is ``"frobenius"`` (D divided by its Frobenius norm ||F^T F||_F, the
    normalization of the Burer-Monteiro solver), ``"max_row_norm"`` (F divided by
    its largest row norm, as :func:`prepare_gram_data`), or a number.

    Attributes: ``shape``, ``dtype`` (float64), ``fro_norm`` (||D||_F after scaling),
    ``matmats`` (products so far), ``rows_read`` (rows of X read so far, all passes).
    """

    def __init__(self, X, *, center=True, scale="frobenius", chunk_rows=None):
        if isinstance(X, str) or hasattr(X, "__fspath__"):
            import zarr

            X = zarr.open_array(store=str(X), mode="r")
        if getattr(X, "ndim", None) != 2:
            raise InputValueError(f"X must be a 2-D array (n_samples, n_features); got "
                                  f"{type(X).__name__} of shape {getattr(X, 'shape', None)}")
        self.X = X
        self.in_memory = isinstance(X, np.ndarray)
        n, d = X.shape
        self.shape = (n, n)
        self.n, self.d = n, d
        self.dtype = np.dtype(np.float64)
        own = getattr(X, "chunks", None)
        self.chunk_rows = int(chunk_rows or max(DEFAULT_CHUNK_ROWS, own[0] if own else 0))
        self.matmats = 0
        self.rows_read = 0
        self._pool = None
        # One pass: column sums and X^T X; a second (max_row_norm only) for the row norms.
        total, xtx = np.zeros(d), np.zeros((d, d))
        for _, Xc in self._chunks():
            if not np.isfinite(Xc).all():
                raise InputValueError("X contains NaN or Inf")
            total += Xc.sum(axis=0)
            xtx += Xc.T @ Xc
        self.mean = total / n if center else np.zeros(d)
        ftf = xtx - n * np.outer(self.mean, self.mean)          # F^T F
        if scale == "frobenius":
            fro = np.linalg.norm(ftf)
            if fro == 0:
                raise InputValueError("X is constant after centering: its Gram matrix is zero")
            self.scale = float(fro)
        elif scale == "max_row_norm":
            top = max(float(np.max(np.einsum("ij,ij->i", Xc - self.mean, Xc - self.mean)))
                      for _, Xc in self._chunks())
            if top == 0:
                raise InputValueError("X is constant after centering: its Gram matrix is zero")
            self.scale = top
        else:
            self.scale = float(scale)
            if not self.scale > 0:
                raise InputValueError(f"scale must be 'frobenius', 'max_row_norm' or a number > 0; "
                                      f"got {scale!r}")
        self.fro_norm = float(np.linalg.norm(ftf)) / self.scale

    def _spans(self, rows_per_chunk=None):
        step = rows_per_chunk or self.chunk_rows
        return [(r0, min(self.n, r0 + step)) for r0 in range(0, self.n, step)]

    def _chunks(self):
        for r0, r1 in self._spans():
            self.rows_read += r1 - r0
            yield slice(r0, r1), np.asarray(self.X[r0:r1], dtype=np.float64)

    def _map_chunks(self, fn):
        """[fn(rows, X[rows]) for each row chunk], on a thread per core: each chunk's GEMM
        runs on one BLAS thread (the solvers run with single-threaded BLAS), so the
        chunks are what spreads the work.  In memory X is cut into one chunk per
        thread (at most ``chunk_rows``); Zarr X in its own chunks, read concurrently."""
        import concurrent.futures
        import os

        threads = len(os.sched_getaffinity(0))
        step = min(self.chunk_rows, -(-self.n // threads)) if self.in_memory else None
        spans = self._spans(step)
        if self._pool is None and threads > 1 and len(spans) > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="dnomad-gram")

        def run(span):
            rows = slice(*span)
            return fn(rows, np.asarray(self.X[rows], dtype=np.float64))

        results = list(self._pool.map(run, spans)) if self._pool is not None and len(spans) > 1 else \
            [run(span) for span in spans]
        self.rows_read += self.n
        return results

    def rmatmat_data(self, Y):
        """F^T Y (d x r), one pass over X."""
        parts = self._map_chunks(lambda rows, Xc: Xc.T @ Y[rows])
        return sum(parts[1:], parts[0]) - np.outer(self.mean, Y.sum(axis=0))

    def matmat(self, Y):
        """D Y for Y (n x r): F (F^T Y) / scale, two passes over X's row chunks."""
        Y = np.asarray(Y, dtype=np.float64)
        squeeze = Y.ndim == 1
        if squeeze:
            Y = Y[:, None]
        if Y.shape[0] != self.n:
            raise InputValueError(f"Y must have {self.n} rows; got shape {Y.shape}")
        G = self.rmatmat_data(Y) / self.scale
        out = np.empty((self.n, Y.shape[1]))
        shift = self.mean @ G

        def fill(rows, Xc):
            out[rows] = Xc @ G - shift

        self._map_chunks(fill)
        self.matmats += 1
        return out[:, 0] if squeeze else out

    def diag(self):
        """D's diagonal, ||F_i||^2 / scale: one pass over X."""
        out = np.empty(self.n)

        def fill(rows, Xc):
            F = Xc - self.mean
            out[rows] = np.einsum("ij,ij->i", F, F) / self.scale

        self._map_chunks(fill)
        return out

    def _factor_rows(self, r0, r1):
        self.rows_read += r1 - r0
        return (np.asarray(self.X[r0:r1], dtype=np.float64) - self.mean) / np.sqrt(self.scale)

    def dense(self):
        """D as a dense array (tests and small n only)."""
        F = np.asarray(self.X[...], dtype=np.float64) - self.mean
        return F @ F.T / self.scale


class ScaledMatrix:
    """A square operator (anything with ``matmat``, e.g. a BlockMatrix) divided by a
    number: D / scale, with ``fro_norm`` its Frobenius norm after scaling."""

    def __init__(self, D, scale, fro_norm):
        self.D = D
        self.shape = tuple(D.shape)
        self.n = self.shape[0]
        self.dtype = np.dtype(np.float64)
        self.scale = float(scale)
        self.fro_norm = float(fro_norm) / self.scale
        self.matmats = 0

    def matmat(self, Y):
        self.matmats += 1
        return np.asarray(self.D.matmat(np.asarray(Y, dtype=self.D.dtype)), dtype=np.float64) / self.scale

    def diag(self):
        return np.asarray(self.D.diag(), dtype=np.float64) / self.scale

    def summary(self):
        out = {k: v / self.scale for k, v in self.D.summary().items()}
        if self.scale < 0:
            out["min"], out["max"] = out["max"], out["min"]
        out["fro"] = abs(out["fro"])
        return out

    def threshold_components(self, threshold):
        if self.scale < 0:
            raise InputValueError("threshold_components of a negatively scaled matrix is not defined "
                                  "(the edges would flip to D_ij < t scale)")
        return self.D.threshold_components(np.asarray(threshold, dtype=np.float64) * self.scale)


class LowRankGram(_TiledGram):
    """Q = Y Y^T for a thin Y >= 0 (n x r), as a linear operator: the Burer-Monteiro
    solution of NOMAD without its n x n matrix.

    ``matmat`` costs O(n r k); ``diag`` and ``max`` O(n r) (Q is PSD, so its largest
    entry is on the diagonal); ``fro_norm`` = ||Y^T Y||_F, O(n r^2); ``summary``'s
    minimum and ``threshold_components`` scan Q by tiles, O(n^2 r) work in
    O(TILE_ROWS^2) memory.  A Y that is not a NumPy array but has a shape (a dask array
    over a result in a store) is read into memory when first used.
    """

    def __init__(self, Y):
        if isinstance(Y, np.ndarray) or not hasattr(Y, "shape"):
            self._Y, self._source = np.asarray(Y, dtype=np.float64), None
            shape = self._Y.shape
        else:
            self._Y, self._source = None, Y
            shape = tuple(Y.shape)
        if len(shape) != 2:
            raise InputValueError(f"Y must be 2-D (n, r); got shape {shape}")
        self.n, self.rank = shape
        self.shape = (self.n, self.n)
        self.dtype = np.dtype(np.float64)
        self.matmats = 0

    @property
    def Y(self):
        if self._Y is None:
            self._Y = np.asarray(self._source, dtype=np.float64)
        return self._Y

    @property
    def fro_norm(self):
        return float(np.linalg.norm(self.Y.T @ self.Y))

    def matmat(self, V):
        V = np.asarray(V, dtype=np.float64)
        if V.shape[0] != self.n or V.ndim > 2:
            raise InputValueError(f"matmat needs V of shape ({self.n},) or ({self.n}, k); got {V.shape}")
        self.matmats += 1
        return self.Y @ (self.Y.T @ V)

    matvec = matmat

    def diag(self):
        return np.einsum("ij,ij->i", self.Y, self.Y)

    def max(self):
        return float(self.diag().max())

    def _factor_rows(self, r0, r1):
        return self.Y[r0:r1]

    def to_numpy(self):
        from .matrix import available_memory

        nbytes = self.n * self.n * 8
        if nbytes > 0.5 * available_memory():
            raise MemoryError(f"a dense {self.n} x {self.n} Q needs {nbytes / 2**30:.1f} GiB, more than half "
                              f"the available memory; use matmat, diag or the factor Y instead")
        return self.Y @ self.Y.T

    def __array__(self, dtype=None, copy=None):
        Q = self.to_numpy()
        return Q if dtype is None else Q.astype(dtype, copy=False)

    def __repr__(self):
        return f"LowRankGram(n={self.n}, rank={self.rank})"
