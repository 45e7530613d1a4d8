"""The NOMAD family behind one estimator: solver="cgm" | "bm", multi-layer NOMAD, the
shared result attributes, Burer-Monteiro checkpoints and Zarr input, and bad options."""
import warnings

import numpy as np
import pytest
import zarr

import dnomad
from dnomad.blocks import store as run_store
from dnomad.blocks.operators import LowRankGram
from dnomad.data import gaussian_blobs, noisy_semicircles, two_rings
from dnomad.errors import ConvergenceWarning, InputValueError
from dnomad.metrics import adjusted_rand_score


@pytest.mark.parametrize("make", [lambda: two_rings(200), lambda: noisy_semicircles(200)],
                         ids=["rings", "half-moons"])
def test_multilayer_separates_manifolds_that_one_layer_and_kmeans_do_not(make, tmp_path):
    """Sec. 3.1, Fig. 9: layers K = 16, 8, 4, 2 put each manifold in one connected
    component of Q; one layer with K = 2 and K-means (scikit-learn) mix them.  Every layer
    runs to the stopping rule: stopped early (150 steps), the half-moons' layers ended
    mixed or separated depending on the BLAS kernels' rounding (AVX-512 against AVX2)."""
    from sklearn.cluster import KMeans

    X, y = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        deep = dnomad.NOMAD(2, layers="halving", sdp_k=16,
                            store=str(tmp_path / "ml.zarr")).fit(X)
        # One layer with K = 2 is far slower to converge (rings: past 2000 steps); 150 steps
        # show the mixing, which sets in early.
        single = dnomad.NOMAD(n_clusters=2, sdp_k=2, max_iter=150).fit(X)
    assert all(r["stop_reason"] == "tolerance" for r in deep.layers_)
    assert [r["sdp_k"] for r in deep.layers_] == [16, 8, 4, 2]
    assert adjusted_rand_score(y, deep.labels_) == 1.0
    assert adjusted_rand_score(y, single.labels_) < 0.3
    assert adjusted_rand_score(y, KMeans(2, n_init=10, random_state=0).fit_predict(X)) < 0.3
    # Every layer's Q is kept: the inner ones under layers/<l>/Q, the last as result/Q;
    # each has trace K_l and unit row sums (to the solver's feasibility).
    for layer, record in enumerate(deep.layers_[:-1]):
        Q = np.asarray(zarr.open_array(store=str(tmp_path / "ml.zarr"), path=f"layers/{layer}/Q", mode="r"))
        np.testing.assert_allclose(Q, np.asarray(record["Q"]))
        assert np.trace(Q) == pytest.approx(record["sdp_k"], rel=1e-3)
        np.testing.assert_allclose(Q.sum(axis=1), 1, atol=1e-3)
    assert run_store.read_json(str(tmp_path / "ml.zarr"), "result")["layers"] == [16, 8, 4, 2]


@pytest.mark.parametrize("steps", [{}, dict(direction="vertex", lagrangian="paper", n_inner=10, tau="scale")],
                         ids=["block", "paper-loop"])
