"""Bregman divergences, the projection onto M2 and the induced norm Omega (Cheng, Zhang,
Schuurmans), each against an independent computation."""
import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from dnomad.errors import InputValueError
from dnomad.bregman import (DIVERGENCES, get_divergence, omega, omega_dual, omega_lmo,
                                    omega_squared_from_singular_values, project_m2)


def domain_points(div, rng, shape):
    if div.name == "logistic":
        return rng.uniform(0.02, 0.98, shape)
    if div.name in ("kl", "itakura-saito"):
        return rng.uniform(0.05, 4.0, shape)
    return rng.normal(size=shape)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_divergence_definition_and_duality(name, rng):
    div = get_divergence(name)
    x, y = domain_points(div, rng, (50, 6)), domain_points(div, rng, (50, 6))
    D = div(x, y)
    assert D.shape == (50,) and np.all(D > 0)
    np.testing.assert_allclose(div(x, x), 0, atol=1e-12)
    # The definition through F and f (the stable forms differ from it only by round-off).
    np.testing.assert_allclose(D, np.sum(div.F(x) - div.F(y) - (x - y) * div.f(y), axis=1), rtol=1e-9, atol=1e-12)
    # f is F's derivative (central differences), f^-1 inverts it.
    h = 1e-6
    np.testing.assert_allclose(div.f(x), (div.F(x + h) - div.F(x - h)) / (2 * h), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(div.f_inv(div.f(x)), x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(div.curvature(x), (div.f(x + h) - div.f(x - h)) / (2 * h), rtol=1e-5)
    # F* is the conjugate: sup_x theta x - F(x), computed numerically over F's domain.
    bounds = {"logistic": (1e-12, 1 - 1e-12), "kl": (1e-12, 1e3), "itakura-saito": (1e-9, 1e3),
              "euclidean": (-1e3, 1e3)}[name]
    for theta in div.f(x[0]):
        res = minimize_scalar(lambda v: -(theta * v - div.F(v)), bounds=bounds, method="bounded",
                              options={"xatol": 1e-12})
        assert div.F_conj(theta) == pytest.approx(-res.fun, rel=1e-7, abs=1e-9)
    # D_F(x, y) = D_F*(f(y), f(x)).
    np.testing.assert_allclose(div.conjugate(div.f(y), div.f(x)), D, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_joint_convexity_is_as_declared(name, rng):
    """The Hessian of (x, y) -> D_F(x, y) (one coordinate, central differences) is PSD
    on random domain points for jointly convex divergences; Itakura-Saito has a point
    where it is not (so the ADMM of Sec. 3.1 refuses it)."""
    div = get_divergence(name)
    h = 1e-4

    def hessian(x, y):
        def D(a, b):
            return float(div(np.array([a]), np.array([b])))
        fxx = (D(x + h, y) - 2 * D(x, y) + D(x - h, y)) / h ** 2
        fyy = (D(x, y + h) - 2 * D(x, y) + D(x, y - h)) / h ** 2
        fxy = (D(x + h, y + h) - D(x + h, y - h) - D(x - h, y + h) + D(x - h, y - h)) / (4 * h * h)
        return np.array([[fxx, fxy], [fxy, fyy]])

    pts = domain_points(div, rng, (40, 2))
    smallest = min(np.linalg.eigvalsh(hessian(a, b))[0] / max(1.0, np.abs(hessian(a, b)).max())
                   for a, b in pts)
    if div.jointly_convex:
        assert smallest > -1e-4
    else:
        assert np.linalg.det(hessian(2.0, 1.0)) == pytest.approx(-0.25, rel=1e-4)


def test_domain_errors_name_the_divergence_and_the_entry():
    with pytest.raises(InputValueError, match=r"logistic divergence \(the open interval \(0, 1\)\).*\(1, 0\)"):
        get_divergence("logistic").check_domain(np.array([[0.5, 0.2], [1.0, 0.3]]))
    with pytest.raises(InputValueError, match="kl divergence"):
        get_divergence("kl").check_domain(np.array([0.0, 1.0]))
    with pytest.raises(InputValueError, match="divergence must be one of"):
        get_divergence("hellinger")


def cvxpy_project_m2(A, d):
    import cvxpy as cp

    t = A.shape[0]
    Z = cp.Variable((t, t), symmetric=True)
    cons = [Z >> 0, np.eye(t) - Z >> 0, cp.trace(Z) <= d, Z @ np.ones(t) == np.ones(t)]
    cp.Problem(cp.Minimize(cp.sum_squares(Z - A)), cons).solve(solver="CLARABEL")
    return Z.value


@pytest.mark.parametrize("t,d,scale", [(7, 2, 1.0), (8, 3, 1.0), (9, 4, 0.3), (8, 3, 5.0)])
def test_projection_onto_m2_equals_a_generic_convex_solver(t, d, scale, rng):
    A = scale * rng.normal(size=(t, t))
    Z = project_m2(A, d)
    np.testing.assert_allclose(Z, cvxpy_project_m2(A, d), atol=2e-6)
    # Z is in M2.
    w = np.linalg.eigvalsh(Z)
    assert w.min() > -1e-10 and w.max() < 1 + 1e-10 and np.trace(Z) <= d + 1e-10
    np.testing.assert_allclose(Z @ np.ones(t), 1, atol=1e-12)
    # A point of M2 projects onto itself.
    np.testing.assert_allclose(project_m2(Z, d), Z, atol=1e-10)


@pytest.mark.parametrize("t,d,scale", [(60, 2, 1.0), (60, 3, 0.05), (80, 5, 0.3)])
def test_projection_onto_m2_by_partial_eigendecomposition_equals_the_dense_one(t, d, scale, rng):
    """Lanczos for the eigenvalues above the threshold only (scale 0.05: all eigenvalues
    below 1, none clipped by the threshold: k must grow to reach them)."""
    A = scale * rng.normal(size=(t, t)) + np.eye(t) * rng.uniform(0, 1, t)
    np.testing.assert_allclose(project_m2(A, d, partial=True), project_m2(A, d, partial=False), atol=1e-9)


def omega_by_sdp(T, d):
    """(17) as written: min tr(W) over M in M3 and [[M, T], [T', W]] PSD (Schur
    complement form of tr(T' M^+ T) with Im T in Im M), by a generic SDP solver."""
    import cvxpy as cp

    t, n = T.shape
    M = cp.Variable((t, t), symmetric=True)
    W = cp.Variable((n, n), symmetric=True)
    cons = [cp.bmat([[M, T], [T.T, W]]) >> 0, M >> 0, np.eye(t) - M >> 0, cp.trace(M) <= d - 1]
    return cp.Problem(cp.Minimize(cp.trace(W)), cons).solve(solver="CLARABEL")


@pytest.mark.parametrize("t,n,d", [(6, 3, 2), (6, 4, 3), (7, 2, 4)])
def test_omega_equals_its_defining_minimization(t, n, d, rng):
    T = rng.normal(size=(t, n))
    assert omega(T, d) ** 2 == pytest.approx(omega_by_sdp(T, d), rel=1e-5)


def test_algorithm_2_equals_the_minimization_over_sigma(rng):
    """(18) by a generic solver (quad-over-lin is jointly convex) for random s."""
    import cvxpy as cp

    for t, d in ((6, 2), (6, 3), (8, 5), (5, 6)):
        s = np.abs(rng.normal(size=t)) * rng.choice([0.1, 1, 10], size=t)
        sigma = cp.Variable(t)
        prob = cp.Problem(cp.Minimize(sum(cp.quad_over_lin(s[i], sigma[i]) for i in range(t))),
                          [sigma >= 0, sigma <= 1, cp.sum(sigma) <= d - 1])
        assert omega_squared_from_singular_values(s, d) == pytest.approx(prob.solve(solver="CLARABEL"), rel=1e-6)


def test_omega_is_a_norm_and_the_lmo_attains_the_dual_norm(rng):
    d = 3
    for _ in range(20):
        T1, T2 = rng.normal(size=(8, 4)), rng.normal(size=(8, 4))
        assert omega(T1 + T2, d) <= omega(T1, d) + omega(T2, d) + 1e-12
        assert omega(-2.5 * T1, d) == pytest.approx(2.5 * omega(T1, d), rel=1e-12)
    R = rng.normal(size=(8, 4))
    S = omega_lmo(R, d)
    assert omega(S, d) == pytest.approx(1.0, rel=1e-10)
    assert np.sum(R * S) == pytest.approx(omega_dual(R, d), rel=1e-10)
    # No point of the unit ball does better (random points scaled onto its boundary).
    for _ in range(200):
        P = rng.normal(size=(8, 4))
        assert np.sum(R * P) / omega(P, d) <= omega_dual(R, d) + 1e-10


def blobs(rng, t=60, d=3, spread=0.5):
    """d well-separated positive clusters in R^4."""
    centers = np.array([[1, 1, 5, 5], [5, 1, 1, 5], [1, 5, 5, 1], [5, 5, 1, 1]], float)[:d]
    y = np.repeat(np.arange(d), t // d)
    return centers[y] + spread * np.abs(rng.normal(size=(len(y), 4))), y


def test_simplex_projection_rows_equal_a_generic_solver(rng):
    import cvxpy as cp

    from dnomad.bregman import project_simplex_rows

    A = rng.normal(size=(5, 7)) * np.array([[0.1], [1], [3], [10], [0.01]])
    P = project_simplex_rows(A)
    for a, p in zip(A, P):
        x = cp.Variable(7)
        cp.Problem(cp.Minimize(cp.sum_squares(x - a)), [x >= 0, cp.sum(x) == 1]).solve(solver="CLARABEL")
        np.testing.assert_allclose(p, x.value, atol=1e-7)


@pytest.mark.parametrize("name", ["euclidean", "kl"])
def test_cond_jc_admm_reaches_the_optimum_over_m1(name, rng):
    """The ADMM's D_F(X, M X) against the convex program over M1 written for cvxpy."""
    import cvxpy as cp

    from dnomad.bregman import cond_jc

    X, _ = blobs(rng, t=15, spread=1.5)
    d = 3
    res = cond_jc(X, d, name, tol=1e-6, max_iter=3000)
    assert res.stop_reason == "tolerance"
    t = X.shape[0]
    M = cp.Variable((t, t), symmetric=True)
    Y = M @ X
    loss = 0.5 * cp.sum_squares(X - Y) if name == "euclidean" else cp.sum(cp.kl_div(X, Y))
    cons = [M >> 0, np.eye(t) - M >> 0, cp.trace(M) <= d, M >= 0, M @ np.ones(t) == np.ones(t)]
    best = cp.Problem(cp.Minimize(loss), cons).solve(solver="CLARABEL")
    assert res.objective == pytest.approx(best, rel=2e-3, abs=1e-6)
    # M and Z agree, M's rows are on the simplex, Z is in M2.
    np.testing.assert_allclose(res.M.sum(axis=1), 1, atol=1e-12)
    assert res.M.min() >= 0 and np.abs(res.M - res.Z).max() < 1e-4


def test_cond_jc_in_row_chunks_from_zarr_and_on_workers_equals_one_chunk_in_memory(tmp_path, rng,
                                                                                     cluster_client):
    """cvxCondJC with M and Lambda in row chunks (X from Zarr, 4 chunks; and on two
    dask.distributed workers) and the partial projection ends where one chunk with the
    dense projection does (each chunk backtracks its own step, here as the one chunk)."""
    import zarr

    from dnomad.blocks import RowChunks
    from dnomad.bregman import cond_jc

    X, _ = blobs(rng, t=30, spread=1.5)
    kw = dict(tol=1e-5, max_iter=3000)
    ref = cond_jc(X, 3, "kl", chunk_rows=60, projection="dense", **kw)
    assert ref.stop_reason == "tolerance"
    z = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(8, 4), dtype="f8")
    z[:] = X
    # to the tolerance from Zarr; the first 60 iterations on the workers (a round trip
    # per pass makes each iteration slower there)
    short = cond_jc(X, 3, "kl", chunk_rows=30, projection="dense", tol=0.0, max_iter=60)
    for make, ref, kw in ((lambda: RowChunks(str(tmp_path / "X.zarr"), center=False), ref, kw),
                          (lambda: RowChunks(X, chunk_rows=12, center=False, client=cluster_client), short,
                           dict(tol=0.0, max_iter=60))):
        with make() as data:
            assert len(data.spans) > 1
            res = cond_jc(data, 3, "kl", projection="partial", **kw)
            M = data.get("M")
        assert res.stop_reason == ref.stop_reason and res.n_iter == ref.n_iter and res.M is None
        assert res.objective == pytest.approx(ref.objective, rel=1e-6)
        np.testing.assert_allclose(res.Z, ref.Z, atol=1e-5)
        np.testing.assert_allclose(M, ref.M, atol=1e-5)
        np.testing.assert_allclose(M.sum(axis=1), 1, atol=1e-12)
        assert max(h["eig_passes"] for h in res.history) > 1        # the Krylov path ran


def test_partial_projection_within_its_error_bound_and_in_m2(rng):
    """project_m2_factor's Krylov answer is within its stated bound (tol sqrt(t)) of the
    dense projection, stays in M2 exactly, and a warm start from the answer converges
    in one block."""
    from dnomad.bregman.norms import project_m2_factor

    t, d = 300, 4
    B = rng.normal(size=(t, 6))
    S = B @ B.T / t + 0.01 * rng.normal(size=(t, t)) / np.sqrt(t)
    S = 0.5 * (S + S.T)
    tol = 1e-6
    Phi, mu, passes = project_m2_factor(lambda V: S @ V, t, d, tol=tol)
    P, m, _ = project_m2_factor(None, t, d, dense=lambda: S)
    Z, Zd = (Phi * mu) @ Phi.T, (P * m) @ P.T
    assert np.linalg.norm(Z - Zd) <= tol * np.sqrt(t)
    np.testing.assert_allclose(Phi.T @ Phi, np.eye(mu.size), atol=1e-10)
    np.testing.assert_allclose(Phi.T @ np.ones(t), 0, atol=1e-9)
    assert mu.min() > 0 and mu.max() <= 1 and mu.sum() <= d - 1 + 1e-12
    assert passes > 1
    _, _, warm = project_m2_factor(lambda V: S @ V, t, d, tol=tol, start=Phi)
    assert warm < passes


@pytest.mark.parametrize("name", ["euclidean", "kl", "logistic"])
def test_cond_jc_with_rounding_and_reoptimization_recovers_planted_clusters(name, rng):
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import cond_jc, hard_clustering, spectral_rounding

    X, y = blobs(rng)
    if name == "logistic":
        X = X / (X.max() + 1.0)                       # into (0, 1)
    res = cond_jc(X, 3, name)
    for labels in spectral_rounding(res.M, 3, repeats=3, random_state=0):
        final, objective, _ = hard_clustering(X, 3, name, labels)
        assert clustering_accuracy(y, final) == 1.0


def test_shi_malik_rounding_uses_the_generalized_eigenvectors_rows_as_they_are(rng, monkeypatch):
    """Shi-Malik rounding (the paper's citation) clusters the rows of the top d generalized
    eigenvectors of (S, diag(S 1)) unnormalized, NJW the rows of S's top d normalized; both
    recover the blocks of a noisy equivalence matrix of unequal clusters; bad method or
    nonpositive degrees are refused."""
    import scipy.linalg

    from dnomad import rounding
    from dnomad.bregman import spectral_rounding
    from dnomad.metrics import adjusted_rand_score

    sizes = [5, 12, 23]
    y = np.repeat(np.arange(3), sizes)
    t = y.size
    W = (y[:, None] == y[None, :]) / np.array(sizes)[y][:, None]     # M 1 = 1, blocks 1/size
    W = W + 0.01 * np.abs(rng.normal(size=(t, t)))
    seen = []
    real_kmeans = rounding.kmeans_rows
    monkeypatch.setattr(rounding, "kmeans_rows", lambda E, k, r, **kw: seen.append(E) or real_kmeans(E, k, r, **kw))
    for method in ("ng-jordan-weiss", "shi-malik"):
        for labels in spectral_rounding(W, 3, repeats=3, random_state=0, method=method):
            assert adjusted_rand_score(y, labels) == 1.0
    S = 0.5 * (W + W.T)
    njw, sm = seen[0], seen[3]
    np.testing.assert_allclose(np.linalg.norm(njw, axis=1), 1.0)
    w, V = scipy.linalg.eigh(S, np.diag(S.sum(axis=1)))       # S v = mu D v, increasing mu
    # The same subspace (eigenvectors are defined up to sign and rotation within it) ...
    proj = V[:, -3:] @ np.linalg.pinv(V[:, -3:])
    np.testing.assert_allclose(proj @ sm, sm, atol=1e-9)
    # ... each column a generalized eigenvector, the rows not normalized.
    for j in range(3):
        Dv = S.sum(axis=1) * sm[:, j]
        mu = sm[:, j] @ S @ sm[:, j] / (sm[:, j] @ Dv)
        np.testing.assert_allclose(S @ sm[:, j], mu * Dv, atol=1e-10)
    assert np.ptp(np.linalg.norm(sm, axis=1)) > 0.05
    with pytest.raises(InputValueError, match="method must be one of"):
        spectral_rounding(W, 3, method="kmeans")
    with pytest.raises(InputValueError, match="positive row sums"):
        spectral_rounding(W - 0.2, 3, method="shi-malik")


def test_hard_clustering_refills_empty_clusters_and_cond_jc_refuses_itakura_saito(rng):
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import cond_jc, hard_clustering

    X, y = blobs(rng, t=40, d=4)
    labels, objective, _ = hard_clustering(X, 4, "kl", np.zeros(40, int))
    assert len(np.unique(labels)) == 4 and objective > 0
    best = min((hard_clustering(X, 4, "kl", random_state=s) for s in range(10)), key=lambda r: r[1])
    assert clustering_accuracy(y, best[0]) == 1.0
    with pytest.raises(InputValueError, match="jointly convex divergence; itakura-saito is not"):
        cond_jc(X, 4, "itakura-saito")
    with pytest.raises(InputValueError, match="kl divergence"):
        cond_jc(-X, 4, "kl")


@pytest.mark.parametrize("joint", [False, True])
def test_hard_clustering_on_row_chunks_from_zarr_equals_in_memory(joint, tmp_path, rng):
    """Hard (and hard joint) Bregman clustering with the labels in row chunks of X read
    from Zarr (4 chunks): the same labels, objective and iterations as in memory, from
    random labels and from labels with empty clusters (refilled, or kept empty when
    joint)."""
    import zarr

    from dnomad.blocks import RowChunks
    from dnomad.bregman import hard_clustering

    X, _ = blobs(rng, t=90, d=3, spread=1.0)
    z = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(25, 4), dtype="f8")
    z[:] = X
    starts = [rng.integers(0, 4, size=90), np.zeros(90, int), np.where(np.arange(90) < 45, 0, 2)]
    with RowChunks(str(tmp_path / "X.zarr"), center=False) as data:
        assert len(data.spans) == 4
        for start in starts:
            want = hard_clustering(X, 4, "kl", start, joint=joint)
            got = hard_clustering(data, 4, "kl", start, joint=joint)
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1] == pytest.approx(want[1], rel=1e-12) and got[2] == want[2]
            if not joint:                   # the empty clusters were refilled
                assert len(np.unique(got[0])) == 4


def xi_by_sdp(T, d):
    """(38) as written, with M in M2 (M 1 = 1, 0 <= M <= I, tr M <= d)."""
    import cvxpy as cp

    t, n = T.shape
    M = cp.Variable((t, t), symmetric=True)
    W = cp.Variable((n, n), symmetric=True)
    cons = [cp.bmat([[M, T], [T.T, W]]) >> 0, M >> 0, np.eye(t) - M >> 0, cp.trace(M) <= d,
            M @ np.ones(t) == np.ones(t)]
    return cp.Problem(cp.Minimize(cp.trace(W)), cons).solve(solver="CLARABEL")


@pytest.mark.parametrize("t,n,d", [(6, 3, 2), (7, 3, 3)])
def test_xi_equals_its_defining_minimization_and_its_lmo_attains_the_dual(t, n, d, rng):
    from dnomad.bregman import xi, xi_dual, xi_lmo, xi_minimizer

    T = rng.normal(size=(t, n)) + 0.5
    assert xi(T, d) ** 2 == pytest.approx(xi_by_sdp(T, d), rel=1e-5)
    # The factored minimizer is in M2 and attains Xi^2.
    Phi, sigma = xi_minimizer(T, d)
    M = (Phi * sigma) @ Phi.T + 1.0 / t
    assert np.trace(T.T @ np.linalg.pinv(M) @ T) == pytest.approx(xi(T, d) ** 2, rel=1e-8)
    np.testing.assert_allclose(M @ np.ones(t), 1, atol=1e-10)
    assert np.trace(M) <= d + 1e-10 and np.linalg.eigvalsh(M).max() <= 1 + 1e-10
    G = rng.normal(size=(t, n))
    S = xi_lmo(G, d)
    assert xi(S, d) == pytest.approx(1.0, rel=1e-10)
    assert np.sum(G * S) == pytest.approx(xi_dual(G, d), rel=1e-10)
    for _ in range(200):
        P = rng.normal(size=(t, n)) + rng.normal() * np.ones((t, 1))
        assert np.sum(G * P) / xi(P, d) <= xi_dual(G, d) + 1e-10
        assert xi(P + T, d) <= xi(P, d) + xi(T, d) + 1e-12


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_cond_gcg_reaches_the_convex_optimum():
    """(17) over M2 with the Euclidean divergence (L(T) = ||T - X||^2 / 2), as an SDP."""
    import cvxpy as cp

    from dnomad.bregman import cond

    rng = np.random.default_rng(3)
    X, _ = blobs(rng, t=12, spread=1.0)
    d, alpha = 3, 0.5
    res = cond(X, d, "euclidean", alpha=alpha, tol=1e-6, max_iter=3000)
    t, n = X.shape
    T = cp.Variable((t, n))
    M = cp.Variable((t, t), symmetric=True)
    W = cp.Variable((n, n), symmetric=True)
    cons = [cp.bmat([[M, T], [T.T, W]]) >> 0, M >> 0, np.eye(t) - M >> 0, cp.trace(M) <= d,
            M @ np.ones(t) == np.ones(t)]
    best = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(T - X) + alpha / 2 * cp.trace(W)), cons).solve(
        solver="CLARABEL")
    # The solver's duality gap bounds its distance to the optimum (the SDP solver's value
    # is accurate to about 1e-6 relative).
    assert -1e-5 * best <= res.objective - best <= res.history[-1]["gap"] + 1e-5 * best
    assert res.objective == pytest.approx(best, rel=5e-4)
    assert all(a["objective"] >= b["objective"] - 1e-12 for a, b in zip(res.history, res.history[1:]))


