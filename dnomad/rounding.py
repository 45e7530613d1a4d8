"""Rounding: hard labels from a relaxed solution.  Lloyd's k-means on the rows of a thin
matrix (an embedding, the factor U of Z = U U^T), in memory or over row chunks, the
connected components of a NOMAD solution Q, and normalized spectral clustering of Q as an
affinity, also of Q = Y Y^T with Y left in row chunks (with its embedding)."""
from __future__ import annotations

import numpy as np
from scipy import sparse

from .blocks.operators import LowRankGram
from .errors import InputValueError
from .linalg import top_eigenvectors


def kmeans_rows(Y, k, random_state=None, *, n_init=10, max_iter=300, init=None):
    """Labels of the rows of Y (n x r) by Lloyd's k-means, the best of ``n_init``
    greedy k-means++ seedings (plus ``init``, a k x r array of starting centres, when given).
    Distances through ||y||^2 - 2 y.c + ||c||^2: O(n k) memory."""
    Y = np.asarray(Y, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    norms = np.einsum("ij,ij->i", Y, Y)

    def dist2(C):
        return np.maximum(norms[:, None] - 2.0 * (Y @ C.T) + np.einsum("ij,ij->i", C, C)[None], 0.0)

    trials = 2 + int(np.log(k))

    def seed():
        """Greedy k-means++ (Arthur & Vassilvitskii; ``trials`` candidates per centre, the
        one that lowers the potential most kept, as scikit-learn's)."""
        centers = [Y[rng.integers(len(Y))]]
        d2 = dist2(np.array(centers))[:, 0]
        for _ in range(1, k):
            total = d2.sum()
            if total <= 0:
                centers.append(Y[rng.integers(len(Y))])
                continue
            picks = rng.choice(len(Y), size=trials, p=d2 / total)
            options = np.minimum(d2[:, None], dist2(Y[picks]))
            best = int(np.argmin(options.sum(axis=0)))
            centers.append(Y[picks[best]])
            d2 = options[:, best]
        return np.array(centers)

    starts = ([np.asarray(init, dtype=np.float64)] if init is not None else []) + [None] * n_init
    best, best_inertia = None, np.inf
    for start in starts:
        C = seed() if start is None else start
        for _ in range(max_iter):
            lab = np.argmin(dist2(C), axis=1)
            counts = np.bincount(lab, minlength=k)
            sums = group_sums(lab, Y, k)
            newC = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C)
            if np.allclose(newC, C):
                break
            C = newC
        inertia = float(np.min(dist2(C), axis=1).sum())
        if inertia < best_inertia:
            best, best_inertia = np.argmin(dist2(C), axis=1), inertia
    return best


def group_sums(labels, Y, k):
    """The k x r sums of the rows of Y (n x r) by group (``labels`` in 0..k-1): one sparse
    product, O(n r) (np.add.at took 80% of a k-means++ start on 5,000 MNIST digits)."""
    n = len(labels)
    onehot = sparse.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
    return np.asarray(onehot @ Y)


# Default of ``component_labels``' fraction: on the exact SDP solution any value in (0, 1)
# gives the groups; on conditional-gradient iterates stopped by the authors' rule the
# Frank-Wolfe residue between planted blobs of sizes up to 20:1 reached 0.17 of the
# larger diagonal and the weakest link inside a group held above 0.76 of it (blobs and
# two rings, tests/test_nomad.py), so 0.5 sits in the middle of that window.
COMPONENT_FRACTION = 0.5


def component_labels(Q, fraction=COMPONENT_FRACTION):
    """Hard labels from a NOMAD solution Q: connected components of the graph with an edge
    (i, j) where Q_ij > fraction * max(Q_ii, Q_jj).

    Q is any :class:`dnomad.linalg.SymmetricOperator` (its ``diag()`` and
    ``threshold_components(t)`` with per-node thresholds t, an edge needing
    Q_ij > max(t_i, t_j)): a BlockMatrix (one pass over the diagonal blocks, one over Q)
    or a LowRankGram (tiles of Y Y^T).  The rule reads Q_ij against each
    end's own self-affinity, so it does not change when Q is scaled, and on the SDP's
    solution for separated groups (Q block diagonal, entries 1 / |group|) it returns the
    groups whatever their sizes; a threshold relative to max(Q) instead cuts every group
    more than 1 / fraction times the smallest into singletons.  Since Q is PSD,
    Q_ij <= sqrt(Q_ii Q_jj) <= max(Q_ii, Q_jj): an edge is a pair whose affinity is at
    least ``fraction`` of the larger self-affinity.  With K larger than the number of
    groups, Q is a band along each manifold and the components are the manifolds
    (chains of overlapping neighbourhoods).  Labels are numbered 0..c-1 by first
    appearance.
    """
    d = np.clip(np.asarray(Q.diag(), dtype=np.float64), 0.0, None)
    return Q.threshold_components(fraction * d)


