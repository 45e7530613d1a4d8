"""NOMAD's low-rank (Burer-Monteiro) solver and symmetric NMF by ADMM, against finite
differences, planted factorizations and the exact SDP solution."""
import tracemalloc

import numpy as np
import pytest

from dnomad.blocks.operators import DataGram
from dnomad.data import gaussian_blobs, two_rings
from dnomad.errors import InputValueError
from dnomad.metrics import adjusted_rand_score
from dnomad.nomad.bm import (BurerMonteiroParams, burer_monteiro, lagrangian,
                                           symnmf_admm)


class Dense:
    """A dense symmetric matrix as an operator (tests only)."""

    def __init__(self, A):
        self.A = A
        self.shape = A.shape

    def matmat(self, Y):
        return self.A @ Y


@pytest.fixture(scope="module")
def rings_and_exact_sdp():
    from test_nomad import exact_nomad

    X = two_rings(200)[0]
    D = DataGram(X)
    return X, D, exact_nomad(D.dense(), 8)


def test_lagrangian_gradient_has_taylor_slope_two(rng):
    n, r, K = 30, 5, 3
    A = rng.standard_normal((n, n))
    A = (A + A.T) / 2
    Y = rng.random((n, r))
    mu, lam = rng.standard_normal(n), 0.7
    f0, g = lagrangian(Y, A @ Y, mu, lam, K, sigma=1.3, phi=0.8)
    E = rng.standard_normal((n, r))
    errors = []
    for h in (1e-2, 5e-3, 2.5e-3, 1.25e-3):
        f1, _ = lagrangian(Y + h * E, A @ (Y + h * E), mu, lam, K, sigma=1.3, phi=0.8)
        errors.append(abs(f1 - f0 - h * np.sum(g * E)))
    slopes = np.diff(np.log(errors)) / np.diff(np.log([1e-2, 5e-3, 2.5e-3, 1.25e-3]))
    np.testing.assert_allclose(slopes, 2.0, atol=0.05)


@pytest.mark.parametrize("where", ["numpy", "zarr"])
def test_data_gram_products_match_the_dense_gram(where, rng, tmp_path):
    X = rng.standard_normal((500, 7)) + 3.0
    if where == "zarr":
        import zarr

        z = zarr.create_array(store=str(tmp_path / "X.zarr"), shape=X.shape, dtype=X.dtype, chunks=(64, 7))
        z[...] = X
        source = str(tmp_path / "X.zarr")
    else:
        source = X
    D = DataGram(source, chunk_rows=64)
    F = X - X.mean(axis=0)
    dense = F @ F.T
    dense /= np.linalg.norm(dense)
    Y = rng.random((500, 4))
    np.testing.assert_allclose(D.matmat(Y), dense @ Y, rtol=1e-10, atol=1e-13)
    assert D.fro_norm == pytest.approx(1.0)
    # Matrix-free: a product reads X twice by row chunks and nothing else.
    before = D.rows_read
    D.matmat(Y)
    assert D.rows_read - before == 2 * 500


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_symnmf_admm_factors_a_planted_completely_positive_matrix(seed):
    rng = np.random.default_rng(seed)
    B = rng.random((120, 6)) * (rng.random((120, 6)) < 0.6)
    A = B @ B.T
    res = symnmf_admm(lambda W: A @ W, 120, 6, random_state=seed, max_iter=5000, tol=1e-7)
    assert res.converged and res.W.min() >= 0
    assert np.linalg.norm(A - res.W @ res.W.T) / np.linalg.norm(A) <= 1e-3
    # Matrix-free: the same factorization of the Gram of B, never formed.
    G = DataGram(B, center=False, scale=1.0)
    res = symnmf_admm(G.matmat, 120, 6, random_state=seed, max_iter=5000, tol=1e-7)
    assert np.linalg.norm(A - res.W @ res.W.T) / np.linalg.norm(A) <= 1e-3


def test_random_rows_are_the_same_however_the_rows_are_cut():
    """The starts are drawn by the row chunks where they live: row i's values depend on the
    key and i only, not on the cut (blocks of RANDOM_BLOCK_ROWS rows, each its own
    stream), and they have the distribution asked for."""
    from dnomad.blocks.rows import RANDOM_BLOCK_ROWS, random_rows

    n = 3 * RANDOM_BLOCK_ROWS + 123
    whole = random_rows(7, 0, n, 5)
    for cuts in ([0, 1, 4095, 4096, 9000, n], [0, 777, n], list(range(0, n, 1000)) + [n]):
        np.testing.assert_array_equal(np.vstack([random_rows(7, a, b, 5) for a, b in zip(cuts, cuts[1:])]), whole)
    assert not np.array_equal(random_rows(8, 0, n, 5), whole)
    assert abs(whole.mean()) < 0.02 and abs(whole.std() - 1) < 0.02
    uniform = random_rows(7, 0, n, 5, draw="random")
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.01