@pytest.mark.parametrize("name", ["euclidean", "kl", "logistic"])
def test_cond_with_rounding_and_reoptimization_recovers_planted_clusters(name, rng):
    from dnomad.metrics import clustering_accuracy
    from dnomad.rounding import kmeans_rows
    from dnomad.bregman import cond, hard_clustering

    X, y = blobs(rng)
    if name == "logistic":
        X = X / (X.max() + 1.0)
    res = cond(X, 3, name, alpha=1e-3)
    E = res.membership_eigenvectors(3)
    E = E / np.linalg.norm(E, axis=1, keepdims=True)
    labels = kmeans_rows(E, 3, 0)
    final, _, _ = hard_clustering(X, 3, name, labels)
    assert clustering_accuracy(y, final) == 1.0


def test_soft_clustering_is_em_and_finds_planted_clusters(rng):
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import soft_clustering

    X, y = blobs(rng, t=60, d=3, spread=0.8)
    trace = []
    for iters in (1, 2, 5, 20, 200):
        post, loglik, _ = soft_clustering(X, 3, "kl", max_iter=iters, random_state=1)
        trace.append(loglik)
    assert all(b >= a - 1e-9 for a, b in zip(trace, trace[1:]))
    np.testing.assert_allclose(post.sum(axis=1), 1, atol=1e-12)
    assert clustering_accuracy(y, post.argmax(axis=1)) == 1.0


