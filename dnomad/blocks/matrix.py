"""BlockMatrix: one n x n matrix of a BlockGroup, with the small operator interface."""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError
from . import passes
from .device import is_device_array
from .engine import BlockGroup


def available_memory():
    """Bytes of memory available to this process now (psutil; 8 GiB where it cannot tell)."""
    try:
        import psutil

        return psutil.virtual_memory().available
    except Exception:  # pragma: no cover - psutil ships with distributed
        return 8 << 30


class BlockMatrix:
    """An n x n (symmetric) matrix stored as b x b blocks, in memory or in Zarr.

    Implements the operator interface the solvers use (``shape``, ``dtype``,
    ``matmat``, ``diag``, ``row_sums``, ``inner``).  ``np.asarray(bm)`` assembles the
    dense matrix when it fits in memory.  Where the blocks live (this process,
    worker memory, a Zarr store) and which blocks are stored (only i <= j for a
    symmetric matrix) are the engine's business.
    """

    def __init__(self, group: BlockGroup, name: str):
        if name not in group.names:
            raise InputValueError(f"matrix {name!r} is not in the block group (has {group.names})")
        self.group = group
        self.name = name

    # operator interface ----------------------------------------------------
    @property
    def shape(self):
        return (self.group.n, self.group.n)

    @property
    def dtype(self):
        return self.group.dtype

    @property
    def n(self):
        return self.group.n

    @property
    def block_size(self):
        return self.group.layout.block_size

    @property
    def chunks(self):
        c = self.group.layout.chunks
        return (c, c)

    @property
    def backend(self):
        return self.group.backend

    @property
    def device(self):
        return self.group.device

    def matmat(self, V):
        """A @ V for V of shape (n, k) or (n,); one read of A (see ``passes.matmat``).
        A CuPy V (device blocks) gets a CuPy answer without leaving the device."""
        V = V if is_device_array(V) else np.asarray(V)
        if V.shape[0] != self.n or V.ndim > 2:
            raise InputValueError(f"matmat needs V of shape ({self.n},) or ({self.n}, k); got {V.shape}")
        return passes.matmat(self.group, self.name, V)

    matvec = matmat

    def label_sums(self, labels, n_labels):
        """A @ S for S the n x ``n_labels`` one-hot matrix of ``labels`` (one read of A;
        see ``passes.label_sums``).  Returns a float64 (n, n_labels) array."""
        labels = np.asarray(labels)
        if labels.shape != (self.n,) or not np.issubdtype(labels.dtype, np.integer):
            raise InputValueError(f"labels must be an integer array of shape ({self.n},); got "
                                  f"{labels.dtype} {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= n_labels):
            raise InputValueError(f"labels must lie in [0, {n_labels}); got range "
                                  f"[{labels.min()}, {labels.max()}]")
        return passes.label_sums(self.group, self.name, labels, n_labels)

    def diag(self):
        return passes.diagonal(self.group, self.name)

    def row_sums(self):
        return self.matmat(np.ones(self.n, self.dtype))

    def inner(self, U, W):
        """trace(U^T A W)."""
        U = np.asarray(U).reshape(self.n, -1)
        return float(np.sum(U * self.matmat(np.asarray(W).reshape(self.n, -1))))

    def summary(self):
        """sum, Frobenius norm, min and max in one pass."""
        return passes.summary(self.group, self.name)

    def threshold_components(self, threshold):
        """Labels 0..c-1 of the connected components of the graph A_ij > ``threshold``
        (a number, or per-node thresholds t: A_ij > max(t_i, t_j)); one pass."""
        return passes.threshold_components(self.group, self.name, threshold)

    # conversion ------------------------------------------------------------
    def to_numpy(self):
        nbytes = self.n * self.n * self.dtype.itemsize
        if nbytes > 0.5 * available_memory():
            raise MemoryError(f"a dense {self.n} x {self.n} {self.dtype} array needs {nbytes / 2**30:.1f} "
                              f"GiB, more than half the available memory; use matmat, block access "
                              f"or the Zarr store instead")
        return passes._full_assemble(self.group, self.name)

    def __array__(self, dtype=None, copy=None):
        A = self.to_numpy()
        return A if dtype is None else A.astype(dtype, copy=False)

    def __repr__(self):
        return (f"BlockMatrix(n={self.n}, block_size={self.block_size}, dtype={self.dtype}, "
                f"backend={self.backend!r}, device={self.device!r})")