@pytest.mark.parametrize("seed", [0, 1])
def test_symnmf_admm_in_row_chunks_factors_the_planted_gram_as_the_operator_does(seed):
    """The start of Burer-Monteiro in data mode: ADMM over row chunks of X, each half
    step one pass that finishes one product and starts the next.  In float64 it is the
    operator form's iteration (same W to round-off); in float32 (the default start) it
    ends within 1e-4 of it and still factors the completely positive Gram."""
    from dnomad.blocks import RowChunks
    from dnomad.nomad.bm import _symnmf_admm, drop_states

    rng = np.random.default_rng(seed)
    B = rng.random((300, 5)) * (rng.random((300, 5)) < 0.5)
    A = B @ B.T
    kw = dict(random_state=seed, max_iter=5000, tol=1e-6)
    ref = symnmf_admm(lambda W: A @ W, 300, 5, scale=0.1, **kw)
    with RowChunks(B, chunk_rows=64, center=False) as chunks:
        W = {}
        for dtype in (np.float64, np.float32):
            res = _symnmf_admm(chunks, 5, gram_scale=1.0, dtype=dtype, scale=0.1, **kw)
            assert res.converged and res.passes == 1 + 2 * res.n_iter and res.products == 2 * res.n_iter
            W[dtype] = chunks.get("W")
            chunks.map(drop_states, ["W", "_H", "_Gamma"], read_x=False)
    assert abs(res.n_iter - ref.n_iter) <= 0.02 * ref.n_iter       # float32's, near tol
    np.testing.assert_allclose(W[np.float64], ref.W, rtol=0, atol=1e-10 * ref.W.max())
    np.testing.assert_allclose(W[np.float32], ref.W, rtol=0, atol=1e-4 * ref.W.max())
    assert np.linalg.norm(A - W[np.float32] @ W[np.float32].T) / np.linalg.norm(A) <= 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_k_on_separated_blobs_is_the_hard_clustering(seed):
    """r = K gives a hard clustering (Kulis et al. 2007).  Which one is a matter of the
    start at r = K: the balanced start and the paper's each merged two clusters on
    about one in 20 seeds of these blobs and on more than half of 20 seeds of 5 blobs
    (n = 300); the default r is 2 K."""
    X, y = gaussian_blobs(150, n_centers=3, separation=8.0, random_state=seed)
    res = burer_monteiro(DataGram(X), BurerMonteiroParams(n_clusters=3, rank=3, random_state=seed))
    assert res.stop_reason == "tolerance"
    assert adjusted_rand_score(y, res.Y.argmax(axis=1)) == 1.0


def test_rank_8k_on_two_rings_is_near_the_exact_sdp_and_rank_k_is_not(rings_and_exact_sdp):
    """The paper's Fig. 12 trend: r = K gives a hard clustering far from Q*; r = 8K (the
    authors' default) lands within 0.15 (relative Frobenius) of it, at an objective within 2e-3.
    The distance is flat near Q* (objectives 7e-4 below it, at 0.06 to 0.10 by seed, and
    seed 1 moves from 0.084 to 0.101 between AVX2 and AVX-512 BLAS kernels); r = K stays
    above 0.9."""
    X, D, Qs = rings_and_exact_sdp
    distances, gaps = {}, {}
    D_dense = D.dense()
    f_exact = np.sum(D_dense * Qs)
    for rank in (8, 64):
        for seed in (0, 1, 2):
            res = burer_monteiro(D, BurerMonteiroParams(n_clusters=8, rank=rank, random_state=seed))
            Y = res.Y
            assert res.stop_reason == "tolerance" and Y.min() >= 0
            Q = Y @ Y.T
            # The constraints at convergence: Tr(Y^T Y) = K, Y Y^T 1 = 1.
            assert np.trace(Q) == pytest.approx(8, abs=1e-3)
            np.testing.assert_allclose(Q.sum(axis=1), 1, atol=1e-3)
            distances[rank, seed] = np.linalg.norm(Q - Qs) / np.linalg.norm(Qs)
            gaps[rank, seed] = (f_exact - np.sum(D_dense * Q)) / f_exact
    assert all(distances[64, s] <= 0.15 for s in range(3)), distances
    assert all(abs(gaps[64, s]) <= 2e-3 for s in range(3)), gaps
    assert all(distances[8, s] >= 0.5 for s in range(3)), distances
    assert BurerMonteiroParams(n_clusters=8).resolved_rank(1000) == 16
    assert BurerMonteiroParams(n_clusters=8).resolved_rank(12) == 12


def test_matrix_free_memory_grows_as_n_not_n_squared():
    """Peak memory of a Burer-Monteiro step (L-BFGS-B over Y, products D Y from X) at
    n = 4,000 and 16,000: 4x the points, about 4x the memory (16x if anything n x n were
    formed; D itself would take 2 GB at 16,000)."""
    peaks = {}
    for n in (4000, 16000):
        D = DataGram(two_rings(n)[0])
        tracemalloc.start()
        res = burer_monteiro(D, BurerMonteiroParams(n_clusters=4, rank=8, max_iter=1, inner_max_iter=100,
                                                    start="random", random_state=0))
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert D.matmats == res.matmats and D.rows_read >= 2 * n * res.matmats
    assert peaks[16000] <= 5 * peaks[4000], peaks
    assert peaks[16000] <= 16000 ** 2 * 8 / 20, peaks


@pytest.mark.parametrize("kw,match", [({"rank": 2}, "rank"), ({"rank": 300}, "rank"),
                                      ({"n_clusters": 0}, "n_clusters"), ({"sigma": 0}, "sigma"),
                                      ({"start": "kmeans"}, "start"), ({"inner_rtol": -0.1}, "inner_rtol"),
                                      ({"sigma": float("nan")}, "sigma"), ({"precondition": 0}, "precondition"),
                                      ({"precondition": "yes"}, "precondition")])
def test_bad_parameters_are_refused_before_work(kw, match):
    params = dict(n_clusters=3)
    params.update(kw)
    with pytest.raises(InputValueError, match=match):
        burer_monteiro(DataGram(gaussian_blobs(60, n_centers=3)[0]), BurerMonteiroParams(**params))