@pytest.mark.parametrize("model,divergence", [("cond-jc", "euclidean"), ("cond-jc", "kl"), ("cond", "kl"),
                                              ("cond", "logistic"), ("disc", "logistic"), ("joint", "euclidean"),
                                              ("joint", "kl")])
def test_estimator_recovers_planted_clusters_and_beats_random_restarts(model, divergence, rng):
    import dnomad
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import hard_clustering

    X, y = blobs(rng, t=60, d=3, spread=1.0)
    if divergence == "logistic":
        X = X / (X.max() + 1.0)
    # cvxDisc's loss scales V by 1 / t: gamma t^3 of about 1 as the paper's 1e-9 at t = 1000
    est = dnomad.fit(X, method="bregman", model=model, divergence=divergence, n_clusters=3, gamma=1e-5,
                     random_state=0)
    assert clustering_accuracy(y, est.labels_) == 1.0
    assert min(est.reoptimized_objectives_ + est.seeded_objectives_) == est.objective_
    assert len(est.seeded_objectives_) == est.n_init == 10
    assert all(b <= a + 1e-9 for a, b in zip(est.rounded_objectives_, est.reoptimized_objectives_))
    joint = model == "joint"
    best_alt = min(hard_clustering(X, 3, divergence, joint=joint, random_state=s)[1] for s in range(30))
    assert est.objective_ <= best_alt + 1e-9 * abs(best_alt)
    if joint:
        np.testing.assert_allclose(est.posteriors_.sum(axis=1), 1.0, atol=1e-12)
        assert clustering_accuracy(y, est.posteriors_.argmax(axis=1)) == 1.0


