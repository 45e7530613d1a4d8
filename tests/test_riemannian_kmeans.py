"""The K-means manifold V x Orth(r) and the cost (13): interior start, retraction,
and the Riemannian gradient and Hessian against central differences along the retraction."""
import numpy as np
import pytest

from dnomad.errors import InputValueError
from dnomad.kmeans_sdp.riemannian import KMeansManifold, KMeansProblem


def near_interior_point(M, rng, step=0.05):
    """A strictly feasible point off the symmetric start: a short retracted step."""
    x = M.interior_point()
    return M.retract(x, M.random_tangent(x, rng, scale=step))


@pytest.mark.parametrize("n,r,K", [(60, 5, 3), (40, 5, 4), (48, 6, 2),          # n divisible by r
                                   (61, 5, 3), (43, 5, 4), (50, 6, 2), (503, 5, 4)])
def test_interior_point_is_feasible_and_strictly_positive(n, r, K):
    """Lemma 5, both cases."""
    M = KMeansManifold(n, r, K)
    x = M.interior_point()
    U = M.phi(x)
    assert U.min() > 0
    np.testing.assert_allclose(U @ U.T @ np.ones(n), 1, atol=1e-12)
    assert np.trace(U @ U.T) == pytest.approx(K, abs=1e-12)
    ones, trace, orth, _ = M.feasibility(x)
    assert max(ones, trace, orth) < 1e-12


def test_retraction_stays_on_the_manifold(rng):
    M = KMeansManifold(50, 5, 3)
    x = near_interior_point(M, rng)
    for scale in (1e-3, 0.1, 3.0):
        y = M.retract(x, M.random_tangent(x, rng, scale=scale))
        ones, trace, orth, _ = M.feasibility(y)
        assert ones < 1e-10 and trace < 1e-10 and orth < 1e-10
    # The projection is idempotent and its output is tangent.
    Z = (rng.standard_normal(x[0].shape), rng.standard_normal(x[1].shape))
    T = M.proj(x, Z)
    T2 = M.proj(x, T)
    assert max(np.abs(T[0] - T2[0]).max(), np.abs(T[1] - T2[1]).max()) < 1e-12
    assert np.abs(T[0].sum(axis=0)).max() < 1e-10 and abs(np.vdot(T[0], x[0])) < 1e-10
    S = T[1] @ x[1].T
    assert np.abs(S + S.T).max() < 1e-12


def test_gradient_and_hessian_match_central_differences_along_the_retraction(rng):
    """For a second-order retraction R (the projection), d/dt f(R(x, t v)) = <grad f, v>
    and d^2/dt^2 f(R(x, t v)) = <Hess f[v], v> at t = 0; central differences give both
    to O(h^2).  (Taylor-slope fits over a fixed range of t passed or failed with the draw:
    where the t^2 or t^4 term crossed into the range, slopes read 1.25 or 3.26.)"""
    M = KMeansManifold(40, 5, 3)
    X = rng.standard_normal((40, 3))
    P = KMeansProblem(M, X, mu=0.05)

    def f_along(x, v, t):
        return P.cost(M.retract(x, (t * v[0], t * v[1])))

    for _ in range(3):
        x = near_interior_point(M, rng)
        v = M.random_tangent(x, rng)
        f0, g, Hv = P.cost(x), P.grad(x), P.hess(x, v)
        gv, vHv = M.inner(x, g, v), M.inner(x, Hv, v)
        # h = 1e-5: O(h^2) error about 1e-9 relative; h = 1e-4 for the second difference:
        # 2e-7 relative (it is 2e-5 at h = 1e-3, 2e-6 at 3e-4: the O(h^2) law), round-off
        # eps |f| / h^2 about 1e-8.
        h = 1e-5
        fd1 = (f_along(x, v, h) - f_along(x, v, -h)) / (2 * h)
        h2 = 1e-4
        fd2 = (f_along(x, v, h2) - 2 * f0 + f_along(x, v, -h2)) / h2 ** 2
        assert abs(gv - fd1) <= 1e-7 * abs(fd1), (gv, fd1)
        assert abs(vHv - fd2) <= 2e-6 * abs(fd2), (vHv, fd2)
        # The checks tell wrong derivatives: a gradient without the barrier's part is off
        # by 8% to 73%, the projected Euclidean Hessian (no curvature terms) by 3% to 5%.
        GV, GQ = P.egrad(x)
        Ux = M.phi(x)
        barrier = (-P.mu * (1 / Ux) @ x[1][1:].T, -P.mu * np.vstack([(1 / Ux).sum(axis=0) / np.sqrt(M.n),
                                                                     x[0].T @ (1 / Ux)]))
        gv_bad = M.inner(x, M.proj(x, (GV - barrier[0], GQ - barrier[1])), v)
        assert abs(gv_bad - fd1) > 1e-2 * abs(fd1), (gv_bad, fd1)
        bad = M.inner(x, M.proj(x, P.ehess(x, v)), v)
        assert abs(bad - fd2) > 1e-2 * abs(fd2), (bad, fd2)
        # The Hessian is symmetric on the tangent space.
        w = M.random_tangent(x, rng)
        assert M.inner(x, P.hess(x, w), v) == pytest.approx(M.inner(x, Hv, w), rel=1e-8)


