"""NOMAD against an exact SDP solution, planted clusters, checkpoints, and bad input."""
import itertools

import numpy as np
import pytest

import dnomad
from devices import DEVICES
from dnomad import blocks
from dnomad.nomad import passes as nomad_passes
from dnomad.data import gaussian_blobs, trefoil_knot, two_rings
from dnomad.errors import InputTypeError, InputValueError, StoreError
from dnomad.metrics import adjusted_rand_score, nonnegativity_residuals

cp = pytest.importorskip("cvxpy")


_EXACT = {}


def exact_nomad(D, K):
    """The NOMAD SDP solved by SCS (an interior-free splitting method, independent of ours);
    solved once per (D, K) in a session."""
    key = (D.tobytes(), K)
    if key not in _EXACT:
        _EXACT[key] = _solve_exact(D, K)
    return _EXACT[key]


def _solve_exact(D, K):
    n = len(D)
    Z = cp.Variable((n, n), PSD=True)
    prob = cp.Problem(cp.Maximize(cp.trace(D @ Z)), [Z >= 0, Z @ np.ones(n) == 1, cp.trace(Z) == K])
    prob.solve(solver="SCS", eps=1e-6, max_iters=50000)
    return Z.value


# (data, K, solver options, bound on ||Q - Q*||_F / ||Q*||_F or None where the optimum
# need not be unique).  The trefoil's optimum is nearly degenerate: at the default
# tolerances the paper's loop stops at 0.073 from it; with rmse_tol=3e-5 it reaches 0.040
# (3968 outer iterations), still meeting the default stopping rule that the test checks
# below.  The default (block) direction stops at 0.045 (87 outer iterations), at 0.034 with
# rmse_tol=3e-5.
CASES = {
    "rings": (lambda: two_rings(120)[0], 8, {}, 0.05),
    "trefoil": (lambda: trefoil_knot(120)[0], 8, {"rmse_tol": 3e-5, "max_iter": 6000}, 0.05),
    "blobs": (lambda: gaussian_blobs(120, n_centers=4)[0], 8, {}, None),
    "rings_line_search": (lambda: two_rings(120)[0], 8,
                          {"direction": "vertex", "lagrangian": "paper", "step_rule": "line_search",
                           "n_inner": 10}, 0.05),
    # The paper's loop (Alg. 2: Frank-Wolfe vertices, eq. 13), kept for comparison.
    "rings_paper": (lambda: two_rings(120)[0], 8,
                    {"direction": "vertex", "lagrangian": "paper", "n_inner": 10, "tau": "scale"}, 0.05),
    "trefoil_paper": (lambda: trefoil_knot(120)[0], 8,
                      {"direction": "vertex", "lagrangian": "paper", "n_inner": 10, "tau": "scale",
                       "rmse_tol": 3e-5, "max_iter": 6000}, 0.05),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make,K,options,q_bound", list(CASES.values()), ids=list(CASES))
def test_matches_exact_sdp(make, K, options, q_bound, device):
    X = make()
    est = dnomad.NOMAD(n_clusters=K, sdp_k=K, dtype=np.float64, device=device, **options).fit(X)
    Q = np.asarray(est.Q_)
    D = blocks.prepare_gram_data(X) @ blocks.prepare_gram_data(X).T
    Qs = exact_nomad(D, K)
    f, fs = np.sum(D * Q), np.sum(D * Qs)
    assert abs(f - fs) <= 0.01 * abs(fs)
    if q_bound is not None:
        assert np.linalg.norm(Q - Qs) / np.linalg.norm(Qs) <= q_bound
    n = len(X)
    np.testing.assert_allclose(Q.sum(axis=1), 1, atol=1e-6)
    assert np.trace(Q) == pytest.approx(K, abs=1e-6)
    rmse, minq, _ = nonnegativity_residuals(Q)
    assert rmse <= 1e-4 and minq <= 1e-2 * K / n
    assert est.stop_reason_ == "tolerance"
    row = est.history_[-1]
    assert row["rmse_neg"] == pytest.approx(rmse, rel=1e-6)
    assert row["objective"] == pytest.approx(f, rel=1e-9)


def test_scale_penalty_is_n_rms_of_centered_gram_over_k():
    from dnomad.nomad.cgm import PENALTY_SCALE, NomadParams, resolve_penalty

    X = two_rings(90)[0]
    F = blocks.prepare_gram_data(X)
    n, K = len(X), 6
    J = np.eye(n) - 1.0 / n
    want = PENALTY_SCALE * n * (np.linalg.norm(J @ (F @ F.T) @ J) / n) / K
    group = blocks.new_group(n, dtype=np.float64, backend="local", block_size=40)
    got = resolve_penalty(NomadParams(n_clusters=K, tau="scale"), group, blocks.DataPanels(group, F))
    assert got == pytest.approx((want, want), rel=1e-12)
    # The default multiplier step follows the penalty (the classical method of
    # multipliers of the shifted Lagrangian): tau None; eq. 13's Lagrangian takes "scale".
    got = resolve_penalty(NomadParams(n_clusters=K), group, blocks.DataPanels(group, F))
    assert got[0] == pytest.approx(want, rel=1e-12) and got[1] is None
    got = resolve_penalty(NomadParams(n_clusters=K, lagrangian="paper"), group, blocks.DataPanels(group, F))
    assert got == pytest.approx((want, want), rel=1e-12)
    # From a stored D: a constant offset (an uncentered Gram) does not change it.
    D = blocks.from_array(F @ F.T + 5.0, dtype=np.float64, block_size=40)
    assert resolve_penalty(NomadParams(n_clusters=K, tau="scale"), D.group) == pytest.approx((want, want), rel=1e-9)
    assert resolve_penalty(NomadParams(n_clusters=K, penalty=2.0, tau="scale"), D.group) == \
        pytest.approx((2.0, want))
    assert resolve_penalty(NomadParams(n_clusters=K, penalty=2.0, tau=3.0), D.group) == (2.0, 3.0)
    assert resolve_penalty(NomadParams(n_clusters=K, penalty=2.0), D.group) == (2.0, None)
    with pytest.warns(dnomad.ConvergenceWarning):
        est = dnomad.NOMAD(n_clusters=K, sdp_k=K, dtype=np.float64, max_iter=2, tau="scale").fit(X)
    assert (est.penalty_, est.tau_) == pytest.approx((want, want), rel=1e-6)


def test_objective_tol_means_relative_change():
    """The run stops at the first outer iteration where all three tolerances hold, and
    objective_tol bounds the relative change of Tr(D Q) in that iteration."""
    X = two_rings(80)[0]
    tol = 1e-4
    est = dnomad.NOMAD(n_clusters=6, sdp_k=6, dtype=np.float64, objective_tol=tol).fit(X)
    assert est.stop_reason_ == "tolerance"
    h = est.history_

    def all_hold(prev, row):
        change = abs(row["objective"] - prev["objective"]) / abs(row["objective"])
        return change <= tol and row["rmse_neg"] <= 1e-4 and row["max_violation"] <= 1e-2

    assert all_hold(h[-2], h[-1])
    assert not any(all_hold(a, b) for a, b in zip(h[:-2], h[1:-1]))


@pytest.mark.parametrize("n_centers", [3, 5])
def test_separated_blobs_are_recovered_exactly(n_centers):
    X, y = gaussian_blobs(150, n_centers=n_centers, separation=12.0, random_state=1)
    est = dnomad.NOMAD(n_clusters=n_centers, sdp_k=n_centers).fit(X)
    assert adjusted_rand_score(y, est.labels_) == 1.0
    spec = dnomad.NOMAD(n_clusters=n_centers, sdp_k=n_centers, label_method="spectral",
                        random_state=0).fit(X)
    assert adjusted_rand_score(y, spec.labels_) == 1.0
    assert est.embedding_.shape == (150, 2)


def unequal_blobs(sizes, separation=12.0, random_state=0):
    """Unit-variance 2-D blobs of the given sizes, centres on a circle ``separation`` apart."""
    rng = np.random.default_rng(random_state)
    k = len(sizes)
    angle = 2 * np.pi * np.arange(k) / k
    centers = separation / (2 * np.sin(np.pi / k)) * np.c_[np.cos(angle), np.sin(angle)]
    X = np.concatenate([c + rng.normal(size=(s, 2)) for c, s in zip(centers, sizes)])
    return X, np.repeat(np.arange(k), sizes)


# Size ratios up to 20:1.  A threshold relative to max(Q) (the rule before issue 23)
# cut every group more than twice the smallest into singletons: 98 labels on the second.
@pytest.mark.parametrize("solver", ["cgm", "bm"])
@pytest.mark.parametrize("sizes", [(12, 240), (40, 95, 60, 45), (10, 200, 50, 25)], ids=str)
def test_hard_labels_of_unequal_blobs_are_the_blobs(sizes, solver):
    X, y = unequal_blobs(sizes)
    est = dnomad.NOMAD(n_clusters=len(sizes), sdp_k=len(sizes), solver=solver, random_state=0).fit(X)
    assert est.stop_reason_ == "tolerance"
    assert len(np.unique(est.labels_)) == len(sizes)
    assert adjusted_rand_score(y, est.labels_) == 1.0


@pytest.mark.parametrize("solver", ["cgm", "bm"])
def test_hard_labels_with_k_above_the_manifolds_are_the_manifolds(solver):
    X, y = two_rings(300)
    est = dnomad.NOMAD(n_clusters=2, sdp_k=12, solver=solver, random_state=0).fit(X)
    assert adjusted_rand_score(y, est.labels_) == 1.0
    assert est.label_method_used_ == "components"


def test_component_labels_ignore_scale_and_read_each_ends_diagonal(rng):
    """Block-diagonal Q with blocks 1/size (the SDP's solution on separated groups) plus a
    small positive residue: the groups, at every scale of Q and every fraction in
    (residue, 1); per-node thresholds through the engine pass equal a dense reference."""
    from scipy.sparse.csgraph import connected_components

    from dnomad.blocks.operators import LowRankGram
    from dnomad.rounding import component_labels

    sizes = [3, 60, 17]
    truth = np.repeat(np.arange(3), sizes)
    Y = np.zeros((sum(sizes), 3))
    Y[np.arange(len(truth)), truth] = 1 / np.sqrt(np.array(sizes)[truth])
    Y = np.hstack([Y, 0.02 * rng.random((len(truth), 2)) / np.sqrt(len(truth))])
    Q = Y @ Y.T
    for scale in (1.0, 1e-6, 1e4):
        for frac in (0.2, 0.5, 0.9):
            labels = component_labels(LowRankGram(np.sqrt(scale) * Y), frac)
            assert adjusted_rand_score(truth, labels) == 1.0
            for b in (80, 23):
                bm = blocks.from_array(scale * Q, block_size=b, dtype=np.float64)
                np.testing.assert_array_equal(component_labels(bm, frac), labels)
    t = rng.random(len(truth)) * Q.max()
    ref = connected_components(Q > np.maximum.outer(t, t), directed=False)[1]
    for b in (80, 23):
        ours = blocks.from_array(Q, block_size=b, dtype=np.float64).threshold_components(t)
        assert adjusted_rand_score(ref, ours) == 1.0 and ours.max() == ref.max()


def _band_factor(sizes, width, rng):
    """Y >= 0 whose Q = Y Y^T is, per group, a band along a path (a sampled manifold):
    row i of a group overlaps the ``width`` rows on either side; consecutive groups touch
    through one link (the last row of one and the first of the next share a column)."""
    blocks_ = []
    for size in sizes:
        Y = np.zeros((size, size))
        for i in range(size):
            Y[i, max(0, i - width):i + width + 1] = 1.0
        blocks_.append(Y)
    n = sum(sizes)
    Y = np.zeros((n, sum(sizes) + len(sizes)))
    r = c = 0
    for g, B in enumerate(blocks_):
        Y[r:r + len(B), c:c + len(B)] = B
        r, c = r + len(B), c + len(B)
    for g in range(len(sizes) - 1):                    # one link between consecutive groups
        end = sum(sizes[:g + 1])
        Y[end - 1, -1 - g] = Y[end, -1 - g] = 1.0
    Y += 1e-3 * rng.random(Y.shape)
    return Y / np.sqrt(Y @ Y.sum(axis=0))[:, None]     # rows of Q sum to about 1


def test_spectral_labels_split_linked_bands_the_same_on_every_operator(rng):
    """Bands of unequal lengths linked end to end (one connected affinity): normalized
    spectral clustering returns the bands, the same labels from a dense Q, a BlockMatrix
    (Lanczos over its blocks, b dividing n or not) and the factor Y (thin SVD)."""
    from dnomad.blocks.operators import LowRankGram
    from dnomad.rounding import spectral_labels

    sizes = (70, 40, 90)
    truth = np.repeat(np.arange(3), sizes)
    Y = _band_factor(sizes, 4, rng)
    Q = Y @ Y.T
    dense = spectral_labels(Q, 3, random_state=0)
    assert adjusted_rand_score(truth, dense) == 1.0
    np.testing.assert_array_equal(spectral_labels(LowRankGram(Y), 3, random_state=0), dense)
    for b in (200, 64):
        np.testing.assert_array_equal(
            spectral_labels(blocks.from_array(Q, block_size=b, dtype=np.float64), 3, random_state=0), dense)
    for bad in (1, 200, 2.0):
        with pytest.raises(InputValueError, match=r"n_clusters must be an integer in \[2, 200\)"):
            spectral_labels(Q, bad)


def test_embedding_and_spectral_labels_of_y_in_row_chunks_are_the_dense_eigenproblems(rng, cluster_client):
    """Q = Y Y^T with Y left in row chunks (one chunk, uneven chunks, on two workers):
    the embedding is the top eigenvectors of P Q P (P = I - 1 1^T / n, by NumPy's eigh
    of the dense matrix), each times the square root of its eigenvalue and signed so its
    largest entry is positive, with those eigenvalues (0 past Y's rank); the spectral
    labels are those of the dense Q."""
    from dnomad.rounding import factor_sums, low_rank_embedding, low_rank_spectral_labels, spectral_labels

    sizes = (70, 40, 90)
    Y = _band_factor(sizes, 4, rng)[:, :60]             # rank 60 < n = 200
    n = len(Y)
    P = np.eye(n) - 1.0 / n
    w_ref, V_ref = np.linalg.eigh(P @ (Y @ Y.T) @ P)
    w_ref, V_ref = w_ref[::-1][:62], V_ref[:, ::-1][:, :62]
    V_ref *= np.sign(V_ref[np.argmax(np.abs(V_ref), axis=0), np.arange(62)])
    labels_ref = spectral_labels(Y @ Y.T, 3, random_state=0)
    X = rng.random((n, 2))
    deficient = []
    for chunks in (dict(), dict(chunk_rows=37), dict(chunk_rows=64, client=cluster_client)):
        with blocks.RowChunks(X, **chunks) as space:
            space.put("Y", Y)
            for k in (3, 62):
                w = low_rank_embedding(space, "Y", k, "E", sums=factor_sums(space, "Y"))
                m = min(k, 60)                          # P Y has rank 60
                np.testing.assert_allclose(w[:m], w_ref[:m], rtol=1e-9, atol=1e-14)
                np.testing.assert_allclose(w[m:], 0.0, atol=1e-12)
                E = space.get("E")
                assert E.shape == (n, k)
                np.testing.assert_allclose(E[:, :m], V_ref[:, :m] * np.sqrt(w_ref[:m]), rtol=0, atol=1e-10)
                np.testing.assert_allclose(E[:, m:], 0.0, atol=1e-7)
            np.testing.assert_array_equal(low_rank_spectral_labels(space, "Y", 3, random_state=0), labels_ref)
            # more clusters than Y has directions: Y's null space gives zero columns, not
            # round-off's directions, so every chunking labels alike
            space.put("thin", np.repeat(Y[:, :2], 3, axis=1) @ np.diag([1, 1, 2, 2, 3, 3.0]))   # rank 2, r = 6
            deficient.append(low_rank_spectral_labels(space, "thin", 5, random_state=0))
    for labels in deficient[1:]:
        np.testing.assert_array_equal(labels, deficient[0])


def test_labels_take_the_components_where_there_are_n_clusters_of_them_else_spectral(rng):
    """label_method="auto": Q of separated blocks gives its components; the same Q asked
    for fewer clusters than components gets n_clusters spectral groups; asked
    for "components" it keeps the components whatever their number."""
    from dnomad.blocks.operators import LowRankGram
    from dnomad.nomad.estimator import nomad_labels

    sizes = (30, 50, 20, 40)
    truth = np.repeat(np.arange(4), sizes)
    Y = np.zeros((140, 4))
    Y[np.arange(140), truth] = 1 / np.sqrt(np.array(sizes)[truth])
    Q = LowRankGram(Y)
    labels, used = nomad_labels(Q, 4)
    assert used == "components" and adjusted_rand_score(truth, labels) == 1.0
    for k in (2, 3):
        labels, used = nomad_labels(Q, k, random_state=0)
        assert used == "spectral" and len(np.unique(labels)) == k
    labels, used = nomad_labels(Q, 2, "components")
    assert used == "components" and labels.max() == 3


def test_auto_labels_a_large_low_rank_q_by_spectral_clustering_alone(monkeypatch):
    """Past AUTO_COMPONENTS_MAX_N rows "auto" does not scan a low-rank Q's pairs for its
    components (O(n^2 r)): the spectral labels give the separated groups all the same; a
    stored Q (cgm) and "components" asked for by name still take the components."""
    from dnomad.blocks.operators import LowRankGram
    from dnomad.nomad import estimator

    sizes = (30, 50, 20, 40)
    truth = np.repeat(np.arange(4), sizes)
    Y = np.zeros((140, 4))
    Y[np.arange(140), truth] = 1 / np.sqrt(np.array(sizes)[truth])
    monkeypatch.setattr(estimator, "AUTO_COMPONENTS_MAX_N", 139)
    scanned = []
    monkeypatch.setattr(estimator, "component_labels", lambda Q, t: scanned.append(Q) or np.zeros(140, int))
    labels, used = estimator.nomad_labels(LowRankGram(Y), 4, random_state=0)
    assert used == "spectral" and not scanned and adjusted_rand_score(truth, labels) == 1.0
    estimator.nomad_labels(LowRankGram(Y), 4, "components")
    estimator.nomad_labels(blocks.from_array(Y @ Y.T), 4)
    assert len(scanned) == 2


def test_default_sdp_k_rule():
    from dnomad.nomad.estimator import default_sdp_k

    assert [default_sdp_k(n, c) for n, c in [(3000, 2), (3000, 3), (1797, 10), (70000, 10), (200, 2),
                                             (40, 2), (30, 3)]] == [24, 24, 40, 40, 20, 4, 3]


@pytest.mark.parametrize("solver", ["cgm", "bm"])
@pytest.mark.parametrize("data", ["rings", "half-moons", "unequal blobs"])
def test_defaults_find_noisy_manifolds_and_unequal_blobs(data, solver):
    """What a user gets from NOMAD(n_clusters=true count) and nothing else: noisy rings and
    half-moons exactly (one layer with K = n_clusters mixes them: ARI 0.00 and 0.25 at
    n = 3,000), and blobs of sizes 10:3:1 with unequal spreads.  (bm depends on its
    random start on the half-moons: random_state 0-7 separated them in 7 of 8 runs, the
    other at ARI 0.01; at 3ae49e8, before the starts were drawn by the row chunks, in 6
    of 8, the others at 0.28 and 0.33.  This test takes random_state 1 for bm.)"""
    from dnomad.data import noisy_semicircles

    X, y = {"rings": lambda: two_rings(600, noise=0.05, random_state=1),
            "half-moons": lambda: noisy_semicircles(600, noise=0.08, random_state=1),
            "unequal blobs": lambda: unequal_blobs((300, 90, 30), separation=9.0)}[data]()
    k = len(np.unique(y))
    est = dnomad.NOMAD(k, solver=solver, random_state=0 if solver == "cgm" else 1).fit(X)
    assert est.sdp_k_ == 24 and len(np.unique(est.labels_)) == k
    assert adjusted_rand_score(y, est.labels_) >= (0.99 if data != "unequal blobs" else 0.95)


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("device", DEVICES)
def test_resume_after_kill_matches_uninterrupted(tmp_path, device):
    X = two_rings(100)[0]
    kw = dict(n_clusters=6, sdp_k=6, dtype=np.float64, max_iter=25, checkpoint_every=5, rmse_tol=0, min_tol=0,
              objective_tol=0, device=device)
    with pytest.warns(dnomad.ConvergenceWarning):
        full = dnomad.NOMAD(**kw).fit(X)

    def kill_at_12(row):
        if row["iteration"] == 12:
            raise Interrupt

    store = str(tmp_path / "run.zarr")
    with pytest.raises(Interrupt):
        dnomad.NOMAD(store=store, callback=kill_at_12, **kw).fit(X)
    info = dnomad.blocks.store.Checkpoints(store, "nomad_checkpoint").latest()
    assert info["iteration"] == 10 and len(info["history"]) == 10
    with pytest.warns(dnomad.ConvergenceWarning):
        resumed = dnomad.resume(store)
    assert resumed.n_iter_ == full.n_iter_ == 25
    np.testing.assert_allclose(np.asarray(resumed.Q_), np.asarray(full.Q_), rtol=0, atol=1e-12)
    assert [r["objective"] for r in resumed.history_] == pytest.approx(
        [r["objective"] for r in full.history_], rel=1e-12)


def test_store_holding_another_run_is_refused(tmp_path):
    store = str(tmp_path / "run.zarr")
    X = gaussian_blobs(40, n_centers=2)[0]
    dnomad.fit(X, n_clusters=2, sdp_k=2, store=store)
    with pytest.raises(StoreError, match="already holds a dnomad run"):
        dnomad.fit(X, n_clusters=3, sdp_k=3, store=store)
    dnomad.fit(X, n_clusters=3, sdp_k=3, store=store, overwrite=True)


def _read_only_dir(tmp_path):
    """A directory this process cannot write to: a chmod 500 one, or, as root (whom
    permissions do not stop), the kernel's /proc/sys, which refuses even root."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if not os.access(ro, os.W_OK):
        return ro
    assert os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK)
    return "/proc/sys"


def test_store_not_writable(tmp_path):
    ro = _read_only_dir(tmp_path)
    try:
        with pytest.raises(StoreError, match="not writable"):
            dnomad.fit(gaussian_blobs(40, n_centers=2)[0], n_clusters=2, sdp_k=2, store=f"{ro}/x.zarr")
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_store_path_with_missing_parent(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        dnomad.fit(gaussian_blobs(40, n_centers=2)[0], n_clusters=2, sdp_k=2,
                   store=str(tmp_path / "no" / "such" / "x.zarr"))


@pytest.mark.parametrize("X,kw,err,match", [
    (np.array([[0.0, 1.0], [np.nan, 2.0], [1.0, 1.0]]), {}, InputValueError, "NaN or Inf"),
    (np.array([[0.0, 1.0], [np.inf, 2.0], [1.0, 1.0]]), {}, InputValueError, "NaN or Inf"),
    (np.zeros(5), {}, InputValueError, "2-D"),
    (np.ones((4, 3)), {"precomputed": True}, InputValueError, "square"),
    (np.triu(np.ones((4, 4))), {"precomputed": True}, InputValueError, "symmetric"),
    ("gaussian", {"n_clusters": 1}, InputValueError, "n_clusters"),
    ("gaussian", {"n_clusters": 30}, InputValueError, "n_clusters"),
    ("gaussian", {"dtype": np.int32}, InputTypeError, "dtype"),
    ("gaussian", {"dtype": np.float16}, InputTypeError, "dtype"),
    ("gaussian", {"step_rule": "armijo"}, InputValueError, "step_rule"),
    ("gaussian", {"penalty": "auto"}, InputValueError, "penalty"),
    ("gaussian", {"tau": -1.0}, InputValueError, "tau"),
    (np.ones((6, 2)), {}, InputValueError, "constant after centering"),
    ("gaussian", {"backend": "gpu"}, InputValueError, "backend"),
    ("gaussian", {"device": "gpu"}, InputValueError, r"device must be one of \('cpu', 'cuda', 'auto'\)"),
    ("gaussian", {"device": "cuda", "solver": "bm"}, InputValueError, "device='cuda' runs solver='cgm'"),
    ("gaussian", {"device": "cuda", "backend": "zarr"}, InputValueError,
     "device='cuda' runs with backend='local'|asks for 'cuda', but"),
])
def test_bad_input_raises_clear_error(X, kw, err, match):
    if isinstance(X, str):
        X = gaussian_blobs(30, n_centers=2)[0]
    params = dict(n_clusters=2)
    params.update(kw)
    with pytest.raises(err, match=match):
        dnomad.fit(X, **params)


def test_precomputed_gram_and_zarr_input(tmp_path):
    """Data, precomputed Gram and Zarr Gram inputs run the same iterations.

    Over a few iterations they agree to the eigensolver's round-off: D U formed as
    F (F^T U) or read from D's blocks differ by 1e-16, which LOBPCG's nearly singular
    basis Gram matrices amplify to ~1e-8 in Q (entries ~1e-2).  A full run does not stay
    within that: loose early tolerances turn such differences into different iterates,
    so converged runs are compared to the solver's accuracy (and labels exactly).
    """
    import zarr

    X, y = gaussian_blobs(90, n_centers=3, random_state=2)
    F = blocks.prepare_gram_data(X)
    D = F @ F.T
    url = str(tmp_path / "D.zarr")
    z = zarr.create_array(store=url, shape=D.shape, chunks=(30, 30), dtype="f8")
    z[...] = D
    inputs = [(X, False), (D, True), (url, True)]
    short = dict(max_iter=5, rmse_tol=0, min_tol=0, objective_tol=0)
    with pytest.warns(dnomad.ConvergenceWarning):
        Qs = [np.asarray(dnomad.NOMAD(n_clusters=3, sdp_k=3, dtype=np.float64, precomputed=pre, **short)
                         .fit(inp).Q_) for inp, pre in inputs]
    for Q in Qs[1:]:
        np.testing.assert_allclose(Q, Qs[0], rtol=0, atol=1e-6)
    full = [dnomad.NOMAD(n_clusters=3, sdp_k=3, dtype=np.float64, precomputed=pre).fit(inp)
            for inp, pre in inputs]
    Q0 = np.asarray(full[0].Q_)
    for est in full[1:]:
        assert np.linalg.norm(np.asarray(est.Q_) - Q0) <= 1e-3 * np.linalg.norm(Q0)
        assert adjusted_rand_score(full[0].labels_, est.labels_) == 1.0
    assert adjusted_rand_score(y, full[0].labels_) == 1.0


@pytest.mark.parametrize("block_size", [60, 16])
def test_line_search_pass_and_step_match_dense(block_size, rng):
    """The binned line-search pass equals the dense h(alpha) at its grid, and the step it
    gives is the minimizer of g along the Frank-Wolfe direction (scipy, on the dense g)."""
    from scipy.optimize import minimize_scalar

    from dnomad.nomad.cgm import _line_search_step

    n, K, gamma = 60, 5, 3.0
    B = rng.standard_normal((n, 4))
    P = B @ B.T / n - 0.05
    P -= P.mean(0)[None] + P.mean(1)[:, None] - P.mean()       # P 1 = 0, entries of both signs
    v = rng.standard_normal(n)
    v -= v.mean()
    v /= np.linalg.norm(v)
    bm = blocks.from_array(P, block_size=block_size, dtype=np.float64)
    alphas, h, h0 = nomad_passes.line_search_pass(bm.group, v=v, vv_scale=K - 1, name=bm.name)
    Q, Delta = P + 1.0 / n, (K - 1) * np.outer(v, v) - P
    dense_h = [np.sum(np.minimum(Q + a * Delta, 0) * Delta) for a in alphas]
    np.testing.assert_allclose(h, dense_h, rtol=1e-10, atol=1e-12)
    assert h0 == pytest.approx(np.sum(np.minimum(Q, 0) * Delta), rel=1e-10)
    Lin = -rng.standard_normal((n, n)) * 0.01     # -D + Gamma, any symmetric matrix
    Lin = (Lin + Lin.T) / 2
    phi = lambda a: np.sum(Lin * (P + a * Delta)) + gamma / 2 * np.sum(np.minimum(Q + a * Delta, 0) ** 2)
    gap = -(np.sum(Lin * Delta) + gamma * np.sum(np.minimum(Q, 0) * Delta))    # -phi'(0)
    assert gap > 0
    best = minimize_scalar(phi, bounds=(0, 1), method="bounded", options={"xatol": 1e-12}).x
    assert 1e-3 < best < 0.9          # an interior minimizer, where the search matters
    step = _line_search_step(alphas, h, h0, gap, gamma)
    assert abs(step - best) <= 0.1 * best
    assert phi(step) - phi(best) <= 1e-3 * (phi(0) - phi(best))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [25, 60])
@pytest.mark.parametrize("shifted", [True, False])
def test_lowrank_line_search_pass_matches_dense(block_size, shifted, device, rng, monkeypatch):
    """The block direction's line-search pass (Delta = A U^T - P, entries of
    R = P + E_n + Gamma / gamma) equals the dense h(alpha) at its grid and <P, A U^T>, on
    each device (on a GPU the direction's rows come in slabs: made small here, so a
    block takes several)."""
    from dnomad.nomad import kernels

    monkeypatch.setattr(kernels, "DEVICE_LOWRANK_SLAB", 7 * block_size)
    n, k, gamma = 60, 3, 2.5
    B = rng.standard_normal((n, 4))
    P = B @ B.T / n - 0.05
    P -= P.mean(0)[None] + P.mean(1)[:, None] - P.mean()
    Gam = -np.abs(rng.standard_normal((n, n))) * 0.02 * (rng.random((n, n)) < 0.5)
    Gam = np.minimum(Gam, Gam.T)
    U = np.linalg.qr(rng.standard_normal((n, k)) - 0.0)[0]
    A = U * np.array([2.0, 1.5, 0.5])
    group = blocks.new_group(n, block_size=block_size, dtype=np.float64, backend="local", device=device)

    def block_of(M):
        return lambda key: (np.ascontiguousarray(M[slice(*group.layout.bounds(key[0])),
                                                   slice(*group.layout.bounds(key[1]))]),)
    group.build(["P", "Gamma"], lambda key, p, g: {"P": p, "Gamma": g},
                lambda key: block_of(P)(key) + block_of(Gam)(key))
    shift = 1.0 / gamma if shifted else 0.0
    R, Delta = P + 1.0 / n + shift * Gam, A @ U.T - P
    for store in (None, "M"):
        alphas, h, h0, pv = nomad_passes.lowrank_line_search_pass(group, A=A, U=U, shift=shift, store=store)
        dense_h = [np.sum(np.minimum(R + a * Delta, 0) * Delta) for a in alphas]
        np.testing.assert_allclose(h, dense_h, rtol=1e-10, atol=1e-12)
        assert h0 == pytest.approx(np.sum(np.minimum(R, 0) * Delta), rel=1e-10)
        assert pv == pytest.approx(np.sum(P * (A @ U.T)), rel=1e-12)
    # The direction it stored, for the next fused pass to read.
    np.testing.assert_allclose(blocks.BlockMatrix(group, "M").to_numpy(), A @ U.T, rtol=1e-12, atol=1e-14)
    group.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shifted,update_gamma,write_g", [(True, False, True), (False, False, True),
                                                          (True, True, False), (True, True, True),
                                                          (False, True, True)])
def test_fused_block_with_rank_k_step_matches_dense(dtype, shifted, update_gamma, write_g, device, rng):
    """nomad_block with a rank-k step and the projected-step output M = P - G / L equals
    its dense formula, on each device (numba on the host, CUDA and cuBLAS on a GPU), with
    D given and with D formed from data panels."""
    from dnomad.blocks import device as dev
    from dnomad.nomad import kernels

    bi, bj, k, n, d = 30, 40, 4, 200, 3
    gamma, tau, L, step = 1.7, 0.9, 2.3, 0.35
    P0 = rng.standard_normal((bi, bj)) * 0.01
    Gam0 = np.minimum(rng.standard_normal((bi, bj)) * 0.01, 0)
    Xi, Xj = rng.standard_normal((bi, d)), rng.standard_normal((bj, d))
    D = Xi @ Xj.T
    Ai, Uj = rng.standard_normal((bi, k)) * 0.1, rng.standard_normal((bj, k)) * 0.1
    Pn = (1 - step) * P0 + step * Ai @ Uj.T
    Q = Pn + 1.0 / n
    Gn = np.minimum(Gam0 + tau * Q, 0) if update_gamma else Gam0
    g = (np.minimum(Gn + gamma * Q, 0) if shifted else Gn + gamma * np.minimum(Q, 0)) - D
    M = Pn - g / L
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-13)
    on = lambda a: dev.to_device(np.array(a, dtype=dtype), device)       # noqa: E731
    # The step formed by GEMM (lowrank), or read from a stored direction block: its own
    # array, or G's (the line search stores it in M, which the pass then overwrites).
    forms = ["lowrank", "stored"] + (["stored in G"] if write_g else [])
    for given_d, form in itertools.product((True, False), forms):
        P, Gam, G = on(P0), on(Gam0), on(np.zeros((bi, bj)))
        step_kw = dict(lowrank=(on(step * Ai), on(Uj)))
        if form == "stored":
            step_kw = dict(direction=on(Ai @ Uj.T))
        elif form == "stored in G":
            G = on(Ai @ Uj.T)
            step_kw = dict(direction=G)
        panels = dict(D=on(D)) if given_d else dict(Xi=on(Xi), Xj=on(Xj))
        stats = kernels.nomad_block(P, Gam, G, **panels, vi=on(np.zeros(bi)), vj=on(np.zeros(bj)),
                                    vv_scale=0.0, gamma=gamma, tau=tau, inv_n=1.0 / n,
                                    update_gamma=update_gamma, write_g=write_g, weight=1.0, shifted=shifted,
                                    out_p=1.0, out_g=-1.0 / L, step=step, **step_kw)
        stats = dev.to_host(stats)
        np.testing.assert_allclose(dev.to_host(P), Pn, **tol)
        np.testing.assert_allclose(dev.to_host(Gam), Gn, **tol)
        if write_g:
            np.testing.assert_allclose(dev.to_host(G), M, **tol)
            assert stats[kernels.SUM_GP] == pytest.approx(np.sum(g * Pn), rel=1e-3 if dtype == np.float32 else 1e-9)
        assert stats[kernels.MIN_Q] == pytest.approx(Q.min(), rel=1e-4)
        assert stats[kernels.NOMAD_STATS.index("sum_DQ")] == pytest.approx(np.sum(D * Q), rel=1e-4)
        assert stats[kernels.NOMAD_STATS.index("neg_count")] == np.sum(Q < 0)


def test_block_steps_converge_the_kept_pairs_and_the_first_cut(monkeypatch):
    """The block step asks LOBPCG to converge the Ritz pairs the simplex projection keeps
    and the first one it cuts (all of them where none is cut, all where a value is not
    finite); the fit with it still reaches the rule."""
    from dnomad.nomad import cgm

    calls = []
    real = cgm.lobpcg_top

    def spy(*args, wanted=None, **kw):
        calls.append(wanted)
        return real(*args, wanted=wanted, **kw)

    monkeypatch.setattr(cgm, "lobpcg_top", spy)
    X, _ = two_rings(300)
    K = 8                                           # k = 2K + 8 = 24, 5k < n - 1: LOBPCG, not eigh
    est = dnomad.NOMAD(n_clusters=K, sdp_k=K, backend="local").fit(X)
    assert est.stop_reason_ == "tolerance" and calls and all(w is not None for w in calls)
    wanted = calls[-1]
    w = np.array([9.0, 4.0, 3.5, 1.0, 0.5, 0.1])     # onto {sum = K - 1 = 7}: 9 - 1 = 8 > 7, keeps 1, 2 ...
    kept = int((cgm._simplex_projection(w, K - 1.0) > 0).sum())
    assert 0 < kept < len(w) and wanted(w) == kept + 1
    assert wanted(np.full(6, 5.0)) == 6 + 1         # nothing cut: every pair (LOBPCG clamps to k)
    assert wanted(np.array([np.nan, 1.0, 0.5])) == 3


def test_host_blocks_in_memory_keep_the_direction_in_m(tmp_path):
    """Blocks in this process's memory keep the step's direction in M (one GEMM per step);
    blocks in a Zarr store form it twice (the extra M traffic would go to disk)."""
    from dnomad.nomad import cgm

    local = blocks.new_group(50, backend="local")
    on_disk = blocks.new_group(50, backend="zarr", store=str(tmp_path / "blocks.zarr"))
    assert cgm._stores_direction(local) and not cgm._stores_direction(on_disk)
    local.close()
    on_disk.close()


def test_fused_block_refuses_two_forms_of_the_step(rng):
    """The rank-k step given both as (A, U) and as its stored direction is refused before
    any block changes (it would apply one and silently drop the other)."""
    from dnomad.nomad import kernels

    b, k = 20, 3
    P, Gam, G = rng.standard_normal((b, b)), np.zeros((b, b)), np.zeros((b, b))
    A, U = rng.standard_normal((b, k)), rng.standard_normal((b, k))
    before = P.copy()
    with pytest.raises(dnomad.InputValueError, match="not both"):
        kernels.nomad_block(P, Gam, G, D=np.eye(b), vi=np.zeros(b), vj=np.zeros(b), step=0.5, vv_scale=0.0,
                            gamma=1.0, tau=0.0, inv_n=1.0 / b, update_gamma=False, write_g=True, weight=1.0,
                            lowrank=(A, U), direction=A @ U.T)
    np.testing.assert_array_equal(P, before)
    group = blocks.from_array(np.eye(b), dtype=np.float64, block_size=10).group
    with pytest.raises(dnomad.InputValueError, match="not both"):
        nomad_passes.nomad_pass(group, v=None, step=0.5, vv_scale=0.0, gamma=1.0, tau=0.0, update_gamma=False,
                                lowrank=(A, U), direction="D")
    group.close()


@pytest.mark.parametrize("stored_direction", [False, True])
def test_block_direction_matches_dense_reference(stored_direction, rng, monkeypatch):
    """Two outer iterations of the block direction against the same iteration written
    densely here: the fused pass, the projected step from the exact top-k eigenpairs of
    J M J (n small: the solver's dense path), the line-search step, the multiplier update;
    the step formed by GEMM (blocks in a Zarr store) or kept in M by the line search (in memory)."""
    from dnomad.nomad import cgm
    from dnomad.nomad.cgm import NomadParams, _line_search_step, _simplex_projection, nomad_cgm

    monkeypatch.setattr(cgm, "_stores_direction", lambda group: stored_direction)

    X = rng.standard_normal((60, 30)) + 3.0 * (np.arange(60) % 3)[:, None]     # D of rank 29 > k: no ties
    F = blocks.prepare_gram_data(X)
    D = F @ F.T
    n, K, gamma0, k = len(D), 4, 20.0, 12        # 5 k >= n - 1: the solver's exact (dense) path
    params = NomadParams(n_clusters=K, max_iter=2, n_inner=2, penalty=gamma0, block_rank=k,
                         rmse_tol=0, min_tol=0, objective_tol=0)
    with pytest.warns(dnomad.ConvergenceWarning):
        res = nomad_cgm(blocks.from_array(D, dtype=np.float64, block_size=25).group, params)
    P, Gam = np.zeros((n, n)), np.zeros((n, n))
    J = np.eye(n) - 1.0 / n
    first = True
    for t in range(2):
        gamma = gamma0 * np.sqrt(t + 1)
        for _ in range(2):
            Q = P + 1.0 / n
            G = -D + np.minimum(Gam + gamma * Q, 0)
            M = J @ (P - G / gamma) @ J - 10.0 * np.ones((n, n)) / n
            w, V = np.linalg.eigh(M)
            theta, U = w[::-1][:k], V[:, ::-1][:, :k]
            lam = _simplex_projection(theta, K - 1.0)
            Vd = (U * lam) @ U.T
            Delta = Vd - P
            R = Q + Gam / gamma
            from dnomad.nomad import kernels
            alphas = 2.0 ** (-np.arange(kernels.LS_BINS + 1) / kernels.LS_BINS_PER_OCTAVE)
            h = np.array([np.sum(np.minimum(R + a * Delta, 0) * Delta) for a in alphas])
            gap = -np.sum(G * Delta)
            a = 1.0 if first else _line_search_step(alphas, h, np.sum(np.minimum(R, 0) * Delta), gap, gamma)
            first = False
            P = P + a * Delta
        Gam = np.minimum(Gam + gamma * (P + 1.0 / n), 0)
    assert min(r["rank"] for r in res.history) >= 3       # a rank-k step, not a vertex
    np.testing.assert_allclose(np.asarray(res.P), P, rtol=0, atol=1e-9)
    assert np.abs(P).max() > 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("factored", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_steps_dense_eigenpairs_equal_numpys_on_the_ones_complement(device, factored, dtype, rng):
    """The block step's dense path (5 k >= n - 1): M read whole from its blocks (a
    symmetric host layout, or whole device blocks), D / L added from its factor when D is
    kept as one, centred, and its top k eigenpairs off the ones vector, against NumPy's
    eigh of the projected matrix.  The spectrum on 1^perp is negative, so the ones
    vector (0 in J M J) would come first were it not pushed to the bottom; M's blocks
    are left as they were."""
    from dnomad.nomad.cgm import NomadParams, _BlockDirection, _FactoredGram

    n, k, L = 50, 12, 4.0
    basis = np.linalg.qr(np.column_stack([np.ones(n), rng.standard_normal((n, n - 1))]))[0]
    values = np.concatenate([[100.0], rng.uniform(-3.0, -0.5, n - 1)])
    Mp = (basis * values) @ basis.T
    Mp = (0.5 * (Mp + Mp.T)).astype(dtype).astype(np.float64)      # as the blocks hold it
    F = rng.standard_normal((n, 4)) + 1.0               # not centred: D 1 is not a multiple of 1
    want_M = Mp + (F @ F.T / (20.0 * L) if factored else 0.0)
    group = blocks.from_array(Mp, name="M", dtype=dtype, block_size=16, backend="local", device=device).group
    ones = np.ones(n) / np.sqrt(n)
    gram = _FactoredGram(blocks.DataPanels(group, F / np.sqrt(20.0)), group, ones, 0.0) if factored else None
    direction = _BlockDirection(group, gram, NomadParams(n_clusters=4, block_rank=k), None)
    for _ in range(2):                                  # the second call reuses D in full
        w, U, products = direction._eigs(L, True)
        assert isinstance(w, np.ndarray) and isinstance(U, np.ndarray) and products == 1
        B = basis[:, 1:]                                # an orthonormal basis of 1^perp
        exact = np.linalg.eigvalsh(B.T @ want_M @ B)[::-1][:k]
        assert exact[0] < 0
        np.testing.assert_allclose(w, exact, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(U.T @ U, np.eye(k), atol=1e-10)
        assert np.abs(U.sum(axis=0)).max() < 1e-10
        J = np.eye(n) - 1.0 / n
        np.testing.assert_allclose(J @ want_M @ J @ U, U * w, atol=1e-9)
        np.testing.assert_array_equal(np.asarray(blocks.BlockMatrix(group, "M")), Mp.astype(dtype))
    group.close()


@pytest.mark.parametrize("device", DEVICES)
def test_block_steps_eigensolver_finds_the_top_eigenpairs_off_the_ones_vector(device):
    """The block step's LOBPCG (on the blocks' device) against a planted spectrum, at a size
    where LOBPCG runs (5 k < n - 1; the exact-SDP instances are small enough to go dense):
    the ones direction, though M's largest, is left out; the top k on its complement are
    found from random starts and again, in the few iterations of a later call, from a
    warm start after M changes a little."""
    from dnomad.nomad.cgm import _BlockDirection, NomadParams

    n, K = 400, 4
    params = NomadParams(n_clusters=K)
    rng = np.random.default_rng(7)
    basis = np.linalg.qr(np.column_stack([np.ones(n), rng.standard_normal((n, n - 1))]))[0]
    k = 2 * K + 8
    values = np.concatenate([[50.0], np.linspace(10.0, 5.0, k), rng.uniform(-1.0, 1.0, n - 1 - k)])
    M = (basis * values) @ basis.T
    counts = []
    for first, A in ((True, M), (False, M + 0.01 * (basis[:, 1:2] @ basis[:, 1:2].T))):
        group = blocks.from_array(0.5 * (A + A.T), name="M", dtype=np.float64, block_size=100,
                                  backend="local", device=device).group
        if first:
            direction = _BlockDirection(group, None, params, None)
            direction.state = direction._start(direction.k)
        direction.group = group
        w, U, products = direction._eigs(1.0, first)
        direction.state = np.ascontiguousarray(U)
        assert isinstance(w, np.ndarray) and isinstance(U, np.ndarray)      # back on the host
        exact = np.linalg.eigvalsh(basis[:, 1:].T @ A @ basis[:, 1:])[::-1][:k]
        np.testing.assert_allclose(w, exact, rtol=1e-6)
        np.testing.assert_allclose(U.T @ U, np.eye(k), atol=1e-8)
        assert np.abs(U.sum(axis=0)).max() < 1e-8 * np.sqrt(n)
        np.testing.assert_allclose(np.einsum("ij,ij->j", U, A @ U), w, rtol=1e-6)
        counts.append(products)
        group.close()
    assert counts[0] > 1 and 1 <= counts[1] < counts[0]         # the warm start pays


def test_block_component_edges_in_row_strips_match_connected_components(rng, monkeypatch):
    """The block-local component edges read in strips of rows (any strip height, one row
    included) give the components scipy finds on the whole bipartite block graph."""
    from scipy.sparse import bmat, csr_matrix
    from scipy.sparse.csgraph import connected_components

    from dnomad.blocks import passes

    for shape, density in (((120, 90), 0.01), ((40, 300), 0.02), ((60, 60), 0.5), ((0, 7), 0.1), ((7, 0), 0.1)):
        mask = rng.random(shape) < density
        B = csr_matrix(mask.astype(np.int8))
        full = bmat([[None, B], [B.T, None]]) if B.nnz else None
        for entries in (1 << 30, 997, 1):
            monkeypatch.setattr(passes, "MASK_STRIP_ENTRIES", entries)
            idx, root = passes.block_component_edges(mask)
            touched = np.flatnonzero(np.concatenate([mask.any(axis=1), mask.any(axis=0)]))
            np.testing.assert_array_equal(idx, touched)
            if full is None:
                assert len(root) == 0
                continue
            labels = connected_components(full, directed=False)[1]
            # the root is the smallest node of the node's component
            smallest = {lab: i for i, lab in reversed(list(zip(touched, labels[touched])))}
            np.testing.assert_array_equal(root, [smallest[lab] for lab in labels[touched]])


def test_block_step_stays_within_the_client_memory(monkeypatch, caplog):
    """CGM's block step holds at most CLIENT_MEMORY_FRACTION of the available memory: where
    the dense step's n x n matrices do not fit, LOBPCG runs with as many directions as
    fit (a warning says the step is capped and that solver='bm' is the way out), ending
    near the uncapped objective; where not even the first block fits, the fit is refused
    before any step, naming solver='bm'."""
    import logging
    import warnings

    from dnomad.nomad import cgm

    X = two_rings(60)[0]
    kw = dict(n_clusters=2, sdp_k=6, dtype=np.float64, max_iter=300)
    full = dnomad.NOMAD(**kw).fit(X)                      # k = 2K + 8 = 20 >= (n - 1) / 5: dense
    n, k = 60, 20
    dense_bytes = cgm.DENSE_STEP_MATRICES * 8 * n * n
    lobpcg_bytes = cgm.LOBPCG_BLOCKS * 8 * n * k
    assert lobpcg_bytes < dense_bytes
    monkeypatch.setattr(cgm, "CLIENT_MEMORY_FRACTION", (lobpcg_bytes + dense_bytes) / 2 / blocks.available_memory())
    with caplog.at_level(logging.WARNING, logger="dnomad.nomad.cgm"), warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        capped = dnomad.NOMAD(**kw).fit(X)
    assert any("directions this process's memory holds" in r.getMessage() and "solver='bm'" in r.getMessage()
               for r in caplog.records)
    assert capped.objective_ == pytest.approx(full.objective_, rel=2e-3)
    assert capped.Q_.row_sums() == pytest.approx(np.ones(n), abs=1e-3)
    monkeypatch.setattr(cgm, "CLIENT_MEMORY_FRACTION", lobpcg_bytes / 2 / blocks.available_memory())
    with pytest.raises(InputValueError, match=r"20 eigenvectors of length n = 60.*solver='bm'"):
        dnomad.NOMAD(**kw).fit(X)
