"""The sets and norms of the relaxations: the projection onto the spectral set M2
(Lemma 1), the induced norm Omega of (17) (Alg. 2) with its dual and linear
minimization oracle (Sec. 3.2.1), and its extension Xi over M2 (App. B)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputValueError


@dataclass(frozen=True, eq=False)
class FactoredM:
    """A result holding an equivalence matrix in M2 factored as
    Phi diag(sigma) Phi' + 1 1' / t (Phi orthonormal, orthogonal to 1; sigma descending)."""

    Phi: np.ndarray
    sigma: np.ndarray

    def membership_eigenvectors(self, d):
        """The top d eigenvectors of the matrix: 1 / sqrt(t) and the d - 1 leading Phi
        columns (for spectral rounding)."""
        t = self.Phi.shape[0]
        return np.hstack([np.full((t, 1), 1.0 / math.sqrt(t)), self.Phi[:, : d - 1]])


# ------------------------------------------------------------ the spectral set M2
def project_m2(A, d, *, partial=False, check=True):
    """The Frobenius projection of a t x t matrix A onto
    M2 = {M : 0 <= M <= I (Loewner), tr M <= d, M 1 = 1} (Lemma 1 and (13)), dense.

    With H = I - 1 1^T / t and B = sym(A) - 1 1^T / t, the answer is T + 1 1^T / t where
    T keeps the eigenvectors of H B H and moves its eigenvalues sigma_i to
    mu_i = clip(sigma_i - theta, 0, 1), theta >= 0 the smallest with sum mu_i <= d - 1
    (the solution of (13)); the eigenvalue 0 of the vector 1 stays 0.  (A's
    antisymmetric part is orthogonal to the symmetric set and drops out.)
    ``partial=True``: only the eigenpairs above theta, by :func:`project_m2_factor`'s
    block eigensolver; else one dense eigendecomposition, O(t^3).
    """
    A = np.asarray(A, dtype=np.float64)
    if check:
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise InputValueError(f"A must be a square matrix; got shape {A.shape}")
        if not (isinstance(d, (int, np.integer)) and 1 <= d <= A.shape[0]):
            raise InputValueError(f"d (the number of clusters) must be an integer in [1, t = {A.shape[0]}]; "
                                  f"got {d!r}")
    t = A.shape[0]
    S = 0.5 * (A + A.T)
    Phi, mu, _ = project_m2_factor((lambda V: S @ V) if partial else None, t, d, dense=lambda: S)
    return (Phi * mu) @ Phi.T + 1.0 / t


def project_m2_factor(sym_matmat, t, d, *, start=None, tol=1e-9, dense=None, max_block=None, seed=0,
                      max_depth=6, max_rounds=50):
    """The projection of Lemma 1 onto M2 of a symmetric t x t matrix S given by its
    products, in factored form: (Phi, mu, passes) with the projection
    Phi diag(mu) Phi' + 1 1' / t, Phi's columns orthonormal and orthogonal to 1, mu in
    (0, 1] descending, ``passes`` the calls of ``sym_matmat(V)`` (= S V for t x k V).

    Only the eigenpairs of H S H above the shift theta enter (:func:`project_m2`), and
    inside ADMM they are few (14 to 17 for 3 clusters at t = 1000).  They come from a
    block Krylov space on the complement of 1: from a block Q (``start``, the previous
    projection's Phi, plus as many random columns and 8 more), [Q, S Q, S^2 Q, ...]
    orthonormalized as it grows (one call of ``sym_matmat`` per block, on an orthonormal
    block) with Rayleigh-Ritz after each block, restarted from the leading Ritz vectors
    after ``max_depth`` blocks with a block half as wide again (twice, when as many Ritz
    values as its width lie above theta), until the leading pairs above theta have
    residuals R with sqrt(2) ||R||_F + ||mu of the rest|| <= ``tol`` sqrt(t) (a bound
    on the error of the projection, in the units of ADMM's residuals) and fewer Ritz
    values than the block's width lie above theta (the pairs never computed are
    assumed below the largest Ritz value left out, as for any Krylov method).
    ``dense``: a callable returning S, for one dense eigendecomposition instead when
    ``sym_matmat`` is None, or the block would pass ``max_block`` (t / 5 by default) or
    ``max_rounds`` restarts."""
    one = np.full((t, 1), 1.0 / math.sqrt(t))
    calls = [0]
    rng = np.random.default_rng(seed)

    def op(V):
        calls[0] += 1
        W = np.asarray(sym_matmat(V), dtype=np.float64)
        return W - one @ (one.T @ W)

    def orthonormal_to(N, basis):
        """N orthonormalized against ``basis`` (and 1), twice for stability; columns
        that vanish (an invariant subspace was reached) are replaced by random ones."""
        for _ in range(2):
            N = N - one @ (one.T @ N) - basis @ (basis.T @ N)
            Q, R = np.linalg.qr(N)
            small = np.abs(np.diag(R)) <= 1e-10 * max(1.0, float(np.abs(R).max()) if R.size else 1.0)
            if small.any():
                Q[:, small] = rng.standard_normal((t, int(small.sum())))
            N = Q
        return N

    max_block = max_block or max(d + 8, t // 5)
    Q = np.zeros((t, 0)) if start is None else np.asarray(start, dtype=np.float64).reshape(t, -1)
    k = max(2 * Q.shape[1] + 8, d + 8)
    rounds = 0
    while sym_matmat is not None and k <= max_block and rounds < max_rounds:
        rounds += 1
        blocks = [orthonormal_to(np.hstack([Q, rng.standard_normal((t, k - Q.shape[1]))]), np.zeros((t, 0)))]
        images = [op(blocks[0])]
        while True:
            basis, image = np.hstack(blocks), np.hstack(images)
            sigma, Y = np.linalg.eigh(0.5 * (basis.T @ image + image.T @ basis))
            sigma, Y = sigma[::-1], Y[:, ::-1]
            mu, theta = _capped_simplex_shift(sigma, d - 1)
            above = int(np.sum(sigma > theta + tol))
            keep = np.flatnonzero(mu > 0)
            U = basis @ Y[:, : max(k, keep.size)]
            # With R the residuals of the first j pairs, S - (R U' + U R') has their
            # span as an invariant subspace, and the projection is nonexpansive:
            # keeping those j is within sqrt(2) ||R||_F + ||mu_{j+1..}|| of the exact
            # projection (pairs just above theta converge slowly but weigh little).
            R2 = np.linalg.norm(image @ Y[:, keep] - U[:, keep] * sigma[keep], axis=0) ** 2
            bound = (math.sqrt(2.0) * np.sqrt(np.concatenate([[0.0], np.cumsum(R2)]))
                     + np.sqrt(np.concatenate([np.cumsum(mu[keep][::-1] ** 2)[::-1], [0.0]])))
            met = np.flatnonzero(bound <= tol * math.sqrt(t))
            j = int(met[0]) if met.size else -1      # the fewest pairs that meet the bound
            if above < k and met.size:
                keep = keep[:j]
                return U[:, keep], mu[keep], calls[0]
            if above >= k or len(blocks) == max_depth:
                break
            blocks.append(orthonormal_to(images[-1], basis))
            images.append(op(blocks[-1]))
        Q = U[:, :k]
        # a wider block next round: more room below theta speeds up the pairs near it
        k = 2 * k if above >= k else k + k // 2
    if dense is None:
        raise InputValueError(f"the projection onto M2 needs more than {max_block} eigenpairs at t = {t} "
                              f"(max_block); give dense= or a larger max_block")
    S = np.asarray(dense(), dtype=np.float64)
    B = S - 1.0 / t
    HBH = B - B.mean(axis=0)[None] - B.mean(axis=1)[:, None] + B.mean()
    sigma, phi = np.linalg.eigh(0.5 * (HBH + HBH.T))
    mu, _ = _capped_simplex_shift(sigma, d - 1)
    keep = np.flatnonzero(mu > 0)[::-1]
    return phi[:, keep], mu[keep], calls[0] + 1


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
