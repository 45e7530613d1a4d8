"""Named passes over a BlockGroup: what solvers call, by name, instead of building graphs.

Each function here is one pass (one task per stored block, one gather of small
results).  The per-block functions are module-level and close over nothing large;
vector slices travel with each task (b x k numbers), data panels as futures.
"""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError
from . import kernels
from .device import array_module, is_device_array, to_device, to_host
from .engine import BlockGroup


# ------------------------------------------------------------------ helpers
def _weight(layout, key):
    return 2.0 if (layout.symmetric and key[0] != key[1]) else 1.0


def group_vector(group, v):
    """``v`` (length n) in the group's dtype, where its blocks compute (a CuPy vector for
    device blocks: one host-to-device copy when it came from the host)."""
    return group_array(group, v).reshape(group.n)


def group_array(group, A):
    """A tall array (n x k) in the group's dtype, where its blocks compute."""
    if group.device == "cuda":
        return to_device(A, "cuda").astype(group.dtype, copy=False)
    return np.asarray(to_host(A), dtype=group.dtype)


def row_slices(layout, V, key):
    (r0, r1), (c0, c1) = layout.bounds(key[0]), layout.bounds(key[1])
    return V[r0:r1], V[c0:c1]


def _panel(block):
    """A small array made a task result, so that the scheduler can recompute it on
    another worker if the one holding it dies (scattered data would be lost)."""
    return block


class DataPanels:
    """Row panels of a small-d data matrix (n x d), one per block row, where the tasks can
    reach them: slices in this process and for the workers' shards (sent with each call),
    or futures broadcast once to the workers that run Zarr-backed tasks."""

    def __init__(self, group: BlockGroup, X: np.ndarray):
        self.X = X
        self.layout = group.layout
        self._features = {}
        panels = [X[slice(*self.layout.bounds(i))] for i in range(self.layout.nblocks)]
        if group.device == "cuda":
            # Device blocks form D's blocks on the GPU: the panels are copied there once.
            panels = [to_device(np.ascontiguousarray(p, dtype=group.dtype), "cuda") for p in panels]
        if group.client is not None and group.backend != "distributed":
            # Scheduled tasks (Zarr backend) take the panels as futures, sent once: task
            # results, not scattered data, so that a panel whose worker dies is made
            # again elsewhere.  The in-memory backend's shards are called directly and
            # get them by value (b x d numbers per block).
            self.panels = [group.client.submit(_panel, p, pure=False) for p in panels]
        else:
            self.panels = panels

    def pair(self, key):
        return self.panels[key[0]], self.panels[key[1]]

    def _features_like(self, x):
        """X in float64 where ``x`` lives, made once per device (the products below run
        once per eigensolver matvec)."""
        device = "cuda" if is_device_array(x) else "cpu"
        if device not in self._features:
            self._features[device] = to_device(np.asarray(self.X, dtype=np.float64), device)
        return self._features[device]

    def gram_product(self, x):
        """D x = X (X^T x) for D = X X^T, in float64 on ``x``'s device: O(n d), no pass."""
        F = self._features_like(x)
        return F @ (F.T @ x)

    def gram_matrix(self, like):
        """D = X X^T in full (n x n, float64) on ``like``'s device: O(n^2 d), no pass."""
        F = self._features_like(like)
        return F @ F.T

    def gram_bilinear(self, A, U):
        """sum_j a_j^T D u_j = <D, A U^T> for A, U (n x k): O(n d k), no pass."""
        F = self._features_like(U)
        return float((F.T @ A).ravel() @ (F.T @ U).ravel())

    def gram_quadratic(self, v):
        """v^T D v = ||X^T v||^2 (a float)."""
        w = self._features_like(v).T @ v
        return float(w @ w)


# ------------------------------------------------------------------ matmat
def _matmat_block_task(bundle, key, name, Vi, Vj, mirror):
    return kernels.matmat_block(bundle[name], Vi, Vj, mirror=mirror)