def test_multilayer_resumes_in_the_layer_it_stopped(tmp_path, steps):
    """A run stopped in layer 2 of 3 resumes there (layer 1's Q from the store, layer 2
    from its checkpoint) and ends with the uninterrupted run's Q, bit for bit."""
    X, _ = two_rings(120)
    kw = dict(layers=[8, 4, 2], n_clusters=2, max_iter=40, checkpoint_every=5, dtype=np.float64, **steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        whole = dnomad.NOMAD(**kw).fit(X)
        calls = []

        def stop_in_layer_two(row):
            calls.append(row["iteration"])
            return len(calls) == 40 + 12          # layer 1 ran 40 steps; stop at step 12 of layer 2

        store = str(tmp_path / "r.zarr")
        with pytest.raises(RuntimeError, match="stopped"):
            dnomad.NOMAD(**kw, store=store, callback=_raising(stop_in_layer_two)).fit(X)
        assert run_store.read_json(store, "layers/0") is not None
        assert run_store.read_json(store, "layers/1") is None
        resumed = dnomad.resume(store)
    np.testing.assert_array_equal(np.asarray(resumed.Q_), np.asarray(whole.Q_))
    assert [r["sdp_k"] for r in resumed.layers_] == [8, 4, 2]


def _raising(predicate):
    """A callback that kills the run (as a crash would) when ``predicate`` says so."""
    def callback(row):
        if predicate(row):
            raise RuntimeError("stopped")
    return callback


def test_burer_monteiro_estimator_gives_the_shared_result(tmp_path):
    """solver="bm" through dnomad.fit: the attributes of solver="cgm" (labels, embedding
    from the leading eigenvectors of Q, history, Q_ with matmat/diag/asarray), Y_ in the
    store as a row-chunked n x r array, Q = Y Y^T feasible."""
    X, y = gaussian_blobs(300, n_centers=4, separation=12.0)
    store = str(tmp_path / "bm.zarr")
    bm = dnomad.fit(X, method="nomad", solver="bm", n_clusters=4, sdp_k=4, rank=4, random_state=0, store=store)
    cgm = dnomad.fit(X, method="nomad", n_clusters=4, sdp_k=4)
    for est in (bm, cgm):
        assert adjusted_rand_score(y, est.labels_) == 1.0
        assert est.embedding_.shape == (300, 2) and np.isfinite(est.embedding_).all()
        assert {"iteration", "objective", "seconds"} <= set(est.history_[-1])
        assert est.Q_.shape == (300, 300) and est.Q_.diag().shape == (300,)
        assert [r["sdp_k"] for r in est.layers_] == [4]
    assert isinstance(bm.Q_, LowRankGram) and bm.Y_.shape == (300, 4) and bm.stop_reason_ == "tolerance"
    Q = np.asarray(bm.Q_)
    np.testing.assert_allclose(Q, bm.Y_ @ bm.Y_.T)
    assert np.trace(Q) == pytest.approx(4, abs=1e-3)
    np.testing.assert_allclose(Q.sum(axis=1), 1, atol=1e-3)
    # The embedding: Q's leading eigenvectors after the constant one, scaled by sqrt(eigenvalue).
    n = len(Q)
    J = np.eye(n) - 1.0 / n
    w, V = np.linalg.eigh(J @ Q @ J)
    np.testing.assert_allclose(bm.eigenvalues_[:2], w[::-1][:2], rtol=1e-6)
    for k in range(2):
        np.testing.assert_allclose(np.abs(bm.embedding_[:, k]), np.abs(V[:, -1 - k]) * np.sqrt(w[-1 - k]),
                                   atol=1e-6)
    Y_stored = zarr.open_array(store=store, path="result/Y", mode="r")
    assert Y_stored.shape == (300, 4)
    np.testing.assert_array_equal(Y_stored[...], bm.Y_)
    assert run_store.read_json(store, "result")["solver"] == "bm"


def test_burer_monteiro_resumes_exactly_from_its_checkpoint(tmp_path):
    """Checkpoints hold (Y, mu, lambda, history): a run killed after outer step 3 and
    resumed ends with the uninterrupted run's Y, bit for bit."""
    X, _ = two_rings(200)
    kw = dict(solver="bm", n_clusters=4, sdp_k=4, rank=16, random_state=1, checkpoint_every=1)
    whole = dnomad.NOMAD(**kw).fit(X)
    assert whole.n_iter_ > 3
    store = str(tmp_path / "bm.zarr")
    with pytest.raises(RuntimeError, match="stopped"):
        dnomad.NOMAD(**kw, store=store, callback=_raising(lambda row: row["iteration"] == 3)).fit(X)
    ck = run_store.Checkpoints(store, "nomad_checkpoint").latest()
    assert ck["iteration"] == 2
    resumed = dnomad.resume(store)
    np.testing.assert_array_equal(resumed.Y_, whole.Y_)
    assert [r["iteration"] for r in resumed.history_] == list(range(1, whole.n_iter_ + 1))


def test_burer_monteiro_reads_data_from_zarr_chunk_by_chunk(tmp_path):
    """X as a Zarr path stays in Zarr: D Y is made from row chunks (no n x n matrix), and
    the result equals the in-memory run's to the solver's accuracy.  The chunks round
    differently from one in-memory block, so the runs part at round-off and end at
    different points that meet the stopping rule; the rule is tightened here (tol 1e-7,
    constraints to 1e-6) so that "the same Q" means 1e-3 of its largest entry (at the
    defaults, 1e-5 and 1e-4, the two runs' Q differed by 7e-3 of it; Y itself is defined
    only up to how a cluster's weight is split between columns)."""
    X, y = gaussian_blobs(400, n_centers=3, separation=12.0)
    url = str(tmp_path / "X.zarr")
    arr = zarr.create_array(store=url, shape=X.shape, dtype="f8", chunks=(64, 2))
    arr[...] = X
    kw = dict(solver="bm", n_clusters=3, sdp_k=3, rank=6, random_state=0,
              solver_options={"tol": 1e-7, "feasibility_tol": 1e-6})
    from_zarr = dnomad.NOMAD(**kw, store=str(tmp_path / "s.zarr")).fit(url)
    in_memory = dnomad.NOMAD(**kw).fit(X)
    Q_zarr, Q_mem = from_zarr.Y_ @ from_zarr.Y_.T, in_memory.Y_ @ in_memory.Y_.T
    np.testing.assert_allclose(Q_zarr, Q_mem, rtol=0, atol=1e-3 * Q_mem.max())
    assert from_zarr.objective_ == pytest.approx(in_memory.objective_, rel=1e-5)
    np.testing.assert_array_equal(from_zarr.labels_, in_memory.labels_)
    assert adjusted_rand_score(y, from_zarr.labels_) == 1.0
    assert run_store.read_json(str(tmp_path / "s.zarr"), run_store.RUN_MARKER)["input"]["kind"] == "data_zarr"


def test_burer_monteiro_on_two_workers_from_zarr_equals_the_run_in_this_process(tmp_path, cluster_client):
    """Y in row chunks beside X on a 2-worker LocalCluster (X read from Zarr by the
    workers, chunk by chunk) or in this process: the same chunks, kernels and chunk-order
    sums, so the same Y to round-off, outer step for outer step."""
    X, y = gaussian_blobs(400, n_centers=3, separation=12.0)
    url = str(tmp_path / "X.zarr")
    arr = zarr.create_array(store=url, shape=X.shape, dtype="f8", chunks=(64, 2))
    arr[...] = X
    kw = dict(solver="bm", n_clusters=3, sdp_k=3, rank=6, random_state=0)
    here = dnomad.NOMAD(**kw, backend="local").fit(url)
    workers = dnomad.NOMAD(**kw, backend="distributed").fit(url)
    assert workers.backend_used_ == "distributed" and here.backend_used_ == "local"
    np.testing.assert_allclose(workers.Y_, here.Y_, rtol=0, atol=1e-12)
    assert [r["inner_iterations"] for r in workers.history_] == [r["inner_iterations"] for r in here.history_]
    assert adjusted_rand_score(y, workers.labels_) == 1.0


def test_burer_monteiro_on_workers_leaves_y_and_the_embedding_in_the_store(tmp_path, cluster_client,
                                                                              monkeypatch):
    """On the workers with a store, the row chunks write Y and the embedding and the
    labels are taken where Y is held: the client gathers no n x r state (only the
    labels), Y_ and embedding_ are dask arrays over the store, equal to the run in this
    process, and a finished run loads them lazily again."""
    import dask.array as da

    from dnomad.blocks import RowChunks
    from dnomad.nomad import estimator

    monkeypatch.setattr(estimator, "AUTO_COMPONENTS_MAX_N", 0)      # spectral labels, as at scale
    gathered = []
    get = RowChunks.get
    monkeypatch.setattr(RowChunks, "get", lambda self, name: gathered.append(name) or get(self, name))
    X, y = gaussian_blobs(400, n_centers=3, separation=12.0)
    url = str(tmp_path / "X.zarr")
    zarr.create_array(store=url, shape=X.shape, dtype="f8", chunks=(64, 2))[...] = X
    kw = dict(solver="bm", n_clusters=3, sdp_k=3, rank=6, n_components=3, random_state=0)
    here = dnomad.NOMAD(**kw, backend="local", store=str(tmp_path / "here.zarr")).fit(url)
    assert isinstance(here.Y_, np.ndarray) and isinstance(here.embedding_, np.ndarray)
    gathered.clear()
    store = str(tmp_path / "workers.zarr")
    workers = dnomad.NOMAD(**kw, backend="distributed", store=store).fit(url)
    assert workers.backend_used_ == "distributed" and workers.label_method_used_ == "spectral"
    assert gathered == ["kmeans_labels"]
    for est in (workers, dnomad.NOMAD(**kw, backend="distributed", store=store).fit(url, resume=True)):
        assert isinstance(est.Y_, da.Array) and isinstance(est.embedding_, da.Array)
        np.testing.assert_allclose(np.asarray(est.Y_), here.Y_, rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(est.embedding_), here.embedding_, rtol=0, atol=1e-10)
        np.testing.assert_array_equal(est.labels_, here.labels_)
        np.testing.assert_allclose(est.Q_.diag(), here.Q_.diag(), rtol=0, atol=1e-12)
    assert adjusted_rand_score(y, workers.labels_) == 1.0
    assert run_store.read_result(store)["lazy_arrays"] == ["Y", "embedding"]
    assert run_store.read_result(str(tmp_path / "here.zarr"))["lazy_arrays"] == []


def test_low_rank_components_match_dense_components(rng):
    from scipy.sparse.csgraph import connected_components

    Y = rng.random((700, 5)) ** 6
    Q = LowRankGram(Y)
    Q.tile_rows = 128                # tiles across the component boundaries
    dense = Y @ Y.T
    assert Q.max() == pytest.approx(dense.max())
    for frac in (0.05, 0.2, 0.5):
        ours = Q.threshold_components(frac * Q.max())
        ref = connected_components(dense > frac * dense.max())[1]
        assert ours.max() == ref.max() and adjusted_rand_score(ref, ours) == 1.0
    t = rng.random(len(Y)) * dense.max()
    ours = Q.threshold_components(t)
    ref = connected_components(dense > np.maximum.outer(t, t))[1]
    assert ours.max() == ref.max() and adjusted_rand_score(ref, ours) == 1.0


@pytest.mark.parametrize("make", [lambda: two_rings(600, noise=0.05, random_state=1),
                                  lambda: noisy_semicircles(600, noise=0.08, random_state=1)],
                         ids=["noisy rings", "noisy half-moons"])
def test_halving_schedule_from_the_default_k_separates_noisy_manifolds(make):
    """layers="halving" with nothing else set: K = the default sdp_k, halved down to
    n_clusters (24, 12, 6, 3, 2 at n = 600), each layer to its stopping rule; the last
    layer's labels are the manifolds."""
    X, y = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = dnomad.NOMAD(2, layers="halving").fit(X)
    assert [r["sdp_k"] for r in est.layers_] == [24, 12, 6, 3, 2] and est.sdp_k_ == 24
    assert adjusted_rand_score(y, est.labels_) == 1.0


@pytest.mark.parametrize("params,match", [
    ({"solver": "sdp"}, "solver must be one of"),
    ({"rank": 16}, "rank is the Burer-Monteiro"),
    ({"solver": "bm", "solver_options": {"n_inner": 3}}, r"solver_options \['n_inner'\]"),
    ({"solver_options": {"sigma": 2.0}}, "not options of solver='cgm'"),
    ({"solver": "bm", "rank": 2, "n_clusters": 4}, r"rank must be an integer in \[K, n\]"),
    ({"layers": [4, 8, 2]}, "strictly decreasing"),
    ({"layers": [8, 4, 2], "n_clusters": 3}, r"last layer's K \(2\) must be at least n_clusters \(3\)"),
    ({"layers": [8, 4], "n_clusters": 2, "sdp_k": 8}, "either as sdp_k or as layers"),
    ({"layers": [8, True], "n_clusters": 2}, "list of integers"),
    ({"layers": [8.0, 4.0], "n_clusters": 2}, "list of integers"),
    ({"sdp_k": 4, "n_clusters": 6}, r"sdp_k \(4\) must be at least n_clusters \(6\)"),
    ({"n_clusters": 40}, r"n_clusters must be below the number of samples \(40\)"),
    ({"sdp_k": 40, "n_clusters": 2}, r"sdp_k must be below the number of samples \(40\)"),
    ({"layers": [40, 2], "n_clusters": 2}, r"the first layer's K \(40\) must be below the number of samples"),
    ({"layers": "thirds"}, "layers must be None or one of 'halving' or a list"),
    ({"layers": [8, "x"]}, "list of integers"),
    ({"solver": "bm", "checkpoint_every": 0}, r"checkpoint_every must be None or an int in \[1, inf\)"),
])
def test_bad_family_options_are_refused_before_work(params, match):
    X, _ = two_rings(40)
    with pytest.raises(InputValueError, match=match):
        dnomad.NOMAD(**params).fit(X)


def test_burer_monteiro_multilayer_keeps_each_layers_factor(tmp_path):
    """Layers of Burer-Monteiro: D_{l+1} = Y_l Y_l^T / ||Y_l^T Y_l||_F, matrix-free.  On
    the half-moons 8-4-2 separates them (deeper schedules from 16 found worse local
    optima of the nonconvex problem in our runs: docs/benchmark_notes.md); each inner layer's Y is in the
    store."""
    X, y = noisy_semicircles(200)
    store = str(tmp_path / "bm.zarr")
    est = dnomad.NOMAD(2, solver="bm", layers=[8, 4, 2], random_state=0, store=store).fit(X)
    assert adjusted_rand_score(y, est.labels_) == 1.0
    for layer, K in enumerate([8, 4]):
        Y = zarr.open_array(store=store, path=f"layers/{layer}/Y", mode="r")[...]
        assert Y.shape == (200, 2 * K) and Y.min() >= 0
        np.testing.assert_allclose(np.asarray(est.layers_[layer]["Q"]), Y @ Y.T)
        assert np.sum(Y * Y) == pytest.approx(K, abs=1e-3)
        np.testing.assert_allclose(Y @ Y.sum(axis=0), 1, atol=1e-3)
