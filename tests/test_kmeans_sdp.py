"""K-means by Riemannian Newton and by NLR through the estimators: the same labels,
the same results wherever the row chunks live (this process or 1 or 2 workers, X in
memory or in Zarr, any chunking), results in the store, and bad input refused before
X is read."""
import numpy as np
import pytest

import dnomad
from dnomad.blocks import RowChunks
from dnomad.blocks.cluster import workers_info
from dnomad.blocks import store as run_store
from dnomad.data import gmm_simplex
from dnomad.errors import InputValueError
from dnomad.metrics import clustering_accuracy
from dnomad.kmeans_sdp.nlr import nlr
from dnomad.kmeans_sdp.riemannian import riemannian_kmeans


def write_zarr(path, X, chunk_rows):
    import zarr

    z = zarr.open_array(store=str(path), mode="w", shape=X.shape, chunks=(chunk_rows, X.shape[1]),
                        dtype=X.dtype)
    z[...] = X
    return str(path)


def test_nlr_reaches_the_labels_of_riemannian_newton_on_the_issue_gmm():
    X, y = gmm_simplex(500, n_clusters=4, gamma=1.2, random_state=0)
    rn = dnomad.fit(X, method="riemannian-kmeans", n_clusters=4, mu=0.01, random_state=0)
    assert rn.stop_reason_ == "tolerance" and clustering_accuracy(y, rn.labels_) == 1.0
    for seed in range(3):
        est = dnomad.NLR(n_clusters=4, random_state=seed).fit(X)
        assert est.stop_reason_ == "tolerance" and est.infeasibility_ < 1e-5
        assert clustering_accuracy(rn.labels_, est.labels_) == 1.0
        # Both solve the same SDP: U U^T agree up to the barrier's bias (mu = 0.01).
        Zn, Zr = est.membership(), rn.membership()
        assert np.linalg.norm(Zn - Zr) <= 0.01 * np.linalg.norm(Zn)
    assert rn.U_.min() > 0 and est.U_.min() >= 0


def test_results_do_not_depend_on_where_the_row_chunks_live(tmp_path, cluster_client):
    """Same chunking: bit-identical on 1 or 2 workers, from Zarr or memory (sums are
    formed in chunk order); other chunkings agree to round-off.  25 Newton steps and
    100 NLR steps (equality, not convergence, is the point)."""
    X, _ = gmm_simplex(300, n_clusters=3, gamma=1.5, random_state=1)
    workers = sorted(workers_info(cluster_client))
    zpath = write_zarr(tmp_path / "X.zarr", X, 40)

    def run_rn(data):
        with data:
            return riemannian_kmeans(data, 3, mu=0.02, random_state=0, max_iter=25)

    def run_nlr(data):
        with data:
            return nlr(data, 3, random_state=0, max_iter=100)     # equality, not convergence

    for run in (run_nlr, run_rn):
        ref = run(RowChunks(X, chunk_rows=40))
        same = [run(RowChunks(X, chunk_rows=40, client=cluster_client)),
                run(RowChunks(X, chunk_rows=40, client=cluster_client, workers=workers[:1])),
                run(RowChunks(zpath)),
                run(RowChunks(zpath, client=cluster_client))]
        for res in same:
            np.testing.assert_array_equal(res.U, ref.U)
            assert res.n_iter == ref.n_iter
        other = run(RowChunks(X, chunk_rows=7))
        np.testing.assert_allclose(other.U, ref.U, atol=1e-7)


def test_kmeans_partition_is_lloyds_fixed_point_wherever_the_chunks_live(cluster_client):
    """The start of NLR: k-means over row chunks ends at a partition that Lloyd's step
    leaves as it is (every row nearest its own group's mean, checked densely here), the
    planted blobs exactly, and the same labels on 1 or 2 workers and in any chunking
    (sums in chunk order)."""
    from sklearn.datasets import make_blobs

    from dnomad.rounding import kmeans_partition

    X, y = make_blobs([300, 120, 40], centers=[[0, 0, 0], [6, 0, 0], [0, 6, 0]], random_state=4)
    ref = kmeans_partition(RowChunks(X, chunk_rows=50), 3, random_state=0)
    centres = np.stack([X[ref == k].mean(axis=0) for k in range(3)])
    nearest = np.argmin(((X[:, None, :] - centres[None]) ** 2).sum(axis=2), axis=1)
    np.testing.assert_array_equal(nearest, ref)
    assert clustering_accuracy(y, ref) == 1.0
    for data in (RowChunks(X, chunk_rows=50, client=cluster_client), RowChunks(X, chunk_rows=7), RowChunks(X)):
        with data:
            np.testing.assert_array_equal(kmeans_partition(data, 3, random_state=0), ref)