def test_euclidean_gradient_matches_finite_differences(rng):
    M = KMeansManifold(32, 4, 2)
    P = KMeansProblem(M, rng.standard_normal((32, 2)), mu=0.1)
    V, Q = near_interior_point(M, rng)
    GV, GQ = P.egrad((V, Q))
    dV, dQ = rng.standard_normal(V.shape), rng.standard_normal(Q.shape)
    h = 1e-6
    fd = (P.cost((V + h * dV, Q + h * dQ)) - P.cost((V - h * dV, Q - h * dQ))) / (2 * h)
    assert fd == pytest.approx(np.vdot(GV, dV) + np.vdot(GQ, dQ), rel=1e-6)
    HV, HQ = P.ehess((V, Q), (dV, dQ))
    gp, gm = P.egrad((V + h * dV, Q + h * dQ)), P.egrad((V - h * dV, Q - h * dQ))
    np.testing.assert_allclose((gp[0] - gm[0]) / (2 * h), HV, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((gp[1] - gm[1]) / (2 * h), HQ, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args,match", [
    ((50, 5, 1), "K\\) must be >= 2"),
    ((50, 3, 3), "rank r must exceed K"),
    ((4, 5, 3), "at least r = 5 points"),
])
def test_bad_sizes_are_refused(args, match):
    with pytest.raises(InputValueError, match=match):
        KMeansManifold(*args)


def test_bad_problem_input_is_refused(rng):
    M = KMeansManifold(20, 4, 2)
    X = rng.standard_normal((20, 3))
    with pytest.raises(InputValueError, match="mu must be"):
        KMeansProblem(M, X, mu=0.0)
    X[3, 1] = np.nan
    with pytest.raises(InputValueError, match="NaN"):
        KMeansProblem(M, X, mu=0.1)


def dense_newton_step(M, P, x, lam):
    """The saddle-point system [[H + lam I, J^T], [J, 0]] [p; y] = [-g; 0] over vec(dV),
    vec(dQ), H probed column by column from the Lagrangian Hessian and J written from
    the constraints 1^T dV = 0, <V, dV> = 0, dQ Q^T + Q dQ^T = 0; solved densely."""
    V, Q = x
    nv, nq = V.size, Q.size
    N = nv + nq

    def split(u):
        return u[:nv].reshape(V.shape), u[nv:].reshape(Q.shape)

    H = np.empty((N, N))
    for k in range(N):
        e = np.zeros(N)
        e[k] = 1.0
        hv, hq = P.lagrangian_hess(x, split(e))
        H[:, k] = np.r_[hv.ravel(), hq.ravel()]
    rows = []
    for j in range(V.shape[1]):
        dV = np.zeros_like(V)
        dV[:, j] = 1.0
        rows.append(np.r_[dV.ravel(), np.zeros(nq)])
    rows.append(np.r_[V.ravel(), np.zeros(nq)])
    for a in range(M.r):
        for b in range(a, M.r):
            row = np.zeros(N)
            for k in range(nq):
                dQ = np.zeros(nq)
                dQ[k] = 1.0
                dQ = dQ.reshape(Q.shape)
                row[nv + k] = (dQ @ Q.T + Q @ dQ.T)[a, b]
            rows.append(row)
    J = np.array(rows)
    m = len(J)
    gV, gQ = P.grad(x)
    K = np.block([[H + lam * np.eye(N), J.T], [J, np.zeros((m, m))]])
    sol = np.linalg.lstsq(K, np.r_[-gV.ravel(), -gQ.ravel(), np.zeros(m)], rcond=None)[0]
    return split(sol[:N])


@pytest.mark.parametrize("chunk_rows", [7, 4096])
def test_schur_complement_solve_equals_dense_saddle_point_solve(rng, chunk_rows):
    M = KMeansManifold(30, 5, 3)
    P = KMeansProblem(M, rng.standard_normal((30, 4)), mu=0.05, chunk_rows=chunk_rows)
    x = near_interior_point(M, rng)
    for lam in (0.5, 10.0):
        dV, dQ = P.newton_step(x, lam)
        rV, rQ = dense_newton_step(M, P, x, lam)
        scale = np.sqrt(np.sum(rV ** 2) + np.sum(rQ ** 2))
        err = np.sqrt(np.sum((dV - rV) ** 2) + np.sum((dQ - rQ) ** 2))
        assert err <= 1e-8 * scale, (err, scale)
        # The step is tangent.
        assert np.abs(dV.sum(axis=0)).max() < 1e-10 and abs(np.vdot(dV, x[0])) < 1e-10
        S = dQ @ x[1].T
        assert np.abs(S + S.T).max() < 1e-10


