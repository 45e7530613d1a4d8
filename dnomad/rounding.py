"""Rounding: hard labels from a relaxed solution.  Lloyd's k-means on the rows of a thin
matrix (an embedding, the factor U of Z = U U^T), the connected components of a NOMAD
solution Q, and normalized spectral clustering of Q as an affinity."""
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


def spectral_labels(Q, n_clusters, random_state=None, *, tol=1e-8):
    """``n_clusters`` labels of a nonnegative affinity Q by normalized spectral clustering
    (Ng, Jordan & Weiss 2002): the top ``n_clusters`` eigenvectors of D^-1/2 Q D^-1/2
    (D = diag(Q 1)), rows scaled to unit length, then k-means.

    Q is a :class:`dnomad.linalg.SymmetricOperator` (a BlockMatrix: one pass for the
    degrees and one per Lanczos product; nothing n x n beyond Q's blocks), a
    LowRankGram Q = Y Y^T (the exact thin SVD of D^-1/2 Y: two products with Y, O(n r^2)),
    or a dense array.  For NOMAD's Q the degrees are 1 up to the row-sum constraint's
    residual, so this is the spectral clustering of Q itself, and on Q's exact solution for
    separated groups (block diagonal) it returns the groups.  Unlike the components of Q,
    it returns exactly ``n_clusters`` groups whatever K was, and it splits manifolds that
    touch at a few points, where a band of Q links them weakly.
    """
    n = int(Q.shape[0])
    if not isinstance(n_clusters, (int, np.integer)) or not 2 <= n_clusters < n:
        raise InputValueError(f"n_clusters must be an integer in [2, {n}) (n = {n} points); got {n_clusters!r}")
    if isinstance(Q, np.ndarray):
        dense = np.asarray(Q, dtype=np.float64)
        matmat = dense.__matmul__
    else:
        matmat = Q.matmat
    degrees = np.asarray(matmat(np.ones((n, 1))), dtype=np.float64).ravel()
    floor = MIN_DEGREE_FRACTION * max(float(degrees.mean()), np.finfo(float).tiny)
    scale = 1.0 / np.sqrt(np.maximum(degrees, floor))
    if isinstance(Q, LowRankGram):
        U, _, _ = np.linalg.svd(Q.Y * scale[:, None], full_matrices=False)
        V = U[:, :n_clusters]
    else:
        _, V = top_eigenvectors(lambda W: scale[:, None] * np.asarray(matmat(scale[:, None] * W)), n,
                                n_clusters, tol=tol)
    norms = np.linalg.norm(V, axis=1, keepdims=True)
    V = V / np.where(norms > 0, norms, 1.0)
    return kmeans_rows(V, n_clusters, random_state)