def test_inexact_multiplier_steps_end_where_exact_ones_do():
    """Multiplier steps solved to inner_rtol of their starting projected gradient or
    inexact_max_iter iterations (the default; the step that confirms the stopping rule
    is solved to inner_tol) reach the exact steps' solution from the balanced start (the
    default) or the paper's start as it is (whose first step is exact).  (Whether in fewer
    evaluations depends on the start at n = 300 with these tight tolerances: fewer from 4
    of 6 random starts; graphs/nomad_bm_steps.py measures the schedules.)  sigma defaults to
    10 / n.  Both end at the exact SDP's solution (SCS), which on these blobs is not the
    planted partition: its objective is 1e-4 higher, its entries up to 0.0065 away (the
    unpreconditioned solver with phi = 1 stopped at the partition, a stationary point
    of the low-rank problem)."""
    from test_nomad import exact_nomad

    X, y = gaussian_blobs(300, n_centers=4, separation=6.0, random_state=2)
    D = DataGram(X)
    Q_sdp = exact_nomad(D.dense(), 4)
    Q_planted = (y[:, None] == y[None, :]) / np.bincount(y)[y][:, None]
    f_sdp = np.sum(D.dense() * Q_sdp)
    assert f_sdp - np.sum(D.dense() * Q_planted) > 5e-5
    kw = dict(n_clusters=4, rank=32, random_state=0, tol=1e-7, feasibility_tol=1e-6)   # the authors' 8 K: near Q*
    assert BurerMonteiroParams(**kw).resolved_sigma(300) == pytest.approx(10 / 300)
    inexact = burer_monteiro(D, BurerMonteiroParams(**kw))
    unbalanced = burer_monteiro(D, BurerMonteiroParams(**kw, balance=False))
    exact = burer_monteiro(D, BurerMonteiroParams(**kw, inner_rtol=0.0))
    assert all(h["rtol"] == 0 for h in exact.history) and inexact.history[0]["rtol"] == 0.1
    assert unbalanced.history[0]["exact"] and unbalanced.history[1]["rtol"] == 0.1
    for res in (inexact, unbalanced, exact):
        assert res.stop_reason == "tolerance"
        assert res.history[-1]["exact"]
        Q = res.Y @ res.Y.T
        np.testing.assert_allclose(Q, Q_sdp, rtol=0, atol=1e-4)
        assert res.history[-1]["objective"] == pytest.approx(f_sdp, rel=2e-6)
    Q_ex = exact.Y @ exact.Y.T
    for res in (inexact, unbalanced):
        assert not all(h["exact"] for h in res.history)
        np.testing.assert_allclose(res.Y @ res.Y.T, Q_ex, rtol=0, atol=1e-3 * Q_ex.max())
        assert res.history[-1]["objective"] == pytest.approx(exact.history[-1]["objective"], rel=1e-6)


@pytest.mark.parametrize("optimizer", ["lbfgs", "spg", "scipy"])
def test_the_history_says_why_each_inner_solve_ended(optimizer):
    """inner_stop codes INNER_STOPS: solves cut at inner_max_iter say max_iter; a run to
    the rule ends its exact steps by gtol or ftol (the step that confirms the rule is
    not cut short), and its inexact ones by those or at inexact_max_iter."""
    from dnomad.errors import ConvergenceWarning
    from dnomad.nomad.bm import INNER_STOPS

    X, _ = gaussian_blobs(120, n_centers=3, separation=8.0, random_state=1)
    kw = dict(n_clusters=3, rank=6, optimizer=optimizer, random_state=0)
    with pytest.warns(ConvergenceWarning):
        capped = burer_monteiro(DataGram(X), BurerMonteiroParams(**kw, inner_max_iter=3, max_iter=2))
    assert [INNER_STOPS[h["inner_stop"]] for h in capped.history] == ["max_iter", "max_iter"]
    assert all(h["inner_iterations"] == 3 for h in capped.history)
    full = burer_monteiro(DataGram(X), BurerMonteiroParams(**kw))
    assert full.stop_reason == "tolerance"
    assert all(isinstance(h["inner_stop"], int) for h in full.history)
    for h in full.history:
        stop = INNER_STOPS[h["inner_stop"]]
        cut = not h["exact"] and optimizer != "scipy" and h["inner_iterations"] == BurerMonteiroParams.inexact_max_iter
        assert stop in ("gtol", "ftol") or (stop == "max_iter" and cut), h
    assert full.history[-1]["exact"] and INNER_STOPS[full.history[-1]["inner_stop"]] in ("gtol", "ftol")


@pytest.mark.parametrize("options, stop", [(dict(gtol=1e-3, ftol=1e-30), "gtol"), (dict(gtol=1e-30, ftol=1e-3), "ftol"),
                                           (dict(maxiter=2), "max_iter"), (dict(maxfun=3), "max_iter")])
def test_scipy_endings_map_to_the_inner_stop_they_are(options, stop):
    """SciPy L-BFGS-B's own results, each ended by one test, read as that test."""
    from scipy.optimize import Bounds, minimize

    from dnomad.nomad.bm import _scipy_stop

    A, b = np.diag(np.linspace(1.0, 100.0, 20)), np.ones(20)
    res = minimize(lambda x: (0.5 * x @ A @ x - b @ x, A @ x - b), np.zeros(20), jac=True, method="L-BFGS-B",
                   bounds=Bounds(-1.0, 1.0), options=options)
    assert _scipy_stop(res) == stop