def test_partition_factor_is_a_feasible_point_of_the_kmeans_sdp():
    """U U^T is the partition's membership matrix (1/|group| within each group, 0 across),
    U >= 0, U U^T 1 = 1 and ||U||_F^2 = K, with no empty column at r = 2K."""
    from dnomad.kmeans_sdp.lloyd import partition_factor

    labels = np.repeat([0, 1, 2], [5, 3, 9])
    U = partition_factor(labels, 3, 6)
    Z = (labels[:, None] == labels[None]) / np.bincount(labels)[labels][None]
    np.testing.assert_allclose(U @ U.T, Z, atol=1e-15)
    np.testing.assert_allclose(U @ (U.T @ np.ones(17)), 1.0, atol=1e-15)
    assert U.min() >= 0 and abs(np.sum(U ** 2) - 3) < 1e-13 and (U.sum(axis=0) > 0).all()


def test_nlr_defaults_do_not_depend_on_the_units_of_x():
    """beta="scale" and the k-means start: the same partition (the planted one) for X in
    any units, and at least k-means++'s ARI; the authors' fixed beta = 10 stays one
    argument away (on X in large units it leaves the iterates infeasible)."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_blobs
    from sklearn.metrics import adjusted_rand_score

    X, y = make_blobs([400, 150, 50], n_features=5, cluster_std=[2.0, 1.0, 0.5], random_state=5)
    base = dnomad.NLR(3, random_state=0).fit(X)
    assert base.stop_reason_ == "tolerance" and base.infeasibility_ < 1e-6
    kmeans = KMeans(3, random_state=0).fit(X).labels_
    assert adjusted_rand_score(y, base.labels_) >= adjusted_rand_score(y, kmeans) - 0.02
    for units in (1e-3, 100.0):
        est = dnomad.NLR(3, random_state=0).fit(units * X)
        np.testing.assert_array_equal(est.labels_, base.labels_)
        assert est.beta_ == pytest.approx(base.beta_ * units ** 2, rel=1e-9)
    with pytest.warns(dnomad.ConvergenceWarning, match="infeasibility"):
        paper = dnomad.NLR(3, beta=10.0, init="random", random_state=0, max_iter=3000).fit(100.0 * X)
    assert paper.beta_ == 10.0 and paper.infeasibility_ > 1e-3


def test_estimator_on_the_cluster_and_from_zarr(tmp_path, cluster_client):
    X, y = gmm_simplex(300, n_clusters=3, gamma=1.5, random_state=2)
    zpath = write_zarr(tmp_path / "X.zarr", X, 64)
    local = dnomad.RiemannianKMeans(3, mu=0.02, random_state=0, backend="local").fit(X)
    remote = dnomad.RiemannianKMeans(3, mu=0.02, random_state=0, backend="distributed",
                                     chunk_rows=64).fit(zpath)
    np.testing.assert_allclose(remote.U_, local.U_, atol=1e-7)
    np.testing.assert_array_equal(remote.labels_, local.labels_)
    assert clustering_accuracy(y, local.labels_) == 1.0


def test_results_are_written_to_the_store(tmp_path):
    X, y = gmm_simplex(200, n_clusters=3, gamma=1.5, random_state=3)
    store = str(tmp_path / "run.zarr")
    est = dnomad.fit(X, method="riemannian-kmeans", n_clusters=3, mu=[0.1, 0.02], random_state=0,
                     store=store, min_eigenvalue="final")
    np.testing.assert_array_equal(run_store.read_vector(store, "result/labels"), est.labels_)
    np.testing.assert_array_equal(run_store.read_vector(store, "result/U"), est.U_)
    summary = run_store.read_json(store, "result")
    assert summary["stop_reason"] == "tolerance" and summary["mu"] == 0.02
    assert summary["min_eigenvalue"] >= -1e-3
    stages = {row["stage"] for row in est.history_}
    assert stages == {0, 1} and est.history_[-1]["mu"] == 0.02
    with pytest.raises(Exception, match="overwrite"):
        dnomad.fit(X, method="riemannian-kmeans", n_clusters=3, mu=0.5, store=store)


class _Stop(Exception):
    pass


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("method, kw, lazy", [
    ("NLR", dict(max_iter=300), ["U"]),
    # two mu stages, the smallest Hessian eigenvalue at the end (Lanczos over the chunks)
    ("RiemannianKMeans", dict(mu=[0.1, 0.02], min_eigenvalue="final"), ["U", "V"]),
])
def test_kmeans_on_workers_leaves_the_factor_in_the_store_and_gathers_only_labels(
        method, kw, lazy, tmp_path, cluster_client, monkeypatch):
    """On the workers with a store the K-means solvers' starts, iterates, factor and
    labels stay in the row chunks: the client gathers the k-means labels alone (the
    start's and the rounding's), U_ (and V_) are dask arrays over the store equal to the
    run in this process, and a finished run loads them lazily again; two starts keep
    the better one's factor in the chunks."""
    import dask.array as da

    gathered = []
    get = RowChunks.get
    monkeypatch.setattr(RowChunks, "get", lambda self, name: gathered.append(name) or get(self, name))
    X, y = gmm_simplex(300, n_clusters=3, gamma=1.5, random_state=1)
    url = write_zarr(tmp_path / "X.zarr", X, 64)
    kw = dict(kw, n_clusters=3, n_init=2, random_state=0)
    cls = getattr(dnomad, method)
    here = cls(**kw, backend="local", store=str(tmp_path / "here.zarr")).fit(url)
    assert isinstance(here.U_, np.ndarray)
    gathered.clear()
    store = str(tmp_path / "workers.zarr")
    workers = cls(**kw, backend="distributed", store=store).fit(url)
    assert set(gathered) == {"kmeans_labels"}
    for est in (workers, cls(**kw, backend="distributed", store=store).fit(url, resume=True)):
        for name in lazy:
            assert isinstance(getattr(est, f"{name}_"), da.Array)
            np.testing.assert_allclose(np.asarray(getattr(est, f"{name}_")), getattr(here, f"{name}_"),
                                       rtol=0, atol=1e-12)
        np.testing.assert_array_equal(est.labels_, here.labels_)
    np.testing.assert_allclose(here.membership() @ np.ones(len(X)), 1.0, atol=1e-3)     # U U^T 1 = 1
    assert clustering_accuracy(y, workers.labels_) > 0.9
    assert run_store.read_result(store)["lazy_arrays"] == lazy
    assert run_store.read_result(str(tmp_path / "here.zarr"))["lazy_arrays"] == []


