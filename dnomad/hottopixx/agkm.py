"""AGKM: the separable NMF algorithm of Arora, Ge, Kannan and Moitra (STOC 2012), as
Bittorf et al. (NIPS 2012) state it in their Alg. 1 and run it as their baseline (Sec. 5).

X is f x n with rows on the simplex, X = F W + Delta with W's rows alpha-robustly
simplicial (each at l1 distance >= alpha from the convex hull of the others) and
||Delta||_{inf,1} <= epsilon.  Unlike HOTTOPIXX it must be told epsilon and alpha:

1. D_jk = ||X_j - X_k||_1 for all pairs (O(f^2 n));
2. for each row k, N_k = the rows at least 5 epsilon / alpha + 2 epsilon away from X_k,
   and delta_k = the l1 distance from X_k to conv{X_j : j in N_k} (one LP per row);
3. R = {k : delta_k > 2 epsilon}: rows far from the hull of the rows far from them;
4. rows of R within 10 epsilon / alpha + 6 epsilon of each other form one cluster (the
   transitive closure of that relation: Alg. 1 line 8 names the pairs, and a cluster is
   a connected set of them); one row per cluster is a hott row (here the row of the
   cluster farthest from its N_k's hull, delta_k largest);
5. F = argmin_Z ||X - Z W||_{inf,1} (Alg. 1 line 10; :func:`.solver.fit_components` fits
   it, as for HOTTOPIXX, which is how the paper compared the two).

The number of hott rows is an output, not an input: with epsilon and alpha outside
Theorem 2.3's range (epsilon <= alpha^2 / (20 + 13 alpha)) it can differ from the rank.
A row at distance 0 from X_k (a duplicate) is never in N_k, so that epsilon = 0 (exact
separable data) works: the hott rows and their duplicates are then the rows outside the
hull of all rows different from them, and duplicates fall into one cluster.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from .._checks import check_numbers
from ..errors import InputValueError
from ..metrics import l1_distance_to_hull


@dataclass
class AgkmResult:
    """hott_rows: one row index per cluster of R, in increasing order; clusters: the rows
    of each cluster; delta: delta_k for every row (inf where N_k is empty); far, merge:
    the two radii 5 eps / alpha + 2 eps and 10 eps / alpha + 6 eps."""

    hott_rows: np.ndarray
    clusters: list
    delta: np.ndarray
    far: float
    merge: float


def agkm_radii(epsilon, alpha):
    """AGKM's two radii (Alg. 1): rows at l1 distance >= ``far`` from row k form N_k, whose
    hull row k is tested against; rows of R within ``merge`` of each other share a cluster."""
    return 5 * epsilon / alpha + 2 * epsilon, 10 * epsilon / alpha + 6 * epsilon


def agkm(X, epsilon, alpha):
    """Alg. 1 (AGKM) on X (f x n, nonnegative rows summing to 1) with the noise level
    ``epsilon`` >= 0 and the robust-simplicial constant ``alpha`` > 0; returns an
    :class:`AgkmResult`."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise InputValueError(f"X must be f x n with f >= 2 rows; got shape {X.shape}")
    if not np.isfinite(X).all() or (X < 0).any():
        raise InputValueError("X must be finite and nonnegative")
    given = SimpleNamespace(epsilon=epsilon, alpha=alpha)
    check_numbers(given, ["epsilon"], positive=False)
    check_numbers(given, ["alpha"], positive=True)       # the hott rows' robust-simplicial constant
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial.distance import cdist

    f = X.shape[0]
    D = cdist(X, X, "cityblock")
    far, merge = agkm_radii(epsilon, alpha)
    delta = np.full(f, np.inf)
    for k in range(f):
        away = np.flatnonzero((D[k] >= far) & (D[k] > 0))
        if len(away):
            delta[k] = l1_distance_to_hull(X[k], X[away])
    R = np.flatnonzero(delta > 2 * epsilon)
    if len(R) == 0:
        return AgkmResult(np.array([], dtype=np.int64), [], delta, far, merge)
    n_clusters, label = connected_components(D[np.ix_(R, R)] <= merge, directed=False)
    clusters = [R[label == c] for c in range(n_clusters)]
    hott = np.sort([members[np.argmax(delta[members])] for members in clusters])
    return AgkmResult(hott.astype(np.int64), clusters, delta, far, merge)