def test_a_block_matrix_gram_gives_the_same_solution_as_the_data():
    """D as n x n blocks (ScaledMatrix over a BlockMatrix) or as X (DataGram): the same
    Y to the solver's accuracy (the products differ at round-off, and Y is defined to
    the stopping rule's tolerance: tightened here to 1e-7)."""
    from dnomad import blocks
    from dnomad.blocks.operators import ScaledMatrix

    X, y = gaussian_blobs(120, n_centers=3, separation=8.0, random_state=4)
    G = DataGram(X)
    F = X - X.mean(axis=0)
    B = blocks.from_array(F @ F.T, dtype=np.float64, block_size=50)
    fro = B.summary()["fro"]
    S = ScaledMatrix(B, fro, fro)
    assert S.fro_norm == pytest.approx(1.0) and G.fro_norm == pytest.approx(1.0)
    Y = np.random.default_rng(0).random((120, 3))
    np.testing.assert_allclose(S.matmat(Y), G.matmat(Y), rtol=1e-10, atol=1e-14)
    params = dict(n_clusters=3, rank=3, random_state=4, tol=1e-7, feasibility_tol=1e-6)
    a = burer_monteiro(S, BurerMonteiroParams(**params))
    b = burer_monteiro(G, BurerMonteiroParams(**params))
    np.testing.assert_allclose(a.Y, b.Y, atol=1e-5)
    assert adjusted_rand_score(y, a.Y.argmax(axis=1)) == 1.0


# ------------------------------------------------------------ the row-space optimizers
class _BoxQuadratic:
    """f(x) = 1/2 <x, A x> - <b, x> over row-space states, A = H (x) I_r + the rank-one
    coupling c c^T of each column (like the augmented Lagrangian's Y Y^T 1 term): an
    ill-conditioned convex quadratic whose box-constrained minimizer SciPy's L-BFGS-B
    finds to 1e-10."""

    def __init__(self, space, H, b):
        self.space, self.H, self.b = space, H, b
        space.put("_b", b)

    def dense_value_and_grad(self, x):
        Ax = self.H @ x
        return 0.5 * float(np.vdot(x, Ax)) - float(np.vdot(self.b, x)), Ax - self.b

    def evaluate(self, x, g):
        Y = self.space.get(x)
        f, grad = self.dense_value_and_grad(Y)
        self.space.put(g, grad)
        return f


@pytest.mark.parametrize("method", ["spg", "lbfgs", "lbfgs-identity", "lbfgs-preconditioned", "lbfgs-float32",
                                    "lbfgs-preconditioned-float32"])
@pytest.mark.parametrize("chunk_rows", [None, 7])
def test_row_space_optimizers_find_the_box_constrained_minimizer(method, chunk_rows):
    """SPG and projected L-BFGS over a row space (one chunk or uneven chunks of 7 rows)
    end at SciPy L-BFGS-B's minimizer of a convex quadratic over [0, 1]^{n x r} with
    about a third of the entries at a bound; L-BFGS also with a row preconditioner (the
    identity, or any SPD r x r matrix: restricted to a row's free entries it stays SPD,
    so the directions descend), and with its pairs stored in float32 (the minimizer to
    the same 1e-6: the pairs shape the steps, not the point they converge to)."""
    from scipy.optimize import Bounds, minimize

    from dnomad.blocks import RowState
    from dnomad.nomad import box_optim

    rng = np.random.default_rng(3)
    n, r = 40, 3
    M = rng.standard_normal((n, n))
    H = M @ M.T / n + np.diag(np.geomspace(1e-2, 10, n))      # condition number ~ 1e3
    b = rng.standard_normal((n, r)) * 2
    space = RowState(n, chunk_rows=chunk_rows)
    problem = _BoxQuadratic(space, H, b)

    def fun(x):
        f, g = problem.dense_value_and_grad(x.reshape(n, r))
        return f, g.ravel()

    ref = minimize(fun, np.full(n * r, 0.5), jac=True, method="L-BFGS-B", bounds=Bounds(0, 1),
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10000}).x.reshape(n, r)
    at_bound = np.mean((ref <= 0) | (ref >= 1))
    assert 0.2 <= at_bound <= 0.8
    space.put("x", np.full((n, r), 0.5))
    kw = {"lbfgs-identity": {"precondition": np.eye(r)},
          }.get(method.replace("-float32", ""), {})
    if "preconditioned" in method:
        kw["precondition"] = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.3]])
    if method.endswith("float32"):
        kw["pair_dtype"] = "float32"
    res = getattr(box_optim, method.split("-")[0])(space, problem, "x", lo=0.0, hi=1.0, max_iter=5000, ftol=1e-15,
                                                   gtol=1e-9, release=False, **kw)
    assert res.reason in ("gtol", "ftol"), res
    if method.startswith("lbfgs"):
        assert {space.get(f"_{v}{i}").dtype for v in "sy" for i in range(5)} == {np.dtype(kw.get("pair_dtype",
                                                                                                   "float64"))}
    x = space.get(res.x)
    assert x.min() >= 0 and x.max() <= 1
    np.testing.assert_allclose(x, ref, atol=1e-6)
    assert res.f == pytest.approx(problem.dense_value_and_grad(ref)[0], rel=1e-10)