def dense_row_system(X, V, Q, n, mu, shift):
    """D_i and L_i of every row written out entry by entry (the coupling of row i's dV to
    dQ, z = -B^T dV, the multipliers of 1^T dV = 0 and of <V, dV> = 0; see
    KMeansProblem.solve): the dense reference of the Schur sums."""
    c, m = V.shape
    r, d = m + 1, X.shape[1]
    Vhat = np.hstack([np.full((c, 1), 1 / np.sqrt(n)), V])
    U = Vhat @ Q
    width = r * r + d * m + m + 1
    D = np.empty((c, m, m), dtype=np.longdouble)      # formed in extended precision too
    L = np.zeros((c, m, width))
    Q1 = Q[1:].astype(np.longdouble)
    for i in range(c):
        D[i] = mu * Q1 @ np.diag(U[i].astype(np.longdouble) ** -2) @ Q1.T + shift * np.eye(m)
        for a in range(m):
            for l in range(r):
                for j in range(r):
                    L[i, a, l * r + j] = mu * Q[1 + a, j] * Vhat[i, l] / U[i, j] ** 2 - mu * (l == a + 1) / U[i, j]
            for l in range(d):
                L[i, a, r * r + l * m + a] = np.sqrt(2) * X[i, l]
            L[i, a, r * r + d * m + a] = 1.0
            L[i, a, -1] = V[i, a]
    return D, L


def inverse_longdouble(D):
    """The inverses of a stack of matrices by Gauss-Jordan elimination with partial
    pivoting in extended precision (np.linalg's float64 inverse loses digits on the D_i
    near the boundary, where they span 1e7 in scale)."""
    A = np.asarray(D, dtype=np.longdouble).copy()
    c, m, _ = A.shape
    inv = np.broadcast_to(np.eye(m, dtype=np.longdouble), A.shape).copy()
    rows = np.arange(c)
    for k in range(m):
        p = k + np.argmax(np.abs(A[:, k:, k]), axis=1)
        for M in (A, inv):
            M[rows, k], M[rows, p] = M[rows, p].copy(), M[rows, k].copy()
        pivot = A[:, k, k][:, None].copy()
        A[:, k] /= pivot
        inv[:, k] /= pivot
        f = A[:, :, k].copy()
        f[:, k] = 0
        A -= f[:, :, None] * A[:, k][:, None]
        inv -= f[:, :, None] * inv[:, k][:, None]
    return inv


def point_near_a_solution(rng, n, r, d, small=1e-4):
    """Rows of X and V with an orthogonal Q (first row 1 / sqrt(r)) where each row of U =
    [1/sqrt(n), V] Q is one large entry and r - 1 entries ``small``, as near a clustering:
    Lambda_i then has one entry 1e7 below the others."""
    Q = np.linalg.qr(np.hstack([np.ones((r, 1)), rng.standard_normal((r, r - 1))]))[0].T
    Q *= np.sign(Q[0, 0])
    U = np.full((n, r), small)
    U[np.arange(n), rng.integers(r, size=n)] += np.sqrt(r / n) - small * r
    return rng.standard_normal((n, d)), (U @ Q.T)[:, 1:], Q


def point_with_small_entries(rng, n, r, d, tiny=1e-4):
    """Rows of X and V with an orthogonal Q in which some rows of U = [1/sqrt(n), V] Q have an
    entry of size ``tiny`` (the D_i then span 1e7 in scale)."""
    Q = np.linalg.qr(rng.standard_normal((r, r)))[0]
    X = rng.standard_normal((n, d))
    V = 0.3 * rng.standard_normal((n, r - 1)) / np.sqrt(n)
    for i in range(0, n, 3):
        k = rng.integers(r)
        col = Q[1:, k]
        V[i] += (tiny - Q[0, k] / np.sqrt(n) - V[i] @ col) * col / (col @ col)
    return X, V, Q