# Degrees below this fraction of the mean count as this fraction: a row of an iterate
# with (almost) no mass would otherwise get an unbounded weight D^-1/2.
MIN_DEGREE_FRACTION = 1e-6


def _degree_floor(mean_degree):
    return MIN_DEGREE_FRACTION * max(float(mean_degree), np.finfo(float).tiny)


def spectral_labels(Q, n_clusters, random_state=None, *, tol=1e-8):
    """``n_clusters`` labels of a nonnegative affinity Q by normalized spectral clustering
    (Ng, Jordan & Weiss 2002): the top ``n_clusters`` eigenvectors of D^-1/2 Q D^-1/2
    (D = diag(Q 1)), rows scaled to unit length, then k-means.

    Q is a :class:`dnomad.linalg.SymmetricOperator` (a BlockMatrix: one pass for the
    degrees and one per Lanczos product; nothing n x n beyond Q's blocks), a
    LowRankGram Q = Y Y^T (:func:`low_rank_spectral_labels`: from the r x r Gram of
    D^-1/2 Y, O(n r^2)), or a dense array.  For NOMAD's Q the degrees are 1 up to the
    row-sum constraint's residual, so this is the spectral clustering of Q itself, and on
    Q's exact solution for
    separated groups (block diagonal) it returns the groups.  Unlike the components of Q,
    it returns exactly ``n_clusters`` groups whatever K was, and it splits manifolds that
    touch at a few points, where a band of Q links them weakly.  Groups are numbered by
    first appearance.
    """
    n = int(Q.shape[0])
    if not isinstance(n_clusters, (int, np.integer)) or not 2 <= n_clusters < n:
        raise InputValueError(f"n_clusters must be an integer in [2, {n}) (n = {n} points); got {n_clusters!r}")
    if isinstance(Q, np.ndarray):
        dense = np.asarray(Q, dtype=np.float64)
        matmat = dense.__matmul__
    else:
        matmat = Q.matmat
    if not isinstance(Q, LowRankGram):
        degrees = np.asarray(matmat(np.ones((n, 1))), dtype=np.float64).ravel()
        scale = 1.0 / np.sqrt(np.maximum(degrees, _degree_floor(degrees.mean())))
    if isinstance(Q, LowRankGram):
        from .blocks import RowState

        with RowState(n) as space:
            space.put("Y", Q.Y)
            return low_rank_spectral_labels(space, "Y", n_clusters, random_state)
    _, V = top_eigenvectors(lambda W: scale[:, None] * np.asarray(matmat(scale[:, None] * W)), n,
                            n_clusters, tol=tol)
    norms = np.linalg.norm(V, axis=1, keepdims=True)
    V = V / np.where(norms > 0, norms, 1.0)
    return numbered_by_appearance(kmeans_rows(V, n_clusters, random_state))


def numbered_by_appearance(labels):
    """``labels`` renamed 0, 1, ... in the order the groups first appear (so that the
    same partition found by different k-means runs reads the same)."""
    labels = np.asarray(labels)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.ravel()]


# Rows the seeding clusters in this process (k-means++ and Lloyd's iterations on them,
# the best of kmeans_rows' seedings): all of X below it, a uniform sample above.
SEED_SAMPLE_ROWS = 20000
LLOYD_MAX_ITER = 300


def kmeans_partition(data, K, random_state=None, *, max_iter=LLOYD_MAX_ITER, x_state=None, init=None):
    """Labels (n,) of the rows of ``data`` (a :class:`dnomad.blocks.RowChunks` or RowState) by
    k-means: :func:`dnomad.rounding.kmeans_rows` on min(n, SEED_SAMPLE_ROWS) rows drawn
    uniformly (``init``: K starting centres it tries beside its seedings), then Lloyd's
    iterations over every row until no label changes (or ``max_iter``).  Costs one pass
    to draw the sample and one per iteration (O(n d K) each); the client holds the
    sample and K centres.  A centre left without rows keeps its place.  ``x_state``: the
    rows are that state of the chunks (e.g. X's sketch)."""
    rng = np.random.default_rng(random_state)
    n = data.n
    picked = np.zeros((n, 1), dtype=bool)
    picked[rng.choice(n, min(n, SEED_SAMPLE_ROWS), replace=False)] = True
    data.put("kmeans_pick", picked)
    sample = np.concatenate(data.map(_picked_rows, x_state=x_state), axis=0)
    data.drop("kmeans_pick")
    seed = kmeans_rows(sample, K, rng, init=init)
    centres = np.stack([sample[seed == k].mean(axis=0) if np.any(seed == k) else sample[rng.integers(len(sample))]
                        for k in range(K)])
    data.put("kmeans_labels", np.full((n, 1), -1, dtype=np.int64))
    for _ in range(max_iter):
        parts = data.map(_lloyd_kernel, centres, x_state=x_state)
        sums = sum(p[0] for p in parts)
        counts = sum(p[1] for p in parts)
        changed = sum(p[2] for p in parts)
        centres = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centres)
        if changed == 0:
            break
    labels = data.get("kmeans_labels")[:, 0]
    data.drop("kmeans_labels")
    return labels


