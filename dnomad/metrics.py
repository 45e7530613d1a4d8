"""Clustering scores and NOMAD's constraint residuals."""
from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import comb


def _contingency(labels_true, labels_pred):
    _, t = np.unique(np.asarray(labels_true), return_inverse=True)
    _, p = np.unique(np.asarray(labels_pred), return_inverse=True)
    C = np.zeros((t.max() + 1, p.max() + 1), np.int64)
    np.add.at(C, (t, p), 1)
    return C


def adjusted_rand_score(labels_true, labels_pred):
    """Adjusted Rand index (Hubert & Arabie, 1985): 1 for identical partitions."""
    C = _contingency(labels_true, labels_pred)
    n = C.sum()
    sum_comb = comb(C, 2).sum()
    a = comb(C.sum(1), 2).sum()
    b = comb(C.sum(0), 2).sum()
    expected = a * b / comb(n, 2)
    maximum = (a + b) / 2
    if maximum == expected:
        return 1.0
    return float((sum_comb - expected) / (maximum - expected))


def clustering_accuracy(labels_true, labels_pred):
    """Fraction of points correctly grouped under the best one-to-one matching of
    clusters (Hungarian algorithm)."""
    C = _contingency(labels_true, labels_pred)
    r, c = linear_sum_assignment(-C)
    return float(C[r, c].sum() / C.sum())


def nonnegativity_residuals(Q):
    """(RMSE of [Q]_- over its negative entries, |min Q|, ||[Q]_-||_F / ||Q||_F) of a dense Q."""
    Q = np.asarray(Q)
    neg = Q[Q < 0]
    rmse = float(np.sqrt(np.mean(neg ** 2))) if neg.size else 0.0
    return rmse, float(max(0.0, -Q.min())), float(np.linalg.norm(neg) / np.linalg.norm(Q))