@pytest.mark.parametrize("point,n,r,d,shift,block_entries", [
    ("boundary", 40, 5, 4, 0.3, 1 << 18), ("boundary", 150, 5, 4, 0.3, 300),   # 150 rows: 3 row blocks of 64
    ("boundary", 33, 7, 9, 1e-3, 1 << 18),                                     # d > r: the z-z block dominates
    ("solution", 150, 5, 4, 0.3, 300),          # one Lambda_ij 1e7 below the others in every row
    ("boundary", 150, 4, 2, -40.0, 200),        # D_i indefinite in some rows
    ("boundary", 150, 4, 2, "zero", 200),       # a Lambda_ij at round-off from 0
])
def test_schur_sums_by_kronecker_structure_equal_the_dense_ones(rng, monkeypatch, point, n, r, d, shift,
                                                                 block_entries):
    """The Schur pass's sums over rows (formed from the Kronecker structure of the data
    block and the closed-form D_i^-1, in blocks of rows) equal sum_i L_i^T D_i^-1 L_i and
    sum_i L_i^T D_i^-1 b_i of the written-out L_i to 1e-10 block by block (D_i formed and
    inverted in extended precision), its count of non-positive eigenvalues of the D_i is
    theirs, and the back-substitution gives D_i^-1 (b_i - L_i s)."""
    from dnomad.kmeans_sdp import riemannian as rk

    monkeypatch.setattr(rk, "_BLOCK_ENTRIES", block_entries)
    X, V, Q = (point_with_small_entries if point == "boundary" else point_near_a_solution)(rng, n, r, d)
    mu = 0.05
    if shift == "zero":                 # Lambda_10 = mu u_10^-2 + shift = 0 (row 1: no tiny entry)
        shift = -mu / (np.hstack([1 / np.sqrt(n), V[1]]) @ Q[:, 0]) ** 2
    D, L = dense_row_system(X, V, Q, n, mu, shift)
    b = rng.standard_normal(V.shape)
    layout = rk._SmallLayout(r, d)
    small = {"Q": Q, "n": n, "mu": mu, "XtV": X.T @ V, "m": np.zeros(r - 1), "c": 0.0, "shift": shift}
    chunk = {"X": X, "V": V, "rhsV": b}
    S, rhs, _, _, negative = rk._schur_kernel(chunk, "V", small, layout, "rhsV")
    Dinv = inverse_longdouble(D)
    S_ref = -np.einsum("iab,ibc,icd->ad", L.transpose(0, 2, 1), Dinv, L).astype(float)
    rhs_ref = -np.einsum("iab,ibc,ic->a", L.transpose(0, 2, 1), Dinv, b).astype(float)
    w = layout.coupled
    if block_entries < 1 << 18:
        assert len(rk._row_blocks(n, d, r)) > 1
    blocks = (layout.q, layout.z, layout.ones, layout.sphere)
    for a in blocks:
        for b_ in blocks:
            assert np.abs(S[a, b_] - S_ref[a, b_]).max() <= 1e-10 * np.abs(S_ref[a, b_]).max(), (a, b_)
        assert np.abs(rhs[a] - rhs_ref[a]).max() <= 1e-10 * np.abs(rhs_ref[a]).max(), a
    assert np.all(S[w:] == 0) and np.all(S[:, w:] == 0)
    assert negative == int(np.sum(np.linalg.eigvalsh(D.astype(float)) <= 0))
    assert (negative > 0) == (shift < -1)
    s = rng.standard_normal(layout.size)
    rk._back_substitute_kernel(chunk, "V", small, layout, s, np.zeros((r, r)), "rhsV", "dV")
    dV_ref = np.einsum("iab,ib->ia", Dinv, b - L @ s[:w]).astype(float)
    assert np.abs(chunk["dV"] - dV_ref).max() <= 1e-10 * np.abs(dV_ref).max()