def matmat(group: BlockGroup, name: str, V: np.ndarray):
    """A @ V for the group's matrix ``name`` and a tall V (n x k): one read of A.

    Each task returns (A_ij V_j, A_ij^T V_i) for its block; the client adds the
    partial rows (n x k numbers per block row), so only O(n k (n/b)) bytes travel.
    """
    layout = group.layout
    on_device = is_device_array(V)
    V = V if on_device else np.asarray(V)
    squeeze = V.ndim == 1
    out_dtype = np.result_type(group.dtype, np.float64) if V.dtype == np.float64 else group.dtype
    V2 = to_device(V.reshape(layout.n, -1).astype(group.dtype, copy=False), group.device)

    def args(key):
        Vi, Vj = row_slices(layout, V2, key)
        return (name, Vi, Vj, layout.symmetric and key[0] != key[1])

    if group.device == "cuda":
        Y = _device_matmat(group, name, V2).astype(out_dtype, copy=False)
    else:
        results = group.map_blocks(_matmat_block_task, args, reads=[name], writes=[], name="matmat")
        Y = _sum_row_partials(layout, results, V2.shape, out_dtype)
    if group.device == "cuda" and not on_device:
        Y = to_host(Y)              # a host V gets a host answer; a device V stays there
    return Y.reshape(layout.n) if squeeze else Y


def _device_matmat(group, name, V):
    """A @ V on the GPU: one cuBLAS GEMM per block, accumulated in place into its block
    row of Y (beta = 1), issued from this thread in layout order: the GPU runs them in
    order on one stream, and a thread pool would only add launch contention.  One
    float32 vector (k = 1) goes through :func:`kernels.device_matvec_accumulate`.  On an
    H100 (graphs/gpu_matmat.py, n = 32768 float32, blocks of 8192) a pass reads at 87%
    of the copy bandwidth for k = 1 (cuBLAS per block: 76%) and 57-59% for k = 8 (one
    GEMM over the whole matrix: 98% and 72%); with a thread pool and a sum of per-block
    partials it was 61% and 42%."""
    import time

    from .device import cupy
    from .engine import PassRecord

    cp = cupy()
    layout = group.layout
    if layout.symmetric:
        raise InputValueError("device blocks are stored whole (new_group's layout for device='cuda')")
    t0 = time.perf_counter()
    Y = cp.zeros(V.shape, dtype=V.dtype)
    for key in layout.keys:
        (r0, r1), (c0, c1) = layout.bounds(key[0]), layout.bounds(key[1])
        A = group.block(name, key)
        if V.shape[1] == 1 and c0 % 4 == 0 and kernels.device_matvec_fits(A, V):    # 16-byte aligned
            kernels.device_matvec_accumulate(A, V[c0:c1, 0], Y[r0:r1, 0])
        else:
            cp.cublas.gemm("N", "N", A, V[c0:c1], out=Y[r0:r1], beta=1.0)
    cp.cuda.get_current_stream().synchronize()          # the record times the work, not its launch
    group.passes.add(PassRecord("matmat", len(layout.keys), group.matrix_nbytes, 0, time.perf_counter() - t0))
    return Y


def _sum_row_partials(layout, results, shape, dtype):
    """Add each block's (rows of block row i, rows of block row j or None) partial products
    into one n x k result."""
    Y = np.zeros(shape, dtype=dtype)
    for key, (Yi, Yj) in zip(layout.keys, results):
        Y[slice(*layout.bounds(key[0]))] += Yi
        if Yj is not None:
            Y[slice(*layout.bounds(key[1]))] += Yj
    return Y


# ------------------------------------------------------------------ one-hot products
def _label_sum_task(bundle, key, name, li, lj, k, mirror):
    return kernels.label_sum_block(bundle[name], li, lj, k, mirror=mirror)


