"""Simplicial SymNMF: the objective, gradient and line search against dense numpy, exact
feasibility, planted recovery, monotone line search, the baselines on real data, one
pass per iteration, and bad input."""
import warnings

import numpy as np
import pytest

import dnomad
from dnomad import blocks
from dnomad.data import gaussian_blobs
from dnomad.errors import InputValueError
from dnomad.metrics import adjusted_rand_score
from dnomad.symnmf import solvers as S


def dense_f(P, W):
    return 0.25 * np.sum((P - W @ W.T) ** 2)


def dense_grad(P, W):
    return (W @ W.T - P) @ W


@pytest.fixture
def small(rng):
    n, k = 40, 4
    X = rng.standard_normal((n, 3))
    P = np.exp(-((X[:, None] - X[None]) ** 2).sum(-1) / 2.0)
    W = S.random_simplex_rows(n, k, rng)
    return P, W


def test_objective_and_gradient_equal_dense(small):
    P, W = small
    M = P @ W
    fro2 = np.sum(P * P)
    assert S.objective_from(W, M, fro2) == pytest.approx(dense_f(P, W), rel=1e-12)
    np.testing.assert_allclose(S.gradient_from(W, M), dense_grad(P, W), rtol=1e-12, atol=1e-12)


def test_gradient_taylor_slope_is_two(small, rng):
    """|f(W + h D) - f(W) - h <grad, D>| = O(h^2): the error falls 100x per 10x in h."""
    P, W = small
    G = S.gradient_from(W, P @ W)
    D = rng.standard_normal(W.shape)
    hs = np.array([1e-2, 1e-3, 1e-4])
    err = np.array([abs(dense_f(P, W + h * D) - dense_f(P, W) - h * np.sum(G * D)) for h in hs])
    slopes = np.diff(np.log10(err)) / np.diff(np.log10(hs))
    np.testing.assert_allclose(slopes, 2.0, atol=0.05)


def test_quartic_line_search_equals_brute_force(small):
    P, W = small
    k = W.shape[1]
    fro2 = np.sum(P * P)
    M = P @ W
    gap, labels = S.fw_gap(S.gradient_from(W, M), W)
    Sv = np.eye(k)[labels]
    c = S.quartic_coefficients(W, M, labels, P @ Sv, fro2)
    for step in (0.0, 0.37, 1.0):
        assert np.polyval(c[::-1], step) == pytest.approx(dense_f(P, W + step * (Sv - W)), rel=1e-12)
    assert c[1] == pytest.approx(-gap, rel=1e-10)        # slope at 0 is <grad, S - W> = -gap
    grid = np.linspace(0, 1, 200001)
    brute = grid[np.argmin([dense_f(P, W + s * (Sv - W)) for s in grid[::100]]) * 100]
    best = S.quartic_argmin(c)
    assert abs(best - brute) <= 1e-3
    phi = lambda s: dense_f(P, W + s * (Sv - W))
    assert phi(best) <= min(phi(s) for s in grid[::100]) + 1e-12


def test_simplex_projection_matches_definition(rng):
    V = rng.standard_normal((200, 5)) * 2
    Pj = S.project_rows_to_simplex(V)
    np.testing.assert_allclose(Pj.sum(axis=1), 1, atol=1e-12)
    assert Pj.min() >= 0
    # Optimality (KKT): V - Pj = theta 1 on the support and <= theta off it.
    R = V - Pj
    for r, w in zip(R, Pj):
        theta = r[w > 0]
        assert np.ptp(theta) < 1e-10 and (r[w == 0] <= theta[0] + 1e-10).all()