def factor_labels(space, name, K, random_state=0, method="kmeans"):
    """Labels (n,) of a K-means SDP factor U (Z = U U^T), the state ``name`` of a row
    space (a :class:`dnomad.blocks.RowChunks` or RowState), with U left where it is.
    Lemma 1 of the Riemannian K-means paper: at the optimum in the exact-recovery regime
    rows of one group coincide and rows of different groups are orthogonal, so K
    representatives picked by farthest-point traversal (from the row of largest norm; K
    passes over U, O(n r) each) label every row by the nearest one (``method=
    "farthest"``, one more pass).  Off that regime (real data) the rows spread and
    k-means rounds far better: ``"kmeans"`` (the default) is :func:`kmeans_partition` on
    U's rows with the representatives as one more seeding.  Groups are numbered by first
    appearance; the client holds K rows of U (and k-means' sample)."""
    if method not in ("kmeans", "farthest"):
        raise InputValueError(f"method must be 'kmeans' or 'farthest'; got {method!r}")
    reps = []
    try:
        for _ in range(K):
            found = space.map(_farthest_row, reps[-1] if reps else None, x_state=name)
            reps.append(max(found, key=lambda f: f[0])[1])        # the first chunk's on a tie: np.argmax's
    finally:
        space.drop("_farthest_d2")
    reps = np.array(reps)
    if method == "kmeans":
        labels = kmeans_partition(space, K, random_state, x_state=name, init=reps)
    else:
        labels = np.concatenate(space.map(_nearest_row, reps, x_state=name))
    return numbered_by_appearance(labels)


def _farthest_row(chunk, rep):
    """Farthest-point traversal's step on a chunk: each row's squared distance to the
    representatives so far (``rep`` the newest; None: the first is the row of largest
    norm) and the chunk's farthest row, (its distance, its values)."""
    U = chunk["X"]
    if rep is None:
        d2 = np.einsum("ij,ij->i", U, U)
    else:
        d2 = np.sum((U - rep) ** 2, axis=1)
        if "_farthest_d2" in chunk:
            d2 = np.minimum(chunk["_farthest_d2"][:, 0], d2)
        chunk["_farthest_d2"] = d2[:, None]
    i = int(np.argmax(d2))
    return float(d2[i]), np.array(U[i])


def _nearest_row(chunk, reps):
    U = chunk["X"]
    return np.argmin(np.stack([np.sum((U - rep) ** 2, axis=1) for rep in reps], axis=1), axis=1)


def _picked_rows(chunk):
    return chunk["X"][chunk["kmeans_pick"][:, 0]]


def _lloyd_kernel(chunk, centres):
    """One Lloyd step on the chunk's rows: nearest centres (kept in the chunk), and the
    per-centre sums and counts, and how many labels changed."""
    X = chunk["X"]
    d2 = -2.0 * (X @ centres.T) + np.einsum("ij,ij->i", centres, centres)[None]
    labels = np.argmin(d2, axis=1)
    changed = int(np.sum(labels != chunk["kmeans_labels"][:, 0]))
    chunk["kmeans_labels"] = labels[:, None]
    K = len(centres)
    return group_sums(labels, X, K), np.bincount(labels, minlength=K).astype(np.float64), changed


