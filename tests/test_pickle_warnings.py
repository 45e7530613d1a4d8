"""Fitted estimators survive pickle and joblib, and ConvergenceWarning points at the
user's line (issue 23, item 6).

Every fit here is tiny (n <= 150, a few iterations): the pickle tests cap iterations on
purpose and ignore the ConvergenceWarning that follows; the warning tests cap them to
get one, or give settings that converge quickly and expect none.
"""
import inspect
import pickle
import re
import warnings

import joblib
import numpy as np
import pytest
from devices import DEVICES

import dnomad
from dnomad import blocks
from dnomad.data import gaussian_blobs, gmm_simplex, separable_nmf, two_rings
from dnomad.errors import ConvergenceWarning, DnomadError, NotPicklableError

ESTIMATORS = {"nomad": dnomad.NOMAD, "symnmf": dnomad.SymNMF, "hottopixx": dnomad.Hottopixx,
              "riemannian-kmeans": dnomad.RiemannianKMeans, "nlr": dnomad.NLR,
              "bregman": dnomad.BregmanClustering}


def record_row(row):
    """A callback defined at module level: pickled by reference, as any importable function."""
    return None


def rings():
    return two_rings(120)[0]


def hott_rows():
    return separable_nmf(30, 60, 3)["X"]


def blobs():
    return gaussian_blobs(60, n_centers=3, separation=10.0, random_state=0)[0]


# ---------------------------------------------------------------------------- pickle
# case -> (method, parameters (a function of tmp_path), input, learned attributes compared)
FITS = {
    "nomad-cgm": ("nomad", lambda tmp: dict(n_clusters=4, sdp_k=4, max_iter=30, random_state=np.random.default_rng(0),
                                            callback=record_row),
                  rings, ["labels_", "Q_", "embedding_", "eigenvalues_"]),
    "nomad-cgm-store": ("nomad", lambda tmp: dict(n_clusters=4, sdp_k=4, max_iter=30, store=str(tmp / "run.zarr")),
                        rings, ["labels_", "Q_", "embedding_"]),
    "nomad-bm": ("nomad", lambda tmp: dict(n_clusters=4, sdp_k=4, solver="bm", max_iter=5, callback=record_row),
                 rings, ["labels_", "Q_", "Y_", "embedding_"]),
    "nomad-layers": ("nomad", lambda tmp: dict(n_clusters=2, layers=[4, 2], max_iter=20),
                     rings, ["labels_", "Q_", "embedding_"]),
    "symnmf": ("symnmf", lambda tmp: dict(n_clusters=4, max_iter=20, random_state=np.random.default_rng(0),
                                          callback=record_row),
               rings, ["labels_", "components_"]),
    "hottopixx": ("hottopixx", lambda tmp: dict(rank=3, n_epochs=3, random_state=0, callback=record_row),
                  hott_rows, ["hott_rows_", "components_", "W_", "diag_"]),
    "riemannian-kmeans": ("riemannian-kmeans", lambda tmp: dict(n_clusters=2, max_iter=20, random_state=0,
                                                                callback=record_row),
                          rings, ["labels_", "U_", "V_", "Q_"]),
    "nlr": ("nlr", lambda tmp: dict(n_clusters=2, max_iter=50, random_state=np.random.default_rng(0)),
            rings, ["labels_", "U_"]),
    "bregman": ("bregman", lambda tmp: dict(n_clusters=2, max_iter=20, random_state=0),
                rings, ["labels_", "M_"]),
}


def as_arrays(value):
    """A learned attribute as NumPy arrays: an operator (BlockMatrix, LowRankGram) densely."""
    if isinstance(value, tuple):
        return tuple(as_arrays(v) for v in value)
    return np.asarray(value)


def assert_same(a, b):
    a, b = as_arrays(a), as_arrays(b)
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def round_trips(est, tmp_path):
    """The estimator through pickle and through joblib (to a file, as users save models)."""
    loaded = [pickle.loads(pickle.dumps(est))]
    path = tmp_path / "model.joblib"
    joblib.dump(est, path)
    loaded.append(joblib.load(path))
    return loaded


