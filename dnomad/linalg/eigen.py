"""Extreme eigenvectors of a symmetric operator restricted to a subspace's complement.

Only ``matmat`` passes touch the operator: the n x n matrix never comes into one
process.  The vectors of length n live on the client; ARPACK (``scipy eigsh``)
drives the Lanczos iteration on the (n - m)-dimensional complement of the given
vectors, represented exactly by Householder reflectors (no shift to guess, no
drift back into the deflated directions).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg as sla

from ..errors import InputValueError


class ComplementBasis:
    """An orthonormal basis of the orthogonal complement of span(U), U of shape (n, m).

    H = H_0 ... H_{m-1} (Householder reflectors) maps e_0..e_{m-1} onto span(U);
    its remaining columns span the complement.  ``lift`` maps R^{n-m} -> R^n and
    ``restrict`` is its adjoint; both cost O(n m).
    """

    def __init__(self, U):
        U = np.asarray(U, dtype=np.float64)
        if U.ndim == 1:
            U = U[:, None]
        n, m = U.shape
        if m >= n:
            raise InputValueError(f"need fewer deflation vectors than n; got U of shape {U.shape}")
        W = U.copy()
        self.reflectors = []
        for j in range(m):
            x = W[j:, j]
            norm = np.linalg.norm(x)
            if norm == 0:
                raise InputValueError("deflation vectors must be linearly independent")
            v = x.copy()
            v[0] += np.copysign(norm, x[0] if x[0] != 0 else 1.0)
            v /= np.linalg.norm(v)
            W[j:] -= 2.0 * np.outer(v, v @ W[j:])
            self.reflectors.append(v)
        self.n, self.m = n, m

    def lift(self, x):
        z = np.zeros(self.n)
        z[self.m:] = x
        for j in reversed(range(self.m)):
            v = self.reflectors[j]
            z[j:] -= 2.0 * v * (v @ z[j:])
        return z

    def restrict(self, y):
        z = np.array(y, dtype=np.float64, copy=True)
        for j in range(self.m):
            v = self.reflectors[j]
            z[j:] -= 2.0 * v * (v @ z[j:])
        return z[self.m:]


@dataclass
class EigResult:
    """Result of :func:`extreme_eigenvector`."""

    value: float
    vector: np.ndarray
    matvecs: int
    converged: bool


def extreme_eigenvector(matvec, n, *, which="SA", deflate=None, v0=None, tol=1e-3, ncv=None,
                        maxiter=None):
    """Smallest (``"SA"``) or largest (``"LA"``) algebraic eigenpair of a symmetric
    operator restricted to the orthogonal complement of ``deflate``.

    Parameters
    ----------
    matvec : callable
        ``matvec(x)`` returns A @ x for x of shape (n,); one pass over A each.
    n : int
    which : {"SA", "LA"}
    deflate : array (n,) or (n, m), optional
        Directions to exclude (for NOMAD: the ones vector).  The eigenvector is
        orthogonal to them to machine precision.
    v0 : array (n,), optional
        Warm start (the previous eigenvector); its component in span(deflate) is dropped.
    tol : float
        Relative accuracy of the Ritz value, as ARPACK's ``tol``.
    ncv : int, optional
        Lanczos basis size.  Small ncv with a warm start costs fewest matvecs per call.
    maxiter : int, optional
        ARPACK restarts; on no convergence the best Ritz pair is returned, flagged.

    Returns
    -------
    EigResult
        value, unit vector (float64, sign fixed so its largest-magnitude entry is
        positive), matvecs used, converged flag.
    """
    if which not in ("SA", "LA"):
        raise InputValueError(f"which must be 'SA' or 'LA'; got {which!r}")
    basis = ComplementBasis(deflate) if deflate is not None else None
    dim = n - (basis.m if basis else 0)
    count = [0]

    def op(x):
        count[0] += 1
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if basis is None:
            return np.asarray(matvec(x), dtype=np.float64).reshape(-1)
        return basis.restrict(np.asarray(matvec(basis.lift(x)), dtype=np.float64).reshape(-1))

    start = None
    if v0 is not None:
        v0 = np.asarray(v0, dtype=np.float64).reshape(-1)
        start = basis.restrict(v0) if basis else v0
        if not np.linalg.norm(start) > 0:
            start = None
    if start is None:
        # Deterministic start with weight in every direction.
        start = np.cos(np.arange(dim) * 0.7 + 0.3) + 1.5

    if dim <= 3:
        # ARPACK needs ncv < dim; a dense eigensolve of the tiny operator is exact.
        M = np.column_stack([op(e) for e in np.eye(dim)])
        w, V = np.linalg.eigh((M + M.T) / 2)
        idx = 0 if which == "SA" else -1
        return _finish(w[idx], V[:, idx], basis, count[0], True)

    if ncv is not None:
        ncv = int(min(max(ncv, 3), dim - 1))
    A = sla.LinearOperator((dim, dim), matvec=op, dtype=np.float64)
    converged = True
    try:
        w, V = sla.eigsh(A, k=1, which=which, tol=tol, v0=start, ncv=ncv, maxiter=maxiter)
    except sla.ArpackNoConvergence as exc:
        converged = False
        if exc.eigenvectors.shape[1] > 0:
            w, V = exc.eigenvalues, exc.eigenvectors
        else:
            x = start / np.linalg.norm(start)
            w, V = np.array([x @ op(x)]), x[:, None]
    return _finish(float(w[0]), V[:, 0], basis, count[0], converged)


def _finish(value, x, basis, matvecs, converged):
    v = basis.lift(x) if basis else np.asarray(x, dtype=np.float64)
    v /= np.linalg.norm(v)
    if v[np.argmax(np.abs(v))] < 0:
        v = -v
    return EigResult(float(value), v, matvecs, converged)


def top_eigenvectors(matmat, n, k, *, deflate=None, tol=1e-6, ncv=None, maxiter=None):
    """The k largest algebraic eigenpairs of a symmetric operator on the complement of
    ``deflate`` (descending), by Lanczos over matmat passes.  Vectors are sign-fixed."""
    if not 1 <= k:
        raise InputValueError(f"k must be >= 1; got {k}")
    basis = ComplementBasis(deflate) if deflate is not None else None
    dim = n - (basis.m if basis else 0)
    if k >= dim:
        raise InputValueError(f"k must be < {dim} (the dimension of the complement); got {k}")

    def op(X):
        X = np.asarray(X, dtype=np.float64).reshape(dim, -1)
        if basis is None:
            return np.asarray(matmat(X), dtype=np.float64)
        L = np.column_stack([basis.lift(x) for x in X.T])
        Y = np.asarray(matmat(L), dtype=np.float64).reshape(n, -1)
        return np.column_stack([basis.restrict(y) for y in Y.T])

    A = sla.LinearOperator((dim, dim), matvec=lambda x: op(x)[:, 0], matmat=op, dtype=np.float64)
    start = np.cos(np.arange(dim) * 0.7 + 0.3) + 1.5
    w, V = sla.eigsh(A, k=k, which="LA", tol=tol, v0=start, ncv=ncv, maxiter=maxiter)
    order = np.argsort(w)[::-1]
    w, V = w[order], V[:, order]
    if basis is not None:
        V = np.column_stack([basis.lift(x) for x in V.T])
    signs = np.sign(V[np.argmax(np.abs(V), axis=0), np.arange(V.shape[1])])
    signs[signs == 0] = 1
    return w, V * signs
