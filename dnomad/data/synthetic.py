"""Seeded generators for the data sets of Tepper et al. (2018), Figs. 1, 4, 5, 8.

Each returns ``(X, y)``: X of shape (n_samples, n_features), y the ground-truth
group (or position along the manifold).  Randomness comes only from ``random_state``.
"""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError


def _check_n(n_samples, minimum=2):
    if not isinstance(n_samples, (int, np.integer)) or n_samples < minimum:
        raise InputValueError(f"n_samples must be an integer >= {minimum}; got {n_samples!r}")


def two_rings(n_samples=200, *, factor=0.5, noise=0.0, random_state=0):
    """Two concentric circles (radii 1 and ``factor``), evenly spaced (Fig. 4); odd n puts
    the extra point on the outer ring."""
    _check_n(n_samples, 4)
    n_out = n_samples - n_samples // 2
    n_in = n_samples // 2
    t_out = np.linspace(0, 2 * np.pi, n_out, endpoint=False)
    t_in = np.linspace(0, 2 * np.pi, n_in, endpoint=False)
    X = np.vstack([np.c_[np.cos(t_out), np.sin(t_out)], factor * np.c_[np.cos(t_in), np.sin(t_in)]])
    if noise:
        X = X + np.random.default_rng(random_state).normal(scale=noise, size=X.shape)
    y = np.r_[np.zeros(n_out, int), np.ones(n_in, int)]
    return X, y


def noisy_semicircles(n_samples=200, *, noise=0.05, random_state=0):
    """Two interleaved half circles with Gaussian noise (Fig. 5, "moons")."""
    _check_n(n_samples, 4)
    rng = np.random.default_rng(random_state)
    n1 = n_samples - n_samples // 2
    n2 = n_samples // 2
    t1 = np.linspace(0, np.pi, n1)
    t2 = np.linspace(0, np.pi, n2)
    X = np.vstack([np.c_[np.cos(t1), np.sin(t1)], np.c_[1 - np.cos(t2), 0.5 - np.sin(t2)]])
    X = X + rng.normal(scale=noise, size=X.shape)
    return X, np.r_[np.zeros(n1, int), np.ones(n2, int)]


def trefoil_knot(n_samples=200, *, noise=0.0, random_state=0):
    """The trefoil knot in 3-D (Fig. 1a), evenly spaced in its parameter; y is the parameter."""
    _check_n(n_samples, 4)
    t = np.linspace(0, 2 * np.pi, n_samples, endpoint=False)
    X = np.c_[np.sin(t) + 2 * np.sin(2 * t), np.cos(t) - 2 * np.cos(2 * t), -np.sin(3 * t)]
    if noise:
        X = X + np.random.default_rng(random_state).normal(scale=noise, size=X.shape)
    return X, t


