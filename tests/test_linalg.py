import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components
from sklearn.metrics import adjusted_rand_score

from devices import CUDA, DEVICES
from dnomad import blocks
from dnomad.blocks import device as dev
from dnomad.errors import InputValueError
from dnomad.linalg import ComplementBasis, extreme_eigenvector, top_eigenvectors
from dnomad.linalg.eigen import lanczos_extreme


# "cpu": ARPACK.  "cuda": vectors on the GPU; these problems are short enough that ARPACK
# runs on host copies over the device's matvecs.  "cuda-lanczos": the same problems kept on
# the GPU (host_max_n=0), the eigensolver's own Lanczos, as for large n.
EIGEN_PATHS = DEVICES + [pytest.param("cuda-lanczos", marks=CUDA.marks)]


def on(path, a):
    """``a`` where the test computes: NumPy for "cpu", CuPy for the cuda paths."""
    return dev.to_device(a, "cpu" if path == "cpu" else "cuda")


def host_max_n(path):
    return 0 if path == "cuda-lanczos" else None


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


@pytest.mark.parametrize("path", EIGEN_PATHS)
@pytest.mark.parametrize("n", [6, 50, 200])
def test_smallest_on_complement_of_ones_is_fiedler_vector(n, path):
    # Path-graph Laplacian: eigenvalues 2 - 2 cos(pi k / n), k = 0..n-1; k = 0 is the ones vector.
    L = path_laplacian(n)
    Ld = on(path, L)
    ones = np.ones(n) / np.sqrt(n)
    res = extreme_eigenvector(lambda x: Ld @ x, n, which="SA", deflate=on(path, ones), tol=1e-12,
                              host_max_n=host_max_n(path))
    assert dev.device_of(res.vector) == dev.device_of(Ld)
    v = dev.to_host(res.vector)
    lam1 = 2 - 2 * np.cos(np.pi / n)
    assert res.value == pytest.approx(lam1, rel=1e-9)
    assert abs(v @ ones) < 1e-12
    np.testing.assert_allclose(L @ v, lam1 * v, atol=1e-8)
    assert res.matvecs > 0 and res.converged


@pytest.mark.parametrize("path", EIGEN_PATHS)
def test_warm_start_needs_fewer_matvecs(rng, path):
    n = 300
    A = rng.standard_normal((n, n))
    A = on(path, (A + A.T) / 2)
    ones = on(path, np.ones(n) / np.sqrt(n))
    kw = dict(deflate=ones, tol=1e-8, ncv=8, host_max_n=host_max_n(path))
    cold = extreme_eigenvector(lambda x: A @ x, n, **kw)
    warm = extreme_eigenvector(lambda x: A @ x, n, v0=cold.vector, **kw)
    assert dev.device_of(warm.vector) == dev.device_of(A)
    assert warm.value == pytest.approx(cold.value, rel=1e-7)
    assert warm.matvecs < cold.matvecs


@pytest.mark.parametrize("which", ["SA", "LA"])
@pytest.mark.parametrize("tol", [1e-2, 1e-10])
def test_lanczos_meets_its_stopping_rule_against_eigh(rng, which, tol):
    """The device eigensolver's Lanczos, run here on NumPy vectors: its residual is within
    ARPACK's bound tol |theta|, and theta is then within tol^2-order of the true extreme
    eigenvalue (Rayleigh quotient of a vector with residual r: error <= |r|^2 / gap)."""
    n = 400
    A = rng.standard_normal((n, n))
    A = (A + A.T) / 2
    w, V = np.linalg.eigh(A)
    matvecs = [0]

    def op(x):
        matvecs[0] += 1
        return A @ x

    theta, x, converged = lanczos_extreme(op, np.ones(n), which=which, tol=tol, ncv=6)
    assert converged
    assert np.linalg.norm(x) == pytest.approx(1, rel=1e-12)
    assert np.linalg.norm(A @ x - theta * x) <= tol * abs(theta) * (1 + 1e-9)
    exact = w[0] if which == "SA" else w[-1]
    gap = abs(w[1] - w[0]) if which == "SA" else abs(w[-1] - w[-2])
    assert abs(theta - exact) <= (tol * abs(theta)) ** 2 / gap * (1 + 1e-6) + 1e-12
    if tol < 1e-6:
        assert abs(abs(x @ V[:, 0 if which == "SA" else -1]) - 1) < 1e-8