def test_estimator_rounds_as_the_paper_cites_when_asked(rng):
    """rounding="shi-malik": k-means on the rows of M's top eigenvectors as they are (M 1 = 1);
    the planted clusters are still found, and the roundings are those of the rows unnormalized."""
    import dnomad
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import kmeans_roundings

    X, y = blobs(rng, t=60, d=3, spread=1.0)
    est = dnomad.fit(X, method="bregman", model="cond-jc", n_clusters=3, rounding="shi-malik", random_state=0)
    assert clustering_accuracy(y, est.labels_) == 1.0
    Phi, sigma = est.M_
    E = np.hstack([np.full((60, 1), 1 / np.sqrt(60)), Phi[:, :2]])
    expected = kmeans_roundings(E, 3, repeats=est.rounding_repeats, random_state=0, normalize_rows=False)
    for got, want in zip(est.rounded_labels_, expected):
        np.testing.assert_array_equal(got, want)


def test_estimator_refuses_bad_input():
    import dnomad

    X = np.abs(np.random.default_rng(0).normal(size=(20, 3))) + 0.1
    for params, match in [({"model": "mixture"}, "model must be one of"), ({"n_clusters": 1}, "n_clusters"),
                          ({"model": "joint", "beta": 0.0}, "beta must be"),
                          ({"model": "disc", "gamma": float("nan")}, "gamma must be"),
                          ({"model": "cond", "divergence": "itakura-saito"}, "conjugate"),
                          ({"divergence": "hellinger"}, "divergence must be one of"),
                          ({"model": "cond-jc", "divergence": "itakura-saito"}, "jointly convex"),
                          ({"rounding": "kmeans"}, "rounding must be one of")]:
        with pytest.raises(InputValueError, match=match):
            dnomad.BregmanClustering(**params).fit(X)
    with pytest.raises(InputValueError, match="logistic divergence"):
        dnomad.BregmanClustering(divergence="logistic").fit(X + 1.0)