@pytest.mark.parametrize("pair_dtype", ["float64", "float32"])
def test_preconditioned_two_loop_equals_the_dense_recursion(pair_dtype, rng):
    """The vector-free two-loop recursion with H0 = gamma P on every row (P an r x r SPD
    matrix; gamma = s'y / y'H0y of the newest pair) gives the direction the textbook
    recursion gives on the dense vectors, with the pairs in ring order (to the float32
    round-off of the products with P); with the pairs stored in float32, the recursion
    of those stored pairs, each dot accumulated in float64."""
    from dnomad.blocks import RowState
    from dnomad.nomad import box_optim

    n, r, memory = 30, 4, 5
    space = RowState(n, chunk_rows=7)
    x, g = rng.random((n, r)) + 0.5, rng.standard_normal((n, r))
    for name, value in (("x", x), ("g", g), ("_gh", g.copy())):
        space.put(name, value)
    A = rng.standard_normal((n * r, n * r))
    A = A @ A.T / (n * r) + np.eye(n * r)
    S = [rng.standard_normal((n, r)).astype(pair_dtype) for _ in range(3)]
    Yp = [(A @ s.ravel()).reshape(n, r).astype(pair_dtype) for s in S]
    slots = [2, 0, 1]                   # the ring's slots, oldest pair first
    SY = np.zeros((memory, memory))     # SY[i, j] = s_i'y_j by slot
    for a, i in enumerate(slots):
        space.put(f"_s{i}", S[a])
        space.put(f"_y{i}", Yp[a])
        for b, j in enumerate(slots):
            SY[i, j] = np.vdot(S[a].astype(float), Yp[b].astype(float))
    S, Yp = [s.astype(float) for s in S], [y.astype(float) for y in Yp]     # the stored values, in float64
    dots = [np.vdot(g, s) for s in S] + [np.vdot(g, y) for y in Yp] + [np.vdot(g, g)]
    P = rng.standard_normal((r, r))
    P = P @ P.T + np.eye(r)
    terms, gamma = box_optim._preconditioned_direction(
        space, "x", "g", -np.inf, np.inf, "_gh", slots, SY, dots, P,
        [f"_s{i}" for i in range(memory)], [f"_y{i}" for i in range(memory)], None, None)
    d = sum(c * space.get(name) for c, name in terms)
    q, alphas = g.copy(), []
    for s, y in zip(S[::-1], Yp[::-1]):
        alphas.insert(0, np.vdot(s, q) / np.vdot(s, y))
        q -= alphas[0] * y
    gamma_ref = np.vdot(S[-1], Yp[-1]) / np.vdot(Yp[-1], Yp[-1] @ P)
    h = gamma_ref * (q @ P)
    for s, y, alpha in zip(S, Yp, alphas):
        h += (alpha - np.vdot(y, h) / np.vdot(s, y)) * s
    # The products with P are float32 GEMMs (an approximate inverse Hessian: see
    # box_optim._precondition), so the match is to float32's round-off, 1e-7 of each
    # term, not float64's; an error in the recursion would be O(1).
    assert gamma == pytest.approx(gamma_ref, rel=1e-6)
    np.testing.assert_allclose(d, -h, rtol=1e-5, atol=1e-6 * np.abs(h).max())


def test_float32_pairs_dots_are_the_stored_values_dots_in_float64(rng):
    """With pairs stored in float32, the pair pass's dots (s's, s'y, y'y, with the other
    pairs and with the free gradient) are those of the stored values, summed in float64
    (to 1e-13 of the sum of the products' magnitudes, against exact sums): a product
    rounded to float32 before the sum would be off by ~1e-8 of it, which is what ignoring
    the rounding costs too.  s and y are made nearly orthogonal, so s'y cancels."""
    import math

    from dnomad.nomad import box_optim

    n, r = 700, 6
    x_old, g_old = rng.random((n, r)), rng.standard_normal((n, r))
    s_true = rng.standard_normal((n, r)) * 1e-3
    y_true = rng.standard_normal((n, r))
    y_true -= np.vdot(y_true, s_true) / np.vdot(s_true, s_true) * s_true * (1 - 1e-6)
    chunk = {"x": x_old, "xt": x_old + s_true, "g": g_old, "gt": g_old + y_true,
             "_s1": rng.standard_normal((n, r)).astype(np.float32),
             "_y1": rng.standard_normal((n, r)).astype(np.float32)}
    dots, _ = box_optim._pair(chunk, "xt", "x", "gt", "g", "_s0", "_y0", ["_s1", "_y1"], -np.inf, np.inf, "_gh",
                              "float32")
    S, Y, GH = chunk["_s0"], chunk["_y0"], chunk["_gh"]
    assert S.dtype == Y.dtype == np.float32 and GH.dtype == np.float64

    def exact(a, b):
        products = (a.astype(np.float64) * b.astype(np.float64)).ravel()
        return math.fsum(products), math.fsum(np.abs(products))

    others = [chunk["_s1"], chunk["_y1"]]
    want = ([exact(S, S), exact(S, Y), exact(Y, Y)] + [exact(S, o) for o in others] + [exact(Y, o) for o in others]
            + [exact(GH, o) for o in others] + [exact(GH, S), exact(GH, Y), exact(GH, GH)])
    value, magnitude = np.array(want).T
    assert np.all(np.abs(np.asarray(dots) - value) <= 1e-13 * magnitude), (dots, value)


@pytest.mark.parametrize("method", ["spg", "lbfgs"])
def test_a_warm_start_with_the_returned_scale_ends_at_the_new_minimizer(method):
    """A solve warm-started from a previous solution with that solve's curvature scale
    (as Burer-Monteiro's multiplier steps are) ends at the shifted problem's minimizer."""
    from scipy.optimize import Bounds, minimize

    from dnomad.blocks import RowState
    from dnomad.nomad import box_optim

    rng = np.random.default_rng(5)
    n, r = 30, 2
    M = rng.standard_normal((n, n))
    H = M @ M.T / n + np.diag(np.geomspace(1e-2, 10, n))
    b = rng.standard_normal((n, r)) * 2
    space = RowState(n)
    space.put("x", np.full((n, r), 0.5))
    first = getattr(box_optim, method)(space, _BoxQuadratic(space, H, b), "x", max_iter=5000, ftol=1e-15,
                                       gtol=1e-9)
    assert first.scale is not None and 0 < first.scale < np.inf
    shifted = _BoxQuadratic(space, H, b + 0.05 * rng.standard_normal((n, r)))
    space.put("x", space.get(first.x))
    res = getattr(box_optim, method)(space, shifted, "x", max_iter=5000, ftol=1e-15, gtol=1e-9,
                                     scale0=first.scale)

    def fun(x):
        f, g = shifted.dense_value_and_grad(x.reshape(n, r))
        return f, g.ravel()

    ref = minimize(fun, np.full(n * r, 0.5), jac=True, method="L-BFGS-B", bounds=Bounds(0, 1),
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10000}).x.reshape(n, r)
    np.testing.assert_allclose(space.get(res.x), ref, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["spg", "lbfgs"])
