"""The bullseye score and its geodesic distances against brute-force computations."""
import itertools
import math

import numpy as np
import pytest

from dnomad.metrics import bullseye_score, geodesic_distances, knn_graph, nomad_graph


def brute_knn_geodesics(X, k):
    """Geodesic distances on the symmetric kNN graph by explicit loops and Floyd-Warshall."""
    n = len(X)
    E = np.array([[math.dist(X[i], X[j]) for j in range(n)] for i in range(n)])
    G = np.full((n, n), np.inf)
    np.fill_diagonal(G, 0.0)
    for i in range(n):
        for j in sorted(range(n), key=lambda j: E[i, j])[1:k + 1]:
            G[i, j] = G[j, i] = E[i, j]
    for m in range(n):
        for i in range(n):
            for j in range(n):
                G[i, j] = min(G[i, j], G[i, m] + G[m, j])
    return G


def brute_bullseye(A, B, percentile):
    pairs = list(itertools.combinations(range(len(A)), 2))
    m = math.ceil(percentile / 100 * len(pairs))
    near_a = set(sorted(pairs, key=lambda p: A[p])[:m])
    near_b = set(sorted(pairs, key=lambda p: B[p])[:m])
    return len(near_a & near_b) / m


def test_bullseye_equals_brute_force(rng):
    X = rng.standard_normal((25, 3))
    noisy = np.c_[X, 0.3 * rng.standard_normal((25, 4))]
    truth = brute_knn_geodesics(X, 4)
    other = brute_knn_geodesics(noisy, 4)
    np.testing.assert_allclose(geodesic_distances(knn_graph(X, 4)), truth, rtol=1e-12)
    np.testing.assert_allclose(geodesic_distances(knn_graph(noisy, 4)), other, rtol=1e-12)
    for p in (5.0, 10.0, 33.0, 100.0):
        score = bullseye_score(truth, other, p)
        assert score == pytest.approx(brute_bullseye(truth, other, p), abs=1e-15)
    assert 0 < bullseye_score(truth, other, 10.0) < 1
    assert bullseye_score(truth, truth, 10.0) == 1.0
    assert bullseye_score(truth, other, 100.0) == 1.0


def test_nomad_graph_distances_on_the_support_of_q(rng):
    """Edges only where Q is positive, weighted Q_ii + Q_jj - 2 Q_ij; blocks of Q are
    components (inf between them)."""
    Y = np.zeros((8, 2))
    Y[:4, 0] = rng.random(4) + 0.5
    Y[4:, 1] = rng.random(4) + 0.5
    Q = Y @ Y.T
    G = nomad_graph(Q, support_threshold=0.0).toarray()
    for i, j in itertools.product(range(8), repeat=2):
        same = (i < 4) == (j < 4)
        expected = Q[i, i] + Q[j, j] - 2 * Q[i, j] if same and i != j else 0.0
        assert G[i, j] == pytest.approx(expected, abs=1e-15)
    D = geodesic_distances(nomad_graph(Q))
    assert np.isinf(D[:4, 4:]).all() and np.isfinite(D[:4, :4]).all()


def test_bullseye_checks_its_input():
    with pytest.raises(ValueError, match="same shape"):
        bullseye_score(np.zeros((3, 3)), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="percentile"):
        bullseye_score(np.zeros((3, 3)), np.zeros((3, 3)), 0)
    with pytest.raises(ValueError, match="n_neighbors"):
        knn_graph(np.zeros((3, 2)), 3)