def test_lanczos_over_a_space_of_vectors_releases_all_but_its_result(rng):
    """Over a space of vectors it does not hold (the row chunks' states, for Riemannian
    K-means), Lanczos releases every vector it made but the one it returns, converged
    or stopped at maxiter (without a last restart's product), and finds the same pair
    as over arrays."""
    from dnomad.linalg.eigen import ArrayVectors

    n = 300
    A = rng.standard_normal((n, n))
    A = (A + A.T) / 2

    class Counted(ArrayVectors):
        def __init__(self):
            super().__init__(np, n)
            self.live = {}

        def made(self, v):
            self.live[id(v)] = v
            return v

        def combine(self, coeffs, vectors, base=None):
            out, norm2 = super().combine(coeffs, vectors, base)
            return self.made(out), norm2

        def rotate(self, vectors, S):
            out = [self.made(v) for v in super().rotate(vectors, S)]
            for v in vectors:
                self.release(v)
            return out

        def release(self, v):
            assert self.live.pop(id(v), None) is not None, "released twice or never made"

    for maxiter, ncv in ((None, 8), (0, 8), (2, 8)):
        space, products = Counted(), [0]

        def op(x):
            products[0] += 1
            return space.made(A @ x)

        start = rng.standard_normal(n)
        theta, x, converged = lanczos_extreme(op, start, which="SA", tol=1e-8, ncv=ncv, maxiter=maxiter,
                                              vectors=space)
        assert list(space.live) == [id(x)]
        if maxiter is None:
            assert converged and theta == pytest.approx(np.linalg.eigvalsh(A)[0], rel=1e-10)
        else:
            # ncv products fill the basis; each restart keeps ncv // 2 vectors and makes the rest
            assert not converged and products[0] == ncv + maxiter * (ncv - ncv // 2)


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


def _operators(rng):
    """Each n x n operator type of dnomad, with its dense matrix."""
    from dnomad.blocks.operators import DataGram, LowRankGram, ScaledMatrix

    n = 40
    X = rng.standard_normal((n, 3))
    gram = DataGram(X, scale=2.0)
    Y = rng.random((n, 4))
    A = rng.standard_normal((n, n))
    A = A + A.T
    block = blocks.from_array(A, block_size=16, dtype=np.float64)
    return [("BlockMatrix", block, A), ("LowRankGram", LowRankGram(Y), Y @ Y.T),
            ("DataGram", gram, gram.dense()), ("ScaledMatrix", ScaledMatrix(block, 4.0, 1.0), A / 4.0)]


def test_every_operator_follows_the_symmetric_operator_protocol(rng):
    from dnomad.linalg import SymmetricOperator

    V = rng.standard_normal((40, 3))
    for name, op, dense in _operators(rng):
        assert isinstance(op, SymmetricOperator), name
        assert tuple(op.shape) == dense.shape, name
        np.testing.assert_allclose(op.matmat(V), dense @ V, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(op.matmat(V[:, 0]), dense @ V[:, 0], atol=1e-10, err_msg=name)
        np.testing.assert_allclose(op.diag(), np.diag(dense), atol=1e-12, err_msg=name)
        want = {"sum": dense.sum(), "fro": np.linalg.norm(dense), "min": dense.min(), "max": dense.max()}
        got = op.summary()
        assert set(got) == set(want), name
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-10, abs=1e-10), (name, key)
        # Components of a thresholded graph: a number and per-node thresholds, against
        # SciPy on the dense matrix (a threshold that leaves several components).
        top = np.quantile(dense, 0.97)
        for t in (top, top * (0.8 + 0.4 * rng.random(len(dense)))):
            edges = dense > np.maximum.outer(np.broadcast_to(t, len(dense)), np.broadcast_to(t, len(dense)))
            n_ref, ref = connected_components(edges, directed=False)
            ours = op.threshold_components(t)
            assert ours.max() + 1 == n_ref > 1, name
            assert adjusted_rand_score(ref, ours) == 1.0, name
            assert ours[0] == 0 and np.all(np.diff(np.maximum.accumulate(ours)) <= 1), name


def test_eigensolvers_take_an_operator_or_a_callable(rng):
    for name, op, dense in _operators(rng):
        w = np.linalg.eigvalsh(dense)
        by_op = top_eigenvectors(op, k=2, tol=1e-10)
        by_callable = top_eigenvectors(op.matmat, dense.shape[0], 2, tol=1e-10)
        np.testing.assert_allclose(by_op[0], w[::-1][:2], rtol=1e-8, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(by_op[0], by_callable[0], rtol=1e-12, atol=1e-12, err_msg=name)
        smallest = extreme_eigenvector(op, which="SA", tol=1e-10)
        assert smallest.value == pytest.approx(w[0], rel=1e-7, abs=1e-9), name
    with pytest.raises(TypeError, match="n must be given"):
        top_eigenvectors(lambda V: V, k=1)


def planted_operator(n, k, rng, top=(10.0, 5.0), rest=(-1.0, 4.9), along_ones=50.0):
    """A symmetric n x n matrix whose largest eigenvalue is along the ones vector and whose
    top k on its complement are spread over ``top``, the others drawn from ``rest``; the
    complement's basis and its exact top k."""
    basis = np.linalg.qr(np.column_stack([np.ones(n), rng.standard_normal((n, n - 1))]))[0]
    values = np.concatenate([[along_ones], np.linspace(*top, k), rng.uniform(*rest, n - 1 - k)])
    A = (basis * values) @ basis.T
    return 0.5 * (A + A.T), basis, np.sort(values[1:])[::-1][:k]


@pytest.mark.parametrize("device", DEVICES)
def test_lobpcg_top_finds_the_top_eigenpairs_on_the_complement_of_a_constraint(device, rng):
    from dnomad.linalg.lobpcg import lobpcg_top

    n, k = 600, 12
    A, basis, exact = planted_operator(n, k, rng)
    A_dev, ones = on(device, A), on(device, np.ones((n, 1)) / np.sqrt(n))
    start = on(device, rng.standard_normal((n, k)))
    calls = [0]

    def product(V):
        calls[0] += 1
        return A_dev @ V

    w, U, products = lobpcg_top(product, start, constraint=ones, tol=1e-8, maxiter=200)
    assert dev.device_of(U) == device
    w, U = dev.to_host(w), dev.to_host(U)
    np.testing.assert_allclose(w, exact, rtol=1e-9)
    assert np.all(np.diff(w) <= 0)
    np.testing.assert_allclose(U.T @ U, np.eye(k), atol=1e-10)
    assert np.abs(U.sum(axis=0)).max() < 1e-10              # the ones vector left out, though largest
    np.testing.assert_allclose(np.einsum("ij,ij->j", U, A @ U), w, rtol=1e-9)
    # LOBPCG tests the residual it carries (A X combined as X is, no extra product); a
    # fresh A @ U differs from it by the basis's loss of orthogonality times ||A|| (one
    # orthonormalization pass where it suffices): 1.3e-8 at tol 1e-8 on an H100.
    assert np.linalg.norm(A @ U - U * w, axis=0).max() <= 2e-8
    # The count it reports is the products it took, and the tolerance is what stopped it:
    # capped 10 iterations earlier, it runs to the cap (one product per iteration after
    # the first) and its residuals are still above the tolerance there.
    assert products == calls[0]
    early = products - 11
    we, Ue, products_early = lobpcg_top(product, start, constraint=ones, tol=1e-8, maxiter=early)
    assert products_early == early + 1
    we, Ue = dev.to_host(we), dev.to_host(Ue)
    assert np.linalg.norm(A @ Ue - Ue * we, axis=0).max() > 1e-8
    # Warm-started from the answer after a small change of A: a few products, not a restart.
    A2 = A + 1e-3 * np.outer(basis[:, 1], basis[:, 1])
    A2_dev = on(device, A2)
    w2, U2, warm = lobpcg_top(lambda V: A2_dev @ V, on(device, U), constraint=ones, tol=1e-6, maxiter=200)
    exact2 = np.sort(np.linalg.eigvalsh(basis[:, 1:].T @ A2 @ basis[:, 1:]))[::-1][:k]
    np.testing.assert_allclose(dev.to_host(w2), exact2, rtol=1e-7)
    assert warm < products / 2


@pytest.mark.parametrize("device", DEVICES)
def test_lobpcg_top_converges_only_the_wanted_pairs(device, rng):
    """With ``wanted`` (a count from the current Ritz values) only that many leading
    pairs must meet the tolerance: it stops in fewer products, those pairs are as
    accurate as a full solve's, the others need not be; it receives the Ritz values in
    decreasing order, as host floats."""
    from dnomad.linalg.lobpcg import lobpcg_top

    n, k, m = 600, 12, 3
    A, basis, exact = planted_operator(n, k, rng)
    A_dev, ones = on(device, A), on(device, np.ones((n, 1)) / np.sqrt(n))
    start = on(device, rng.standard_normal((n, k)))
    seen = []

    def wanted(w):
        seen.append(w)
        return m

    _, _, every = lobpcg_top(lambda V: A_dev @ V, start, constraint=ones, tol=1e-8, maxiter=300)
    w, U, some = lobpcg_top(lambda V: A_dev @ V, start, constraint=ones, tol=1e-8, maxiter=300, wanted=wanted)
    w, U = dev.to_host(w), dev.to_host(U)
    residuals = np.linalg.norm(A @ U - U * w, axis=0)
    assert some < every
    assert residuals[:m].max() <= 2e-8
    assert residuals[m:].max() > 1e-8                       # stopped before the rest converged
    np.testing.assert_allclose(w[:m], exact[:m], rtol=1e-9)
    np.testing.assert_allclose(U.T @ U, np.eye(k), atol=1e-10)
    assert seen and all(isinstance(v, np.ndarray) and v.shape == (k,) and np.all(np.diff(v) <= 0) for v in seen)


@pytest.mark.parametrize("device", DEVICES)
def test_lobpcg_top_survives_dependent_blocks(device, rng):
    """A start with repeated columns, and one that already holds k - 1 exact eigenvectors
    (their residuals vanish, so the residual block is nearly rank one): the Rayleigh-Ritz
    basis drops the dependent directions (CuPy's lobpcg stopped with an error here) and
    the answer is still the top k."""
    from dnomad.linalg.lobpcg import lobpcg_top

    n, k = 400, 10
    A, basis, exact = planted_operator(n, k, rng)
    A_dev, ones = on(device, A), on(device, np.ones((n, 1)) / np.sqrt(n))
    repeated = rng.standard_normal((n, k))
    repeated[:, 1] = repeated[:, 0]
    nearly_there = basis[:, 1:k + 1].copy()
    nearly_there[:, -1] = rng.standard_normal(n)
    for start in (repeated, nearly_there):
        w, U, _ = lobpcg_top(lambda V: A_dev @ V, on(device, start), constraint=ones, tol=1e-8, maxiter=300)
        np.testing.assert_allclose(dev.to_host(w), exact, rtol=1e-8)
        np.testing.assert_allclose(dev.to_host(U.T @ U), np.eye(k), atol=1e-9)


def test_lobpcg_top_refuses_more_vectors_than_the_complement_holds(rng):
    from dnomad.linalg.lobpcg import lobpcg_top

    ones = np.ones((5, 1)) / np.sqrt(5)
    with pytest.raises(InputValueError, match="k <= n - m"):
        lobpcg_top(lambda V: V, rng.standard_normal((5, 5)), constraint=ones)
    with pytest.raises(InputValueError, match="n x k"):
        lobpcg_top(lambda V: V, rng.standard_normal(5))


@pytest.mark.parametrize("kind", ["definite", "indefinite", "saddle point", "scaled saddle point"])
def test_solve_with_inertia_matches_a_dense_solve_and_the_eigenvalue_signs(rng, kind):
    """Against numpy's solve and eigvalsh: a spectrum with known signs, and a KKT matrix
    [[A, B], [B^T, 0]] whose zero block forces 2 x 2 pivots (inertia: m - p positive, p
    negative for A positive definite and B of full column rank p), also with A's scale
    far from B's."""
    from dnomad.linalg.indefinite import solve_with_inertia

    m = 60
    if kind.endswith("saddle point"):
        # Scaled: the primal block 1e8 times the constraints', as in the Riemannian
        # Newton system, where the multipliers' eigenvalues sit near 1e-8 of the largest.
        p, scale = 12, 1e8 if kind.startswith("scaled") else 1.0
        G = rng.standard_normal((m - p, m - p))
        B = rng.standard_normal((m - p, p))
        S = np.block([[scale * (G @ G.T + np.eye(m - p)), B], [B.T, np.zeros((p, p))]])
        expected = p
    else:
        Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
        signs = np.ones(m) if kind == "definite" else np.where(np.arange(m) % 3 == 0, -1.0, 1.0)
        S = (Q * (signs * rng.uniform(0.5, 4.0, m))) @ Q.T
        expected = int(np.sum(signs < 0))
    assert int(np.sum(np.linalg.eigvalsh(S) < 0)) == expected
    b = rng.standard_normal(m)
    x, negative = solve_with_inertia(S, b)
    assert negative == expected
    # Backward-stable solve: residual at the level of eps * cond(S) * ||b||.
    assert np.linalg.norm(S @ x - b) <= 1e-10 * np.linalg.cond(S) * np.linalg.norm(b)
    np.testing.assert_allclose(x, np.linalg.solve(S, b), rtol=1e-8 * np.linalg.cond(S))