def test_row_space_burer_monteiro_finds_the_planted_clustering_as_the_operator_does(optimizer):
    """Y in row chunks beside X (RowChunks: D Y as two passes over X) or in one array with
    D a DataGram operator, each run to the stopping rule on well separated blobs, where
    the SDP's solution is the planted partition's Q* (1/|C| within a cluster): both end
    at Q* to the feasibility tolerance.  (Mid-run the two part at round-off: a
    projection decides which entries sit exactly at 0.)"""
    from dnomad.blocks import RowChunks

    X, y = gaussian_blobs(240, n_centers=4, separation=12.0, random_state=2)
    Q_star = (y[:, None] == y[None, :]) / np.bincount(y)[y][:, None]
    params = dict(n_clusters=4, rank=8, optimizer=optimizer, random_state=0)
    a = burer_monteiro(DataGram(X), BurerMonteiroParams(**params))
    with RowChunks(X, chunk_rows=64) as chunks:
        b = burer_monteiro(chunks, BurerMonteiroParams(**params))
        # construction; the start: its scale, then one pass per ADMM half step (each
        # finishes one product and starts the next); then two per product D Y
        assert b.start["passes"] == 2 + 2 * b.start["iterations"] and b.start["converged"]
        assert chunks.passes == 1 + b.start["passes"] + 2 * b.matmats
    for res in (a, b):
        assert res.stop_reason == "tolerance" and res.Y.min() >= 0 and res.Y.max() <= 1
        np.testing.assert_allclose(res.Y @ res.Y.T, Q_star, atol=2e-3)


def test_inexact_steps_are_cut_at_inexact_max_iter_and_exact_ones_are_not():
    """Inexact multiplier steps stop at inexact_max_iter iterations (inner_stop
    max_iter); exact ones (the first, from the paper's start, and the one that confirms
    the rule) go past it, to gtol or ftol."""
    from dnomad.nomad.bm import INNER_STOPS

    X, _ = gaussian_blobs(200, n_centers=4, separation=6.0, random_state=2)
    res = burer_monteiro(DataGram(X), BurerMonteiroParams(n_clusters=4, rank=8, random_state=0, inexact_max_iter=3,
                                                          balance=False))
    assert res.history[0]["exact"] and INNER_STOPS[res.history[0]["inner_stop"]] in ("gtol", "ftol")
    assert res.stop_reason == "tolerance"
    inexact = [h for h in res.history if not h["exact"]]
    assert inexact and all(h["inner_iterations"] <= 3 for h in inexact)
    assert any(INNER_STOPS[h["inner_stop"]] == "max_iter" for h in inexact)
    assert max(h["inner_iterations"] for h in res.history if h["exact"]) > 3
    assert INNER_STOPS[res.history[-1]["inner_stop"]] in ("gtol", "ftol")


def test_a_run_balances_its_start_unless_told_not_to(rng):
    """With balance (the default) a run's start Y0 is scaled onto Y Y^T 1 = 1 before its
    first step, and the run says so: one inner iteration later its rows are still near
    the row sums, where from Y0 as given (balance=False) they are far off."""
    X, _ = gaussian_blobs(120, n_centers=3, separation=6.0, random_state=0)
    Y0 = rng.random((120, 6)) * 0.05
    assert np.abs(Y0 @ Y0.sum(axis=0) - 1).max() > 0.3
    runs = {}
    for balance in (True, False):
        params = BurerMonteiroParams(n_clusters=3, rank=6, random_state=0, balance=balance, max_iter=1,
                                     inner_max_iter=1)
        with pytest.warns(Warning, match="max_iter"):
            runs[balance] = burer_monteiro(DataGram(X), params, Y0=Y0)
    start = runs[True].start
    assert start["method"] == "Y0" and start["balanced"] and start["balance_sweeps"] >= 1
    assert runs[False].start is None
    assert runs[True].history[0]["row_sum_violation"] < 0.1 < runs[False].history[0]["row_sum_violation"]


def test_a_row_too_small_to_scale_leaves_the_start_unscaled():
    """A start with a row of mass 1e-160 in a column no other row uses cannot be scaled
    (its d overflows): the start stays as it was, finite, and the run goes on."""
    from dnomad.blocks import RowState
    from dnomad.nomad.bm import _balance_start

    rng = np.random.default_rng(0)
    Y0 = np.zeros((60, 4))
    Y0[:, :3] = rng.random((60, 3)) * 0.1
    Y0[5] = [0, 0, 0, 1e-160]
    space = RowState(60, chunk_rows=25)
    space.put("Y", Y0)
    sweeps, balanced = _balance_start(space)
    assert not balanced and np.array_equal(space.get("Y"), Y0)