def test_hard_joint_clustering_stops_at_a_fixed_point_of_its_priors_and_centroids(rng):
    """The joint re-optimization: every row ends in the cluster of least D_F(x, mu_j) -
    log q_j for its own final centroids and shares, and the objective is -1'Y log q +
    D_F(X, Y Gamma)."""
    from dnomad.bregman import centroids_of, cluster_posteriors, get_divergence, hard_clustering

    X = np.vstack([rng.normal(0, 1, (150, 2)), rng.normal(2.5, 1, (30, 2))]) + 10
    div = get_divergence("kl")
    for seed in range(5):
        labels, objective, _ = hard_clustering(X, 2, div, joint=True, random_state=seed)
        q = np.bincount(labels, minlength=2) / len(labels)
        C = centroids_of(X, labels, 2)
        with np.errstate(divide="ignore"):
            cost = np.stack([div(X, c[None]) for c in C], axis=1) - np.log(q)[None]
        np.testing.assert_array_equal(labels, cost.argmin(axis=1))
        assert objective == pytest.approx(float(cost[np.arange(len(X)), labels].sum()), rel=1e-12)
        post = cluster_posteriors(X, labels, 2, div)
        np.testing.assert_allclose(post, np.exp(-cost) / np.exp(-cost).sum(axis=1, keepdims=True), rtol=1e-10)


