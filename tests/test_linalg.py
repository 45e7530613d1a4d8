import numpy as np
import pytest

from dnomad.errors import InputValueError
from dnomad.linalg import ComplementBasis, extreme_eigenvector, top_eigenvectors


def path_laplacian(n):
    L = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    L[0, 0] = L[-1, -1] = 1
    return L


def test_complement_basis_is_orthonormal_and_orthogonal(rng):
    U = rng.standard_normal((30, 3))
    B = ComplementBasis(U)
    E = np.column_stack([B.lift(e) for e in np.eye(27)])
    np.testing.assert_allclose(E.T @ E, np.eye(27), atol=1e-12)
    np.testing.assert_allclose(U.T @ E, 0, atol=1e-12)
    x = rng.standard_normal(30)
    np.testing.assert_allclose(B.restrict(x), E.T @ x, atol=1e-12)


@pytest.mark.parametrize("n", [6, 50, 200])
def test_smallest_on_complement_of_ones_is_fiedler_vector(n):
    # Path-graph Laplacian: eigenvalues 2 - 2 cos(pi k / n), k = 0..n-1; k = 0 is the ones vector.
    L = path_laplacian(n)
    ones = np.ones(n) / np.sqrt(n)
    res = extreme_eigenvector(lambda x: L @ x, n, which="SA", deflate=ones, tol=1e-12)
    lam1 = 2 - 2 * np.cos(np.pi / n)
    assert res.value == pytest.approx(lam1, rel=1e-9)
    assert abs(res.vector @ ones) < 1e-12
    np.testing.assert_allclose(L @ res.vector, lam1 * res.vector, atol=1e-8)
    assert res.matvecs > 0 and res.converged


def test_warm_start_needs_fewer_matvecs(rng):
    n = 300
    A = rng.standard_normal((n, n))
    A = (A + A.T) / 2
    ones = np.ones(n) / np.sqrt(n)
    cold = extreme_eigenvector(lambda x: A @ x, n, deflate=ones, tol=1e-8, ncv=8)
    warm = extreme_eigenvector(lambda x: A @ x, n, deflate=ones, v0=cold.vector, tol=1e-8, ncv=8)
    assert warm.value == pytest.approx(cold.value, rel=1e-7)
    assert warm.matvecs < cold.matvecs


def test_top_eigenvectors_match_dense(rng):
    n = 80
    A = rng.standard_normal((n, n))
    A = A @ A.T
    w, V = top_eigenvectors(lambda X: A @ X, n, 3, tol=1e-12)
    wd, Vd = np.linalg.eigh(A)
    np.testing.assert_allclose(w, wd[::-1][:3], rtol=1e-9)
    for k in range(3):
        assert abs(abs(V[:, k] @ Vd[:, -1 - k]) - 1) < 1e-8


def test_bad_which():
    with pytest.raises(InputValueError, match="which"):
        extreme_eigenvector(lambda x: x, 10, which="LM")