def test_the_chunks_make_the_partition_factor_from_the_whole_partition(rng):
    """Each chunk makes its rows of the K-means SDP's point of a partition with the
    groups' sizes over all rows: the same factor as made whole, U U^T 1 = 1."""
    from dnomad.blocks import RowState
    from dnomad.kmeans_sdp import lloyd

    labels = rng.integers(0, 3, 50)
    with RowState(50, chunk_rows=7) as space:
        lloyd.put_partition_factor(space, labels, 3, 5, "U0")
        U = space.get("U0")
    np.testing.assert_array_equal(U, lloyd.partition_factor(labels, 3, 5))
    np.testing.assert_allclose(U @ (U.T @ np.ones(50)), 1.0, rtol=1e-12)


def test_factor_labels_are_the_same_however_the_rows_are_chunked(rng):
    """Farthest-point representatives then k-means over row chunks of U: the same labels
    from one chunk in this process as from 7-row chunks; on a planted factor (rows of a
    group equal, groups orthogonal) both methods give the groups."""
    from dnomad.blocks import RowState
    from dnomad.kmeans_sdp import lloyd
    from dnomad.rounding import factor_labels

    truth = rng.integers(0, 4, 90)
    U = lloyd.partition_factor(truth, 4, 5) + 0.02 * rng.random((90, 5))
    for method in ("kmeans", "farthest"):
        runs = []
        for chunk_rows in (None, 7):
            with RowState(90, chunk_rows=chunk_rows) as space:
                space.put("U", U)
                runs.append(factor_labels(space, "U", 4, 0, method))
        np.testing.assert_array_equal(runs[0], runs[1])
        assert clustering_accuracy(truth, runs[0]) == 1.0


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("method,kw", [
    ("riemannian-kmeans", dict(mu=[0.1, 0.02], checkpoint_every=3, min_eigenvalue="final")),
    # Stages shorter than checkpoint_every: only their starts are saved.
    ("riemannian-kmeans", dict(mu=[0.1, 0.02], checkpoint_every=1000)),
    # On a principal sketch (2 of the 3 features): the sketch is rebuilt on resume.
    ("riemannian-kmeans", dict(mu=[0.1, 0.02], checkpoint_every=3, n_components=2)),
    ("nlr", dict(checkpoint_every=40, record_every=10, max_iter=400)),
])
@pytest.mark.parametrize("as_path", [False, True])
def test_a_killed_run_resumes_from_its_checkpoint_to_the_uninterrupted_result(method, kw, as_path, tmp_path):
    """Two starts (and, for Newton, two mu stages): a run killed in its second start goes
    on from its last checkpoint (not from the start: fewer rows are recorded) to the
    uninterrupted run's U, labels and history; resuming the finished run reads it back."""
    X, _ = gmm_simplex(150, n_clusters=3, gamma=1.5, random_state=3)
    X_in = write_zarr(tmp_path / "x.zarr", X, 50) if as_path else X
    kw = dict(kw, n_clusters=3, n_init=2, random_state=0)
    seen = []
    whole = dnomad.fit(X_in, method=method, callback=lambda row: seen.append(row["iteration"]), **kw)
    kill_at = int(0.8 * len(seen))

    calls = []

    def stop_late(row):
        calls.append(row)
        if len(calls) == kill_at:
            raise _Stop

    store = str(tmp_path / "run.zarr")
    with pytest.raises(_Stop):
        dnomad.fit(X_in, method=method, store=store, callback=stop_late, **kw)
    ck = run_store.Checkpoints(store, f"{method}_checkpoint").latest()
    assert ck["init"] == 1
    # written by the row chunks, not gathered
    assert ck["held"] == (["W", "best_U", "y"] if method == "nlr" else ["V", "best_V"])
    ran = []
    if as_path:
        resumed = dnomad.resume(store, callback=lambda row: ran.append(row))
    else:
        with pytest.raises(dnomad.StoreError, match="in-memory matrix"):
            dnomad.resume(store)
        resumed = type(whole)(**kw, store=store, callback=lambda row: ran.append(row)).fit(X_in, resume=True)
    assert len(seen) - kill_at < len(ran) < len(seen)         # from the checkpoint, not from the start
    np.testing.assert_allclose(resumed.U_, whole.U_, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(resumed.labels_, whole.labels_)
    assert len(resumed.history_) == len(whole.history_)
    for got, want in zip(resumed.history_, whole.history_):
        assert set(got) == set(want)
        for key in set(want) - {"seconds"}:
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-14), (key, got, want)
    assert resumed.stop_reason_ == whole.stop_reason_ and resumed.n_iter_ == whole.n_iter_
    again = dnomad.resume(store) if as_path else type(whole)(**kw, store=store).fit(X_in, resume=True)
    assert again.fit_seconds_ == resumed.fit_seconds_                 # read back, not run again
    if method == "riemannian-kmeans":
        assert again.n_components_ == whole.n_components_ == kw.get("n_components", 3)
        assert again.explained_variance_ratio_ == pytest.approx(whole.explained_variance_ratio_, rel=1e-12)
    np.testing.assert_array_equal(again.labels_, whole.labels_)
    # Read back whole: what a fit sets, a finished run's store gives back.
    if method == "riemannian-kmeans":
        np.testing.assert_allclose(again.V_, whole.V_, rtol=0, atol=1e-12)
        np.testing.assert_allclose(again.Q_, whole.Q_, rtol=0, atol=1e-12)
        assert again.costs_ == pytest.approx(whole.costs_, rel=1e-12)
        assert again.curvature_steps_ == whole.curvature_steps_
    else:
        assert again.dual_steps_ == whole.dual_steps_