def _xi_sdp(cp, W, t, d):
    """Xi^2(W) as an SDP: min tr(Z) with [[M, W], [W', Z]] >= 0, M in M2 (38)."""
    M = cp.Variable((t, t), symmetric=True)
    Z = cp.Variable((W.shape[1], W.shape[1]), symmetric=True)
    cons = [cp.bmat([[M, W], [W.T, Z]]) >> 0, M >> 0, np.eye(t) - M >> 0, cp.trace(M) <= d,
            M @ np.ones(t) == np.ones(t)]
    return cp.trace(Z), cons


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_joint_gcg_reaches_the_convex_optimum():
    """(34) over M2 with the KL divergence, as a conic program (exponential and PSD cones)."""
    import cvxpy as cp

    from dnomad.bregman import joint

    rng = np.random.default_rng(4)
    X, _ = blobs(rng, t=12, spread=1.0)
    d, alpha, beta = 3, 0.3, 0.2
    res = joint(X, d, "kl", alpha=alpha, beta=beta, tol=1e-7, max_iter=5000)
    t, n = X.shape
    u, T = cp.Variable(t), cp.Variable((t, n))
    reg, cons = _xi_sdp(cp, cp.hstack([np.sqrt(beta) * cp.reshape(u, (t, 1), order="F"), np.sqrt(alpha) * T]), t, d)
    # L(T) = D_F*(T, log X) = sum exp(T) - <T, X> + sum (X log X - X)
    L = cp.sum(cp.exp(T)) - cp.sum(cp.multiply(T, X)) + float(np.sum(X * np.log(X) - X))
    best = cp.Problem(cp.Minimize(cp.log_sum_exp(u / t) - cp.sum(u) / t + L / t + reg / 2), cons).solve(
        solver="CLARABEL")
    assert -1e-5 * abs(best) <= res.objective - best <= res.history[-1]["gap"] + 1e-5 * abs(best)
    assert res.objective == pytest.approx(best, rel=1e-4, abs=1e-4)


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_disc_gcg_reaches_the_convex_optimum():
    """(30) over M2, as a conic program: row-wise log-sum-exp of X V' / t + 1 tau'."""
    import cvxpy as cp

    from dnomad.bregman import disc

    rng = np.random.default_rng(5)
    X, _ = blobs(rng, t=12, spread=1.0)
    d, gamma = 3, 2e-4
    res = disc(X, d, gamma=gamma, tol=1e-7, max_iter=5000)
    t, n = X.shape
    V, tau = cp.Variable((t, n)), cp.Variable(t)
    reg, cons = _xi_sdp(cp, V, t, d)
    Zm = X @ V.T / t + np.ones((t, 1)) @ cp.reshape(tau, (1, t), order="F")
    loss = (cp.sum(cp.log_sum_exp(Zm, axis=1)) - cp.sum(cp.multiply(X, V)) / t - cp.sum(tau)) / t
    best = cp.Problem(cp.Minimize(loss + gamma / 2 * reg), cons).solve(solver="CLARABEL")
    assert -1e-5 * abs(best) <= res.objective - best <= res.history[-1]["gap"] + 1e-5 * abs(best)
    assert res.objective == pytest.approx(best, rel=1e-4)
    assert res.objective < np.log(t)          # below its value at V = 0: the regularizer is not all