@pytest.mark.parametrize("case", list(FITS))
def test_fitted_estimator_pickles_with_the_same_learned_state(case, tmp_path):
    method, params, make, attributes = FITS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)            # iterations capped on purpose
        est = ESTIMATORS[method](**params(tmp_path)).fit(make())
    for loaded in round_trips(est, tmp_path):
        assert type(loaded) is type(est)
        assert loaded.get_params().keys() == est.get_params().keys()
        for name in attributes:
            assert_same(getattr(loaded, name), getattr(est, name))
        # the callback is the same function; a Generator keeps its state
        assert getattr(loaded, "callback", None) is getattr(est, "callback", None)
        if isinstance(est.random_state, np.random.Generator):
            assert loaded.random_state.bit_generator.state == est.random_state.bit_generator.state
        Q = getattr(est, "Q_", None)
        if Q is not None and hasattr(Q, "matmat"):
            # the loaded operator computes (its thread pool or Zarr handles made anew)
            V = np.random.default_rng(1).standard_normal((Q.shape[0], 3))
            np.testing.assert_array_equal(loaded.Q_.matmat(V.astype(Q.dtype)), Q.matmat(V.astype(Q.dtype)))
        if case == "nomad-layers":
            assert_same(loaded.layers_[0]["Q"], est.layers_[0]["Q"])
            assert loaded.layers_[-1]["Q"] is loaded.Q_                # shared references stay shared
        if case.startswith("nomad-cgm"):
            # loaded again, a pickled group pickles again
            assert_same(pickle.loads(pickle.dumps(loaded)).Q_, est.Q_)


def test_store_backed_q_pickles_as_a_reference_to_its_store(tmp_path, monkeypatch):
    """Q of a fit with store= pickles as the location of result/Q (a relative store path
    made absolute), not as its n x n values, and reads them back from the store."""
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    with pytest.warns(ConvergenceWarning):
        est = dnomad.NOMAD(4, sdp_k=4, max_iter=10, store="run.zarr").fit(rings())
    assert est.Q_.backend == "zarr"
    Q = np.asarray(est.Q_)
    data = pickle.dumps(est)
    assert len(data) < est.Q_.n ** 2 * est.Q_.dtype.itemsize / 4     # Q's values are not in it
    monkeypatch.chdir(tmp_path / "elsewhere")
    loaded = pickle.loads(data)
    assert loaded.Q_.backend == "zarr"
    assert loaded.Q_.group.store == str(tmp_path / "run" / "run.zarr")
    np.testing.assert_array_equal(np.asarray(loaded.Q_), Q)


@pytest.mark.parametrize("device", DEVICES)
def test_local_block_group_pickles_its_blocks(device):
    """A local group (blocks in this process, on the host or the GPU) pickles its blocks;
    its thread pool, lock and task counter are made anew on loading."""
    A = np.random.default_rng(0).standard_normal((50, 50))
    A = A + A.T
    bm = blocks.from_array(A, dtype=np.float64, block_size=20, device=device)
    np.asarray(bm.matmat(np.ones(50)))                                # the pool exists before pickling
    loaded = pickle.loads(pickle.dumps(bm))
    assert loaded.device == device and loaded.group._pool is None
    np.testing.assert_array_equal(np.asarray(loaded), A)
    v = np.arange(50.0)
    np.testing.assert_array_equal(blocks.device.to_host(loaded.matmat(v)), blocks.device.to_host(bm.matmat(v)))