def label_sums(group: BlockGroup, name: str, labels: np.ndarray, n_labels: int):
    """A @ S for the group's matrix ``name`` and the n x k one-hot S of ``labels``
    (S_jc = 1 where labels_j = c): column c of the result sums A's columns labelled c.

    One read of A; each task sends b x k numbers per block row it touches (as
    :func:`matmat`), accumulated in float64.  Blocks whose columns come in runs of equal
    labels stream at matvec speed; unordered labels go through a tiled kernel that costs
    1.5 to 2.5 matvecs (``kernels.label_sum_block``; graphs/symnmf_convergence.py).
    """
    layout = group.layout
    labels = np.asarray(labels, dtype=np.int64).reshape(layout.n)

    def args(key):
        li, lj = row_slices(layout, labels, key)
        return (name, li, lj, int(n_labels), layout.symmetric and key[0] != key[1])

    results = group.map_blocks(_label_sum_task, args, reads=[name], writes=[], name="label_sums")
    return _sum_row_partials(layout, results, (layout.n, int(n_labels)), np.float64)


# ------------------------------------------------------------------ reductions
def _diag_task(bundle, key, name):
    if key[0] != key[1]:
        return None
    return array_module(bundle[name]).diagonal(bundle[name]).copy()


def diagonal(group: BlockGroup, name: str):
    """The diagonal of matrix ``name`` (tasks on off-diagonal blocks return nothing)."""
    results = group.map_blocks(_diag_task, lambda k: (name,), reads=[name], writes=[], name="diag")
    return np.concatenate([r for r in results if r is not None])


def _stats_task(bundle, key, name, weight):
    return kernels.block_stats(bundle[name], weight)


def summary(group: BlockGroup, name: str):
    """sum, Frobenius norm, min and max of matrix ``name`` in one pass."""
    layout = group.layout
    res = np.stack(group.map_blocks(_stats_task, lambda k: (name, _weight(layout, k)), reads=[name],
                                    writes=[], name="summary"))
    return {"sum": float(res[:, 0].sum()), "fro": float(np.sqrt(res[:, 1].sum())),
            "min": float(res[:, 2].min()), "max": float(res[:, 3].max())}


def _shifted_copy_task(bundle, key, src, dst, shift):
    bundle[dst] = bundle[src] + bundle[src].dtype.type(shift)


def shifted_copy(group: BlockGroup, src: str, dst: str, shift: float):
    """dst = src + shift * 1 1^T (e.g. Q = P + E_n), one read and one write."""
    group.map_blocks(_shifted_copy_task, lambda k: (src, dst, shift), reads=[src], writes=[dst],
                     name="shifted_copy")


def _assemble(layout, A, blocks_by_key):
    """Fill the n x n ``A`` from (key, block) pairs, mirroring a symmetric layout's upper blocks."""
    for key, blk in blocks_by_key:
        ri, ci = slice(*layout.bounds(key[0])), slice(*layout.bounds(key[1]))
        A[ri, ci] = blk
        if layout.symmetric and key[0] != key[1]:
            A[ci, ri] = blk.T
    return A


def _full_assemble(group, name):
    layout = group.layout
    A = np.empty((layout.n, layout.n), group.dtype)
    return _assemble(layout, A, ((key, to_host(group.block(name, key))) for key in layout.keys))


def _read_block_task(bundle, key, name):
    return bundle[name]


def dense(group: BlockGroup, name: str):
    """Matrix ``name`` as one n x n array where its blocks compute (a CuPy array for device
    blocks, on the GPU), in the group's dtype: one pass, recorded as one.  For solvers that
    go dense on small n (cheaper than forming it by a product with the identity, an n^3
    GEMM).  It holds n^2 numbers of the group's dtype in this process (or on the GPU)
    beside the blocks: only for an n whose dense matrix is meant to be formed."""
    layout = group.layout
    if name not in group.names:
        raise InputValueError(f"dense reads matrix {name!r}, which the group does not hold")
    if group.device == "cuda":
        import time

        from .device import cupy
        from .engine import PassRecord

        cp = cupy()
        t0 = time.perf_counter()
        A = _assemble(layout, cp.empty((layout.n, layout.n), group.dtype),
                      ((key, group.block(name, key)) for key in layout.keys))
        cp.cuda.get_current_stream().synchronize()
        group.passes.add(PassRecord("dense", len(layout.keys), group.matrix_nbytes, 0, time.perf_counter() - t0))
        return A
    results = group.map_blocks(_read_block_task, lambda k: (name,), reads=[name], writes=[], name="dense")
    return _assemble(layout, np.empty((layout.n, layout.n), group.dtype), zip(layout.keys, results))