@pytest.mark.parametrize("step", [1e-1, 1e-4, 1e-6])
def test_q_change_is_the_relative_change_of_q(step, rng):
    """The history's q_change, from r x r products, is ||Y Y^T - P P^T||_F / ||P P^T||_F
    computed densely, down to steps of 1e-6; a rotation of Y (Q unchanged) gives 0."""
    from dnomad.nomad.bm import q_change

    P = rng.random((200, 7))
    Y = P + step * rng.standard_normal(P.shape)
    ref = np.linalg.norm(Y @ Y.T - P @ P.T) / np.linalg.norm(P @ P.T)
    assert q_change(Y.T @ Y, P.T @ P, P.T @ Y) == pytest.approx(ref, rel=1e-3)
    O = np.linalg.qr(rng.standard_normal((7, 7)))[0]
    assert q_change((P @ O).T @ (P @ O), P.T @ P, P.T @ (P @ O)) <= 1e-7


@pytest.mark.parametrize("where", ["chunks", "operator"])
def test_the_start_is_scaled_onto_the_row_sums(where, rng):
    """The start's symmetric scaling: Y Y^T 1 = 1 to BALANCE_TOL on every row with mass
    (a row of zeros stays zero), by a diagonal scaling of Y's rows (Q's rows and columns
    scaled by the same d > 0)."""
    from dnomad.blocks import RowChunks, RowState
    from dnomad.nomad.bm import BALANCE_TOL, _balance_start

    n, r = 150, 5
    Y0 = rng.random((n, r)) * np.where(rng.random((n, r)) < 0.4, 0.0, 1.0) * rng.uniform(0.01, 0.2, (n, 1))
    Y0[7] = 0.0
    space = RowChunks(rng.standard_normal((n, 3)), chunk_rows=40) if where == "chunks" else RowState(n, chunk_rows=40)
    space.put("Y", Y0)
    sweeps, balanced = _balance_start(space)
    assert balanced and sweeps > 1
    Y = space.get("Y")
    row_sums = Y @ Y.sum(axis=0)
    live = Y0.any(axis=1)
    assert np.abs(row_sums[live] - 1.0).max() <= BALANCE_TOL and not Y[7].any()
    d = Y[live].sum(axis=1) / Y0[live].sum(axis=1)
    np.testing.assert_allclose(Y[live], d[:, None] * Y0[live], rtol=1e-12)


@pytest.mark.parametrize("block_entries", [None, 30], ids=["chunk-blocks", "5-row-blocks"])
@pytest.mark.parametrize("where", ["chunks", "operator"])
def test_row_space_lagrangian_equals_the_dense_formula(where, block_entries, rng, monkeypatch):
    """The augmented Lagrangian and its gradient as the optimizers see them -- summed over
    row chunks of uneven size (data mode) or from an operator's D Y -- equal (32) and its
    gradient computed densely (which test_lagrangian_gradient_has_taylor_slope_two checks
    against finite differences); also where the kernels take each chunk's rows in
    blocks of 5 (X B and the sums a block at a time; the data mode's chunks of 32, 32
    and 26 rows end in blocks of 2, 2 and 1)."""
    from dnomad.blocks import RowChunks, RowState
    from dnomad.nomad import box_optim
    from dnomad.nomad.bm import _AugmentedLagrangian

    if block_entries is not None:
        monkeypatch.setattr(box_optim, "BLOCK_ENTRIES", block_entries)

    X = rng.standard_normal((90, 4)) + 2.0
    n, r, K = 90, 6, 3
    G = DataGram(X)
    D = G.dense()
    space = RowChunks(X, chunk_rows=32) if where == "chunks" else RowState(n, chunk_rows=40)
    problem = _AugmentedLagrangian(space, None if where == "chunks" else G, K, sigma=1.3, phi=0.8)
    Y, mu = rng.random((n, r)) * 0.1, rng.standard_normal(n)
    problem.lam = 0.7
    space.put("Y", Y)
    space.put("mu", mu)
    f = problem.evaluate("Y", "g")
    f_ref, g_ref = lagrangian(Y, D @ Y, mu, 0.7, K, sigma=1.3, phi=0.8)
    assert f == pytest.approx(f_ref, rel=1e-12)
    np.testing.assert_allclose(space.get("g"), g_ref, rtol=1e-10, atol=1e-12)
    assert problem.objective["Y"] == pytest.approx(np.sum(Y * (D @ Y)), rel=1e-12)


@pytest.mark.parametrize("where", ["here", "here, 4-row blocks", "workers"])
def test_float32_increments_give_the_float64_evaluations(where, rng, request, monkeypatch):
    """Evaluations by increments (D Y_x = D Y_b + F (F^T (Y_x - Y_b)) / scale, the
    step's two products in float32, D Y_b kept in float64) equal float64 evaluations to
    float32's round-off relative to the step, not to D Y: the value difference
    f(x) - f(b) and the gradient change to 1e-5 of themselves (float32's 6e-8 times
    the lengths of the sums, d = 6 and chunks of 40 rows, with room), for steps from
    1e-1 to 1e-6 of Y, alternating the base as the line searches do; in row chunks here
    (whole or in blocks of 4 rows) and on a 2-worker cluster.  A base changed after its evaluation is not stepped from:
    that evaluation is made afresh in float64."""
    from dnomad.blocks import RowChunks
    from dnomad.nomad.bm import _AugmentedLagrangian

    from dnomad.nomad import box_optim

    client = request.getfixturevalue("cluster_client") if where == "workers" else None
    if where == "here, 4-row blocks":                     # X's products a row block at a time
        monkeypatch.setattr(box_optim, "BLOCK_ENTRIES", 20)
    n, r, K = 150, 5, 3
    X = rng.standard_normal((n, 6)) * 3.0 + 100.0          # far from the origin: centring matters
    with RowChunks(X, chunk_rows=40, client=client) as space:
        inc, ref = (_AugmentedLagrangian(space, None, K, sigma=10 / n, phi=1.0) for _ in range(2))
        inc.lam = ref.lam = 0.3
        space.put("mu", rng.standard_normal(n) * 1e-2)
        Y = rng.random((n, r)) * 0.1
        space.put("a", Y)
        inc.begin_solve(True)
        fa, fa64 = inc.evaluate("a", "ga"), ref.evaluate("a", "ra")
        assert fa == pytest.approx(fa64, rel=1e-15)          # the first of a solve: in float64
        for size in (1e-1, 1e-3, 1e-6):
            space.put("b", np.clip(Y + size * 0.1 * rng.standard_normal((n, r)), 0.0, 1.0))
            fb, fb64 = inc.evaluate("b", "gb"), ref.evaluate("b", "rb")
            df64 = fb64 - fa64
            assert abs((fb - fa) - df64) <= 1e-5 * abs(df64)
            dg64 = np.abs(space.get("rb") - space.get("ra")).max()
            assert np.abs(space.get("gb") - space.get("rb")).max() <= 1e-5 * dg64
            # back to a, now from b
            assert inc.evaluate("a", "ga") == pytest.approx(fa64, abs=1e-5 * abs(df64))
            np.testing.assert_allclose(space.get("ga"), space.get("ra"), rtol=0, atol=1e-5 * dg64)
        assert inc.incremental_evaluations == 6
        space.put("a", 0.9 * Y)                              # the base of the next increment, changed
        assert inc.evaluate("b", "gb") == ref.evaluate("b", "rb")
        np.testing.assert_array_equal(space.get("gb"), space.get("rb"))
        assert inc.incremental_evaluations == 6
        inc.begin_solve(False)


