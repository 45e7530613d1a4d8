"""Hard and soft Bregman clustering (Banerjee et al. 2005): the re-optimization and the
baselines of Sec. 6, and spectral rounding of a relaxed equivalence matrix."""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError, warn_convergence
from ..rounding import group_sums
from .divergences import get_divergence


# ------------------------------------------------------------ hard Bregman clustering
def hard_clustering(X, d, divergence, labels=None, *, joint=False, max_iter=300, random_state=None):
    """Bregman hard clustering (Banerjee et al. 2005, Alg. 1): assign each row to the
    centroid of least D_F(x_i, mu_j), move each centroid to its rows' mean (the best
    representative for every Bregman divergence), until no label changes (at ``max_iter``
    with a ConvergenceWarning).  An emptied
    cluster takes the row farthest (in D_F) from its centroid.  Starts from ``labels``
    or from d distinct random rows as centroids.  Returns (labels, objective D_F(X, Y
    Gamma), iterations).

    ``joint=True``: the hard joint model of Sec. 5 / 6.4, with the cluster prior q
    learned too: the cost of x_i in cluster j is D_F(x_i, mu_j) - log q_j, q_j the
    cluster's share of the rows, and the objective is the negative log joint likelihood
    -1'Y log q + D_F(X, Y Gamma) (up to the base measure).  A cluster that empties stays
    empty (its share is 0): the prior can make one cluster absorb another, as in the
    paper's Table 5.

    X may be a :class:`dnomad.blocks.RowChunks` (``center=False``; from Zarr, out of
    core) holding the labels beside X's rows: one pass per iteration (assign, then the
    new clusters' sums), the same iterates as in memory."""
    from ..blocks.rows import RowChunks

    div = get_divergence(divergence)
    if isinstance(X, RowChunks):
        if labels is None:
            raise InputValueError("hard clustering on row chunks starts from labels (give labels=)")
        return _hard_clustering_chunks(X, d, div, labels, joint, max_iter)
    X = div.check_domain(X)
    t = X.shape[0]
    rng = np.random.default_rng(random_state)
    if labels is None:
        centroids = X[rng.choice(t, size=d, replace=False)]
        labels = _assign(X, centroids, div, None)
    labels = np.asarray(labels).copy()
    changed = 0
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
        changed = int(np.count_nonzero(new != labels))
        if changed == 0:
            break
        labels = new
    if changed:
        _warn_hard_max_iter(max_iter, changed, t)
    return labels, hard_objective(X, labels, d, div, joint=joint), it


def bregman_seeding(X, d, divergence, seed):
    """Labels from Bregman k-means++ seeding (Ackermann & Blomer 2010): the first centroid
    a uniformly drawn row, each next one a row drawn with probability proportional to its
    D_F to the nearest centroid so far; every row then goes to its nearest centroid (D_F).
    The start of one hard clustering, as k-means++ is k-means'.

    Rows are drawn by an exponential race on uniforms keyed by (seed, round, row), so X
    in memory and X as :class:`dnomad.blocks.RowChunks` (``center=False``; one pass per
    centroid) give the same labels whatever the chunking."""
    from ..blocks.rows import RowChunks

    div = get_divergence(divergence)
    if not (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and 0 <= seed < 2**32):
        raise InputValueError(f"seed must be an integer in [0, 2**32); got {seed!r}")
    if isinstance(X, RowChunks):
        _check_uncentred(X)
        X.put("row", np.arange(X.n)[:, None])
        X.put("nearest", np.full((X.n, 1), np.inf))

        def run(*args):
            return X.map(*args)
    else:
        X = div.check_domain(X)
        chunk = {"X": X, "row": np.arange(len(X))[:, None], "nearest": np.full((len(X), 1), np.inf)}

        def run(kernel, *args):
            return [kernel(chunk, *args)]
    try:
        centroids = []
        for step in range(d):
            draws = run(_seed_kernel, div, centroids[-1] if centroids else None, int(seed), step)
            centroids.append(min(draws, key=lambda draw: draw[0])[1])
        return np.concatenate(run(_nearest_kernel, div, np.stack(centroids)))
    finally:
        if isinstance(X, RowChunks):
            X.drop("nearest")


def _check_uncentred(data):
    if np.any(data.mean != 0):
        raise InputValueError("the row chunks for Bregman clustering must be built with center=False "
                              "(a divergence is defined on X itself)")


def _keyed_uniforms(seed, step, rows):
    """Uniforms in (0, 1), a function of (seed < 2**32, step, row) alone (splitmix64's mixer)."""
    offset = (seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xD1B54A32D192ED03) % 2**64
    z = rows.astype(np.uint64) + np.uint64(offset)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0 ** 53


