"""Hard and soft Bregman clustering (Banerjee et al. 2005): the re-optimization and the
baselines of Sec. 6, and spectral rounding of a relaxed equivalence matrix."""
from __future__ import annotations

import numpy as np

from .divergences import get_divergence


# ------------------------------------------------------------ hard Bregman clustering
def hard_clustering(X, d, divergence, labels=None, *, joint=False, max_iter=300, random_state=None):
    """Bregman hard clustering (Banerjee et al. 2005, Alg. 1): assign each row to the
    centroid of least D_F(x_i, mu_j), move each centroid to its rows' mean (the best
    representative for every Bregman divergence), until no label changes.  An emptied
    cluster takes the row farthest (in D_F) from its centroid.  Starts from ``labels``
    or from d distinct random rows as centroids.  Returns (labels, objective D_F(X, Y
    Gamma), iterations).

    ``joint=True``: the hard joint model of Sec. 5 / 6.4, with the cluster prior q
    learned too: the cost of x_i in cluster j is D_F(x_i, mu_j) - log q_j, q_j the
    cluster's share of the rows, and the objective is the negative log joint likelihood
    -1'Y log q + D_F(X, Y Gamma) (up to the base measure).  A cluster that empties stays
    empty (its share is 0): the prior can make one cluster absorb another, as in the
    paper's Table 5."""
    div = get_divergence(divergence)
    X = div.check_domain(X)
    t = X.shape[0]
    rng = random_state if isinstance(random_state, np.random.Generator) else np.random.default_rng(random_state)
    if labels is None:
        centroids = X[rng.choice(t, size=d, replace=False)]
        labels = _assign(X, centroids, div, None)
    labels = np.asarray(labels).copy()
    for it in range(1, max_iter + 1):
        centroids = centroids_of(X, labels, d)
        empty = [j for j in range(d) if not np.any(labels == j)]
        if empty and not joint:
            gap = div(X, centroids[labels])
            for j in empty:
                far = int(np.argmax(gap))
                labels[far], gap[far] = j, -np.inf
            centroids = centroids_of(X, labels, d)
        new = _assign(X, centroids, div, _log_prior(labels, d) if joint else None)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels, hard_objective(X, labels, d, div, joint=joint), it


def hard_objective(X, labels, d, divergence, *, joint=False):
    """D_F(X, Y Gamma) at the centroids of ``labels`` (with ``joint``, plus -1'Y log q)."""
    div = get_divergence(divergence)
    objective = float(np.sum(div(X, centroids_of(X, labels, d)[labels])))
    if joint:
        objective -= float(np.sum(_log_prior(labels, d)[labels]))
    return objective


def _log_prior(labels, d):
    with np.errstate(divide="ignore"):
        return np.log(np.bincount(labels, minlength=d) / len(labels))


def cluster_posteriors(X, labels, d, divergence):
    """p(j | x_i) proportional to q_j exp(-D_F(x_i, mu_j)) for the centroids and the
    cluster shares q of ``labels`` (the joint model's posterior; t x d)."""
    div = get_divergence(divergence)
    logp = _log_prior(labels, d)[None] - np.stack([div(X, c[None]) for c in centroids_of(X, labels, d)], axis=1)
    logp -= logp.max(axis=1, keepdims=True)
    p = np.exp(logp)
    return p / p.sum(axis=1, keepdims=True)


def centroids_of(X, labels, d):
    """The mean of each cluster's rows (a cluster without rows gets the overall mean)."""
    out = np.tile(X.mean(axis=0), (d, 1))
    for j in range(d):
        if np.any(labels == j):
            out[j] = X[labels == j].mean(axis=0)
    return out


def _assign(X, centroids, div, log_prior):
    D = np.stack([div(X, c[None]) for c in centroids], axis=1)
    if log_prior is not None:
        D = D - log_prior[None]
    return np.argmin(D, axis=1)



# ------------------------------------------------------------ rounding
def spectral_rounding(M, d, *, repeats=10, random_state=None):
    """Labels from a relaxed equivalence matrix (Sec. 6, SC rounding): the top d
    eigenvectors of sym(M), rows normalized, k-means on them; ``repeats`` k-means runs
    with different seeds (the paper reports their spread), as a list of label arrays."""
    from .._rounding import kmeans_rows

    M = np.asarray(M, dtype=np.float64)
    w, V = np.linalg.eigh(0.5 * (M + M.T))
    E = V[:, -d:]
    E = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-300)
    rng = random_state if isinstance(random_state, np.random.Generator) else np.random.default_rng(random_state)
    return [kmeans_rows(E, d, rng, n_init=1) for _ in range(repeats)]



# ------------------------------------------------------------ soft Bregman clustering
def soft_clustering(X, d, divergence, *, max_iter=500, tol=1e-10, random_state=None):
    """Soft Bregman clustering (Banerjee et al. 2005, Alg. 3): EM for the mixture
    p(x) = sum_j pi_j exp(-D_F(x, mu_j)) b(x) of exponential-family components (the base
    measure b drops out).  E-step: posteriors proportional to pi_j exp(-D_F(x_i, mu_j));
    M-step: pi_j their means, mu_j the posterior-weighted means.  Starts from d distinct
    random rows.  Returns (posteriors t x d, log-likelihood without log b, iterations);
    the log-likelihood never decreases (EM)."""
    div = get_divergence(divergence)
    X = div.check_domain(X)
    t = X.shape[0]
    rng = random_state if isinstance(random_state, np.random.Generator) else np.random.default_rng(random_state)
    mu = X[rng.choice(t, size=d, replace=False)]
    pi = np.full(d, 1.0 / d)
    previous = -np.inf
    for it in range(1, max_iter + 1):
        logp = np.log(pi)[None] - np.stack([div(X, m[None]) for m in mu], axis=1)
        top = logp.max(axis=1, keepdims=True)
        log_norm = top[:, 0] + np.log(np.exp(logp - top).sum(axis=1))
        post = np.exp(logp - log_norm[:, None])
        loglik = float(log_norm.sum())
        weights = post.sum(axis=0)
        pi = np.maximum(weights / t, 1e-300)
        mu = (post.T @ X) / np.maximum(weights, 1e-300)[:, None]
        if loglik - previous <= tol * max(1.0, abs(loglik)):
            break
        previous = loglik
    return post, loglik, it