@pytest.mark.parametrize("params,match", [
    ({"n_clusters": 1}, r"n_clusters must be an int in \[2, inf\)"),
    ({"n_clusters": 3, "rank": 3}, "rank must be an integer >= 4"),
    ({"n_clusters": 3, "mu": 0.0}, "mu must be"),
    ({"n_clusters": 3, "mu": -1.0}, "mu must be"),
    ({"n_clusters": 3, "mu": [0.1, 0.2]}, "strictly decreasing"),
    ({"n_clusters": 3, "mu": "fast"}, "mu must be one of 'auto'"),
    ({"n_clusters": 3, "boundary_fraction": 1.5}, "boundary_fraction"),
    ({"n_clusters": 3, "min_eigenvalue": "always"}, "min_eigenvalue must be None or one of 'final', 'every'"),
    ({"n_clusters": 3, "backend": "zarr"}, "backend must be one of"),
])
def test_bad_riemannian_parameters_are_refused_before_x_is_read(params, match):
    class Unreadable:
        shape = (100, 3)
        ndim = 2

        def __getitem__(self, key):
            raise AssertionError("X was read")

    with pytest.raises(InputValueError, match=match):
        dnomad.RiemannianKMeans(**params).fit(Unreadable())


def test_bad_data_is_refused():
    X, _ = gmm_simplex(60, n_clusters=3, random_state=0)
    X[5, 1] = np.nan
    with pytest.raises(InputValueError, match="NaN"):
        dnomad.RiemannianKMeans(3, mu=0.1).fit(X)
    with pytest.raises(InputValueError, match="NaN"):
        dnomad.NLR(3).fit(X)
    four = np.random.default_rng(0).standard_normal((4, 2))
    # n_clusters and rank against n are named, before any pass (U > 0 needs r > K columns)
    with pytest.raises(InputValueError, match=r"n_clusters must be below the number of samples \(4\); got 4"):
        dnomad.RiemannianKMeans(4, mu=0.1).fit(four)
    with pytest.raises(InputValueError, match=r"rank must be at most the number of samples \(4\); got 5"):
        dnomad.RiemannianKMeans(3, rank=5).fit(four)
    with pytest.raises(InputValueError, match=r"n_clusters must be at most the number of samples \(4\); got 5"):
        dnomad.NLR(5).fit(four)
    with pytest.raises(InputValueError, match=r"rank must be at most the number of samples \(4\); got 5"):
        dnomad.NLR(3, rank=5).fit(four)
    # NLR's default rank 2 n_clusters is capped at n
    assert dnomad.NLR(3, random_state=0).fit(four).U_.shape == (4, 4)
    with pytest.raises(InputValueError, match="2-D"):
        dnomad.NLR(3).fit(np.zeros(10))
    for bad in ({"beta": 0}, {"step": -1.0}, {"rank": 2}, {"n_init": 0}):
        with pytest.raises(InputValueError):
            dnomad.NLR(3, **bad).fit(np.zeros((20, 2)))