# Low-rank Q = Y Y^T with Y in the states of row chunks (on a cluster's workers or here):
# everything from r x r sums over the chunks, so Y is never gathered.
def factor_sums(space, name):
    """Y^T 1 (r,) and Y^T Y (r x r) of state ``name`` of a row space: one pass."""
    parts = space.map(_factor_sums, name, read_x=False)
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def low_rank_spectral_labels(space, name, n_clusters, random_state=None, *, sums=None):
    """:func:`spectral_labels` of Q = Y Y^T, Y the state ``name`` of a row space (a
    :class:`dnomad.blocks.RowChunks` or RowState), with Y left where it is: the degrees
    are Y (Y^T 1); Z = D^-1/2 Y has the r x r Gram Z^T Z = W S^2 W^T (a pass), so Q's
    normalized top eigenvectors are Z W_k S_k^-1, formed row by row (a pass; an
    eigenvalue of Z^T Z within round-off of 0 gives a zero column), scaled to unit rows and
    clustered by :func:`kmeans_partition` on them.  ``sums``: :func:`factor_sums` of Y,
    if already taken.  The client holds r x r and n_clusters x n_clusters numbers, and the
    labels."""
    n = space.n
    if not isinstance(n_clusters, (int, np.integer)) or not 2 <= n_clusters < n:
        raise InputValueError(f"n_clusters must be an integer in [2, {n}) (n = {n} points); got {n_clusters!r}")
    c, _ = factor_sums(space, name) if sums is None else sums
    floor = _degree_floor(float(c @ c) / n)            # the mean degree: 1^T Y Y^T 1 / n
    gram = sum(space.map(_scaled_gram, name, c, floor, read_x=False))
    w, W = np.linalg.eigh(gram)
    # The Gram's eigenvalues are exact to about r eps of the largest: those below are
    # Y's null space, whose directions round-off picks (they would differ from one
    # chunking to another), so they give zero columns.
    w, W = w[::-1][:n_clusters], W[:, ::-1][:, :n_clusters]
    kept = w > len(gram) * np.finfo(float).eps * max(float(w.max(initial=0.0)), np.finfo(float).tiny)
    directions = np.where(kept, W / np.sqrt(np.where(kept, w, 1.0)), 0.0)
    out = f"_spectral_{name}"
    space.map(_spectral_rows, name, c, floor, directions, out, read_x=False)
    try:
        return numbered_by_appearance(kmeans_partition(space, n_clusters, random_state, x_state=out))
    finally:
        space.drop(out)


def low_rank_embedding(space, name, k, out, *, sums=None):
    """The top ``k`` eigenpairs of Q = Y Y^T on the complement of 1, Y the state ``name``
    of a row space, as :func:`dnomad.linalg.top_eigenvectors` with ``deflate=1`` gives
    them, scaled: state ``out`` (n x k) is V diag(sqrt(w)), which is Y_c W for Y_c = Y -
    1 (Y^T 1)^T / n (P Q P = Y_c Y_c^T) and Y_c^T Y_c = W diag(w) W^T, an r x r problem;
    each column signed so that its entry of largest magnitude is positive.  Returns w
    (descending; zero beyond Y's rank).  Two passes over Y (one with ``sums``, Y's
    :func:`factor_sums`), a third to flip signs."""
    n = space.n
    c, G = factor_sums(space, name) if sums is None else sums
    mean = c / n
    w, W = np.linalg.eigh(G - n * np.outer(mean, mean))
    w, W = np.clip(w[::-1][:k], 0.0, None), W[:, ::-1][:, :k]
    if W.shape[1] < k:                   # k above Y's rank r: eigenvalues 0, columns 0
        w = np.concatenate([w, np.zeros(k - len(w))])
        W = np.hstack([W, np.zeros((W.shape[0], k - W.shape[1]))])
    parts = space.map(_centred_product, name, mean, W, out, read_x=False)
    magnitudes = np.stack([p[0] for p in parts])
    values = np.stack([p[1] for p in parts])
    signs = np.sign(values[np.argmax(magnitudes, axis=0), np.arange(k)])
    signs[signs == 0] = 1.0
    if np.any(signs < 0):
        space.map(_scale_columns, out, signs, read_x=False)
    return w


def _factor_sums(chunk, name):
    Y = chunk[name]
    return Y.sum(axis=0), Y.T @ Y


def _inverse_root_degrees(Y, c, floor):
    return 1.0 / np.sqrt(np.maximum(Y @ c, floor))


def _scaled_gram(chunk, name, c, floor):
    Z = chunk[name] * _inverse_root_degrees(chunk[name], c, floor)[:, None]
    return Z.T @ Z


def _spectral_rows(chunk, name, c, floor, directions, out):
    Y = chunk[name]
    U = (Y * _inverse_root_degrees(Y, c, floor)[:, None]) @ directions
    norms = np.linalg.norm(U, axis=1, keepdims=True)
    chunk[out] = U / np.where(norms > 0, norms, 1.0)


def _centred_product(chunk, name, mean, W, out):
    """State ``out`` = (Y - mean) W; per column, the largest magnitude and the entry
    that has it (for the sign rule)."""
    E = (chunk[name] - mean) @ W
    chunk[out] = E
    at = np.argmax(np.abs(E), axis=0)
    picked = E[at, np.arange(E.shape[1])]
    return np.abs(picked), picked


def _scale_columns(chunk, name, factors):
    chunk[name] = chunk[name] * factors
