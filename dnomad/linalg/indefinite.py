"""Dense symmetric indefinite systems: the solution and the inertia from one
Bunch-Kaufman factorization S = L D L^T (LAPACK sytrf), for saddle-point systems
whose number of negative eigenvalues matters as much as the solution (Sylvester's law
of inertia: S and D have the same inertia)."""
from __future__ import annotations

import numpy as np
import scipy.linalg

# Sweeps of symmetric equilibration before the factorization (each O(m^2)), stopped
# once every row's largest entry is within EQUILIBRATION_TOL of 1.
EQUILIBRATION_SWEEPS = 10
EQUILIBRATION_TOL = 0.5


def equilibrate(S):
    """Positive scales c with every row of diag(c) S diag(c) having its largest
    magnitude in [1 - EQUILIBRATION_TOL, 1 + EQUILIBRATION_TOL] (symmetric Ruiz sweeps,
    c_i /= sqrt(max_j |S'_ij|), at most EQUILIBRATION_SWEEPS); zero rows keep scale 1.
    A congruence, so the inertia is S's.  It brings the multipliers of constraint rows
    whose diagonal block is zero to the scale of the rest: left as they are, their
    eigenvalues can sit near the round-off of the largest, where the factorization's
    errors decide their signs."""
    magnitude = np.abs(S)
    scaled = np.empty_like(magnitude)
    c = np.ones(S.shape[0])
    for _ in range(EQUILIBRATION_SWEEPS):
        row_max = np.multiply(magnitude, c[None], out=scaled).max(axis=1) * c
        row_max[row_max == 0] = 1.0
        if np.all(np.abs(row_max - 1.0) <= EQUILIBRATION_TOL):
            break
        c /= np.sqrt(row_max)
    return c


def solve_with_inertia(S, b):
    """(x, negative): x = S^-1 b and the number of negative eigenvalues of S.

    S (m x m) is symmetric (its lower triangle is read); b has m entries.  S is first
    equilibrated (:func:`equilibrate`); then one factorization, about m^3 / 3 flops,
    against about 4 m^3 for ``eigh`` with eigenvectors; D is block diagonal with 1 x 1
    and 2 x 2 blocks, so its inertia and the solve with it cost O(m).  A singular S
    raises ``numpy.linalg.LinAlgError``, as a solve would.
    """
    S = np.asarray(S, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = S.shape[0]
    if m == 0:
        return np.zeros(0), 0
    c = equilibrate(S)
    A = S * c[:, None]
    A *= c[None]
    lwork, _ = scipy.linalg.lapack.dsytrf_lwork(m, lower=1)
    ldu, ipiv, info = scipy.linalg.lapack.dsytrf(A, lower=1, lwork=max(int(lwork), 1), overwrite_a=1)
    if info > 0:
        raise np.linalg.LinAlgError("singular matrix: a pivot of its L D L^T factorization is exactly zero")
    x, _ = scipy.linalg.lapack.dsytrs(ldu, ipiv, (c * b)[:, None], lower=1)
    # A 2 x 2 block of D at rows k, k + 1 has ipiv[k] = ipiv[k + 1] < 0; the blocks do
    # not overlap, so every other negative entry starts one.
    firsts = np.flatnonzero(ipiv < 0)[::2]
    off = np.zeros(m - 1)
    off[firsts] = ldu[firsts + 1, firsts]
    return c * x[:, 0], _negative_eigenvalues(np.diag(ldu).copy(), off)


def _negative_eigenvalues(main, off):
    """Negative eigenvalues of a block diagonal D given by its diagonal and first
    subdiagonal (a nonzero subdiagonal entry k joins rows k and k + 1 in a 2 x 2 block)."""
    pairs = np.flatnonzero(off != 0.0)
    paired = np.zeros(len(main), dtype=bool)
    paired[pairs] = paired[pairs + 1] = True
    a, c, b = main[pairs], main[pairs + 1], off[pairs]
    det, trace = a * c - b * b, a + c
    # A 2 x 2 block's two eigenvalues: one negative where det < 0; both negative where
    # det > 0 and trace < 0; one zero and one negative where det = 0 and trace < 0.
    return int(np.sum(main[~paired] < 0) + np.sum(det < 0) + 2 * np.sum((det > 0) & (trace < 0))
               + np.sum((det == 0) & (trace < 0)))
