"""Builders: block matrices from data (Gram, Gaussian affinity), arrays and Zarr."""
from __future__ import annotations

import math

import numpy as np

from ..errors import InputTypeError, InputValueError
from . import cluster, digest, kernels
from .device import cupy, resolve_device
from .engine import BlockGroup
from .layout import BlockLayout
from .matrix import BlockMatrix
from .passes import DataPanels

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# A block of ~64 MB (4096^2 float32) keeps scheduler overhead small against the
# block's own streaming time (~5 ms at 13 GB/s) and a worker's footprint at a few blocks.
TARGET_BLOCK_BYTES = 64 << 20
MIN_BLOCK_SIDE = 512
# On a GPU, blocks of 8192^2 float32 (256 MiB): a matmat pass over 4096-blocks read at 40%
# of an H100's copy bandwidth at k = 8, over 8192-blocks at 57% (graphs/gpu_matmat.py),
# and fewer blocks mean fewer kernel launches per pass.
DEVICE_BLOCK_BYTES = 256 << 20


def check_dtype(dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise InputTypeError(f"dtype must be float32 or float64; got {dtype!r}") from exc
    if dt not in SUPPORTED_DTYPES:
        raise InputTypeError(f"dtype must be float32 or float64; got {dt}")
    return dt


def choose_block_size(n, dtype=np.float32, target_bytes=TARGET_BLOCK_BYTES, min_per_side=1):
    """The block side: n itself for small n, else near-equal blocks of about ``target_bytes``,
    and at least ``min_per_side`` blocks per side while they stay MIN_BLOCK_SIDE or more."""
    side = int(math.sqrt(target_bytes / np.dtype(dtype).itemsize))
    side = min(side, max(MIN_BLOCK_SIDE, math.ceil(n / min_per_side)))
    if n <= side:
        return int(n)
    nb = math.ceil(n / side)
    return int(math.ceil(n / nb))


def check_block_size(block_size, n, dtype, min_per_side=1):
    if block_size is None:
        return choose_block_size(n, dtype, min_per_side=min_per_side)
    if not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise InputValueError(f"block_size must be a positive integer; got {block_size!r}")
    return int(min(block_size, n))


def _block_size_for_workers(n, dtype, client, per_side):
    """The default block side on a cluster's workers: the usual target, or less where the
    workers' memory limits leave less room (:func:`cluster.block_bytes_for_workers`);
    None without a client or memory limits (the usual default then applies)."""
    client = client if client is not None else cluster.get_client()
    if client is None:
        return None
    side = min(int(n), MIN_BLOCK_SIDE)
    room = cluster.block_bytes_for_workers(client, side * side * dtype.itemsize)
    if room is None:
        return None
    return choose_block_size(n, dtype, target_bytes=min(TARGET_BLOCK_BYTES, room), min_per_side=per_side)


def new_group(n, *, block_size=None, dtype=np.float32, backend="local", client=None, store=None,
              prefix="state", device=None):
    dtype = check_dtype(dtype)
    device = resolve_device(device)
    # In this process, passes run one thread per block: 4 blocks per side (10 stored) keep
    # every core busy.
    per_side = 4 if backend == "local" and device == "cpu" else 1
    if block_size is None and device == "cuda":
        # A multiple of 32 columns keeps every block's rows 16-byte aligned for the
        # row-dot matvec kernel (kernels.device_matvec_accumulate).
        block_size = min(int(n), -(-choose_block_size(n, dtype, target_bytes=DEVICE_BLOCK_BYTES) // 32) * 32)
    # On the GPU every block is stored: an off-diagonal block of the symmetric layout is
    # read twice there (A V and A' V are two cuBLAS GEMMs), which held a matmat pass to
    # 34-46% of the H100's copy bandwidth (graphs/gpu_matmat.py); one GEMM per block
    # reads it once.
    if block_size is None and device == "cpu" and backend in ("distributed", "zarr"):
        block_size = _block_size_for_workers(n, dtype, client, per_side)
    layout = BlockLayout(int(n), check_block_size(block_size, n, dtype, per_side), symmetric=device != "cuda")
    return BlockGroup(layout, dtype, backend=backend, client=client, store=store, prefix=prefix, device=device)


# ------------------------------------------------------------------ data
def input_metadata(X):
    """What an input is, without reading its data: ``{"kind", "dtype", "shape"}`` (and
    a Zarr array's ``"chunks"``) with
    kind "numpy", "sparse" (scipy.sparse), "zarr" (a Zarr array, or its path or URL:
    opened read-only for its metadata), "dask", "block_matrix", "array-like" (a list or
    anything with ``__array__``: dtype and shape None until converted) or
    "unsupported"."""
    import os

    if isinstance(X, BlockMatrix):
        return {"kind": "block_matrix", "dtype": X.dtype, "shape": X.shape}
    if isinstance(X, np.ndarray):
        return {"kind": "numpy", "dtype": X.dtype, "shape": X.shape}
    if isinstance(X, (str, os.PathLike)):
        import zarr

        from .store import redact

        url = os.fspath(X)
        try:
            X = zarr.open_array(store=url, mode="r")
        except Exception as exc:  # noqa: BLE001 - a missing path, a group, a bad URL: one message
            raise InputValueError(f"X = {redact(url)!r} is not a readable Zarr array "
                                  f"({type(exc).__name__}: {redact(str(exc), url)}); give a NumPy array or the "
                                  f"path or URL of a Zarr array") from None
        return {"kind": "zarr", "dtype": X.dtype, "shape": X.shape, "chunks": X.chunks}
    if type(X).__module__.startswith("zarr") and hasattr(X, "shape") and hasattr(X, "dtype"):
        return {"kind": "zarr", "dtype": X.dtype, "shape": X.shape, "chunks": getattr(X, "chunks", None)}
    if hasattr(X, "dask") and hasattr(X, "compute"):
        return {"kind": "dask", "dtype": X.dtype, "shape": X.shape}
    import scipy.sparse

    if scipy.sparse.issparse(X):
        return {"kind": "sparse", "dtype": X.dtype, "shape": X.shape}
    if hasattr(X, "__array__") or isinstance(X, (list, tuple)):
        return {"kind": "array-like", "dtype": None, "shape": None}
    return {"kind": "unsupported", "dtype": None, "shape": None}


def with_known_chunks(X):
    """A dask array whose chunk sizes are unknown (NaN in its shape, as after boolean
    indexing) with them computed: one pass over its graph; the caller's array is left
    as it was."""
    X = X.copy()
    X.compute_chunk_sizes()
    return X


def as_data_matrix(X, name="X"):
    """A finite 2-D float64 NumPy array from numpy, dask, a Zarr array or a Zarr path/URL.

    The data matrix is n x d with d small (features); it is brought into memory
    (n d numbers), never the n x n matrices built from it.
    """
    if isinstance(X, (str,)) or hasattr(X, "__fspath__"):
        import zarr

        X = zarr.open_array(store=str(X), mode="r")
    if hasattr(X, "compute") and hasattr(X, "dask"):
        X = X.compute()
    try:
        A = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputTypeError(f"{name} must be a numeric array (numpy, dask, Zarr); got "
                             f"{type(X).__name__}") from exc
    if A.ndim != 2:
        raise InputValueError(f"{name} must be 2-D (n_samples, n_features); got shape {A.shape}")
    if A.shape[0] < 2:
        raise InputValueError(f"{name} needs at least 2 samples; got shape {A.shape}")
    if not np.isfinite(A).all():
        bad = np.argwhere(~np.isfinite(A))[0]
        raise InputValueError(f"{name} contains NaN or Inf (first at row {bad[0]}, column {bad[1]}); "
                              f"remove or impute those entries")
    return A


def prepare_gram_data(X, *, center=True, normalize=True):
    """The panels F with D = F F^T: X centered, scaled so the largest row norm of X is 1.

    Centering does not change NOMAD's optimizer (with Q 1 = 1, Tr(D_c Q) = Tr(D Q) - 1^T D 1/n);
    the scaling sets the size of D against the penalty gamma, as in the authors' code.
    """
    F = X - X.mean(axis=0) if center else X.copy()
    if normalize:
        scale = np.linalg.norm(X, axis=1).max()
        if scale > 0:
            F /= scale
    return F


def _gram_builder(key, Xi, Xj, dtype, name):
    return {name: kernels.gram_block(Xi, Xj, dtype)}


def _gaussian_builder(key, Xi, Xj, bandwidth, dtype, name):
    return {name: kernels.gaussian_block(Xi, Xj, bandwidth, dtype)}


def _scaled_gaussian_builder(key, Xi, Xj, si, sj, dtype, name):
    return {name: kernels.gaussian_block(Xi, Xj, np.outer(si, sj), dtype)}


def _zeros_builder(key, shapes, dtype, names, device="cpu"):
    xp = cupy() if device == "cuda" else np           # device zeros are made there, not copied
    return {name: xp.zeros(shapes[key], dtype) for name in names}


def _array_builder(key, block, name):
    return {name: np.ascontiguousarray(block)}


def gram(X, *, center=True, normalize=True, name="D", **group_kw):
    """D = F F^T with F = ``prepare_gram_data(X)``, as a BlockMatrix (one pass, no reads)."""
    F = prepare_gram_data(as_data_matrix(X), center=center, normalize=normalize)
    group = new_group(F.shape[0], **group_kw)
    panels = DataPanels(group, F).panels
    group.build([name], _gram_builder, lambda k: (panels[k[0]], panels[k[1]], group.dtype, name))
    return BlockMatrix(group, name)


def gaussian_affinity(X, bandwidth=1.0, *, scales=None, name="A", **group_kw):
    """A_ij = exp(-||x_i - x_j||^2 / bandwidth), built blockwise from X; with ``scales``
    (s, one per row, > 0) instead A_ij = exp(-||x_i - x_j||^2 / (s_i s_j)), the local
    scaling of Zelnik-Manor & Perona (2004) (``bandwidth`` is then not used)."""
    F = as_data_matrix(X)
    n = F.shape[0]
    if scales is None:
        if not bandwidth > 0:
            raise InputValueError(f"bandwidth must be > 0; got {bandwidth!r}")
    else:
        scales = np.asarray(scales, dtype=np.float64)
        if scales.shape != (n,) or not (np.isfinite(scales).all() and scales.min() > 0):
            raise InputValueError(f"scales must be {n} finite numbers > 0, one per row of X")
    group = new_group(n, **group_kw)
    panels = DataPanels(group, F).panels
    if scales is None:
        group.build([name], _gaussian_builder,
                    lambda k: (panels[k[0]], panels[k[1]], float(bandwidth), group.dtype, name))
    else:
        parts = [scales[slice(*group.layout.bounds(i))] for i in range(group.layout.nblocks)]
        group.build([name], _scaled_gaussian_builder,
                    lambda k: (panels[k[0]], panels[k[1]], parts[k[0]], parts[k[1]], group.dtype, name))
    return BlockMatrix(group, name)


# The rows x n block of squared distances a neighbour table takes at a time (with a
# partition's copy beside it: the client's memory for the table, on top of n x m).
NEIGHBOUR_BLOCK_BYTES = 1 << 26


def neighbour_distances(X, n_neighbors, *, max_bytes=NEIGHBOUR_BLOCK_BYTES):
    """The distance from each row of X to its ``n_neighbors``-th nearest other row (a row's
    duplicates count, at distance 0).  Exact, over row chunks in this process: O(n^2 d)
    work, as one pass building a Gaussian affinity, in chunks of at most ``max_bytes``."""
    return neighbour_distance_table(X, n_neighbors, max_bytes=max_bytes, sort=False)[:, -1]


def neighbour_distance_table(X, n_neighbors, *, max_bytes=NEIGHBOUR_BLOCK_BYTES, sort=True):
    """(n, n_neighbors): row i holds the distances from x_i to its 1st, ..., its
    ``n_neighbors``-th nearest other row, ascending (with ``sort=False`` only the last
    column is in place).  One pass as :func:`neighbour_distances`; O(n n_neighbors)
    memory."""
    F = as_data_matrix(X)
    n = F.shape[0]
    if not 1 <= n_neighbors < n:
        raise InputValueError(f"n_neighbors must be in [1, {n}) for {n} rows; got {n_neighbors!r}")
    norms = np.einsum("ij,ij->i", F, F)
    out = np.empty((n, n_neighbors))
    step = max(1, int(max_bytes // (8 * n)))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        sq = kernels.squared_distances(F[r0:r1], F, norms[r0:r1], norms)
        sq[np.arange(r1 - r0), np.arange(r0, r1)] = np.inf          # not its own neighbour
        sq.partition(n_neighbors - 1, axis=1)                        # in place: no copy
        out[r0:r1] = np.sort(sq[:, :n_neighbors], axis=1) if sort else sq[:, :n_neighbors]
        del sq                                  # before the next block is made: one at a time
    return np.sqrt(out)


def squared_distances_from(X, rows, columns=None):
    """(len(rows), len(columns)): the squared distances from the given rows of X to the
    given columns' rows (every row by default)."""
    F = as_data_matrix(X)
    rows = np.asarray(rows)
    cols = F if columns is None else F[np.asarray(columns)]
    return kernels.squared_distances(F[rows], cols)


def zeros_like_layout(group, names):
    shapes = {k: group.layout.block_shape(k) for k in group.layout.keys}
    group.build(list(names), _zeros_builder, lambda k: (shapes, group.dtype, list(names), group.device))


def check_square_symmetric(A, name="D", rtol=1e-6):
    """Raise unless ``A`` (NumPy) is square, finite and symmetric to ``rtol`` * max|A|."""
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise InputValueError(f"{name} must be a square n x n matrix; got shape {A.shape}")
    if not np.isfinite(A).all():
        raise InputValueError(f"{name} contains NaN or Inf")
    scale = float(np.abs(A).max(initial=0.0))
    asym = float(np.abs(A - A.T).max(initial=0.0))
    if asym > rtol * max(scale, np.finfo(np.float64).tiny):
        raise InputValueError(f"{name} must be symmetric; max |{name} - {name}^T| = {asym:.3g} "
                              f"(max |{name}| = {scale:.3g}); pass (A + A.T) / 2 if the asymmetry is "
                              f"round-off")


def from_array(A, *, name="D", check=True, **group_kw):
    """A BlockMatrix from a symmetric n x n NumPy or dask array (validated when ``check``)."""
    if hasattr(A, "compute") and hasattr(A, "dask"):
        A = A.compute()
    A = np.asarray(A)
    if check:
        check_square_symmetric(A, name)
    group = new_group(A.shape[0], **group_kw)
    A = A.astype(group.dtype, copy=False)
    layout = group.layout

    def args(key):
        return (A[slice(*layout.bounds(key[0])), slice(*layout.bounds(key[1]))], name)

    group.build([name], _array_builder, args)
    return BlockMatrix(group, name)


# from_zarr's probe reads at most this many rows and columns of each block it checks:
# whole blocks and their transposes held several blocks in this process (Zarr still
# decodes a chunk whole to read part of it).
PROBE_SIDE = 512


def from_zarr(url, path=None, *, name="D", on_digest=None, check=True, **group_kw):
    """A BlockMatrix over an n x n Zarr array.

    With the "zarr" backend and matching square chunks, blocks are read in place
    (nothing is copied); otherwise they are loaded into the chosen backend's memory.
    Checks the shape and, with ``check``, that a sample is finite and symmetric: the
    leading PROBE_SIDE x PROBE_SIDE corner of the first diagonal blocks and of a few
    off-diagonal pairs (a full check would read the whole matrix once more; the
    corners hold less of this process's memory than whole blocks).  ``check=False``
    reads nothing: for a matrix the caller has just written.  ``on_digest``
    is called with the digest of the chunks read (:mod:`dnomad.blocks.digest`) once the
    first pass over the array (the load, or the first pass that reads it in place) has
    read them.
    """
    import zarr

    from .store import redact

    arr = zarr.open_array(store=str(url), path=path, mode="r") if path else \
        zarr.open_array(store=str(url), mode="r")
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise InputValueError(f"Zarr array at {redact(str(url))!r} must be square n x n; got shape "
                              f"{arr.shape}")
    n = arr.shape[0]
    group_kw.setdefault("dtype", arr.dtype if arr.dtype in SUPPORTED_DTYPES else np.float32)
    if group_kw.get("block_size") is None and arr.chunks[0] == arr.chunks[1]:
        group_kw["block_size"] = arr.chunks[0]
    group = new_group(n, **group_kw)
    layout = group.layout
    rng = np.random.default_rng(0)
    probe = []
    if check:
        probe = [(i, i) for i in range(min(layout.nblocks, 4))]
        if layout.nblocks > 1:
            probe += [tuple(sorted(rng.choice(layout.nblocks, 2, replace=False))) for _ in range(3)]
    for i, j in probe:
        (r0, r1), (c0, c1) = layout.bounds(i), layout.bounds(j)
        ri, cj = slice(r0, min(r1, r0 + PROBE_SIDE)), slice(c0, min(c1, c0 + PROBE_SIDE))
        a, b = np.asarray(arr[ri, cj]), np.asarray(arr[cj, ri])
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise InputValueError(f"Zarr matrix at {redact(str(url))!r} contains NaN or Inf (block {i},{j})")
        scale = max(float(np.abs(a).max(initial=0.0)), np.finfo(np.float64).tiny)
        asym = float(np.abs(a - b.T).max(initial=0.0))
        if asym > 1e-6 * scale:
            raise InputValueError(f"Zarr matrix at {redact(str(url))!r} must be symmetric; blocks ({i},{j}) "
                                  f"and "
                                  f"({j},{i})^T differ by up to {asym:.3g} (max entry {scale:.3g})")
    apath = path or ""
    if group.backend == "zarr" and arr.chunks == (layout.block_size, layout.block_size) \
            and arr.dtype == group.dtype:
        group.attach_zarr(name, url, apath, on_digest=on_digest)
    else:
        from .engine import _load_blocks

        generation = digest.new_generation() if on_digest else "src"
        src = {name: (str(url), apath, generation)}
        try:
            group.build([name], _load_blocks, lambda k: (src, layout, arr.dtype))
        except BaseException:
            digest.discard(generation, group.client)
            raise
        if on_digest is not None:
            on_digest(digest.collect(generation, group.client))
        if arr.dtype != group.dtype:
            group.map_blocks(_cast_task, lambda k: (name, group.dtype), reads=[name], writes=[name],
                             name="cast")
    return BlockMatrix(group, name)


def _cast_task(bundle, key, name, dtype):
    bundle[name] = bundle[name].astype(dtype)