def _seed_kernel(chunk, div, centroid, seed, step):
    """Update the rows' D_F to the nearest centroid with the newest one; this chunk's entry
    in the race for the next centroid, -log(u) / weight (the least wins): (key, row)."""
    X = chunk["X"]
    if centroid is None:
        weight = np.ones(len(X))
    else:
        # D_F >= 0; a row within round-off of the centroid can come out at -1e-16, and a
        # negative weight would win the race
        weight = np.maximum(np.minimum(chunk["nearest"][:, 0], div(X, centroid[None])), 0.0)
        chunk["nearest"] = weight[:, None]
    with np.errstate(divide="ignore"):
        keys = -np.log(_keyed_uniforms(seed, step, chunk["row"][:, 0])) / weight
    i = int(np.argmin(keys))
    return float(keys[i]), np.array(X[i], dtype=np.float64)


def _nearest_kernel(chunk, div, centroids):
    return _assign(chunk["X"], centroids, div, None)


def _warn_hard_max_iter(max_iter, changed, t):
    warn_convergence(f"Bregman hard clustering stopped at max_iter={max_iter} before reaching a fixed point: "
                     f"{changed} of {t} labels changed in the last iteration (it stops when none changes)")


def _hard_clustering_chunks(data, d, div, labels, joint, max_iter):
    _check_uncentred(data)
    labels = np.asarray(labels)
    if labels.shape != (data.n,):
        raise InputValueError(f"labels must have shape ({data.n},); got {labels.shape}")
    data.put("row", np.arange(data.n)[:, None])
    data.put("labels", labels[:, None].astype(np.int64))
    sums, counts, _, _ = _reduce(data.map(_hard_kernel, div, d, None, None, None))
    total = sums.sum(axis=0) / data.n
    objective = None
    for it in range(1, max_iter + 1):
        centroids = _centroids_from(sums, counts, total)
        empty = [j for j in range(d) if counts[j] == 0]
        if empty and not joint:
            # the rows farthest from their centroids, largest first, ties to the lower row
            parts = data.map(_farthest_kernel, div, centroids, len(empty))
            gaps = np.concatenate([p[0] for p in parts])
            rows = np.concatenate([p[1] for p in parts])
            order = np.lexsort((rows, -gaps))[: len(empty)]
            patch = dict(zip(rows[order].tolist(), empty))
            sums, counts, _, _ = _reduce(data.map(_hard_kernel, div, d, None, None, patch))
            centroids = _centroids_from(sums, counts, total)
        log_prior = _log_prior_from(counts) if joint else None
        sums_new, counts_new, changed, objective = _reduce(data.map(_hard_kernel, div, d, centroids, log_prior, None))
        if changed == 0:
            # unchanged labels: their centroids are the ones just used
            if joint:
                objective -= _prior_term(counts)
            break
        sums, counts = sums_new, counts_new
        objective = None
    else:
        _warn_hard_max_iter(max_iter, int(changed), data.n)
    labels = data.get("labels")[:, 0]
    if objective is None:           # max_iter ran out: the objective at the last labels
        centroids = _centroids_from(sums, counts, total)
        objective = sum(data.map(_objective_kernel, div, centroids))
        if joint:
            objective -= _prior_term(counts)
    return labels, float(objective), it


def _centroids_from(sums, counts, total):
    out = np.tile(total, (len(counts), 1))
    filled = counts > 0
    out[filled] = sums[filled] / counts[filled, None]
    return out


def _log_prior_from(counts):
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum())


def _prior_term(counts):
    """sum_j n_j log q_j for cluster sizes n_j and shares q_j (empty clusters add 0)."""
    return float(np.sum(counts * np.where(counts > 0, _log_prior_from(counts), 0.0)))


def _reduce(parts):
    return (sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts),
            sum(p[3] for p in parts))


def _hard_kernel(chunk, div, d, centroids, log_prior, patch):
    """Assign this chunk's rows (with ``centroids``; keep the labels when None; then set
    the rows in ``patch``, global row -> label); return the clusters' row sums and
    counts, the labels changed and D_F to the centroids used."""
    X, labels = chunk["X"], chunk["labels"][:, 0]
    objective = 0.0
    new = labels
    if centroids is not None:
        D = np.stack([div(X, c[None]) for c in centroids], axis=1)
        new = np.argmin(D if log_prior is None else D - log_prior[None], axis=1)
        objective = float(np.sum(D[np.arange(len(new)), new]))
    if patch:
        new = new.copy()
        rows = chunk["row"][:, 0]
        hit = np.isin(rows, np.fromiter(patch, dtype=np.int64))
        new[hit] = [patch[int(r)] for r in rows[hit]]
    changed = int(np.sum(new != labels))
    chunk["labels"] = new[:, None]
    sums = group_sums(new, X, d)
    return sums, np.bincount(new, minlength=d), changed, objective