@pytest.mark.parametrize("name", ["euclidean", "kl"])
def test_cond_from_zarr_row_chunks_equals_cond_in_memory(name, tmp_path, rng):
    """cvxCond with T in the row chunks of X read from Zarr (several chunks, a partial
    last one) follows the in-memory iterates: same objectives, T and M."""
    import zarr

    from dnomad.blocks import RowChunks
    from dnomad.bregman import cond

    X, _ = blobs(rng, t=150, d=3, spread=1.0)
    z = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(40, 4), dtype="f8")
    z[:] = X
    ref = cond(X, 3, name, alpha=1e-3, max_iter=60, tol=1e-12, refine_iter=0)
    with RowChunks(str(tmp_path / "X.zarr"), center=False) as data:
        assert len(data.spans) == 4
        res = cond(data, 3, name, alpha=1e-3, max_iter=60, tol=1e-12)
        passes = data.passes
    # the sums come in another order: the line searches' answers differ in the last digits
    np.testing.assert_allclose([h["objective"] for h in res.history], [h["objective"] for h in ref.history],
                               rtol=1e-7)
    np.testing.assert_allclose(res.T, ref.T, rtol=1e-6, atol=1e-7 * np.abs(ref.T).max())
    np.testing.assert_allclose(np.abs(res.membership_eigenvectors(3)), np.abs(ref.membership_eigenvectors(3)),
                               atol=1e-6)
    assert passes >= res.n_iter * 2           # X was read again in every pass


def test_estimator_cond_from_zarr_equals_in_memory(tmp_path, rng):
    import zarr

    import dnomad

    X, y = blobs(rng, t=90, d=3, spread=1.0)
    z = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(25, 4), dtype="f8")
    z[:] = X
    kw = dict(method="bregman", model="cond", divergence="kl", n_clusters=3, max_iter=200, random_state=0)
    a = dnomad.fit(X, **kw)
    b = dnomad.fit(str(tmp_path / "X.zarr"), **kw)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert b.objective_ == pytest.approx(a.objective_, rel=1e-12)
    # In memory the relaxation is refined locally (App. C) and reaches the tolerance; from
    # Zarr it is not, and its duality gap bounds how far above the optimum it stopped.
    assert a.stop_reason_ == "tolerance"
    gap = a.history_[-1]["gap"] + b.history_[-1]["gap"]
    assert a.relaxation_objective_ - 1e-12 <= b.relaxation_objective_ <= a.relaxation_objective_ + gap
    with pytest.raises(InputValueError, match="model='cond' and 'cond-jc' only"):
        dnomad.fit(str(tmp_path / "X.zarr"), **{**kw, "model": "joint"})
    # cvxCondJC reads X whole from Zarr (its state is t x t): the same fit as in memory
    kw = {**kw, "model": "cond-jc", "max_iter": 300}
    a, b = dnomad.fit(X, **kw), dnomad.fit(z, **kw)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert b.relaxation_objective_ == a.relaxation_objective_
    Phi, sigma = a.M_
    assert Phi.shape[0] == 90 and np.all(np.diff(sigma) <= 0) and a.objective_ == b.objective_


def test_command_line_fit_and_info(tmp_path, rng):
    import subprocess
    import sys

    from dnomad.blocks import store as run_store
    from dnomad.metrics import clustering_accuracy

    X, y = blobs(rng, t=60, d=3, spread=1.0)
    np.save(tmp_path / "X.npy", X)
    store = str(tmp_path / "run.zarr")
    cli = [sys.executable, "-m", "dnomad.cli"]
    out = subprocess.run(cli + ["fit", "--input", str(tmp_path / "X.npy"), "--method", "bregman", "--n-clusters", "3",
                                "--store", store, "--params", '{"model": "joint", "divergence": "kl"}'],
                         capture_output=True, text=True, check=True).stdout
    assert "bregman (joint, kl)" in out
    assert clustering_accuracy(y, run_store.read_vector(store, "result/labels")) == 1.0
    np.testing.assert_allclose(run_store.read_vector(store, "result/posteriors").sum(axis=1), 1.0, atol=1e-12)
    info = subprocess.run(cli + ["info", store], capture_output=True, text=True, check=True).stdout
    assert "bregman" in info and "model=joint" in info


def test_xi_squared_gradient_equals_finite_differences(rng):
    """The envelope-theorem gradient of Xi^2 at a W whose H W has full column rank, in the
    regimes k = 0 (all singular values share the budget) and k > 0 (the largest ones at
    sigma = 1), against central differences; Xi^2 itself equals xi()^2."""
    from dnomad.bregman import xi
    from dnomad.bregman.norms import xi_squared_and_gradient

    for spread, d in [(np.ones(4), 3), (np.array([20.0, 1.0, 0.5, 0.2]), 3), (np.array([5.0, 3, 1, 1]), 4)]:
        W = rng.normal(size=(15, 4)) * spread
        value, grad = xi_squared_and_gradient(W, d)
        assert value == pytest.approx(xi(W, d) ** 2, rel=1e-12)
        E = rng.normal(size=W.shape)
        h = 1e-5
        fd = (xi_squared_and_gradient(W + h * E, d)[0] - xi_squared_and_gradient(W - h * E, d)[0]) / (2 * h)
        assert np.sum(grad * E) == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("data,model,transfer", [("heart", "cond-jc", "sigm"), ("breast", "cond", "sigm"),
                                                 ("spam", "cond", "lin")])
