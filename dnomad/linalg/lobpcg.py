"""The top eigenpairs of a symmetric operator by LOBPCG, on the device of its vectors.

NOMAD's block steps need the top eigenpairs of M on the complement of the ones vector,
from a block of k = 2K + 8 (520 on all 70,000 MNIST digits with K = 256), warm-started
from the previous call's vectors; only the pairs the step keeps must converge.  SciPy's
``lobpcg`` does that on the host; for vectors on a GPU its dense work (Gram matrices of
the n x 3k basis, O(n k^2) per iteration) made an outer iteration on all of MNIST take
46-80 s on an H200 (3.5-7.3 s with this one on the device), and CuPy's port of it stops
with an error when a Cholesky factorization of a nearly dependent block fails.

:func:`lobpcg_top` is LOBPCG (Knyazev, SIAM J. Sci. Comput. 23, 2001) written with the
array module of its vectors, NumPy or CuPy, so the same lines run on the host and on a
GPU.  Each iteration costs one product with the operator (the residuals' block); the
Rayleigh-Ritz step solves in the span of [X, R, P] through an eigendecomposition of
a basis made orthonormal (a second pass where the first may have lost digits; by
Cholesky where that is well conditioned, else
by an eigendecomposition of its Gram matrix that drops directions whose eigenvalue
falls below ``DROP * max``: the basis selection of Duersch, Shao, Yang and Gu, SIAM J.
Sci. Comput. 40, 2018): nearly dependent blocks, which make a plain Cholesky
factorization fail, lose a direction instead.  The stopping rule is SciPy's (every residual
norm ||A x - lambda x|| <= tol), or, with ``wanted``, that of the leading pairs it names,
for the residuals the iteration carries (A X combined by the
same coefficients as X, as SciPy's does, so no product is spent on them); a fresh product
A X differs from them by the basis's loss of orthogonality (about eps / ONE_PASS_PIVOT
per iteration) times ||A||: 1.3e-8 against tol = 1e-8 in a planted test on an H100.
"""
from __future__ import annotations

import numpy as np

from ..blocks.device import array_module, to_host
from ..errors import InputValueError

# Gram eigenvalues below DROP * the largest are dropped from the Rayleigh-Ritz basis
# (Cholesky is used only where its pivots stay above sqrt(DROP) of the largest column
# norm): one pass leaves the basis orthonormal to about eps / DROP = 1e-8 in float64,
# the second to round-off.
DROP = 1e-8
# A Cholesky factor L of the Gram matrix G is used where |L L^T - G| <= this * max G_ii.
CHOLESKY_CHECK = 1e-10
# One orthonormalization pass suffices where no column of [R, P] shrank below this ratio
# of its norm in the projection against X, and the Cholesky factor's smallest squared
# pivot is at least ONE_PASS_PIVOT of the largest column norm squared (its loss of
# orthogonality is about eps / ONE_PASS_PIVOT = 2e-12 then).
REORTH_RATIO = 0.5
ONE_PASS_PIVOT = 1e-4


