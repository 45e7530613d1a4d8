"""dnomad.plan: what each row-chunk method declares it holds is what its chunks hold at
their peak, byte for byte; the plan's arithmetic over workers, chunks and blocks; its
errors; `dnomad plan`."""
import warnings

import numpy as np
import pytest
import zarr

import dnomad
from dnomad.blocks import RowChunks
from dnomad.blocks import cluster as engine_cluster
from dnomad.cli import main
from dnomad.data import gaussian_blobs
from dnomad.errors import InputValueError

# Fits and plans here run in this process unless a test connects its own cluster.
pytestmark = pytest.mark.usefixtures("no_default_client")


def _state_bytes(chunks):
    total = 0
    for state in chunks.values():
        for value in state.values():
            values = value.values() if isinstance(value, dict) else [value]      # "_Xc": by dtype
            total += sum(v.nbytes for v in values if hasattr(v, "nbytes"))
    return total


@pytest.fixture
def peak_state(monkeypatch):
    """The largest total of the row chunks' states (bytes) after any task of a fit."""
    peak = {"bytes": 0}
    run = RowChunks._run

    def measured(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        peak["bytes"] = max(peak["bytes"], _state_bytes(self._chunks))
        return out

    monkeypatch.setattr(RowChunks, "_run", measured)
    return peak


@pytest.mark.parametrize("method,params", [
    ("nomad", dict(solver="bm", sdp_k=4, max_iter=3)),
    ("nomad", dict(solver="bm", sdp_k=5, rank=7, max_iter=2, solver_options={"memory": 2})),
    ("nomad", dict(solver="bm", sdp_k=4, max_iter=2, solver_options={"optimizer": "spg"})),
    ("nlr", dict(max_iter=5)),
    ("nlr", dict(max_iter=5, n_init=2)),                        # the best start's U beside the second's
    # d = 40: X's sketch on 15 components; the Hessian's eigensolve at the end
    ("riemannian-kmeans", dict(max_iter=3, min_eigenvalue="final")),
    ("riemannian-kmeans", dict(max_iter=3, n_components=None, n_init=2, min_eigenvalue="final")),
    ("riemannian-kmeans", dict(max_iter=3, second_order=False)),
], ids=["bm", "bm-rank-memory", "bm-spg", "nlr", "nlr-starts", "riemannian-sketch", "riemannian-starts",
        "riemannian-first-order"])
@pytest.mark.parametrize("in_zarr", [False, True], ids=["numpy", "zarr"])
def test_declared_rows_are_what_the_chunks_hold_at_their_peak(method, params, in_zarr, peak_state, tmp_path):
    """In this process the chunks keep their state and, from a NumPy X, X's centred
    copies (x_rows); from a Zarr X each task reads and centres its rows instead."""
    X = gaussian_blobs(900, n_centers=3, n_features=40, separation=6.0, random_state=0)[0]
    est = dnomad.api.ESTIMATORS[method](n_clusters=3, random_state=0, **params)
    declared = est._memory_parts(*X.shape)
    data = X
    if in_zarr:
        data = str(tmp_path / "X.zarr")
        zarr.create_array(store=data, shape=X.shape, chunks=(200, 40), dtype="f8")[...] = X
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        est.fit(data)
    held = sum(declared.rows.values()) + (0 if in_zarr else sum(declared.x_rows.values()))
    assert peak_state["bytes"] == held * len(X)


def test_the_plan_shares_rows_chunk_by_chunk_and_says_what_a_worker_needs(tmp_path):
    """Row chunks go to workers whole: a Zarr X of 10^6 rows in 62,500-row chunks (its
    metadata only: no value is written or read) on 3 workers puts 6 chunks on the
    busiest; a worker's total is its footprint, its rows' states and one task's
    temporaries, and the least limit it needs is that over the nanny's 95%; the client
    holds the labels and a seeding sample, not Y."""
    from dnomad.nomad import bm

    url = str(tmp_path / "X.zarr")
    zarr.create_array(store=url, shape=(1_000_000, 3), chunks=(62_500, 3), dtype="f8")
    parts = dnomad.NOMAD(n_clusters=8, solver="bm")._memory_parts(1_000_000, 3)
    plan = dnomad.plan(url, "nomad", n_clusters=8, solver="bm", n_workers=3, worker_memory="8 GiB")
    r = 64                                            # 2 sdp_k; sdp_k = 32 for 8 clusters at this n
    expected = (engine_cluster.ROW_WORKER_FOOTPRINT_BYTES + 6 * 62_500 * sum(parts.rows.values())
                + 62_500 * (8 * r * bm.TASK_ROW_TEMPORARIES + 8 * 3 + sum(parts.x_rows.values())))   # X read per task
    assert plan.chunk_rows == 62_500 and plan.worker_total == expected
    assert plan.worker_memory == 8 << 30 and plan.fits and "fits under 95%" in str(plan)
    assert plan.worker_memory_needed == int(np.ceil(expected / engine_cluster.TERMINATE_FRACTION))
    assert plan.client_total < 0.2 * 8 * 1_000_000 * r and not any("Y" in part for part in plan.client)   # not Y
    small = dnomad.plan(url, "nomad", n_clusters=8, solver="bm", n_workers=3, worker_memory=2 << 30)
    assert not small.fits and "does NOT fit" in str(small)
    assert small.worker_memory_needed == plan.worker_memory_needed
    assert (small.worker_total - engine_cluster.ROW_WORKER_FOOTPRINT_BYTES) > 1.9 * (
        dnomad.plan(url, "nomad", n_clusters=8, solver="bm", n_workers=6, worker_memory="8 GiB").worker_total
        - engine_cluster.ROW_WORKER_FOOTPRINT_BYTES)              # 6 workers: 3 chunks each instead of 6
    # two threads a worker: two tasks' temporaries; an X in memory: each worker's rows of it
    # and their centred copies instead of a chunk read per task
    threads = dnomad.plan(url, "nomad", n_clusters=8, solver="bm", n_workers=3, worker_memory="8 GiB",
                          threads_per_worker=2)
    assert threads.worker_total - plan.worker_total == 62_500 * (
        8 * r * bm.TASK_ROW_TEMPORARIES + 8 * 3 + sum(parts.x_rows.values()))
    in_memory = dnomad.plan((1_000_000, 3), "nomad", n_clusters=8, solver="bm", n_workers=3, worker_memory="8 GiB")
    assert in_memory.chunk_rows == 8192 and any("X's rows as given" in part for part in in_memory.worker)


def test_block_methods_keep_their_matrices_in_memory_or_in_the_store():
    """CGM's three n x n matrices (upper blocks, float32) in the workers' memory when they
    fit in half of it, else in Zarr, with the store named where none is given; a task
    holds TASK_BLOCKS blocks whose side follows the workers' limit."""
    n = 20_000
    upper = 3 * n * n / 2 * 4
    roomy = dnomad.plan((n, 10), "nomad", n_clusters=4, n_workers=4, worker_memory="4 GiB")
    assert roomy.where.endswith("in the workers' memory") and not roomy.disk
    assert roomy.worker["3 n x n matrices' blocks (a share)"] == int(upper / 4)
    tight = dnomad.plan((n, 10), "nomad", n_clusters=4, n_workers=2, worker_memory="384 MiB")
    assert tight.where.endswith("in Zarr (the store)") and tight.disk["3 n x n matrices' upper blocks"] == int(upper)
    assert any("needs store=" in note for note in tight.notes)
    assert not any("store" in note for note in dnomad.plan((n, 10), "nomad", n_clusters=4, n_workers=2,
                                                           worker_memory="384 MiB", store="run.zarr").notes)
    side = tight.block_size
    assert tight.worker[f"one task's blocks ({engine_cluster.TASK_BLOCKS})"] == engine_cluster.TASK_BLOCKS * side**2 * 4
    assert side < roomy.block_size                           # less room under 384 MiB: smaller blocks


def test_symnmf_declares_its_local_scales_and_its_matrix_follows_the_backend():
    """SymNMF's client parts for its local scales (the neighbour table and the larger of
    a block of squared distances and the calibration's sample) cover what making them
    holds, traced, within 1.5x; P is one matrix, in the store under backend="zarr" (in
    the given blocks) and in the workers' memory where it fits otherwise."""
    import tracemalloc

    from dnomad.symnmf.estimator import calibrated_scales

    X = gaussian_blobs(3000, n_centers=4, n_features=5, random_state=0)[0]
    tracemalloc.start()
    try:
        calibrated_scales(X, 4)
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    client = dnomad.SymNMF(4)._memory_parts(*X.shape).client
    declared = sum(v for k, v in client.items() if "neighbour table" in k or "squared distances" in k)
    assert traced <= declared <= 1.5 * traced
    zarr_plan = dnomad.plan(X, "symnmf", n_clusters=4, backend="zarr", block_size=500, store="run.zarr",
                            n_workers=2, worker_memory="2 GiB")
    assert zarr_plan.where.endswith("in Zarr (the store)") and zarr_plan.block_size == 500
    assert zarr_plan.disk["1 n x n matrices' upper blocks"] == int(3000 * 3000 / 2 * 4)       # float32
    assert dnomad.plan(X, "symnmf", n_clusters=4, n_workers=2, worker_memory="2 GiB").where.endswith(
        "in the workers' memory")


def _traced_peak(fit):
    import tracemalloc

    tracemalloc.start()
    try:
        fit()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("method,make,data", [
    # C and the projection's copies (f^2) dominate; X's columns and the residual's chunks (f n)
    ("hottopixx", lambda: dnomad.Hottopixx(4, n_epochs=2, clean_epochs=2, random_state=0), (1200, 500)),
    ("hottopixx", lambda: dnomad.Hottopixx(4, n_epochs=2, clean_epochs=2, random_state=0), (200, 30000)),
    ("bregman", lambda: dnomad.BregmanClustering(3, model="cond-jc", max_iter=5, random_state=0), "blobs"),
    ("bregman", lambda: dnomad.BregmanClustering(3, model="cond", max_iter=5, random_state=0), "blobs"),
    ("bregman", lambda: dnomad.BregmanClustering(3, model="disc", max_iter=5, random_state=0), "blobs"),
    ("bregman", lambda: dnomad.BregmanClustering(3, model="joint", max_iter=5, random_state=0), "blobs"),
], ids=["hottopixx-C", "hottopixx-X", "bregman-cond-jc", "bregman-cond", "bregman-disc", "bregman-joint"])
def test_in_process_methods_declare_their_traced_peak(method, make, data):
    """HOTTOPIXX on X in memory and Bregman clustering run in this process: what they
    declare for the client is the traced peak of a fit (after one to warm up) within
    10%, and they declare nothing on workers."""
    if data == "blobs":            # 50 features: the smaller models' peaks are MBs, not a fixed overhead
        X = gaussian_blobs(1000, n_centers=3, n_features=50, random_state=0)[0]
    else:
        X = np.random.default_rng(0).random(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        make().fit(X[:100, :100] if method == "hottopixx" else X[:100])
        peak = _traced_peak(lambda: make().fit(X))
    plan = dnomad.plan(X, method, **make().get_params())
    assert plan.where == "in this process (no workers)" and not plan.worker
    assert 0.9 * peak <= plan.client_total <= 1.1 * peak
    assert plan.client_fits and "the client fits in the" in str(plan)


def test_hottopixx_out_of_core_stages_x_and_runs_its_tasks_on_the_workers(tmp_path):
    """A Zarr X too large for a quarter of this process's memory is staged in the store
    as X^T by columns, and each epoch's tasks read its chunks on the workers (C stays in
    the client); one that fits is read into the client."""
    f, m = 2000, 10**9
    url = str(tmp_path / "X.zarr")
    zarr.create_array(store=url, shape=(f, m), chunks=(f, 10**6), dtype="f8")      # metadata only
    staged = dnomad.plan(url, "hottopixx", rank=5, n_workers=3, worker_memory="16 GiB")
    assert staged.where == "tasks on the workers, reading X from the store"
    assert any("the fit needs store=" in note for note in staged.notes)
    assert staged.disk == {"X^T, staged by columns": 8 * f * m}
    assert staged.client["C (f x f)"] == 8 * f * f and not any("X^T" in k for k in staged.client)
    assert staged.worker["C, sent to each worker for a residual pass"] == 8 * f * f


def test_hottopixx_from_a_zarr_x_that_fits_declares_its_traced_peak(tmp_path):
    """A Zarr X that fits is read whole into the client and kept while X^T is made: the
    plan counts both, within 10% of a fit's traced peak; Bregman's models that need X
    in memory are refused from Zarr by the plan as by the fit."""
    url = str(tmp_path / "X.zarr")
    zarr.create_array(store=url, shape=(200, 30000), chunks=(200, 5000), dtype="f8")[...] = \
        np.random.default_rng(0).random((200, 30000))
    make = lambda: dnomad.Hottopixx(4, n_epochs=2, clean_epochs=2, random_state=0)     # noqa: E731
    make().fit(url)
    peak = _traced_peak(lambda: make().fit(url))
    plan = dnomad.plan(url, "hottopixx", **make().get_params())
    assert plan.client["X read from where it is (kept while X^T is made)"] == 8 * 200 * 30000
    assert 0.9 * peak <= plan.client_total <= 1.1 * peak
    with pytest.raises(InputValueError, match="read by row chunks for model='cond' and 'cond-jc' only"):
        dnomad.plan(url, "bregman", n_clusters=3, model="disc")


@pytest.mark.parametrize("call,message", [
    (lambda: dnomad.plan((100, 3), "nomad", n_clusters=2, worker_memory="lots"), "worker_memory must be"),
    (lambda: dnomad.plan((100, 3), "nomad", n_clusters=2, n_workers=0), "n_workers must be a positive"),
    (lambda: dnomad.plan((1, 3), "nomad", n_clusters=2), "at least 2 rows"),
    (lambda: dnomad.plan(np.zeros(5), "nomad", n_clusters=2), "data must be X"),
    (lambda: dnomad.plan((100, 3), "kmeans", n_clusters=2), "method must be one of"),
    (lambda: dnomad.plan((100, 3), "nomad", n_clusters=2, solver="cgm", rank=4), "rank is the Burer-Monteiro"),
    (lambda: dnomad.plan((100, 3), "nlr", n_clusters=200), "at most the number of samples"),
])
def test_a_plan_refuses_what_a_fit_would_refuse(call, message):
    with pytest.raises(InputValueError, match=message):
        call()


def test_dnomad_plan_prints_the_plan(tmp_path, capsys):
    np.save(tmp_path / "X.npy", np.zeros((5000, 4)))
    assert main(["plan", "--input", str(tmp_path / "X.npy"), "--n-clusters", "3", "--params",
                 '{"solver": "bm"}', "--workers", "2", "--worker-memory", "1 GiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dnomad plan: nomad on 5,000 x 4, state in X's row chunks, 2 workers of 1.0 GiB")
    assert "each worker:" in out and "the client:" in out and "fits under 95%" in out
    assert main(["plan", "--shape", "1000000x3", "--n-clusters", "8", "--params", '{"solver": "bm"}',
                 "--workers", "2", "--worker-memory", "2 GiB"]) == 0
    assert "does NOT fit" in capsys.readouterr().out
    assert main(["plan", "--shape", "100x3", "--n-clusters", "2", "--params", '{"sovler": "bm"}']) != 0
    assert "did you mean 'solver'" in capsys.readouterr().err
    assert main(["plan", "--shape", "20000x10", "--n-clusters", "4", "--workers", "2", "--worker-memory",
                 "512 MiB", "--params", '{"dtype": "float64", "store": "run.zarr"}']) == 0
    out = capsys.readouterr().out
    assert "matrices in blocks in Zarr" in out and "needs store=" not in out
    assert main(["plan", "--shape", "2000x5000", "--method", "hottopixx", "--n-clusters", "5"]) == 0  # its rank
    out = capsys.readouterr().out
    assert out.startswith("dnomad plan: hottopixx on 2,000 x 5,000, in this process (no workers)\n")
    assert "C (f x f)" in out and "the client fits in the" in out


@pytest.mark.parametrize("make,more", [
    (lambda: dnomad.NOMAD(n_clusters=8, solver="bm", backend="distributed"),         # one chunk is too much
     "or X rechunked to at most 12,500 rows a chunk (it has 50,000) and more workers"),
    (lambda: dnomad.NLR(n_clusters=8, backend="distributed"), "or 3 workers of this limit")], ids=["bm", "nlr"])
def test_workers_too_small_for_their_share_are_refused_before_any_pass(make, more, tmp_path):
    """A Zarr X of 4 x 10^6 rows in chunks of 50,000 whose chunks were never written: a
    fit on 2 workers of 400 MiB is refused before it reads a row (an unwritten chunk
    would read as zeros, a constant X), naming the limit its workers would need, the
    plan's, and how many workers of 400 MiB would do where some number would (chunks
    go to workers whole: NLR's hold 27 chunks each on 3 workers), else the chunk rows
    that would let more share it (BM: one 50,000-row chunk's state is more than 400 MiB)."""
    from distributed import Client, LocalCluster

    url = str(tmp_path / "X.zarr")
    zarr.create_array(store=url, shape=(4_000_000, 3), chunks=(50_000, 3), dtype="f8")
    est = make()
    needed = dnomad.plan(url, est._method if hasattr(est, "_method") and est._method else "nomad",
                         n_workers=2, worker_memory="400 MiB", **est.get_params()).worker_memory_needed
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, memory_limit="400MiB",
                      dashboard_address=None) as cluster, Client(cluster):
        with pytest.raises(InputValueError) as info:
            est.fit(url)
    message = str(info.value)
    assert "on the busiest of the 2 workers" in message and "smallest worker memory limit, 0.39 GiB" in message
    assert f"start workers with a memory limit of at least {needed / 2**30:.2f} GiB" in message
    assert message.endswith(more)
    assert not hasattr(est, "labels_")