def test_convex_models_match_the_best_of_30_restarts_on_uci_sets(data, model, transfer):
    """The paper's Tables 2-3 claim on the shipped UCI sets (Sec. 6's preprocessing): the
    best of 10 SC roundings, each re-optimized, is no worse than the best of 30 random
    restarts of hard Bregman clustering.  (graphs/bregman_tables.py: it also holds for
    cvxCondJC on diabetes/sigm and breast/sigm, not on the others, where the convex
    models end 0.01% to 1.3% above the best restart; see the closing notes.)"""
    import dnomad
    import dnomad.data as dd
    from dnomad.bregman import hard_clustering

    X, y = {"heart": dd.heart, "breast": dd.breast_wisconsin, "spam": lambda: dd.spambase(1000)}[data]()
    X = dd.nonnegative_unit_variance(X)
    X, div = (X, "euclidean") if transfer == "lin" else (dd.into_unit_interval(X), "logistic")
    est = dnomad.fit(X, method="bregman", model=model, divergence=div, n_clusters=2, max_iter=500, random_state=0)
    best_alt = min(hard_clustering(X, 2, div, random_state=s)[1] for s in range(30))
    assert est.objective_ <= best_alt * (1 + 1e-12)


def test_bregman_seeding_draws_rows_in_proportion_to_their_divergence():
    """The race for the next centroid picks row i with probability D_F(x_i, c) / sum_j
    D_F(x_j, c) (k-means++'s rule under D_F): frequencies over 20,000 seeds, KL."""
    from dnomad.bregman import clustering as C
    from dnomad.bregman import get_divergence

    div = get_divergence("kl")
    X = np.array([[0.2, 1.0], [1.0, 1.0], [3.0, 0.5], [0.5, 4.0], [1.1, 0.9]])
    c = np.array([1.0, 1.0])
    weight = div(X, c[None])
    counts = np.zeros(len(X))
    for seed in range(20000):
        chunk = {"X": X, "row": np.arange(len(X))[:, None], "nearest": np.full((len(X), 1), np.inf)}
        _, row = C._seed_kernel(chunk, div, c, seed, 1)
        counts[np.flatnonzero((X == row).all(axis=1))[0]] += 1
    assert counts[1] == 0                                   # the centroid itself: D_F = 0
    np.testing.assert_allclose(counts / counts.sum(), weight / weight.sum(), atol=0.01)


def test_bregman_seeding_race_uniform_first_nearest_of_two_and_round_off():
    """The race's first draw is uniform; after two centroids a row's weight is its D_F to
    the nearer of them; a row within round-off of a centroid, whose logistic divergence
    comes out negative (-1e-16), is never drawn (a negative weight would always win)."""
    from dnomad.bregman import clustering as C
    from dnomad.bregman import get_divergence

    div = get_divergence("kl")
    c1, c2 = np.array([1.0, 1.0]), np.array([3.0, 0.5])
    X = np.array([[0.2, 1.0], [1.0, 1.0], [3.0, 0.5], [0.5, 4.0], [1.1, 0.9], [2.5, 0.6]])
    logistic = get_divergence("logistic")
    centre = np.array([0.3, 0.7, 0.45])
    near = np.vstack([centre, centre * (1 + 1e-9 * np.random.default_rng(0).normal(size=(199, 3)))])
    assert (logistic(near, centre[None]) < 0).any()         # the round-off the race must survive
    first, second = np.zeros(len(X)), np.zeros(len(X))
    for seed in range(20000):
        chunk = {"X": X, "row": np.arange(len(X))[:, None], "nearest": np.full((len(X), 1), np.inf)}
        first[np.flatnonzero((X == C._seed_kernel(chunk, div, None, seed, 0)[1]).all(axis=1))[0]] += 1
        C._seed_kernel(chunk, div, c1, seed, 1)
        second[np.flatnonzero((X == C._seed_kernel(chunk, div, c2, seed, 2)[1]).all(axis=1))[0]] += 1
    np.testing.assert_allclose(first / first.sum(), np.full(len(X), 1 / len(X)), atol=0.01)
    weight = np.minimum(div(X, c1[None]), div(X, c2[None]))
    np.testing.assert_allclose(second / second.sum(), weight / weight.sum(), atol=0.01)
    for seed in range(200):
        chunk = {"X": near, "row": np.arange(len(near))[:, None], "nearest": np.full((len(near), 1), np.inf)}
        _, row = C._seed_kernel(chunk, logistic, centre, seed, 1)
        assert logistic(row[None], centre[None])[0] >= 0


def test_seeded_starts_equal_across_chunkings_and_never_lose_to_them(rng, tmp_path):
    """bregman_seeding gives the same labels in memory and over row chunks (a Zarr X, 7
    rows a chunk); the estimator's objective is at most every seeded clustering's, and
    n_init=0 is the paper's pipeline (roundings alone)."""
    import zarr

    import dnomad
    from dnomad import blocks
    from dnomad.bregman import bregman_seeding

    X, _ = blobs(rng, t=60, d=3, spread=2.0)
    z = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(7, 3), dtype="f8")
    z[:] = X
    with blocks.RowChunks(str(tmp_path / "X.zarr"), center=False) as chunks:
        for seed in (0, 5, 2**32 - 1):
            np.testing.assert_array_equal(bregman_seeding(chunks, 4, "kl", seed), bregman_seeding(X, 4, "kl", seed))
    est = dnomad.BregmanClustering(4, divergence="kl", random_state=0).fit(X)
    assert est.objective_ <= min(est.seeded_objectives_) and est.start_.split()[0] in ("rounding", "seeding")
    paper = dnomad.BregmanClustering(4, divergence="kl", n_init=0, random_state=0).fit(X)
    assert paper.seeded_objectives_ == [] and paper.start_.startswith("rounding")
    assert paper.objective_ == min(paper.reoptimized_objectives_) >= est.objective_