def test_row_blocks_with_a_zero_lambda_are_counted_by_their_eigenvalues(rng):
    """Haynsworth's count needs diag(Lambda_i) invertible: a row with a Lambda_ij exactly 0
    is counted from its D_i's eigenvalues, and a singular D_i is refused, not filled with
    inf."""
    from dnomad.kmeans_sdp import riemannian as rk

    Q = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    Lam = np.array([[0.0, -1.0], [1.0, -2.0], [1.0, 3.0]])        # rows: D_1 > 0, D_2 has -2 < mu_1 < -1
    E, negative = rk._inverse_blocks(Lam, Q)
    D = np.einsum("aj,ji,bj->iab", Q[1:], Lam, Q[1:])
    assert negative == int(np.sum(np.linalg.eigvalsh(D) <= 0)) >= 1
    np.testing.assert_allclose(E.transpose(2, 0, 1), np.linalg.inv(D), rtol=1e-12, atol=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        rk._inverse_blocks(np.array([[0.0], [0.0], [1.0]]), Q)


def gmm_simplex(n, K, gamma, rng):
    from dnomad.data import gmm_simplex as generate

    return generate(n, n_clusters=K, gamma=gamma, random_state=rng)


def test_newton_reaches_the_planted_clusters_from_random_starts(rng):
    """Alg. 1 from 5 random strictly feasible starts: every iterate has U > 0 and a lower
    cost, all end with the gradient 6 orders below its start (at 1e-5 some starts stall
    first: the cost, about -2000, stops resolving decreases), and the labels read off U
    (Lemma 1) are the planted ones."""
    from dnomad.metrics import clustering_accuracy
    from dnomad.kmeans_sdp.riemannian import labels_from_u, random_start, riemannian_newton

    X, y = gmm_simplex(120, 3, 1.5, rng)
    M = KMeansManifold(120, 4, 3)
    P = KMeansProblem(M, X, mu=0.01)
    Zstar = (y[:, None] == y[None, :]) / 40.0
    for seed in range(5):
        res = riemannian_newton(P, random_start(M, np.random.default_rng(seed)), gtol=1e-4, max_iter=3000)
        x, history, stop = res.point, res.history, res.stop_reason
        assert stop == "tolerance" and M.norm(x, P.grad(x)) <= 1e-4
        assert all(a["loss"] > b["loss"] for a, b in zip(history, history[1:]))
        U = M.phi(x)
        assert U.min() > 0
        assert clustering_accuracy(y, labels_from_u(U, 3)) == 1.0
        # Critical points differ from start to start (as the paper's Fig. 9), their
        # membership matrices Z = U U^T all lie near the planted one.
        # mu = 0.01 keeps them 0.24-0.25% from it (measured).
        assert np.linalg.norm(U @ U.T - Zstar) / np.linalg.norm(Zstar) <= 0.01


def test_default_mu_puts_the_barrier_at_twenty_times_the_data_term(rng):
    from dnomad.kmeans_sdp.riemannian import default_mu, random_start

    M = KMeansManifold(60, 4, 3)
    X = rng.standard_normal((60, 2)) + 5.0
    x = random_start(M, rng)
    mu = default_mu(X, M, x)
    Xc = X - X.mean(axis=0)
    assert mu * -np.log(M.phi(x)).sum() == pytest.approx(20 * np.sum((Xc.T @ x[0]) ** 2), rel=1e-12)
    assert M.phi(x).min() > 0 and max(M.feasibility(x)[:3]) < 1e-10


@pytest.mark.parametrize("n,r,K,chunk_rows", [(60, 5, 3, 7), (61, 5, 3, 7), (123, 6, 3, 16)])
def test_random_start_and_auto_mu_are_made_by_the_row_chunks(rng, monkeypatch, n, r, K, chunk_rows):
    """Lemma 5's interior point repeats r rows (interior_factor: the same U as the SVD's
    point), so init="random" and mu="auto" make their n-row vectors in the chunks: a run
    with every gather and every put of n x r rows refused ends where the in-memory run
    ends, and the random start's rows do not depend on the chunking."""
    from dnomad.blocks import RowChunks
    from dnomad.kmeans_sdp.riemannian import data_curvature, interior_start, random_start, riemannian_kmeans

    M = KMeansManifold(n, r, K)
    W, Q = M.interior_factor()
    assert np.abs(M.phi((W[np.arange(n) % r], Q)) - M.phi(M.interior_point())).max() < 1e-14
    X = rng.standard_normal((n, 2)) + np.repeat(4.0 * rng.standard_normal((K, 2)), -(-n // K), axis=0)[:n]
    x = random_start(M, np.random.default_rng(3))
    assert M.phi(x).min() > 0 and max(M.feasibility(x)[:3]) < 1e-10
    data = RowChunks(X, chunk_rows=chunk_rows)
    V, Q7 = random_start(M, np.random.default_rng(3), data=data)
    assert np.abs(data.get(V.name) - x[0]).max() < 1e-14 and np.array_equal(Q7, x[1])
    data.drop(V.name)
    point = interior_start(M, data, "V0")
    assert np.abs(M.phi((data.get("V0"), point[1])) - M.phi(M.interior_point())).max() < 1e-14
    data.drop("V0")

    newton = dict(init="random", random_state=5, gtol=1e-8 * data_curvature(data), max_iter=500)
    reference = riemannian_kmeans(RowChunks(X), K, **newton)
    assert reference.stop_reason == "tolerance"

    get, put = RowChunks.get, RowChunks.put

    def labels_only(self, name):                     # the labels (n integers) are the result
        if name != "kmeans_labels":
            raise AssertionError(f"state {name!r} gathered")
        return get(self, name)

    def put_a_column(self, name, A, dtype=None):     # k-means' sample mask is one column of bools
        if np.shape(A)[1:] != (1,):
            raise AssertionError(f"state {name!r} of shape {np.shape(A)} put")
        return put(self, name, A, dtype)

    monkeypatch.setattr(RowChunks, "get", labels_only)
    monkeypatch.setattr(RowChunks, "put", put_a_column)
    res = riemannian_kmeans(data, K, **newton, keep_rows=True)
    monkeypatch.undo()
    assert res.mu == pytest.approx(reference.mu, rel=1e-12)
    assert res.cost == pytest.approx(reference.cost, rel=1e-9)
    assert np.array_equal(res.labels, reference.labels)
    assert np.abs(data.get("U") - reference.U).max() < 1e-6 * np.abs(reference.U).max()


def test_interior_point_refuses_too_few_points():
    with pytest.raises(InputValueError, match="interior point does not exist for n = 7, r = 5"):
        KMeansManifold(7, 5, 4).interior_point()


def dense_riemannian_hessian(M, P, x):
    """The Riemannian Hessian as a matrix on an orthonormal basis of the tangent space
    (the null space of the constraint Jacobian), from the reference Hessian-vector
    product."""
    V, Q = x
    nv = V.size
    N = nv + Q.size
    basis = []
    for k in range(N):
        e = np.zeros(N)
        e[k] = 1.0
        t = M.proj(x, (e[:nv].reshape(V.shape), e[nv:].reshape(Q.shape)))
        basis.append(np.r_[t[0].ravel(), t[1].ravel()])
    # The projector's range, orthonormalized.
    w, E = np.linalg.eigh(np.array(basis))
    B = E[:, w > 0.5]
    H = np.empty((B.shape[1], B.shape[1]))
    for k in range(B.shape[1]):
        b = B[:, k]
        h = P.hess(x, (b[:nv].reshape(V.shape), b[nv:].reshape(Q.shape)))
        H[:, k] = B.T @ np.r_[h[0].ravel(), h[1].ravel()]
    return 0.5 * (H + H.T)


@pytest.mark.parametrize("chunk_rows", [5, 64])
def test_row_chunk_sums_equal_the_reference(rng, chunk_rows):
    """Cost and gradient norm from the row-chunk passes equal the dense reference; the
    inertia of the Schur complement counts the Hessian's eigenvalues below -lam; Lanczos
    on the shift-inverted Hessian finds its smallest eigenvalue."""
    M = KMeansManifold(40, 5, 3)
    P = KMeansProblem(M, rng.standard_normal((40, 3)), mu=0.05, chunk_rows=chunk_rows)
    from dnomad.kmeans_sdp.riemannian import random_start

    x = random_start(M, rng)
    it = P.load(x)
    assert it.cost == pytest.approx(P.cost(x), rel=1e-12)
    eig = np.linalg.eigvalsh(dense_riemannian_hessian(M, P, x))
    assert eig[0] < 0                     # the count below is not trivially zero
    for lam in (-eig[0] / 2, 0.1, 10.0, 1e3):
        sol = P.solve(it, lam)
        assert sol.grad_norm == pytest.approx(M.norm(x, P.grad(x)), rel=1e-10)
        assert sol.negative == int(np.sum(eig < -lam)), lam
    from dnomad.kmeans_sdp.curvature import smallest_eigenpair

    value, e = smallest_eigenpair(P, it, tol=1e-12)
    assert value == pytest.approx(eig[0], rel=1e-8)
    eV, eQ = P.data.get(e.name), e.dQ
    assert M.norm(x, (eV, eQ)) == pytest.approx(1, rel=1e-12)
    hv, hq = P.hess(x, (eV, eQ))
    assert np.sqrt(np.sum((hv - value * eV) ** 2) + np.sum((hq - value * eQ) ** 2)) < 1e-6 * abs(value)
    assert P.min_eigenvalue(it, tol=1e-12) == pytest.approx(value, rel=1e-8)


def test_negative_curvature_step_keeps_its_vectors_in_the_row_chunks(rng, monkeypatch):
    """At a point where the Hessian has a negative eigenvalue, the step along its
    eigenvector lowers the cost to a feasible point whose sums are its own; V, the
    eigenvector and the Lanczos basis stay in the row chunks (a gather is refused), and
    no vector of the eigensolve is left there afterwards."""
    from dnomad.blocks import RowChunks
    from dnomad.kmeans_sdp.riemannian import random_start

    M = KMeansManifold(60, 5, 3)
    P = KMeansProblem(M, rng.standard_normal((60, 3)), mu=0.05, chunk_rows=7)
    x = random_start(M, rng)
    it = P.load(x)
    assert np.linalg.eigvalsh(dense_riemannian_hessian(M, P, x))[0] < 0

    def refused(self, name):
        raise AssertionError(f"state {name!r} gathered")

    before = set(P.data._chunks[0])
    monkeypatch.setattr(RowChunks, "get", refused)
    new = P.negative_curvature_step(it, 0.95)
    value = P.min_eigenvalue(it)
    monkeypatch.undo()
    assert new is not None and new.cost < it.cost and new.min_u > 0
    point = (P.data.get(new.name), new.Q)
    assert new.cost == pytest.approx(P.cost(point), rel=1e-12)
    assert max(M.feasibility(point)[:3]) < 1e-10
    assert value == pytest.approx(np.linalg.eigvalsh(dense_riemannian_hessian(M, P, x))[0], rel=1e-6)
    assert set(P.data._chunks[0]) - before == {new.name, "dV"}
    # a solve that fails mid-eigensolve leaves none of its vectors behind
    solve, calls = P.solve, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 8:
            raise RuntimeError("a lost worker")
        return solve(*args, **kwargs)

    monkeypatch.setattr(P, "solve", failing)
    with pytest.raises(RuntimeError, match="a lost worker"):
        P.min_eigenvalue(it)
    assert set(P.data._chunks[0]) - before == {new.name, "dV"}


def test_issue_gmm_every_start_reaches_the_planted_clusters_at_a_second_order_point():
    """The paper's Fig. 1 instance (GMM, n = 500, K = 4, gamma = 1.2, mu = 0.01): from 10
    random starts, Alg. 1 stops with ||grad|| <= 1e-6 at a point whose smallest Hessian
    eigenvalue is above -sqrt(1e-6) (Lanczos for each, checked once against the dense
    Hessian), strictly feasible throughout, with zero mis-clustering."""
    from dnomad.metrics import clustering_accuracy
    from dnomad.kmeans_sdp.riemannian import labels_from_u, random_start, riemannian_newton

    X, y = gmm_simplex(500, 4, 1.2, np.random.default_rng(0))
    M = KMeansManifold(500, 5, 4)
    P = KMeansProblem(M, X, mu=0.01)
    costs = []
    for seed in range(10):
        res = riemannian_newton(P, random_start(M, np.random.default_rng(seed)), gtol=1e-6,
                                min_eigenvalue="final")
        assert res.stop_reason == "tolerance" and res.grad_norm <= 1e-6
        assert M.norm(res.point, P.grad(res.point)) <= 1e-6
        assert res.min_eigenvalue >= -1e-3
        assert res.U.min() > 0 and max(M.feasibility(res.point)[:3]) < 1e-10
        assert clustering_accuracy(y, labels_from_u(res.U, 4)) == 1.0
        costs.append(res.cost)
        if seed == 0:
            eig = np.linalg.eigvalsh(dense_riemannian_hessian(M, P, res.point))
            assert eig[0] == pytest.approx(res.min_eigenvalue, abs=1e-6)
    # Different critical points, all near the optimum (measured: -10924.10 to -10924.07).
    assert max(costs) - min(costs) < 1e-4 * abs(min(costs))


def test_lam_bisection_solves_the_cubic_subproblem(rng):
    """Sec. 3: lam with 2 lam = L ||p(lam)|| and H + lam I positive definite on the
    tangent space (Lemma 2); Alg. 1 driven by it reaches the planted clusters."""
    from dnomad.metrics import clustering_accuracy
    from dnomad.kmeans_sdp.riemannian import _cubic_lam, labels_from_u, random_start, riemannian_newton

    X, y = gmm_simplex(120, 3, 1.5, rng)
    M = KMeansManifold(120, 4, 3)
    P = KMeansProblem(M, X, mu=0.05)
    x = random_start(M, rng)
    it = P.load(x)
    for L in (0.1, 10.0, 1e3):
        sol, step = _cubic_lam(P, it, L, 1.0)
        # The root lies in [lam / 1.01, lam]: ||p|| <= 2 lam / L there, and just below
        # either ||p|| > 2 lam / L or H + lam I is indefinite (near -lam_min, where
        # ||p|| grows without bound).
        assert sol.negative == 0 and np.sqrt(step.pp) <= 2 * sol.lam / L
        below = P.solve(it, sol.lam / 1.01)
        if below.negative == 0:
            assert np.sqrt(P.back_substitute(it, below).pp) > 2 * (sol.lam / 1.01) / L
    res = riemannian_newton(P, x, lam_rule="bisection", gtol=1e-6)
    assert res.stop_reason == "tolerance" and res.grad_norm <= 1e-6
    assert clustering_accuracy(y, labels_from_u(res.U, 3)) == 1.0


@pytest.mark.parametrize("r", [4, 6])
def test_kmeans_start_is_strictly_feasible_next_to_the_kmeans_partition(r):
    """init="kmeans": U U^T 1 = 1, Tr(U U^T) = K and U > 0 to round-off, on the manifold
    (phi of the returned (V, Q) is U); the r groups (the k-means partition with its
    largest groups cut in two) are each row's largest entry, and merged back they are the
    planted partition k-means finds; U U^T is (1 - theta) times the r groups' membership
    plus theta / n, theta = (r - K) / (r - 1)."""
    from sklearn.datasets import make_blobs

    from dnomad.blocks import RowChunks
    from dnomad.rounding import kmeans_partition
    from dnomad.kmeans_sdp.riemannian import kmeans_start
    from dnomad.metrics import clustering_accuracy

    X, y = make_blobs([150, 90, 60], centers=[[0, 0], [8, 0], [0, 8]], random_state=6)
    n, K = len(X), 3
    M = KMeansManifold(n, r, K)
    with RowChunks(X, chunk_rows=64) as data:
        V, Q = kmeans_start(M, data, np.random.default_rng(0))
        x = (np.asarray(V), Q)                       # made by the chunks
        partition = kmeans_partition(data, K, np.random.default_rng(0))
    U = M.phi(x)
    assert U.min() > 0
    ones, trace, orth, _ = M.feasibility(x)
    assert max(ones, trace, orth) < 1e-12
    np.testing.assert_allclose(U @ (U.T @ np.ones(n)), 1.0, atol=1e-12)
    groups = np.argmax(U, axis=1)
    assert len(np.unique(groups)) == r and clustering_accuracy(y, partition) == 1.0
    # Every group lies inside one k-means group: merging gives the partition back.
    assert all(len(np.unique(partition[groups == g])) == 1 for g in range(r))
    theta = (r - K) / (r - 1)
    same = groups[:, None] == groups[None]
    expected = (1 - theta) * same / np.bincount(groups)[groups][None] + theta / n
    np.testing.assert_allclose(U @ U.T, expected, atol=1e-12)


def test_point_from_u_reflected_takes_a_partition_with_equal_singular_values():
    """U of a partition (K singular values equal to 1, where an SVD cannot single out the
    1/sqrt(n) direction; group 0 spread over two columns): phi(point_from_u_reflected(U))
    = U, V centred, ||V||^2 = K - 1, Q orthogonal."""
    from dnomad.kmeans_sdp.lloyd import partition_factor

    labels = np.repeat([0, 1, 2], [7, 4, 9])
    M = KMeansManifold(20, 4, 3)
    U = partition_factor(labels, 3, 4)
    V, Q = M.point_from_u_reflected(U)
    np.testing.assert_allclose(M.phi((V, Q)), U, atol=1e-14)
    ones, trace, orth, _ = M.feasibility((V, Q))
    assert max(ones, trace, orth) < 1e-13


def test_default_start_beats_kmeans_and_the_random_start_on_unequal_overlapping_blobs():
    """Four overlapping blobs of 200 to 20 points in 6-D: from the k-means start (the
    default) Newton ends at a lower cost, in fewer iterations, than from the paper's
    random start, and its labels are at least k-means++'s (measured: ARI 0.99 against
    0.72 from the random start and 0.68 for scikit-learn's KMeans)."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_blobs
    from sklearn.metrics import adjusted_rand_score

    import dnomad

    X, y = make_blobs([200, 120, 60, 20], n_features=6, cluster_std=[3.0, 2.0, 1.5, 1.0], center_box=(-8, 8),
                      random_state=7)
    start = dnomad.RiemannianKMeans(4, random_state=0).fit(X)
    paper = dnomad.RiemannianKMeans(4, init="random", random_state=0).fit(X)
    assert start.stop_reason_ == paper.stop_reason_ == "tolerance"
    assert start.cost_ < paper.cost_ and start.n_iter_ < paper.n_iter_
    kmeans = KMeans(4, random_state=0).fit(X).labels_
    assert adjusted_rand_score(y, start.labels_) >= adjusted_rand_score(y, kmeans) - 0.02


def test_estimator_tol_and_lam_are_in_units_of_the_data():
    """tol and lam are relative to ||X||_2^2: the run ends with ||grad|| <= tol ||X||_2^2,
    and X in other units (x 1e-2, x 100: the cost, mu's default, lam and the stopping
    norm all scale by the square) takes the same iterations to the same labels."""
    import dnomad
    from dnomad.data import gmm_simplex

    X, _ = gmm_simplex(300, n_clusters=3, gamma=1.2, random_state=8)
    base = dnomad.RiemannianKMeans(3, random_state=0).fit(X)
    Xc = X - X.mean(axis=0)
    curvature = np.linalg.eigvalsh(Xc.T @ Xc)[-1]
    assert base.stop_reason_ == "tolerance" and base.grad_norm_ <= 1e-10 * curvature
    for units in (1e-2, 100.0):
        est = dnomad.RiemannianKMeans(3, random_state=0).fit(units * X)
        assert est.stop_reason_ == "tolerance" and abs(est.n_iter_ - base.n_iter_) <= 0.2 * base.n_iter_
        np.testing.assert_array_equal(est.labels_, base.labels_)
        assert est.cost_ == pytest.approx(units ** 2 * base.cost_, rel=1e-8)


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_many_features_are_solved_on_a_principal_sketch_equal_to_the_projected_problem():
    """X with 120 features (a planted 3-cluster mixture): the default solves on X's
    ceil(3 / 0.2) = 15 top principal components, and ends where the run on those
    components computed by NumPy ends (same labels and cost: the sketch is the projected
    problem, its k-means start included), at the planted clusters; n_components=None
    keeps every feature, the paper's problem."""
    import dnomad
    from dnomad.data import gmm_simplex
    from sklearn.metrics import adjusted_rand_score

    X, y = gmm_simplex(240, n_clusters=3, gamma=1.5, n_features=120, random_state=3)
    sketched = dnomad.RiemannianKMeans(3, random_state=0).fit(X)
    Xc = X - X.mean(axis=0)
    values, vectors = np.linalg.eigh(Xc.T @ Xc)
    projected = Xc @ vectors[:, ::-1][:, :15]
    reference = dnomad.RiemannianKMeans(3, n_components=None, random_state=0).fit(projected)
    assert sketched.n_components_ == 15 and reference.n_components_ == 15
    assert sketched.explained_variance_ratio_ == pytest.approx(values[::-1][:15].sum() / values.sum(), rel=1e-10)
    assert reference.explained_variance_ratio_ == 1.0
    assert sketched.stop_reason_ == reference.stop_reason_ == "tolerance"
    np.testing.assert_array_equal(sketched.labels_, reference.labels_)
    assert sketched.cost_ == pytest.approx(reference.cost_, rel=1e-9)
    assert adjusted_rand_score(y, sketched.labels_) == 1.0
    full = dnomad.RiemannianKMeans(3, n_components=None, random_state=0, max_iter=2).fit(X)
    assert full.n_components_ == 120


@pytest.mark.parametrize("value,match", [(0, "n_components"), (2.5, "n_components"), ("all", "n_components"),
                                         (True, "n_components"), (7, "n_components must be at most X's 6")])
def test_bad_n_components_is_refused_by_name(value, match):
    import dnomad

    X = np.random.default_rng(0).standard_normal((30, 6))
    with pytest.raises(InputValueError, match=match):
        dnomad.RiemannianKMeans(2, n_components=value).fit(X)


def test_sketch_size_rule():
    from dnomad.kmeans_sdp.riemannian import sketch_size

    assert sketch_size("auto", 784, 10) == 50 and sketch_size("auto", 30, 10) == 30
    assert sketch_size("auto", 448, 16) == 80 and sketch_size(None, 784, 10) == 784
    assert sketch_size(12, 784, 10) == 12