def gaussian_blobs(n_samples=200, *, n_centers=6, n_features=2, separation=10.0, std=1.0,
                   random_state=0):
    """Isotropic Gaussian blobs on a grid of spacing ``separation`` (std ``std``).

    Sizes differ by at most one point; with separation / std >= 10 the blobs are far
    above the exact-recovery threshold of the K-means SDP.
    """
    _check_n(n_samples, n_centers)
    rng = np.random.default_rng(random_state)
    side = int(np.ceil(np.sqrt(n_centers)))
    grid = np.array([(i % side, i // side) for i in range(n_centers)], float) * separation
    centers = np.zeros((n_centers, n_features))
    centers[:, :2] = grid[:, : min(2, n_features)] if n_features >= 2 else grid[:, :1]
    y = np.arange(n_samples) % n_centers
    y.sort()
    X = centers[y] + rng.normal(scale=std, size=(n_samples, n_features))
    return X, y


def grid_2d(n_side=12, *, n_features=10, noise=0.05, random_state=0):
    """A regular n_side x n_side grid on the plane, embedded in ``n_features`` dimensions, the
    extra ones Gaussian noise of std ``noise`` (Fig. 8).  y holds the grid coordinates."""
    if not isinstance(n_side, (int, np.integer)) or n_side < 2:
        raise InputValueError(f"n_side must be an integer >= 2; got {n_side!r}")
    if n_features < 2:
        raise InputValueError(f"n_features must be >= 2; got {n_features}")
    rng = np.random.default_rng(random_state)
    g = np.linspace(0, 1, n_side)
    xx, yy = np.meshgrid(g, g)
    coords = np.c_[xx.ravel(), yy.ravel()]
    X = np.hstack([coords, rng.normal(scale=noise, size=(len(coords), n_features - 2))])
    return X, coords


def gmm_simplex(n_samples=500, *, n_clusters=4, gamma=1.2, n_features=None, sigma=1.0, random_state=0):
    """The Gaussian mixture (5) of Xu, Hou, Chen, Zhang: ``n_clusters`` centroids on the
    vertices of a simplex (scaled unit vectors in R^d, d = ``n_features`` >= K, default
    K) whose squared separation ||mu_j - mu_k||^2 is ``gamma`` times the threshold (6),
    Theta-bar^2 = 4 sigma^2 (1 + sqrt(1 + K d / (n log n))) log n, above which the
    K-means SDP recovers the clusters exactly (gamma > 1) and below which no method can
    (gamma < 1).  Equal cluster sizes (the first n mod K clusters one point larger);
    noise N(0, sigma^2 I).  y is the cluster."""
    K = n_clusters
    if not (isinstance(K, (int, np.integer)) and K >= 2):
        raise InputValueError(f"n_clusters must be an integer >= 2; got {n_clusters!r}")
    _check_n(n_samples, max(K, 3))
    d = K if n_features is None else n_features
    if not (isinstance(d, (int, np.integer)) and d >= K):
        raise InputValueError(f"n_features must be an integer >= n_clusters = {K}; got {n_features!r}")
    if not (gamma > 0 and sigma > 0):
        raise InputValueError(f"gamma and sigma must be > 0; got {gamma!r}, {sigma!r}")
    n = n_samples
    theta2 = 4 * sigma ** 2 * (1 + np.sqrt(1 + K * d / (n * np.log(n)))) * np.log(n)
    centers = np.zeros((K, d))
    centers[:, :K] = np.eye(K) * np.sqrt(gamma * theta2 / 2)
    y = np.sort(np.arange(n) % K)
    return centers[y] + sigma * np.random.default_rng(random_state).standard_normal((n, d)), y


DATASETS = {
    "two_rings": two_rings,
    "semicircles": noisy_semicircles,
    "trefoil": trefoil_knot,
    "blobs": gaussian_blobs,
}


def separable_nmf(n_features=40, n_samples=400, rank=3, *, duplicates=0, noise=0.0,
                  random_state=0, with_alpha=True):
    """The synthetic instances of Bittorf et al. (NIPS 2012), Sec. 5.

    ``rank`` hott topics drawn uniformly from the unit simplex in R^n_samples, each
    repeated ``duplicates`` more times; the other ``n_features - rank (duplicates + 1)``
    rows are convex combinations of the hott topics with weights uniform on the simplex;
    rows shuffled.  With ``noise`` = eta > 0, the noise is at the paper's bound: every row
    moves toward a random point u_i of the simplex, X_i <- X_i + s (u_i - X_i), with one step
    s for all rows such that the noise's (inf,1)-norm (its largest row l1 norm) is
    eps = eta alpha^2 / (20 + 13 alpha), alpha the robust-simplicial constant of the hott
    topics; X stays nonnegative with rows summing to 1.  Where eps exceeds the largest
    ||u_i - X_i||_1 (about 1, so eta = 100 on most instances) s is 1: X is the noise alone,
    with (inf,1)-norm below eps.

    Returns a dict: ``X`` (n_features x n_samples), ``hott`` (indices of the hott rows,
    one per topic, in topic order), ``copies`` (for each row, its topic, or -1), ``F``
    and ``W`` of the noiseless factorization X0 = F W, ``alpha``, ``epsilon``.
    ``with_alpha=False`` skips alpha (r LPs over n columns; None then) for noiseless
    instances too large for it.
    """
    rng = np.random.default_rng(random_state)
    f, n, r = int(n_features), int(n_samples), int(rank)
    n_hott_rows = r * (duplicates + 1)
    if r < 1 or n_hott_rows > f:
        raise InputValueError(f"need 1 <= rank and rank * (duplicates + 1) <= n_features; got rank={r}, "
                              f"duplicates={duplicates}, n_features={f}")
    from ..metrics import inf1_norm, robust_simplicial_constant

    W = rng.dirichlet(np.ones(n), size=r)
    F = np.zeros((f, r))
    topic = np.full(f, -1)
    for c in range(duplicates + 1):
        F[c * r:(c + 1) * r] = np.eye(r)
        topic[c * r:(c + 1) * r] = np.arange(r)
    F[n_hott_rows:] = rng.dirichlet(np.ones(r), size=f - n_hott_rows)
    perm = rng.permutation(f)
    F, topic = F[perm], topic[perm]
    X0 = F @ W
    if not with_alpha and noise > 0:
        raise InputValueError("noise > 0 is scaled by alpha: with_alpha must be True")
    alpha = (robust_simplicial_constant(W) if r > 1 else 2.0) if with_alpha else None
    eps = noise * alpha ** 2 / (20 + 13 * alpha) if noise > 0 else 0.0
    X = X0
    if eps > 0:
        U = rng.dirichlet(np.ones(n), size=f)
        # Scaled by the realized (inf,1)-norm, not the simplex's diameter 2: random points
        # of the simplex are about 1 apart in l1, so a step of eps / 2 put in half the noise
        # eta names.  s <= 1 keeps every row a convex combination (nonnegative, sum 1).
        toward = U - X0
        X = X0 + min(eps / inf1_norm(toward), 1.0) * toward
    hott = np.array([np.flatnonzero(topic == t)[0] for t in range(r)])
    return {"X": X, "hott": hott, "copies": topic, "F": F, "W": W, "alpha": alpha, "epsilon": eps}