@pytest.fixture
def in_process_client():
    """A one-worker cluster in this process (threads, no worker processes): actors and
    blocks held by a worker, at the cost of a thread."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


def test_group_with_blocks_in_workers_refuses_to_pickle(in_process_client):
    bm = blocks.from_array(np.eye(10), dtype=np.float64, backend="distributed", client=in_process_client)
    try:
        with pytest.raises(NotPicklableError, match="distributed backend cannot be pickled") as info:
            pickle.dumps(bm)
        assert isinstance(info.value, TypeError) and isinstance(info.value, DnomadError)
        assert "from_array" in str(info.value) and "from_zarr" in str(info.value)     # the ways out
    finally:
        bm.group.close()


def test_distributed_fit_leaves_a_picklable_q_in_this_process(in_process_client):
    X = rings()
    with pytest.warns(ConvergenceWarning):
        est = dnomad.NOMAD(4, sdp_k=4, max_iter=5, backend="distributed").fit(X)
    assert est.backend_used_ == "distributed" and est.Q_.backend == "local"
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(np.asarray(loaded.Q_), np.asarray(est.Q_))
    np.testing.assert_array_equal(loaded.labels_, est.labels_)


# ------------------------------------------------------------------ ConvergenceWarning
# case -> (method, parameters, input): capped at max_iter 1 or 2 with tol > 0.
CAPPED = {
    "nomad-cgm": ("nomad", dict(n_clusters=4, sdp_k=4, max_iter=2), rings),
    "nomad-bm": ("nomad", dict(n_clusters=4, sdp_k=4, solver="bm", max_iter=1), rings),
    "nomad-layers": ("nomad", dict(n_clusters=2, layers=[4, 2], max_iter=2), rings),
    "symnmf": ("symnmf", dict(n_clusters=4, max_iter=2), rings),
    "symnmf-objective-rule": ("symnmf", dict(n_clusters=4, max_iter=2, stop_rule="objective"), rings),
    "riemannian-kmeans": ("riemannian-kmeans", dict(n_clusters=2, max_iter=1, random_state=0), rings),
    "riemannian-kmeans-continuation": ("riemannian-kmeans",
                                       dict(n_clusters=2, max_iter=1, mu=[0.1, 0.01], random_state=0), rings),
    "nlr": ("nlr", dict(n_clusters=2, max_iter=2, random_state=0), rings),
    "bregman-cond-jc": ("bregman", dict(n_clusters=2, max_iter=2, random_state=0), rings),
    "bregman-cond": ("bregman", dict(n_clusters=2, model="cond", max_iter=1, random_state=0), rings),
    "bregman-joint": ("bregman", dict(n_clusters=2, model="joint", max_iter=1, random_state=0), rings),
    "bregman-disc": ("bregman", dict(n_clusters=2, model="disc", max_iter=1, random_state=0), rings),
}


def convergence_warnings(record):
    return [w for w in record if issubclass(w.category, ConvergenceWarning)]


@pytest.mark.parametrize("api", ["estimator", "dnomad.fit"])
@pytest.mark.parametrize("case", list(CAPPED))
def test_capped_fit_warns_at_the_callers_line(case, api):
    method, params, make = CAPPED[case]
    X = make()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 2
        if api == "estimator":
            est = ESTIMATORS[method](**params).fit(X)
        else:
            line += 3
            est = dnomad.fit(X, method=method, **params)
    found = convergence_warnings(record)
    assert found, f"{case}: no ConvergenceWarning"
    for w in found:
        assert (w.filename, w.lineno) == (__file__, line), str(w.message)
        message = str(w.message)
        assert f"max_iter={params['max_iter']}" in message and "tol" in message, message
    assert est.stop_reason_ == "max_iter"


def test_riemannian_kmeans_reports_its_capped_runs_in_one_warning():
    with pytest.warns(ConvergenceWarning) as record:
        dnomad.RiemannianKMeans(2, max_iter=1, mu=[0.1, 0.01], n_init=2, random_state=0).fit(rings())
    (w,) = convergence_warnings(record)
    message = str(w.message)
    assert "in 4 of 4 Newton runs" in message and "stage 2 of 2 (mu=0.01)" in message, message
    assert "grad_norm" in message


def test_direct_solver_calls_warn_at_the_callers_line():
    """The solvers below the estimators warn the same way when called directly."""
    from dnomad.blocks.operators import DataGram
    from dnomad.bregman import hard_clustering, soft_clustering
    from dnomad.nomad.bm import symnmf_admm
    from dnomad.kmeans_sdp.riemannian import KMeansManifold, KMeansProblem, random_start, riemannian_newton

    X = rings()
    D = DataGram(X)
    M = KMeansManifold(len(X), 3, 2)
    x0 = random_start(M, np.random.default_rng(0))
    calls = {
        "Bregman hard clustering": lambda: hard_clustering(X, 3, "euclidean", max_iter=1, random_state=0),
        "Bregman soft clustering": lambda: soft_clustering(X, 3, "euclidean", max_iter=1, random_state=0),
        "symmetric NMF (ADMM)": lambda: symnmf_admm(D.matmat, len(X), 3, max_iter=1, random_state=0),
        "Riemannian Newton (mu=0.01)": lambda: riemannian_newton(KMeansProblem(M, X, mu=0.01), x0, max_iter=1),
    }
    for name, call in calls.items():
        with pytest.warns(ConvergenceWarning, match="^" + re.escape(name)) as record:
            call()
        assert {w.filename for w in convergence_warnings(record)} == {__file__}


# case -> (method, parameters, input): settings that meet the tolerance well before max_iter.
CONVERGING = {
    "nomad-cgm": ("nomad", dict(n_clusters=3, sdp_k=3, dtype=np.float64, max_iter=500, rmse_tol=1e-3, min_tol=0.1,
                                objective_tol=1e-2),
                  lambda: gaussian_blobs(60, n_centers=3, separation=12.0, random_state=1)[0]),
    "nomad-bm": ("nomad", dict(n_clusters=3, sdp_k=3, solver="bm", max_iter=50), blobs),
    "symnmf": ("symnmf", dict(n_clusters=3, tol=1e-2, max_iter=300, dtype=np.float64, bandwidth=4.0,
                              random_state=0),
               lambda: gaussian_blobs(60, n_centers=3, separation=4.0, random_state=2)[0]),
    "riemannian-kmeans": ("riemannian-kmeans", dict(n_clusters=3, mu=0.01, max_iter=1000, random_state=0),
                          lambda: gmm_simplex(120, n_clusters=3, random_state=0)[0]),
    "nlr": ("nlr", dict(n_clusters=3, tol=1e-4, max_iter=5000, random_state=0), blobs),
    "bregman-cond-jc": ("bregman", dict(n_clusters=3, tol=1e-3, max_iter=1000, random_state=0), blobs),
    "bregman-cond": ("bregman", dict(n_clusters=3, model="cond", max_iter=300, random_state=0), blobs),
    # a fixed number of epochs, no tolerance: never a ConvergenceWarning
    "hottopixx": ("hottopixx", dict(rank=3, n_epochs=1, random_state=0), hott_rows),
}


@pytest.mark.parametrize("case", list(CONVERGING))
def test_converged_fit_does_not_warn(case):
    method, params, make = CONVERGING[case]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        est = ESTIMATORS[method](**params).fit(make())
    assert convergence_warnings(record) == [], [str(w.message) for w in record]
    if method != "hottopixx":
        assert est.stop_reason_ == "tolerance"


@pytest.mark.parametrize("params", [dict(tol=0), dict(stop_rule="objective", objective_tol=0),
                                    dict(solver="penalty", objective_tol=0)],
                         ids=["gap-rule", "objective-rule", "penalty"])
def test_symnmf_with_tolerance_zero_runs_max_iter_without_warning(params):
    """tol = 0 asks for max_iter iterations: reaching them is no failure to converge."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        est = dnomad.SymNMF(n_clusters=3, max_iter=2, random_state=0, **params).fit(blobs())
    assert convergence_warnings(record) == [], [str(w.message) for w in record]
    assert est.stop_reason_ == "max_iter"


def test_solvers_with_tolerance_zero_do_not_warn():
    from dnomad.bregman import cond, cond_jc, soft_clustering

    X = blobs()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cond_jc(X, 3, "euclidean", tol=0.0, max_iter=2).stop_reason == "max_iter"
        cond(X, 3, "euclidean", tol=0.0, max_iter=2)
        soft_clustering(X, 3, "euclidean", tol=0.0, max_iter=2, random_state=0)
    assert convergence_warnings(record) == [], [str(w.message) for w in record]