def lobpcg_top(matmat, X, *, constraint=None, tol=1e-3, maxiter=20, wanted=None):
    """The k largest eigenpairs of the symmetric operator ``matmat`` (A V for an n x m
    block V, on V's device) on the orthogonal complement of ``constraint``'s columns,
    from the start ``X`` (n x k).

    constraint: n x m with orthonormal columns, or None.  wanted: None (every pair must
    meet ``tol``), or a function of the current Ritz values (decreasing, on the host)
    returning how many leading pairs must: the others still widen the search (a larger
    block converges faster) but need not converge themselves.  Returns (w, U, products):
    the k Ritz values in decreasing order and their orthonormal Ritz vectors (on X's
    device), and the number of products taken."""
    xp = array_module(X)
    X = xp.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InputValueError(f"X must be n x k; got shape {X.shape}")
    n, k = X.shape
    m = 0 if constraint is None else constraint.shape[1]
    if not 0 < k <= n - m:
        raise InputValueError(f"LOBPCG needs 0 < k <= n - m; got k = {k}, n = {n}, m = {m}")

    def project(V):
        return V if constraint is None else V - constraint @ (constraint.T @ V)

    products = 0

    def apply(V):
        nonlocal products
        products += 1
        return project(xp.asarray(matmat(V), dtype=np.float64).reshape(n, -1))

    if not _orthonormal_in_complement(xp, X, constraint):
        # Twice: where X's columns are dependent, QR fills in arbitrary directions, which
        # the second projection brings back into the constraint's complement.  (A warm
        # start, the Ritz vectors of a previous call, skips this.)
        X = xp.linalg.qr(project(xp.linalg.qr(project(X))[0]))[0]
    AX = apply(X)
    w, C = _top_pairs(xp, _sym(X.T @ AX), k)
    X, AX = X @ C, AX @ C
    P = AP = None
    for _ in range(maxiter):
        R = AX - X * w
        norms = xp.sqrt((R * R).sum(axis=0))
        need = k if wanted is None else min(k, max(1, int(wanted(np.array(to_host(w))))))
        if float(norms[:need].max()) <= tol:
            break
        R = project(R)
        R /= xp.maximum(xp.sqrt((R * R).sum(axis=0)), np.finfo(np.float64).tiny)
        AR = apply(R)
        # [R, P] made orthonormal and orthogonal to X, A's images following by the same
        # combinations (A is linear).  A second pass only where the first may have lost
        # digits (Daniel, Gragg, Kaufman and Stewart's criterion, 1976): a column that the
        # projection shrank below REORTH_RATIO of its norm, or a Cholesky factor whose
        # smallest pivot is below sqrt(ONE_PASS_PIVOT) of the largest column norm (its
        # error grows as the square of the condition number), or the eigendecomposition.
        W = R if P is None else xp.concatenate([R, P], axis=1)
        AW = AR if P is None else xp.concatenate([AR, AP], axis=1)
        for _ in range(2):
            before = (W * W).sum(axis=0)
            C = X.T @ W
            W, AW = W - X @ C, AW - AX @ C
            gram = W.T @ W
            T, clean = _basis_transform(xp, gram)
            W, AW = W @ T, AW @ T
            if clean and bool((xp.diagonal(gram) >= REORTH_RATIO ** 2 * before).all()):
                break
        if W.shape[1] == 0:             # nothing new to search: the pairs are as good as they get
            break
        S, AS = xp.concatenate([X, W], axis=1), xp.concatenate([AX, AW], axis=1)
        w, C = _top_pairs(xp, _sym(S.T @ AS), k)
        X, AX = S @ C, AS @ C
        # The next search direction: the new X's part outside the old X (its implicit P).
        P, AP = W @ C[k:], AW @ C[k:]
    return w, X, products


def _orthonormal_in_complement(xp, X, constraint, tol=1e-10):
    """Whether X's columns are orthonormal and orthogonal to the constraint's, to ``tol``."""
    if constraint is not None and float(xp.abs(constraint.T @ X).max()) > tol:
        return False
    return float(xp.abs(X.T @ X - xp.eye(X.shape[1])).max()) <= tol


def _sym(H):
    return 0.5 * (H + H.T)


def _top_pairs(xp, H, k):
    """The k largest eigenpairs of the small symmetric H, in decreasing order."""
    values, vectors = xp.linalg.eigh(H)
    return values[::-1][:k], vectors[:, ::-1][:, :k]


def _basis_transform(xp, gram):
    """(T, clean): T with (W T)^T (W T) = I for W^T W = ``gram``: L^-T from its Cholesky
    factor L when every pivot is at least sqrt(DROP) of the largest column norm (the
    usual case; a third of an eigendecomposition's cost at k = 520), else over the
    eigenvectors whose Gram eigenvalue is at least DROP times the largest (fewer columns
    than W where W's are nearly dependent; none where W vanishes).  ``clean``: the
    Cholesky factor was used and its smallest squared pivot is at least ONE_PASS_PIVOT of
    the largest column norm squared, so W T is orthonormal to round-off in one pass."""
    gram = _sym(gram)
    largest = float(xp.diagonal(gram).max())
    if largest <= 0.0:
        return gram[:, :0], False
    try:
        L = xp.linalg.cholesky(gram)
        # CuPy does not raise where the factorization fails (its factor is then partly
        # unfactored, not always NaN): the factor is checked against the Gram matrix.
        if bool(xp.isfinite(L).all()):
            pivot = float(xp.diagonal(L).min()) ** 2
            if pivot > DROP * largest and float(xp.abs(L @ L.T - gram).max()) <= CHOLESKY_CHECK * largest:
                return xp.linalg.inv(L).T, pivot >= ONE_PASS_PIVOT * largest
    except np.linalg.LinAlgError:
        pass
    d, V = xp.linalg.eigh(gram)
    keep = d > DROP * float(d[-1])
    return V[:, keep] / xp.sqrt(d[keep]), False