# ------------------------------------------------------------------ graph components
def _components_task(bundle, key, name, threshold, t_rows, t_cols):
    block = bundle[name]
    if t_rows is None:
        return block_component_edges(to_host(block > threshold))
    xp = array_module(block)
    t_rows, t_cols = xp.asarray(t_rows, block.dtype), xp.asarray(t_cols, block.dtype)
    return block_component_edges(to_host((block > t_rows[:, None]) & (block > t_cols[None, :])))


# Entries of a block's mask whose edges are listed at once: a dense strip's nonzero
# indices (16 bytes an edge) stay at 16 MB, where a whole 4096^2 block's would be 270 MB.
MASK_STRIP_ENTRIES = 1 << 20


def block_component_edges(mask):
    """Edges that join each node of a bipartite block graph (rows x columns of the
    boolean ``mask``) to its block-local component root, the smallest node of its
    component: at most b_i + b_j edges, whatever the density.  Node ids: rows
    0..b_i-1, then columns b_i..  The mask is read in strips of rows, each reduced to
    such edges before the next, so memory stays O(b_i + b_j) beyond one strip's edges."""
    bi, bj = mask.shape
    step = max(1, MASK_STRIP_ENTRIES // max(bj, 1))
    sources, targets = [], []
    for a in range(0, bi, step):
        r, c = np.nonzero(mask[a:a + step])
        idx, root = _component_roots(r + a, bi + c, bi + bj)
        sources.append(idx)
        targets.append(root)
    if not sources:                                 # no rows: no edges
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(sources) == 1:
        return sources[0], targets[0]
    return _component_roots(np.concatenate(sources), np.concatenate(targets), bi + bj)


def _component_roots(u, v, nodes):
    """The nodes an edge (u_k, v_k) touches, each with the smallest touched node of its
    component."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    g = coo_matrix((np.ones(len(u), np.int8), (u, v)), shape=(nodes, nodes))
    _, lab = connected_components(g, directed=False)
    touched = np.zeros(nodes, bool)
    touched[u] = True
    touched[v] = True
    idx = np.flatnonzero(touched)
    _, first = np.unique(lab[idx], return_index=True)
    root_of = np.empty(lab.max() + 1 if len(lab) else 0, np.int64)
    root_of[lab[idx[first]]] = idx[first]
    return idx, root_of[lab[idx]]


def join_component_edges(n, tiles):
    """Component labels 0..c-1 (numbered by first appearance) of n nodes from the
    edges of :func:`block_component_edges` for tiles ``(r0, c0, b_i, idx, root)``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rows, cols = [], []
    for r0, c0, bi, idx, root in tiles:
        def glob(local):
            return np.where(local < bi, r0 + local, c0 + local - bi)

        rows.append(glob(idx))
        cols.append(glob(root))
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    g = coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(n, n))
    _, labels = connected_components(g, directed=False)
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first)
    relabel = np.empty_like(order)
    relabel[order] = np.arange(len(order))
    return relabel[labels]


def threshold_components(group: BlockGroup, name: str, threshold):
    """Connected components of the graph with an edge (i, j) where A_ij > threshold, A
    the matrix ``name``; ``threshold`` is a number or a length-n vector of per-node
    thresholds t, and then the edge needs A_ij > max(t_i, t_j) (it clears both ends').

    One pass; each task sends O(b) edges, the client joins them.  Returns labels
    0..c-1 (numbered by first appearance).
    """
    layout = group.layout
    t = np.asarray(threshold, dtype=np.float64)
    if t.ndim == 0:
        def args(key):
            return (name, float(t), None, None)
    else:
        if t.shape != (layout.n,):
            raise InputValueError(f"threshold must be a number or a vector of length {layout.n}; got "
                                  f"shape {t.shape}")

        def args(key):
            return (name, None) + row_slices(layout, t, key)
    results = group.map_blocks(_components_task, args, reads=[name], writes=[], name="components")
    return join_component_edges(layout.n, [
        (layout.bounds(key[0])[0], layout.bounds(key[1])[0], layout.size(key[0]), idx, root)
        for key, (idx, root) in zip(layout.keys, results)])
