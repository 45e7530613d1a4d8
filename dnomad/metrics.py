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


def inf1_norm(A):
    """||A||_{inf,1}: the largest l1 norm of a row (Bittorf et al.'s error norm)."""
    A = np.asarray(A)
    return float(np.abs(A).sum(axis=1).max()) if A.size else 0.0


def l1_distance_to_hull(x, V):
    """min ||x - lambda^T V||_1 over lambda on the simplex (an LP, scipy HiGHS)."""
    from scipy.optimize import linprog

    V = np.atleast_2d(np.asarray(V, dtype=np.float64))
    m, n = V.shape
    # Variables: lambda (m), e (n) with -e <= x - V^T lambda <= e.
    c = np.r_[np.zeros(m), np.ones(n)]
    A_ub = np.block([[-V.T, -np.eye(n)], [V.T, -np.eye(n)]])
    b_ub = np.r_[-x, x]
    A_eq = np.r_[np.ones(m), np.zeros(n)][None]
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[1.0], bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"LP for the l1 distance to a hull failed: {res.message}")
    return float(res.fun)


def robust_simplicial_constant(W):
    """alpha of Bittorf et al., Def. 2.1: the smallest l1 distance from a row of W to the
    convex hull of the other rows (0 when one lies in the hull of the others)."""
    W = np.asarray(W, dtype=np.float64)
    return min(l1_distance_to_hull(W[i], np.delete(W, i, axis=0)) for i in range(len(W)))
