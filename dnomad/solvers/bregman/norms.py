"""The sets and norms of the relaxations: the projection onto the spectral set M2
(Lemma 1), the induced norm Omega of (17) (Alg. 2) with its dual and linear
minimization oracle (Sec. 3.2.1), and its extension Xi over M2 (App. B)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import InputValueError


# ------------------------------------------------------------ the spectral set M2
def project_m2(A, d, *, partial=False, check=True):
    """The Frobenius projection of a t x t matrix A onto
    M2 = {M : 0 <= M <= I (Loewner), tr M <= d, M 1 = 1} (Lemma 1 and (13)).

    With H = I - 1 1^T / t and B = sym(A) - 1 1^T / t, the answer is T + 1 1^T / t where
    T keeps the eigenvectors of H B H and moves its eigenvalues sigma_i to
    mu_i = clip(sigma_i - theta, 0, 1), theta >= 0 the smallest with sum mu_i <= d - 1
    (the solution of (13)); the eigenvalue 0 of the vector 1 stays 0.  (A's
    antisymmetric part is orthogonal to the symmetric set and drops out.)

    Only the eigenvalues above theta matter.  ``partial=True`` computes
    the leading ones by Lanczos (scipy's eigsh), d + 8 first and twice as many while the
    smallest computed is still above theta; else one dense eigendecomposition, O(t^3)
    (the default: at t = 1000 inside cvxCondJC on spambase it is as fast as Lanczos,
    0.23 s per ADMM iteration either way, most of it in the row step; at t = 2000 on
    graphs/bregman_scaling.py's mixture, 10 ADMM iterations did not finish in 5 minutes).
    """
    A = np.asarray(A, dtype=np.float64)
    if check:
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise InputValueError(f"A must be a square matrix; got shape {A.shape}")
        if not (isinstance(d, (int, np.integer)) and 1 <= d <= A.shape[0]):
            raise InputValueError(f"d (the number of clusters) must be an integer in [1, t = {A.shape[0]}]; "
                                  f"got {d!r}")
    t = A.shape[0]
    B = 0.5 * (A + A.T) - 1.0 / t
    HBH = B - B.mean(axis=0)[None] - B.mean(axis=1)[:, None] + B.mean()
    HBH = 0.5 * (HBH + HBH.T)
    sigma = None
    if partial:
        from scipy.sparse.linalg import eigsh

        k = d + 8
        while 2 * k < t:
            sigma, phi = eigsh(HBH, k=k, which="LA")
            mu, theta = _capped_simplex_shift(sigma, d - 1)
            if sigma.min() <= theta:        # the eigenvalues not computed are all clipped to 0
                break
            sigma, k = None, 2 * k
    if sigma is None:
        sigma, phi = np.linalg.eigh(HBH)
        mu, _ = _capped_simplex_shift(sigma, d - 1)
    keep = mu > 0
    T = (phi[:, keep] * mu[keep]) @ phi[:, keep].T
    return T + 1.0 / t


def _capped_simplex_shift(sigma, budget):
    """(clip(sigma - theta, 0, 1), theta) with theta >= 0 the smallest making the sum <=
    budget (bisection on theta to machine precision; the sum is monotone in theta)."""
    mu = np.clip(sigma, 0.0, 1.0)
    if mu.sum() <= budget:
        return mu, 0.0
    lo, hi = 0.0, float(sigma.max())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.clip(sigma - mid, 0.0, 1.0).sum() > budget:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * max(1.0, hi):
            break
    return np.clip(sigma - hi, 0.0, 1.0), hi


def omega_squared_from_singular_values(s, d):
    """Alg. 2: f(s) = min sum_i s_i^2 / sigma_i over sigma_i in [0, 1], sum sigma_i <= d - 1
    (18), for singular values s (any order): sigma_i = 1 on the k largest, the rest
    proportional to s_i."""
    s = np.sort(np.abs(np.asarray(s, dtype=np.float64)))[::-1]
    if not (isinstance(d, (int, np.integer)) and d >= 2):
        raise InputValueError(f"d (the number of clusters) must be an integer >= 2; got {d!r}")
    tail = np.cumsum(s[::-1])[::-1]                      # tail[k] = s[k] + s[k+1] + ... (0-based)
    for k in range(d - 1):
        if k >= len(s) or tail[k] >= (d - 1 - k) * s[k]:
            break
    if k >= len(s):
        return float(np.sum(s ** 2))
    return float(np.sum(s[:k] ** 2) + tail[k] ** 2 / (d - 1 - k))


def omega(T, d):
    """Omega(T) = sqrt(min tr(T' M^+ T) over M in M3 with Im T in Im M) (17), from the
    singular values of T (Theorem 3); T is t x n."""
    s = np.linalg.svd(np.asarray(T, dtype=np.float64), compute_uv=False)
    return math.sqrt(omega_squared_from_singular_values(s, d))


def omega_dual(R, d):
    """The dual norm Omega_*(R) = ||(r_1, ..., r_{d-1})||: the top d - 1 singular values."""
    r = np.linalg.svd(np.asarray(R, dtype=np.float64), compute_uv=False)
    return float(np.linalg.norm(r[: d - 1]))


def omega_lmo(R, d):
    """S with Omega(S) = 1 maximizing <R, S> (so <R, S> = Omega_*(R)): U_{d-1}
    diag(r / ||r||) V_{d-1}', from the top d - 1 singular triplets of R (Sec. 3.2.1,
    step 3; -S is the conditional gradient direction for a gradient R)."""
    U, r, Vt = np.linalg.svd(np.asarray(R, dtype=np.float64), full_matrices=False)
    top = r[: d - 1]
    norm = np.linalg.norm(top)
    if norm == 0:
        raise InputValueError("the matrix is zero: its linear minimization oracle is undefined")
    return (U[:, : d - 1] * (top / norm)) @ Vt[: d - 1]



# ------------------------------------------------------------ Xi: Omega over M2 (App. B)
def _center_rows(T):
    """H T with H = I - 1 1^T / t."""
    return T - T.mean(axis=0)[None]


def xi(T, d):
    """Xi(T) = sqrt(min tr(T' M^+ T) over M in M2 with Im T in Im M) = sqrt(Omega^2(H T)
    + ||T' 1||^2 / t) (38), (44)."""
    T = np.asarray(T, dtype=np.float64)
    return math.sqrt(omega(_center_rows(T), d) ** 2 + float(np.sum(T.sum(axis=0) ** 2)) / T.shape[0])


def xi_dual(G, d):
    """Xi_*(G) = sqrt(||G' 1||^2 / t + Omega_*^2(H G)) (App. B.3; the paper's (46) writes
    Omega(HG) where its derivation gives the dual norm Omega_*)."""
    G = np.asarray(G, dtype=np.float64)
    return math.sqrt(float(np.sum(G.sum(axis=0) ** 2)) / G.shape[0] + omega_dual(_center_rows(G), d) ** 2)


def xi_lmo(G, d):
    """S with Xi(S) = 1 maximizing <G, S> (= Xi_*(G)): the optimal tau of App. B.3 splits
    the unit ball between H S (Omega's LMO on H G) and S' 1 (along G' 1)."""
    G = np.asarray(G, dtype=np.float64)
    t = G.shape[0]
    col = G.sum(axis=0)                          # G' 1
    a2 = float(col @ col) / t                    # ||G' 1||^2 / t
    HG = _center_rows(G)
    b = omega_dual(HG, d)
    total = math.sqrt(a2 + b * b)
    if total == 0:
        raise InputValueError("the matrix is zero: its linear minimization oracle is undefined")
    S = np.zeros_like(G)
    if b > 0:
        S += (b / total) * omega_lmo(HG, d)
    if a2 > 0:
        S += (math.sqrt(a2) / total) * np.outer(np.ones(t), col) / (math.sqrt(a2) * t)
    return S


def xi_minimizer(T, d):
    """The M in M2 attaining Xi(T) (45), factored: (Phi, sigma) with M = Phi diag(sigma)
    Phi' + 1 1' / t, Phi the left singular vectors of H T (orthogonal to 1) and sigma
    from Alg. 2's optimal weights."""
    HT = _center_rows(np.asarray(T, dtype=np.float64))
    U, s, _ = np.linalg.svd(HT, full_matrices=False)
    return U, _alg2_weights(s, d)


def xi_squared_and_gradient(W, d):
    """(Xi^2(W), its gradient 2 (U diag(w) V' + 1 wbar')) for H W = U diag(s) V' and
    wbar = W'1 / t: by the envelope theorem d Omega^2 / d s_i = 2 s_i / sigma_i at
    Alg. 2's sigma, which is 2 s_i on the k largest and 2 sum_{j >= k} s_j / (d - 1 - k)
    on the rest.  Differentiable where H W has full column rank (the rest's nuclear norm
    is not, at zero singular values: there this is a subgradient)."""
    W = np.asarray(W, dtype=np.float64)
    wbar = W.mean(axis=0)
    U, s, Vt = np.linalg.svd(W - wbar, full_matrices=False)
    tail = np.cumsum(s[::-1])[::-1]
    for k in range(d - 1):
        if k >= len(s) or tail[k] >= (d - 1 - k) * s[k]:
            break
    w = s.copy()
    if k < len(s):
        w[k:] = tail[k] / (d - 1 - k)
    value = omega_squared_from_singular_values(s, d) + W.shape[0] * float(wbar @ wbar)
    return value, 2.0 * ((U * w) @ Vt + wbar[None])


def _alg2_weights(s, d):
    """The sigma_i of (18)'s minimizer for singular values s (descending): 1 on the k
    largest, (d - 1 - k) s_i / sum_{j >= k} s_j on the rest."""
    s = np.asarray(s, dtype=np.float64)
    tail = np.cumsum(s[::-1])[::-1]
    for k in range(d - 1):
        if k >= len(s) or tail[k] >= (d - 1 - k) * s[k]:
            break
    sigma = np.ones_like(s)
    if k < len(s) and tail[k] > 0:
        sigma[k:] = (d - 1 - k) * s[k:] / tail[k]
    elif k < len(s):
        sigma[k:] = 0.0
    return sigma