def _farthest_kernel(chunk, div, centroids, m):
    """This chunk's ``m`` largest D_F(x_i, mu_{label_i}) and their global rows."""
    labels = chunk["labels"][:, 0]
    gap = div(chunk["X"], centroids[labels])
    top = np.lexsort((chunk["row"][:, 0], -gap))[:m]
    return gap[top], chunk["row"][top, 0]


def _objective_kernel(chunk, div, centroids):
    return float(np.sum(div(chunk["X"], centroids[chunk["labels"][:, 0]])))


def hard_objective(X, labels, d, divergence, *, joint=False):
    """D_F(X, Y Gamma) at the centroids of ``labels`` (with ``joint``, plus -1'Y log q).
    X may be a :class:`dnomad.blocks.RowChunks` (``center=False``): two passes."""
    from ..blocks.rows import RowChunks

    div = get_divergence(divergence)
    if isinstance(X, RowChunks):
        labels = np.asarray(labels)
        if np.any(X.mean != 0) or labels.shape != (X.n,):
            raise InputValueError(f"hard_objective on row chunks needs center=False chunks and labels of shape "
                                  f"({X.n},); got labels of shape {labels.shape}")
        X.put("labels", labels[:, None].astype(np.int64))
        sums, counts, _, _ = _reduce(X.map(_hard_kernel, div, d, None, None, None))
        objective = sum(X.map(_objective_kernel, div, _centroids_from(sums, counts, sums.sum(axis=0) / X.n)))
        if joint:
            objective -= _prior_term(counts)
        return float(objective)
    objective = float(np.sum(div(X, centroids_of(X, labels, d)[labels])))
    if joint:
        objective -= _prior_term(np.bincount(labels, minlength=d))
    return objective


def _log_prior(labels, d):
    return _log_prior_from(np.bincount(labels, minlength=d))


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
ROUNDINGS = ("ng-jordan-weiss", "shi-malik")


def spectral_rounding(M, d, *, repeats=10, random_state=None, method="ng-jordan-weiss"):
    """Labels from a relaxed equivalence matrix (Sec. 6, SC rounding): k-means on the rows
    of sym(M)'s top d eigenvectors; ``repeats`` k-means runs with different seeds (the
    paper reports their spread), as a list of label arrays.

    method: "ng-jordan-weiss" (the default) normalizes each row to unit length first
    (Ng, Jordan and Weiss, 2001); "shi-malik", the rounding the paper cites (Shi and
    Malik, 2000), takes the top d generalized eigenvectors of (S, D), S = sym(M),
    D = diag(S 1), rows as they are.  For M 1 = 1, as every M of these relaxations has,
    D = I and those are S's own eigenvectors; other M need positive row sums."""
    M = np.asarray(M, dtype=np.float64)
    if method not in ROUNDINGS:
        raise InputValueError(f"method must be one of {ROUNDINGS}; got {method!r}")
    S = 0.5 * (M + M.T)
    if method == "shi-malik":
        degrees = S.sum(axis=1)
        if not np.all(degrees > 0):
            raise InputValueError(f"Shi-Malik rounding needs positive row sums of sym(M) (its degrees); "
                                  f"the smallest is {degrees.min():.3g}")
        scale = 1.0 / np.sqrt(degrees)
        _, V = np.linalg.eigh(S * scale[:, None] * scale[None, :])
        E = V[:, -d:] * scale[:, None]
    else:
        _, V = np.linalg.eigh(S)
        E = V[:, -d:]
    return kmeans_roundings(E, d, repeats=repeats, random_state=random_state,
                            normalize_rows=method == "ng-jordan-weiss")


def kmeans_roundings(E, d, *, repeats=10, random_state=None, normalize_rows=True):
    """``repeats`` k-means labelings of E's rows (t x d eigenvectors), seeds from one
    generator; rows scaled to unit length first with ``normalize_rows``."""
    from ..rounding import kmeans_rows

    if normalize_rows:
        E = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-300)
    rng = np.random.default_rng(random_state)
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
    rng = np.random.default_rng(random_state)
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
        increase = loglik - previous
        if increase <= tol * max(1.0, abs(loglik)):
            break
        previous = loglik
    else:
        if tol > 0:
            warn_convergence(f"Bregman soft clustering (EM) stopped at max_iter={max_iter} before meeting its "
                             f"tolerance: last log-likelihood increase {increase:.3g} > tol * "
                             f"max(1, |log-likelihood|) = {tol * max(1.0, abs(loglik)):.3g} (tol {tol:g})")
    return post, loglik, it
