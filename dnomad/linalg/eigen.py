"""Extreme eigenvectors of a symmetric operator restricted to a subspace's complement.

Only ``matmat`` passes touch the operator: the n x n matrix never comes into one
process.  The vectors of length n live on the client; ARPACK (``scipy eigsh``)
drives the Lanczos iteration on the (n - m)-dimensional complement of the given
vectors, represented exactly by Householder reflectors (no shift to guess, no
drift back into the deflated directions).

Vectors that live on a GPU (CuPy arrays, for an operator over device blocks) stay
there: :func:`extreme_eigenvector` then runs its own thick-restart Lanczos
(:func:`lanczos_extreme`) with the same stopping rule as ARPACK's, and only scalars
and the small projected matrix come to the host.  Short device vectors (up to
``HOST_EIGENSOLVE_MAX_N`` entries) are the exception: copying one costs a transfer's
latency, as a scalar does, while each Lanczos step on the device is some thirty kernel
launches and synchronizations; ARPACK runs them on the host, one copy each way per matvec.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg as sla

from ..blocks.device import array_module, is_device_array
from ..errors import InputValueError
from .operator import as_matmat


# Device vectors up to this length (64 KiB in float64) are solved for on the host.
HOST_EIGENSOLVE_MAX_N = 8192


class ComplementBasis:
    """An orthonormal basis of the orthogonal complement of span(U), U of shape (n, m).

    H = H_0 ... H_{m-1} (Householder reflectors) maps e_0..e_{m-1} onto span(U);
    its remaining columns span the complement.  ``lift`` maps R^{n-m} -> R^n and
    ``restrict`` is its adjoint; both cost O(n m).
    """

    def __init__(self, U):
        xp = self.xp = array_module(U)        # the reflectors live where U does
        U = xp.asarray(U, dtype=np.float64)
        if U.ndim == 1:
            U = U[:, None]
        n, m = U.shape
        if m >= n:
            raise InputValueError(f"need fewer deflation vectors than n; got U of shape {U.shape}")
        W = U.copy()
        self.reflectors = []
        for j in range(m):
            x = W[j:, j]
            norm = float(xp.linalg.norm(x))
            if norm == 0:
                raise InputValueError("deflation vectors must be linearly independent")
            v = x.copy()
            x0 = float(x[0])
            v[0] += np.copysign(norm, x0 if x0 != 0 else 1.0)
            v /= xp.linalg.norm(v)
            W[j:] -= 2.0 * xp.outer(v, v @ W[j:])
            self.reflectors.append(v)
        self.n, self.m = n, m

    def lift(self, x):
        z = self.xp.zeros(self.n)
        z[self.m:] = x
        for j in reversed(range(self.m)):
            v = self.reflectors[j]
            z[j:] -= 2.0 * v * (v @ z[j:])
        return z

    def restrict(self, y):
        z = self.xp.array(y, dtype=np.float64, copy=True)
        for j in range(self.m):
            v = self.reflectors[j]
            z[j:] -= 2.0 * v * (v @ z[j:])
        return z[self.m:]


@dataclass(frozen=True, eq=False)
class EigResult:
    """Result of :func:`extreme_eigenvector`."""

    value: float
    vector: np.ndarray
    matvecs: int
    converged: bool


def extreme_eigenvector(matvec, n=None, *, which="SA", deflate=None, v0=None, tol=1e-3, ncv=None,
                        maxiter=None, host_max_n=None):
    """Smallest (``"SA"``) or largest (``"LA"``) algebraic eigenpair of a symmetric
    operator restricted to the orthogonal complement of ``deflate``.

    Parameters
    ----------
    matvec : SymmetricOperator or callable
        A :class:`~dnomad.linalg.operator.SymmetricOperator` (its ``matmat`` on one
        vector; ``n`` from its shape), or ``matvec(x)`` returning A @ x for x of shape
        (n,); one pass over A each.
    n : int, optional
        A's order; needed with a callable.
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
    host_max_n : int, optional
        Device (CuPy) vectors of up to this many entries are copied to the host and
        solved for by ARPACK, the matvecs still on the device (default
        ``HOST_EIGENSOLVE_MAX_N``; 0 keeps every device problem on the device).

    Returns
    -------
    EigResult
        value, unit vector (float64, sign fixed so its largest-magnitude entry is
        positive), matvecs used, converged flag.
    """
    if which not in ("SA", "LA"):
        raise InputValueError(f"which must be 'SA' or 'LA'; got {which!r}")
    matvec, n = as_matmat(matvec, n)
    on_device = any(is_device_array(a) for a in (deflate, v0))
    xp = array_module(deflate if is_device_array(deflate) else v0)
    if on_device and n <= (HOST_EIGENSOLVE_MAX_N if host_max_n is None else host_max_n):
        res = extreme_eigenvector(lambda x: _host(matvec(xp.asarray(x))), n, which=which,
                                  deflate=None if deflate is None else _host(deflate),
                                  v0=None if v0 is None else _host(v0), tol=tol, ncv=ncv, maxiter=maxiter)
        return EigResult(res.value, xp.asarray(res.vector), res.matvecs, res.converged)
    basis = ComplementBasis(deflate) if deflate is not None else None
    dim = n - (basis.m if basis else 0)
    count = [0]

    def op(x):
        count[0] += 1
        x = xp.asarray(x, dtype=np.float64).reshape(-1)
        if basis is None:
            return xp.asarray(matvec(x), dtype=np.float64).reshape(-1)
        return basis.restrict(xp.asarray(matvec(basis.lift(x)), dtype=np.float64).reshape(-1))

    start = None
    if v0 is not None:
        v0 = xp.asarray(v0, dtype=np.float64).reshape(-1)
        start = basis.restrict(v0) if basis else v0
        if not float(xp.linalg.norm(start)) > 0:
            start = None
    if start is None:
        # Deterministic start with weight in every direction.
        start = xp.cos(xp.arange(dim) * 0.7 + 0.3) + 1.5

    if dim <= 3:
        # ARPACK needs ncv < dim; a dense eigensolve of the tiny operator is exact.
        M = np.column_stack([_host(op(e)) for e in xp.eye(dim)])
        w, V = np.linalg.eigh((M + M.T) / 2)
        idx = 0 if which == "SA" else -1
        return _finish(w[idx], xp.asarray(V[:, idx]), basis, count[0], True)

    if on_device:
        value, x, converged = lanczos_extreme(op, start, which=which, tol=tol, ncv=ncv or 20,
                                              maxiter=maxiter)
        return _finish(value, x, basis, count[0], converged)

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
    xp = array_module(x)
    v = basis.lift(x) if basis else xp.asarray(x, dtype=np.float64)
    v /= xp.linalg.norm(v)
    if float(v[int(xp.argmax(xp.abs(v)))]) < 0:
        v = -v
    return EigResult(float(value), v, matvecs, converged)


def _host(a):
    return a.get() if is_device_array(a) else np.asarray(a)


class ArrayVectors:
    """The vectors of :func:`lanczos_extreme` as NumPy or CuPy arrays (``xp``); sums are
    accumulated term by term (a stacked copy of the basis would double its memory)."""

    def __init__(self, xp, dim):
        self.xp, self.dim = xp, int(dim)

    def dots(self, vectors, w):
        return _host(self.xp.stack([v @ w for v in vectors]))

    def _sum(self, coeffs, vectors, base=None):
        out = self.xp.zeros(self.dim) if base is None else base.copy()
        for c, v in zip(coeffs, vectors):
            out += float(c) * v
        return out

    def combine(self, coeffs, vectors, base=None):
        out = self._sum(coeffs, vectors, base)
        return out, float(out @ out)

    def rotate(self, vectors, S):
        return [self._sum(S[:, k], vectors) for k in range(S.shape[1])]     # no norms: no device syncs

    def release(self, v):
        pass


def lanczos_extreme(op, start, *, which="SA", tol=1e-3, ncv=20, maxiter=None, vectors=None):
    """The smallest ("SA") or largest ("LA") eigenpair of a symmetric operator by Lanczos
    with thick restarts, on the device of ``start`` (NumPy or CuPy vectors alike), or
    on the vectors of ``vectors``: any space with ``dim``, ``dots(vs, w)`` (the inner
    products <v, w> as a host array), ``combine(coeffs, vs, base=None)`` (base + sum
    c_j v_j and its squared norm), ``rotate(vs, S)`` (the vectors sum_j S_jk v_j, the
    vs released) and ``release(v)`` (a vector no longer used), of which ``start`` and
    ``op``'s values are members (vectors kept in a solver's row chunks, for one).

    The basis (``ncv`` vectors, fully reorthogonalized) and its products with the
    operator are kept, so the Rayleigh-Ritz step is exact.  A restart keeps the
    ``ncv // 2`` Ritz vectors nearest the wanted end and the wanted one's residual,
    which continues the same Krylov space (thick restart, Wu and Simon; as ARPACK's
    implicit restart with exact shifts, which also keeps more than the one wanted
    pair).  Stops when ||A x - theta x|| <= tol max(|theta|, eps^(2/3)) (ARPACK's rule;
    or when it reaches the rounding level 8 eps ||H|| sqrt(dim)) or after ``maxiter``
    restarts (default 10 dim).  Only scalars and the ncv x ncv projected matrix come to
    the host.  Returns (theta, x, converged); the caller releases x."""
    space = ArrayVectors(array_module(start), start.shape[0]) if vectors is None else vectors
    dim = space.dim
    ncv = int(min(max(ncv, 2), dim))
    keep = max(1, ncv // 2)
    maxiter = 10 * dim if maxiter is None else int(maxiter)
    floor = np.finfo(np.float64).eps ** (2.0 / 3.0)
    H = np.zeros((ncv, ncv))

    def unit(u, norm):
        v, _ = space.combine([1.0 / norm], [u])
        space.release(u)
        return v

    def extend(V, W):
        # V[m] = A V[m-1] orthogonalized against V (twice is enough, Kahan-Parlett), W[m]
        # its product, H's column m; False where the space is invariant.
        c = space.dots(V + [W[-1]], W[-1])
        u, _ = space.combine(-c[:-1], V, base=W[-1])
        u2, norm2 = space.combine(-space.dots(V, u), V, base=u)
        space.release(u)
        if not np.sqrt(max(norm2, 0.0)) > 1e-12 * np.sqrt(max(c[-1], 0.0)):
            space.release(u2)
            return False
        V.append(unit(u2, float(np.sqrt(norm2))))
        W.append(op(V[-1]))
        H[:len(V), len(V) - 1] = H[len(V) - 1, :len(V)] = space.dots(V, W[-1])
        return True

    V = [space.combine([1.0 / float(np.sqrt(space.dots([start], start)[0]))], [start])[0]]
    W = [op(V[0])]
    H[0, 0] = space.dots(V, W[0])[0]
    for restart in range(maxiter + 1):
        while len(V) < ncv and extend(V, W):
            pass
        m = len(V)
        w, S = np.linalg.eigh(H[:m, :m])
        wanted = np.argsort(w if which == "SA" else -w, kind="stable")[:min(keep, m)]
        theta = float(w[wanted[0]])
        # the kept Ritz vectors and their products, the wanted one first
        V, W = space.rotate(V, S[:, wanted]), space.rotate(W, S[:, wanted])
        r, res2 = space.combine([-theta], [V[0]], base=W[0])
        res = float(np.sqrt(max(res2, 0.0)))
        # Below about eps ||A|| sqrt(dim) the computed residual is rounding: a tighter tol
        # stops there (ARPACK's Ritz estimate would go lower, but not its true residual).
        noise = 8 * np.finfo(np.float64).eps * float(np.abs(w).max()) * np.sqrt(dim)
        converged = res <= max(tol * max(abs(theta), floor), noise) or m < ncv
        if converged or restart == maxiter:
            break
        # Restart from the kept Ritz vectors and r / |r|: r is orthogonal to the basis.
        r2, norm2 = space.combine(-space.dots(V, r), V, base=r)
        space.release(r)
        V.append(unit(r2, float(np.sqrt(norm2))))
        W.append(op(V[-1]))
        k = len(V) - 1
        H[:] = 0
        H[range(k), range(k)] = w[wanted]
        H[:k + 1, k] = H[k, :k + 1] = space.dots(V, W[-1])
    space.release(r)
    return theta, _only_first(space, V, W), converged


def _only_first(space, V, W):
    """V[0], the other vectors released."""
    for v in V[1:] + W:
        space.release(v)
    return V[0]


def top_eigenvectors(matmat, n=None, k=None, *, deflate=None, tol=1e-6, ncv=None, maxiter=None):
    """The k largest algebraic eigenpairs of a symmetric operator on the complement of
    ``deflate`` (descending), by Lanczos over matmat passes.  Vectors are sign-fixed.
    ``matmat``: a :class:`~dnomad.linalg.operator.SymmetricOperator` (``n`` from its
    shape), or a callable V -> A V with ``n`` given."""
    matmat, n = as_matmat(matmat, n)
    if k is None:
        raise InputValueError("k (the number of eigenpairs) must be given")
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