def test_runs_by_float32_increments_end_where_float64_runs_end():
    """Burer-Monteiro over row chunks with X's products by float32 increments (opt-in)
    ends at the float64 run's Q (to the stopping rule's accuracy, tightened
    here) and at the exact SDP's solution (which on these blobs is not the planted
    partition: see test_inexact_multiplier_steps_end_where_exact_ones_do); the history
    counts the evaluations made by increments: all but the first of each solve and one
    in ANCHOR_EVERY."""
    from test_nomad import exact_nomad

    from dnomad.blocks import RowChunks
    from dnomad.nomad.bm import ANCHOR_EVERY

    X, y = gaussian_blobs(300, n_centers=4, separation=6.0, random_state=2)
    Q_sdp = exact_nomad(DataGram(X).dense(), 4)
    kw = dict(n_clusters=4, rank=32, random_state=0, tol=1e-7, feasibility_tol=1e-6)   # the authors' 8 K: near Q*
    assert not BurerMonteiroParams(n_clusters=4).increments
    runs = {}
    for increments in (True, False):
        with RowChunks(X, chunk_rows=128) as chunks:
            # the paper's start: its first step, exact, is long enough to re-anchor
            runs[increments] = burer_monteiro(chunks, BurerMonteiroParams(**kw, increments=increments,
                                                                          balance=False))
    for increments, res in runs.items():
        assert res.stop_reason == "tolerance"
        np.testing.assert_allclose(res.Y @ res.Y.T, Q_sdp, rtol=0, atol=1e-4)
        for row in res.history:
            anchors = 1 + (row["evaluations"] - 1) // (ANCHOR_EVERY + 1)
            assert row["incremental_evaluations"] == (row["evaluations"] - anchors if increments else 0), row
    assert any(row["evaluations"] > ANCHOR_EVERY for row in runs[True].history)
    Q, Q64 = (runs[m].Y @ runs[m].Y.T for m in (True, False))
    np.testing.assert_allclose(Q, Q64, rtol=0, atol=1e-3 * Q64.max())
    assert runs[True].history[-1]["objective"] == pytest.approx(runs[False].history[-1]["objective"], rel=1e-6)


class _Killed(Exception):
    pass


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")     # 6 outer steps
@pytest.mark.parametrize("where", ["here", "workers"])
def test_checkpoints_write_y_from_the_chunks_and_resume_to_the_same_run(where, cluster_client, tmp_path):
    """Burer-Monteiro's checkpoints hand Y and mu to the store as held rows: the chunks
    write them and nothing is gathered into this process (a run killed in its fourth
    outer step, after three checkpoints, gathered nothing), and the run resumed from its
    last checkpoint ends where the uninterrupted run ends."""
    from dnomad.blocks import RowChunks
    from dnomad.blocks.store import Checkpoints, read_json

    client = cluster_client if where == "workers" else None
    X, _ = gaussian_blobs(150, n_centers=3, separation=8.0, random_state=1)
    params = BurerMonteiroParams(n_clusters=3, rank=6, random_state=0, max_iter=6)
    with RowChunks(X, chunk_rows=40) as chunks:
        ref = burer_monteiro(chunks, params)
    gathered = []
    url = str(tmp_path / "bm.zarr")
    ck = Checkpoints(url, "ck")

    def kill_in_step_4(row):
        if row["iteration"] == 4:
            raise _Killed

    with RowChunks(X, chunk_rows=40, client=client) as chunks:
        get = chunks.get
        chunks.get = lambda name: gathered.append(name) or get(name)
        with pytest.raises(_Killed):
            burer_monteiro(chunks, params, callback=kill_in_step_4, checkpoint=ck.save, checkpoint_every=1)
    record = read_json(url, "ck")           # the third checkpoint, written over the first's slot
    assert gathered == [] and record["iteration"] == 3 and record["held"] == ["Y", "mu"]
    with RowChunks(X, chunk_rows=40, client=client) as chunks:
        resumed = burer_monteiro(chunks, params, state=ck.load())
    assert [h["iteration"] for h in resumed.history] == [h["iteration"] for h in ref.history]
    np.testing.assert_allclose(resumed.Y, ref.Y, rtol=0, atol=1e-12)
