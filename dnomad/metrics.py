"""Clustering scores and NOMAD's constraint residuals."""
from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import comb

from .errors import LPFailedError
from .linalg.lp import HIGHS_METHODS, linprog_highs


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


def l1_fits(X, V, *, simplex=False, methods=HIGHS_METHODS):
    """For each row x of X: lambda = argmin ||x - lambda^T V||_1 over lambda >= 0 (on the
    simplex sum(lambda) = 1 with ``simplex``), and its value; one LP a row (scipy HiGHS,
    the ``methods`` in turn where one fails, see :func:`dnomad.linalg.lp.linprog_highs`).
    Returns (Lambda (rows of X x rows of V), values); raises
    :class:`dnomad.errors.LPFailedError` where every method fails on a row."""
    from scipy.sparse import csr_matrix, hstack, identity, vstack

    V = np.atleast_2d(np.asarray(V, dtype=np.float64))
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    m, n = V.shape
    # Variables: lambda (m) and the residual's parts e+, e- (n each), with
    # V^T lambda - e+ + e- = x: n equality rows where |x - V^T lambda| <= e takes 2n
    # inequalities (AGKM, one LP a row: 20 -> 11 s at f = 80, n = 800); sparse, as dense
    # identity blocks would be most of HiGHS's time at n = 800.
    c = np.r_[np.zeros(m), np.ones(2 * n)]
    eye = identity(n, format="csr")
    A_eq = hstack([csr_matrix(V.T), -eye, eye], format="csr")
    if simplex:
        A_eq = vstack([A_eq, csr_matrix(np.r_[np.ones(m), np.zeros(2 * n)][None])], format="csr")
    Lam, values = np.zeros((len(X), m)), np.zeros(len(X))
    for i, x in enumerate(X):
        res = linprog_highs(c, A_eq=A_eq, b_eq=np.r_[x, 1.0] if simplex else x, bounds=(0, None),
                            methods=methods)
        if res.status != 0:
            raise LPFailedError(f"the l1 fit of row {i} ({'on the simplex' if simplex else 'nonnegative'}) "
                                f"failed: {res.message}")
        Lam[i], values[i] = res.x[:m], res.fun
    return Lam, values


def l1_distance_to_hull(x, V):
    """min ||x - lambda^T V||_1 over lambda on the simplex (an LP, scipy HiGHS)."""
    return float(l1_fits(x, V, simplex=True)[1][0])


def robust_simplicial_constant(W):
    """alpha of Bittorf et al., Def. 2.1: the smallest l1 distance from a row of W to the
    convex hull of the other rows (0 when one lies in the hull of the others)."""
    W = np.asarray(W, dtype=np.float64)
    return min(l1_distance_to_hull(W[i], np.delete(W, i, axis=0)) for i in range(len(W)))


# ------------------------------------------------------------------ geodesic distances
def knn_graph(X, n_neighbors):
    """The symmetric k-nearest-neighbour graph of the rows of X (i ~ j when either is
    among the other's ``n_neighbors`` nearest), weighted by Euclidean distance; a
    scipy.sparse CSR matrix."""
    from scipy.sparse import coo_matrix
    from scipy.spatial import cKDTree

    X = np.asarray(X, dtype=np.float64)
    n = len(X)
    if not isinstance(n_neighbors, (int, np.integer)) or not 1 <= n_neighbors < n:
        raise ValueError(f"n_neighbors must be an integer in [1, {n - 1}]; got {n_neighbors!r}")
    dist, idx = cKDTree(X).query(X, k=n_neighbors + 1)
    rows = np.repeat(np.arange(n), n_neighbors)
    cols, w = idx[:, 1:].ravel(), dist[:, 1:].ravel()
    G = coo_matrix((w, (rows, cols)), shape=(n, n)).tocsr()
    return G.maximum(G.T)


def nomad_graph(Q, support_threshold=0.01):
    """NOMAD's neighbourhood graph (Sec. 3.2): i ~ j where Q_ij > ``support_threshold``
    max(Q) (the support of Q), weighted by the distance Q_ii + Q_jj - 2 Q_ij.  Q dense."""
    from scipy.sparse import csr_matrix

    Q = np.asarray(Q, dtype=np.float64)
    d = np.diag(Q)
    W = d[:, None] + d[None, :] - 2 * Q
    mask = Q > support_threshold * Q.max()
    np.fill_diagonal(mask, False)
    # A zero-length edge would vanish from a sparse graph: keep it as the smallest float.
    W = np.where(mask, np.maximum(W, np.finfo(np.float64).tiny), 0.0)
    return csr_matrix(W)


def geodesic_distances(graph):
    """All shortest-path lengths of a weighted undirected graph (Dijkstra); inf between
    components."""
    from scipy.sparse.csgraph import shortest_path

    return shortest_path(graph, method="D", directed=False)


def bullseye_score(distances_true, distances, percentile=10.0):
    """The bullseye score of Tepper et al. (Sec. 3.2, Fig. 10): the fraction of the point
    pairs among the nearest ``percentile`` percent by the true (geodesic) distances that
    are also among the nearest ``percentile`` percent by ``distances``.

    Both are n x n symmetric matrices over the same points; the pairs i < j are ranked
    (inf, i.e. disconnected, last; ties broken by pair order) and the first
    ceil(percentile / 100 * n (n - 1) / 2) of each ranking compared.  1 is a perfect
    preservation of the nearest pairs; a random ordering scores about percentile / 100.
    """
    A = np.asarray(distances_true, dtype=np.float64)
    B = np.asarray(distances, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape != B.shape:
        raise ValueError(f"distances must be two n x n matrices of the same shape; got {A.shape} and {B.shape}")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100]; got {percentile!r}")
    iu = np.triu_indices(len(A), 1)
    a, b = A[iu], B[iu]
    m = int(np.ceil(percentile / 100.0 * len(a)))
    top_a = np.argsort(a, kind="stable")[:m]
    top_b = np.argsort(b, kind="stable")[:m]
    return float(len(np.intersect1d(top_a, top_b, assume_unique=True)) / m)
