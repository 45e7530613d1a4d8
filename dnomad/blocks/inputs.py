"""The input of a fit, checked before any heavy work: data X (n x d, in memory, dask or
Zarr) or a precomputed n x n matrix (a BlockMatrix, an array, or a Zarr path), and the
block group that holds it for a pass."""
from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

from ..errors import InputTypeError, InputValueError
from ..validation import check_data
from . import builders, kernels, runs
from . import store as run_store
from .builders import as_data_matrix, from_array, from_zarr, gram, new_group, prepare_gram_data
from .device import resolve_device
from .matrix import BlockMatrix
from .passes import DataPanels


def is_precomputed(X):
    return isinstance(X, BlockMatrix)


class InputSource:
    """The input of a fit: data X (n x d) or a precomputed n x n matrix, validated
    before any heavy work."""

    def __init__(self, X, *, precomputed, center, normalize, keep_zarr=False, owner, dtype,
                 nonnegative=False, not_constant=False):
        self.matrix = None
        self.data = None
        self.array = None
        self.url = None
        self.zarr_data = None          # data X left in Zarr (``keep_zarr``), read chunk by chunk
        self.url_data = None
        if is_precomputed(X):
            self.matrix = X
            self.n = X.n
            return
        # The gate: kind, dtype, shape (and for arrays in memory, content) before anything else.
        what = "X (precomputed)" if precomputed else "X"
        checked = check_data(X, owner=owner, name=what, square=precomputed, dtype=dtype if precomputed else None,
                             nonnegative=nonnegative and precomputed,
                             not_constant=not_constant and not precomputed)
        if isinstance(checked, np.ndarray):
            X = checked
        if precomputed:
            if isinstance(X, str) or hasattr(X, "__fspath__"):
                import zarr

                self.url = str(X)
                arr = zarr.open_array(store=self.url, mode="r")
                if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
                    raise InputValueError(f"precomputed Gram at {run_store.redact(self.url)!r} must be square n x n; got "
                                          f"shape {arr.shape}")
                self.n = arr.shape[0]
            else:
                A = X.compute() if hasattr(X, "dask") else X
                try:
                    A = np.asarray(A, dtype=np.float64)
                except (TypeError, ValueError) as exc:
                    raise InputTypeError(f"X must be a numeric n x n array when precomputed=True; got "
                                         f"{type(X).__name__}") from exc
                builders.check_square_symmetric(A, "X (precomputed Gram)")
                self.array = A
                self.n = A.shape[0]
            return
        if keep_zarr and (isinstance(X, str) or hasattr(X, "__fspath__")):
            import zarr

            self.url_data = str(X)
            X = zarr.open_array(store=self.url_data, mode="r")
        if keep_zarr and type(X).__module__.startswith("zarr"):
            if X.ndim != 2 or X.shape[0] < 2:
                raise InputValueError(f"X must be 2-D (n_samples, n_features) with n >= 2; got shape {X.shape}")
            self.zarr_data = X
            self.n = X.shape[0]
            return
        X = as_data_matrix(X)
        if checked is not X:                 # read from Zarr or dask just now: its content's turn
            X = check_data(X, owner=owner, not_constant=not_constant)
        self.data = X
        self._gram_scaling = (center, normalize)
        self.n = X.shape[0]

    @property
    def is_data(self):
        """Data X (in memory or in Zarr), not an n x n matrix."""
        return self.data is not None or self.zarr_data is not None

    @functools.cached_property
    def features(self):
        """The panels F with D = F F^T (NOMAD's Gram); made on first use, an n x d copy."""
        center, normalize = self._gram_scaling
        return prepare_gram_data(self.data, center=center, normalize=normalize)

    def describe(self):
        if self.matrix is not None:
            return {"kind": "block_matrix", "n": self.n}
        if self.url is not None:
            return {"kind": "gram_zarr", "url": self.url, "n": self.n}
        if self.array is not None:
            return {"kind": "gram_array", "n": self.n}
        if self.zarr_data is not None:
            return {"kind": "data_zarr", "url": self.url_data, "shape": list(self.zarr_data.shape)}
        return {"kind": "data", "shape": list(self.data.shape), "stored_as": "input/X"}

    def fingerprint(self):
        """The input's part of the run's identity: the bytes of an input in memory (hashed
        once), else its description (a Zarr input's content is checked as it is read:
        :func:`runs.content_check`)."""
        if self.data is None and self.array is None:
            return json.dumps(self.describe(), sort_keys=True)
        return self._content_hash

    @functools.cached_property
    def _content_hash(self):
        held = self.data if self.data is not None else self.array
        return hashlib.sha1(np.ascontiguousarray(held)).hexdigest()[:16]

    def content_check(self, store):
        """What the first pass over a Zarr input calls with its chunks' digest: recorded
        in the run's ``store`` or checked against it (:func:`runs.content_check`); None
        for an input in memory (its bytes are part of the run's identity)."""
        return runs.content_check(store, self.url or self.url_data or self.zarr_data,
                                  "X (precomputed)" if self.url else "X")

    def build(self, *, backend, client, store, dtype, block_size, device=None, on_digest=None):
        """The block group holding D (or ready to form it from data panels); ``on_digest``
        as :func:`from_zarr`'s, for a Zarr input."""
        kw = dict(block_size=block_size, dtype=dtype, backend=backend,
                  client=client if backend != "local" else None, store=store, device=device)
        if self.matrix is not None:
            return self.matrix.group, None
        if self.url is not None:
            return from_zarr(self.url, on_digest=on_digest, **kw).group, None
        if self.array is not None:
            return from_array(self.array, check=False, **kw).group, None
        F = self.features
        if F.shape[1] <= kernels.INLINE_GRAM_MAX_FEATURES or \
                resolve_device(device) == "cuda":
            # NOMAD keeps D = F F^T as its factor: the passes leave D out and each matvec
            # adds F (F^T x) (nomad_cgm).  On the host that is cheaper than reading a stored
            # D only for few features (each matvec reads F twice, a pass reads D once:
            # MNIST zeros, n = 6,903, d = 784, took 50 ms per inner step factored against
            # 32 ms stored); on the GPU a stored D would be a fourth n x n matrix (20 GB
            # at n = 70,000) and forming it a GEMM per block in every pass.
            group = new_group(self.n, **kw)
            return group, DataPanels(group, F.astype(group.dtype))
        D = gram(F, center=False, normalize=False, **kw)
        return D.group, None
