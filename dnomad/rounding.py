"""Lloyd's k-means on the rows of a thin matrix: the rounding step that turns a relaxed
solution (an embedding, the factor U of Z = U U^T) into group labels."""
from __future__ import annotations

import numpy as np


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
            sums = np.zeros_like(C)
            np.add.at(sums, lab, Y)
            newC = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C)
            if np.allclose(newC, C):
                break
            C = newC
        inertia = float(np.min(dist2(C), axis=1).sum())
        if inertia < best_inertia:
            best, best_inertia = np.argmin(dist2(C), axis=1), inertia
    return best


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