def test_command_line_fit_and_info(tmp_path):
    import subprocess
    import sys

    X, y = gmm_simplex(300, n_clusters=3, gamma=1.5, random_state=0)
    np.save(tmp_path / "X.npy", X)
    store = str(tmp_path / "run.zarr")
    cli = [sys.executable, "-m", "dnomad.cli"]
    out = subprocess.run(cli + ["fit", "--input", str(tmp_path / "X.npy"), "--method", "riemannian-kmeans",
                                "--n-clusters", "3", "--store", store, "--params", '{"mu": 0.05}'],
                         capture_output=True, text=True, check=True).stdout
    assert "(tolerance)" in out
    assert clustering_accuracy(y, run_store.read_vector(store, "result/labels")) == 1.0
    info = subprocess.run(cli + ["info", store], capture_output=True, text=True, check=True).stdout
    assert "riemannian-kmeans" in info and "stop_reason=tolerance" in info


def test_group_sums_and_kmeans_rows_against_a_loop_and_scikit_learn():
    """rounding.group_sums is the loop's per-group sum (an empty group's row zero), and
    kmeans_rows reaches scikit-learn's k-means inertia on separated blobs."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_blobs

    from dnomad.rounding import group_sums, kmeans_rows

    rng = np.random.default_rng(0)
    Y = rng.standard_normal((97, 5))
    labels = rng.integers(0, 4, 97)
    labels[labels == 2] = 3                                     # group 2 empty
    expected = np.stack([Y[labels == g].sum(axis=0) for g in range(5)])
    np.testing.assert_allclose(group_sums(labels, Y, 5), expected, rtol=1e-13, atol=1e-13)
    X, _ = make_blobs(400, n_features=6, centers=5, random_state=2)
    lab = kmeans_rows(X, 5, random_state=0)
    inertia = sum(((X[lab == g] - X[lab == g].mean(axis=0)) ** 2).sum() for g in range(5))
    assert inertia <= KMeans(5, n_init=10, random_state=0).fit(X).inertia_ * (1 + 1e-9)


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_an_nlr_checkpoint_of_plain_arrays_still_resumes_to_the_same_run(tmp_path):
    """A checkpoint from before held rows (W and a 1-D y as arrays in the record, no
    ``held``) resumes as one the row chunks wrote: both end at the uninterrupted U."""
    X, _ = gmm_simplex(150, n_clusters=3, gamma=1.5, random_state=3)
    with RowChunks(X, chunk_rows=40) as data:
        whole = nlr(data, 3, random_state=0, max_iter=60)

    def kill_at_25(row, current_u):
        if row["iteration"] == 25:
            raise _Stop

    held = run_store.Checkpoints(str(tmp_path / "held.zarr"), "ck")
    with RowChunks(X, chunk_rows=40) as data, pytest.raises(_Stop):
        nlr(data, 3, random_state=0, max_iter=60, callback=kill_at_25, checkpoint=held.save, checkpoint_every=10)
    state = held.load()
    assert isinstance(state["W"], run_store.StoredRows) and state["iteration"] == 20
    plain = run_store.Checkpoints(str(tmp_path / "plain.zarr"), "ck")
    plain.save(dict(state, W=np.asarray(state["W"]), y=np.asarray(state["y"])[:, 0]))
    assert "held" not in run_store.read_json(str(tmp_path / "plain.zarr"), "ck")
    for ck in (held, plain):
        with RowChunks(X, chunk_rows=40) as data:
            resumed = nlr(data, 3, random_state=0, max_iter=60, state=ck.load())
        np.testing.assert_allclose(resumed.U, whole.U, rtol=0, atol=1e-12)
        assert resumed.n_iter == whole.n_iter


@pytest.mark.parametrize("chunk_rows", [None, 25])
@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_a_later_start_that_wins_is_the_result(chunk_rows):
    """Of n_init starts the largest <X X^T, U U^T> wins, its U kept in the row chunks
    while later starts run: on data where the second of three random starts ends highest
    (planted by the seed), three starts return the second's history, objective and U --
    the U that two starts return, not the first's or the last's -- whole or in
    chunks of 25 rows; each result's objective is its U's."""
    from dnomad.kmeans_sdp.nlr import nlr_kmeans

    X, _ = gmm_simplex(120, n_clusters=4, gamma=0.8, random_state=0)
    kw = dict(init="random", random_state=1, max_iter=300)
    runs = {k: nlr_kmeans(RowChunks(X, chunk_rows=chunk_rows), 4, n_init=k, **kw) for k in (1, 2, 3)}
    assert {row["init"] for row in runs[3].history} == {1}
    assert [row["loss"] for row in runs[3].history] == [row["loss"] for row in runs[2].history]
    assert runs[3].objective == runs[2].objective > runs[1].objective
    np.testing.assert_array_equal(runs[3].U, runs[2].U)
    assert not np.allclose(runs[3].U, runs[1].U)
    F = X - X.mean(axis=0)
    for res in runs.values():                     # the returned U's, one step after the last row's loss
        assert res.objective == pytest.approx(np.linalg.norm(F.T @ res.U) ** 2, rel=1e-12)
        assert res.objective != -res.history[-1]["loss"]