@pytest.mark.parametrize("method", ["fw", "pgd"])
def test_every_iterate_is_exactly_feasible(method, small):
    P, W0 = small
    bm = blocks.from_array(P, dtype=np.float64, block_size=16)
    for t in (1, 2, 5, 40):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
            res = S.solve(method, bm, W0, S.SymNMFParams(n_components=4, max_iter=t, tol=0),
                          fro2=np.sum(P * P))
        assert res.n_iter == t
        assert res.W.min() >= 0
        np.testing.assert_allclose(res.W.sum(axis=1), 1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_one_hot_factor_is_recovered(seed):
    """P = W* W*^T with one-hot W* (groups of unequal sizes): f reaches 0."""
    rng = np.random.default_rng(seed)
    sizes = [7, 12, 25, 5, 16]
    truth = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    Wst = np.eye(len(sizes))[truth]
    P = Wst @ Wst.T
    fro2 = np.sum(P * P)
    est = dnomad.SymNMF(n_clusters=len(sizes), affinity="precomputed", dtype=np.float64, tol=1e-12,
                        random_state=seed, block_size=20).fit(P)
    assert est.stop_reason_ == "tolerance"
    assert est.objective_ <= 1e-8 * fro2
    assert adjusted_rand_score(truth, est.labels_) == 1.0


def test_line_search_never_increases_the_objective(rng):
    X, _ = gaussian_blobs(200, n_centers=4, separation=3.0, random_state=3)
    # tol=0: run all max_iter iterations (no ConvergenceWarning: no tolerance was asked).
    est = dnomad.SymNMF(n_clusters=6, dtype=np.float64, bandwidth=2.0, max_iter=300, tol=0,
                        random_state=0).fit(X)
    assert est.n_iter_ == 300
    f = np.array([r["objective"] for r in est.history_])
    assert np.all(np.diff(f) <= 1e-12 * f[0])
    assert f[-1] < 0.9 * f[0]


@pytest.mark.parametrize("solver", ["fw", "pgd"])
def test_tol_is_the_relative_fw_gap_at_the_first_stop(solver):
    X, _ = gaussian_blobs(150, n_centers=3, separation=4.0, random_state=2)
    tol = 1e-3
    est = dnomad.SymNMF(n_clusters=3, solver=solver, tol=tol, dtype=np.float64, bandwidth=4.0,
                        random_state=0).fit(X)
    F = blocks.prepare_gram_data(X, center=False, normalize=False)
    P = np.exp(-((F[:, None] - F[None]) ** 2).sum(-1) / 4.0)
    fro2 = np.sum(P * P)
    gaps = np.array([r["gap"] for r in est.history_])
    assert est.stop_reason_ == "tolerance"
    assert gaps[-1] <= tol * fro2 and np.all(gaps[:-1] > tol * fro2)
    G = dense_grad(P, est.components_)
    assert gaps[-1] == pytest.approx(np.sum(G * est.components_) - G.min(axis=1).sum(), rel=1e-8)


def test_paper_step_rule_uses_the_curvature_bound(small):
    P, W0 = small
    n = P.shape[0]
    bm = blocks.from_array(P, dtype=np.float64, block_size=16)
    res = S.frank_wolfe(bm, W0, S.SymNMFParams(n_components=4, max_iter=5, tol=0, step_rule="paper"),
                        fro2=np.sum(P * P))
    norm2 = np.linalg.eigvalsh(P)[-1]
    assert res.extra["spectral_norm"] == pytest.approx(norm2, rel=1e-6)
    C = 2 * n * (3 * n + norm2)
    for row in res.history[:-1]:
        assert row["step"] == pytest.approx(min(row["gap"] / C, 1.0), rel=1e-5)


def test_paper_pgd_backtracks_from_one_every_iteration(small):
    """step_rule="paper" for PGD: plain backtracking, each accepted eta the first of
    1, 1/2, 1/4, ... that passes the sufficient-decrease test, checked against dense
    numpy; one pass per trial."""
    P, W0 = small
    fro2 = np.sum(P * P)
    bm = blocks.from_array(P, dtype=np.float64, block_size=16)
    res = S.projected_gradient(bm, W0, S.SymNMFParams(n_components=4, max_iter=6, tol=0, step_rule="paper"),
                               fro2=fro2)
    assert res.step_rule == "plain backtracking"

    def passes_test(W, eta):
        G = dense_grad(P, W)
        Wn = S.project_rows_to_simplex(W - eta * G)
        D = Wn - W
        return dense_f(P, Wn) <= dense_f(P, W) + np.sum(G * D) + np.sum(D * D) / (2 * eta), Wn

    W, trials = W0, 0
    for row in res.history[:-1]:
        eta = row["step"]
        m = -np.log2(eta)
        assert m == round(m) and m >= 0, eta
        assert all(not passes_test(W, 2.0 ** -j)[0] for j in range(int(m)))
        ok, W = passes_test(W, eta)
        assert ok
        trials += int(m) + 1
    assert res.passes == 1 + trials and trials > len(res.history) - 1    # it did backtrack
    np.testing.assert_allclose(res.W, W, rtol=1e-10, atol=1e-12)
    objectives = [r["objective"] for r in res.history]
    assert np.all(np.diff(objectives) <= 1e-9 * objectives[0])
    # The default starts from twice the last accepted step: fewer trials for the same iterations.
    warm = S.projected_gradient(bm, W0, S.SymNMFParams(n_components=4, max_iter=6, tol=0), fro2=fro2)
    assert warm.step_rule == "backtracking" and warm.passes < res.passes


@pytest.fixture(scope="module")
def yeast_data():
    from dnomad.data import yeast

    return yeast()


def test_yeast_loader_matches_uci_counts(yeast_data):
    X, y = yeast_data
    assert X.shape == (1484, 8)
    counts = dict(zip(dnomad.data.YEAST_CLASSES, np.bincount(y)))
    # UCI: CYT 463, MIT 244; one duplicated feature row cannot be told apart (see loader).
    assert counts == {"CYT": 462, "NUC": 429, "MIT": 245, "ME3": 163, "ME2": 51, "ME1": 44,
                      "EXC": 35, "VAC": 30, "POX": 20, "ERL": 5}


def test_fw_pgd_penalty_agree_on_yeast(yeast_data):
    """The paper's comparison (Sec. 5) on its yeast set, k = 10, bandwidth 1, one start."""
    X, _ = yeast_data
    W0 = S.random_simplex_rows(len(X), 10, np.random.default_rng(0))
    objectives = {}
    for solver in ("fw", "pgd", "penalty"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
            est = dnomad.SymNMF(n_clusters=10, solver=solver, init=W0, dtype=np.float64,
                                tol=1e-5, max_iter=1000).fit(X)
        assert est.components_.min() >= 0
        np.testing.assert_allclose(est.components_.sum(axis=1), 1, atol=1e-12)
        objectives[solver] = est.objective_
    f = np.array(list(objectives.values()))
    assert f.max() <= 1.05 * f.min(), objectives


@pytest.mark.parametrize("backend", ["local", "zarr"])
def test_exactly_one_pass_over_p_per_iteration(backend, tmp_path):
    X, _ = gaussian_blobs(150, n_centers=3, random_state=0)
    kw = dict(dtype=np.float64, block_size=40, backend=backend)
    if backend == "zarr":
        kw["store"] = str(tmp_path / "p.zarr")
    P = blocks.gaussian_affinity(X, 2.0, **kw)
    fro2 = P.summary()["fro"] ** 2
    W0 = S.random_simplex_rows(150, 3, np.random.default_rng(0))
    mark = P.group.passes.mark()
    res = S.frank_wolfe(P, W0, S.SymNMFParams(n_components=3, max_iter=25, tol=0), fro2=fro2)
    done = P.group.passes.since(mark)
    assert res.n_iter == 25
    assert done["passes"] == res.n_iter + 1 == res.passes      # the first is M = P W0
    assert done["bytes_read"] == done["passes"] * P.group.matrix_nbytes


def test_in_memory_zarr_and_cluster_runs_agree(tmp_path, cluster_client):
    X, y = gaussian_blobs(120, n_centers=3, separation=6.0, random_state=4)
    kw = dict(n_clusters=3, dtype=np.float64, random_state=1, bandwidth=4.0, block_size=50)
    a = dnomad.SymNMF(backend="local", **kw).fit(X)
    assert adjusted_rand_score(y, a.labels_) == 1.0
    b = dnomad.SymNMF(backend="zarr", store=str(tmp_path / "run.zarr"), **kw).fit(X)
    c = dnomad.SymNMF(backend="distributed", **kw).fit(X)          # on the 2-worker cluster
    for est, backend in ((b, "zarr"), (c, "distributed")):
        assert est.backend_used_ == backend and est.n_iter_ == a.n_iter_
        np.testing.assert_allclose(est.components_, a.components_, rtol=0, atol=1e-10)
    W = dnomad.blocks.store.read_vector(str(tmp_path / "run.zarr"), "result/W")
    np.testing.assert_array_equal(W, b.components_)


def test_fit_function_and_estimator_contract():
    X, _ = gaussian_blobs(60, n_centers=2, random_state=0)
    est = dnomad.fit(X, method="symnmf", n_clusters=2, random_state=0, bandwidth=4.0)
    assert isinstance(est, dnomad.SymNMF)
    assert est.components_.shape == (60, 2) and est.labels_.shape == (60,)
    assert est.history_[-1]["objective"] == est.objective_ and est.stop_reason_ in ("tolerance", "max_iter")
    assert est.get_params()["n_clusters"] == 2
    init = np.tile([0.3, 0.7], (60, 1))      # (the uniform W = 1/2 is a KKT point: gap 0)
    with pytest.warns(dnomad.ConvergenceWarning):
        dnomad.SymNMF(n_clusters=2, init=init, max_iter=3, tol=1e-9).fit(X)
    np.testing.assert_array_equal(init, np.tile([0.3, 0.7], (60, 1)))   # the user's array is kept


@pytest.mark.parametrize("P,kw,match", [
    (-np.ones((5, 5)), {}, "nonnegative"),
    (np.triu(np.ones((5, 5))), {}, "symmetric"),
    (np.ones((5, 4)), {}, "square"),
    (np.ones((5, 5)), {"n_clusters": 1}, "n_clusters"),
    (np.ones((5, 5)), {"n_clusters": 6}, "n_clusters"),
    (np.ones((5, 5)), {"solver": "newton"}, "solver"),
    (np.ones((5, 5)), {"step_rule": "armijo"}, "step_rule"),
    (np.ones((5, 5)), {"init": np.ones((5, 2))}, "init"),
])
def test_bad_affinity_or_parameters_raise(P, kw, match):
    params = dict(n_clusters=2, affinity="precomputed")
    params.update(kw)
    with pytest.raises(InputValueError, match=match):
        dnomad.SymNMF(**params).fit(P)


@pytest.mark.parametrize("X,kw,match", [
    (np.array([[0.0, 1.0], [np.nan, 2.0], [1.0, 1.0]]), {}, "NaN or Inf"),
    (np.ones((4, 2)), {"bandwidth": 0.0}, "bandwidth"),
    (np.ones((4, 2)), {"affinity": "cosine"}, "affinity"),
])
def test_bad_data_raise(X, kw, match):
    with pytest.raises(InputValueError, match=match):
        dnomad.SymNMF(n_clusters=2, **kw).fit(X)


class Interrupt(Exception):
    pass


def _interrupt_at(iteration):
    """A callback that interrupts a fit at the given history row (a kill, for resume tests)."""
    def callback(row):
        if row["iteration"] == iteration:
            raise Interrupt
    return callback


@pytest.mark.parametrize("solver", ["fw", "pgd"])
def test_resume_after_kill_matches_uninterrupted(solver, tmp_path):
    X, _ = gaussian_blobs(120, n_centers=3, separation=4.0, random_state=5)
    kw = dict(n_clusters=3, solver=solver, dtype=np.float64, bandwidth=4.0, random_state=0, tol=0,
              max_iter=60, checkpoint_every=10)
    full = dnomad.SymNMF(**kw).fit(X)

    store = str(tmp_path / "run.zarr")
    with pytest.raises(Interrupt):
        dnomad.SymNMF(store=store, callback=_interrupt_at(37), **kw).fit(X)
    assert dnomad.blocks.store.read_json(store, "symnmf_checkpoint")["iteration"] == 30
    resumed = dnomad.resume(store)
    assert isinstance(resumed, dnomad.SymNMF) and resumed.n_iter_ == full.n_iter_ == 60
    np.testing.assert_allclose(resumed.components_, full.components_, rtol=0, atol=1e-12)
    assert [r["objective"] for r in resumed.history_] == pytest.approx(
        [r["objective"] for r in full.history_], rel=1e-12)
    assert resumed.passes_ == full.passes_
    # A finished run resumed with a larger max_iter goes on from its last iterate.
    longer = dnomad.resume(store, max_iter=70)
    assert longer.n_iter_ == 70 and longer.objective_ <= resumed.objective_ + 1e-12


def test_resume_goes_on_with_the_recorded_auto_scales(tmp_path):
    """A run with n_neighbors="auto" records the scales it chose; resumed, it goes on
    with that P even where the rule would now choose others (here: a changed target),
    ends where the uninterrupted run ends, and a finished run loads the scales."""
    from dnomad.symnmf import estimator as E

    X, _ = gaussian_blobs(150, n_centers=3, separation=4.0, random_state=5)
    kw = dict(n_clusters=3, dtype=np.float64, random_state=0, tol=0, max_iter=40, checkpoint_every=10)
    full = dnomad.SymNMF(**kw).fit(X)

    store = str(tmp_path / "run.zarr")
    with pytest.raises(Interrupt):
        dnomad.SymNMF(store=store, callback=_interrupt_at(25), **kw).fit(X)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(E, "AFFINITY_MASS", 0.3)
        assert E.calibrated_scales(X, 3)[1:] != (full.n_neighbors_, full.scale_factor_)
        resumed = dnomad.resume(store)
    assert (resumed.n_neighbors_, resumed.scale_factor_) == (full.n_neighbors_, full.scale_factor_)
    np.testing.assert_allclose(resumed.components_, full.components_, rtol=0, atol=1e-12)
    finished = dnomad.resume(store)
    assert (finished.n_neighbors_, finished.scale_factor_) == (full.n_neighbors_, full.scale_factor_)


def test_neighbour_distances_and_locally_scaled_affinity_equal_dense(tmp_path):
    """s_i = distance to the 7th nearest other row (a duplicate counts, at 0), and
    exp(-d_ij^2 / (s_i s_j)) built blockwise (b not dividing n; in this process and in a
    Zarr store) against dense references."""
    from scipy.spatial.distance import cdist

    X = np.random.default_rng(3).normal(size=(130, 4))
    X[5] = X[9]                                           # a duplicated row
    d = cdist(X, X)
    np.fill_diagonal(d, np.inf)
    s = blocks.neighbour_distances(X, 7, max_bytes=8 * 130 * 17)   # chunks of 17 rows
    np.testing.assert_allclose(s, np.sort(d, axis=1)[:, 6], rtol=1e-12)
    assert blocks.neighbour_distances(X, 1)[5] == 0.0
    np.fill_diagonal(d, 0.0)
    ref = np.exp(-d ** 2 / np.outer(s, s))
    for backend in ("local", "zarr"):
        P = blocks.gaussian_affinity(X, scales=s, dtype=np.float64, block_size=48, backend=backend,
                                     store=str(tmp_path / "p.zarr") if backend == "zarr" else None)
        np.testing.assert_allclose(np.asarray(P), ref, rtol=1e-12, atol=1e-15)
    with pytest.raises(InputValueError, match="scales must be 130 finite numbers > 0"):
        blocks.gaussian_affinity(X, scales=np.zeros(130))
    with pytest.raises(InputValueError, match=r"n_neighbors must be in \[1, 130\)"):
        blocks.neighbour_distances(X, 130)


def test_the_neighbour_table_holds_one_block_of_distances_at_a_time():
    """The local scales' neighbour table (n x m) is made in blocks of at most max_bytes of
    squared distances, one at a time and in place: this process's memory above the table
    stays within a block and a table (it was 3-4 blocks of 256 MiB: a 1 GB rise of the
    client at n = 8,000), and the table is the sorted dense one."""
    import tracemalloc

    from scipy.spatial.distance import cdist

    X = np.random.default_rng(4).normal(size=(3000, 5))
    block, m = 1 << 22, 16
    tracemalloc.start()
    try:
        table = blocks.neighbour_distance_table(X, m, max_bytes=block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < block + 3 * table.nbytes + (1 << 20)
    d = cdist(X, X)
    np.fill_diagonal(d, np.inf)
    np.testing.assert_allclose(table, np.sort(d, axis=1)[:, :m], rtol=1e-10)


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_default_affinity_follows_the_datas_scale(scale):
    """Blobs whose distances are not O(1): the default (local scaling, k-means start) finds
    them at every scale of X; the paper's bandwidth 1.0 makes P the identity at large
    scales and all ones at small ones, and its clusters are then arbitrary."""
    X, y = gaussian_blobs(240, n_centers=4, separation=8.0, random_state=2)
    est = dnomad.SymNMF(4, random_state=0).fit(scale * X)
    assert adjusted_rand_score(y, est.labels_) == 1.0
    if scale != 1.0:
        paper = dnomad.SymNMF(4, bandwidth=1.0, init="random", random_state=0).fit(scale * X)
        assert adjusted_rand_score(y, paper.labels_) < 0.5


def test_kmeans_start_needs_data_x():
    X, _ = gaussian_blobs(60, n_centers=2, random_state=0)
    P = np.exp(-((X[:, None] - X[None]) ** 2).sum(-1) / 4.0)
    est = dnomad.SymNMF(2, affinity="precomputed", random_state=0).fit(P)      # "auto": random rows
    assert est.components_.shape == (60, 2)
    with pytest.raises(InputValueError, match='init="kmeans" clusters the rows of data X'):
        dnomad.SymNMF(2, affinity="precomputed", init="kmeans").fit(P)


def _built_mean_row_sum(X, s):
    """P's mean row sum as SymNMF builds P (blockwise, float64), less each row's
    duplicates (1 each at any scale)."""
    P = blocks.gaussian_affinity(X, scales=s, name="P", dtype=np.float64, block_size=128)
    _, inverse, counts = np.unique(X, axis=0, return_inverse=True, return_counts=True)
    try:
        return float(np.mean(P.row_sums()) - np.mean(counts[inverse.ravel()] - 1))
    finally:
        P.group.close()


@pytest.mark.parametrize("case", ["neighbour", "shrink", "grow", "duplicates", "tiny", "column sample"])
def test_calibrated_scales_meet_the_mean_row_sum_of_the_built_affinity(case):
    """n_neighbors="auto", checked on the P that SymNMF builds from the scales.  The
    neighbour m is the smallest in range whose scales reach n / (10 k) (two half-moons in
    2-D); past the range's ends a common factor meets it: shrink (400 points in 50-D,
    whose 7th neighbour already gives more) or grow (k = 1 asks for n / 10 at a range
    capped to 30 neighbours).  Duplicated points (100 copies of one, k = 10) count apart
    from the target and get the floor of ``n_neighbors=m``'s scales; at n = 6 the target is capped at n / 2 (8 cannot be met); with fewer
    sampled columns than n the estimate still meets the target within a few percent."""
    from dnomad.data import noisy_semicircles
    from dnomad.symnmf import estimator as E

    moons = noisy_semicircles(400, noise=0.05, random_state=0)[0]
    X, k = {"neighbour": (moons, 2), "shrink": (np.random.default_rng(0).normal(size=(400, 50)), 4),
            "grow": (moons, 1), "duplicates": (np.vstack([moons, np.repeat(moons[:1], 100, axis=0)]), 10),
            "tiny": (moons[:6], 2), "column sample": (noisy_semicircles(1000, noise=0.08, random_state=1)[0], 2),
            }[case]
    n = len(X)
    target = min(max(E.AFFINITY_MASS * n / k, 8.0), n / 2)
    with pytest.MonkeyPatch.context() as mp:
        if case == "grow":
            mp.setattr(E, "MAX_SCALING_NEIGHBOUR", 30)
        if case == "column sample":
            mp.setattr(E, "MASS_SAMPLE_COLUMNS", 300)
        s, m, c = E.calibrated_scales(X, k)
    np.testing.assert_allclose(s, c * E.local_scales(X, m), rtol=1e-12)
    if c == 1.0:
        assert case in ("neighbour", "duplicates", "column sample")
        assert E.MIN_SCALING_NEIGHBOUR < m < E.MAX_SCALING_NEIGHBOUR
        assert _built_mean_row_sum(X, E.local_scales(X, m - 1)) < target <= _built_mean_row_sum(X, s) * (
            1.05 if case == "column sample" else 1.0)
    else:
        assert (m, c < 1) == {"shrink": (7, True), "grow": (30, False), "tiny": (5, True)}[case]
        np.testing.assert_allclose(_built_mean_row_sum(X, s), target, rtol=1e-4)
    if case == "duplicates":
        assert s[-100:].min() > 0 and np.all(s[-100:] == s[-1])


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_default_affinity_separates_noisy_half_moons():
    """The planted manifold case for the "auto" scales: two noisy half-moons (n = 1,000)
    are found with defaults, where Zelnik-Manor and Perona's 7th neighbour, the previous
    default, keeps k-means' cut."""
    from dnomad.data import noisy_semicircles

    X, y = noisy_semicircles(1000, noise=0.08, random_state=1)
    est = dnomad.SymNMF(2, random_state=0).fit(X)
    assert adjusted_rand_score(y, est.labels_) >= 0.85
    assert est.scale_factor_ == 1.0 and est.n_neighbors_ > 7
    seventh = dnomad.SymNMF(2, n_neighbors=7, random_state=0).fit(X)
    assert adjusted_rand_score(y, seventh.labels_) < 0.5 and seventh.n_neighbors_ == 7
    with pytest.raises(InputValueError, match="n_neighbors must be < n = 1000"):
        dnomad.SymNMF(2, n_neighbors=1000).fit(X)
