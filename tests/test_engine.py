"""The engine: passes equal the NumPy expressions, and results agree across layouts
(in process, Zarr on disk, a real 2-worker cluster, CuPy blocks on a GPU; block sizes
dividing n or not).  The "cuda" backend is the in-process one with device blocks; its
cases skip where no GPU is present."""
import numpy as np
import pytest

from devices import CUDA
from dnomad import blocks
from dnomad.nomad import passes as nomad_passes
from dnomad.nomad.cgm import NomadParams, nomad_cgm

N = 50
# eps x size: float32 sums of ~n terms of O(1) values.
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def make_group(backend, block_size, dtype, tmp_path, client):
    if backend == "cuda":
        return dict(block_size=block_size, dtype=dtype, backend="local", device="cuda")
    kw = dict(block_size=block_size, dtype=dtype, backend=backend)
    if backend == "zarr":
        kw["store"] = str(tmp_path / "state.zarr")
    if backend == "distributed":
        kw["client"] = client
    return kw


@pytest.fixture(params=["local", "zarr", "distributed", CUDA])
def backend(request):
    return request.param


@pytest.fixture
def client_for(backend, request):
    return request.getfixturevalue("cluster_client") if backend == "distributed" else None


@pytest.mark.parametrize("block_size", [N, 16, 25])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmat_equals_numpy(backend, client_for, block_size, dtype, tmp_path, rng):
    A = rng.standard_normal((N, N))
    A = A + A.T
    bm = blocks.from_array(A, **make_group(backend, block_size, dtype, tmp_path, client_for))
    Af = A.astype(dtype).astype(np.float64)
    V = rng.standard_normal((N, 3))
    np.testing.assert_allclose(bm.matmat(V), Af @ V.astype(dtype), rtol=0, atol=TOL[dtype] * 10 * N)
    np.testing.assert_allclose(bm.matvec(V[:, 0]), Af @ V[:, 0].astype(dtype), atol=TOL[dtype] * 10 * N)
    np.testing.assert_allclose(bm.diag(), np.diag(Af), atol=0)
    np.testing.assert_allclose(np.asarray(bm), Af, atol=0)
    s = bm.summary()
    assert s["sum"] == pytest.approx(Af.sum(), abs=TOL[dtype] * N * N)
    assert s["min"] == pytest.approx(Af.min()) and s["max"] == pytest.approx(Af.max())


@pytest.mark.parametrize("block_size", [N, 16, 25])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["scattered", "runs"])
def test_label_sums_equal_one_hot_product(backend, client_for, block_size, dtype, order, tmp_path, rng):
    """A @ S for a one-hot S, on both kernels: scattered labels and runs of equal labels
    (the run kernel needs runs of 16 or more per block)."""
    A = rng.random((N, N))
    A = A + A.T
    k = 3
    labels = rng.integers(0, k, N)
    if order == "runs":
        labels = np.repeat(np.arange(k), [17, 20, N - 37])
    bm = blocks.from_array(A, **make_group(backend, block_size, dtype, tmp_path, client_for))
    want = A.astype(dtype).astype(np.float64) @ np.eye(k)[labels]
    # float64 accumulation: only the blocks' rounding to dtype differs from numpy's.
    np.testing.assert_allclose(bm.label_sums(labels, k), want, rtol=1e-12, atol=1e-12)
    rec = bm.group.passes.records[-1]
    assert rec.name == "label_sums" and rec.bytes_read == bm.group.matrix_nbytes


@pytest.mark.parametrize("block_size", [N, 16])
@pytest.mark.parametrize("from_data,d", [(True, 3), (True, 12), (False, 3)])
def test_nomad_pass_equals_numpy(backend, client_for, block_size, from_data, d, tmp_path, rng):
    """D given, or formed in the pass from few features (inline) or many (a GEMM per block)."""
    dtype = np.float64
    X = rng.standard_normal((N, d))
    F = blocks.prepare_gram_data(X)
    D = F @ F.T
    kw = make_group(backend, block_size, dtype, tmp_path, client_for)
    if from_data:
        group = blocks.new_group(N, **kw)
        data = blocks.DataPanels(group, F)
    else:
        group = blocks.from_array(D, **kw).group
        data = None
    blocks.zeros_like_layout(group, ["P", "Gamma"])
    P = np.zeros((N, N))
    Gam = np.zeros((N, N))
    v = rng.standard_normal(N)
    v -= v.mean()
    v /= np.linalg.norm(v)
    # The last pass is an inner pass as the solver runs it: only <G, P> is reduced.
    for step, upd, full in [(0.5, False, True), (0.25, True, True), (0.1, True, True),
                            (0.3, False, False)]:
        stats = nomad_passes.nomad_pass(group, v=v, step=step, vv_scale=7.0, gamma=1.3, tau=0.9,
                                  update_gamma=upd, full_stats=full, data=data)
        P = (1 - step) * P + step * 7.0 * np.outer(v, v)
        v = np.roll(v, 7)
        Q = P + 1.0 / N
        if upd:
            Gam = np.minimum(Gam + 0.9 * Q, 0)
        G = -D + Gam + 1.3 * np.minimum(Q, 0)
        np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "P")), P, atol=1e-12)
        np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "Gamma")), Gam, atol=1e-12)
        np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "G")), G, atol=1e-12)
        neg = Q[Q < 0]
        assert stats["sum_GP"] == pytest.approx(np.sum(G * P), rel=1e-10)
        if not full:
            assert all(np.isnan(val) for key, val in stats.items() if key != "sum_GP")
            continue
        assert stats["sum_DQ"] == pytest.approx(np.sum(D * Q), rel=1e-10)
        assert stats["neg_count"] == neg.size
        assert stats["neg_sumsq"] == pytest.approx(np.sum(neg ** 2), rel=1e-10)
        assert stats["min_Q"] == pytest.approx(Q.min(), rel=1e-12)
    rec = group.passes.records[-1]
    assert rec.name == "nomad" and rec.bytes_read > 0 and rec.bytes_written > 0 and rec.seconds > 0


def short_run(dtype, **kw):
    X = np.c_[np.cos(np.linspace(0, 6, 60)), np.sin(np.linspace(0, 6, 60)) * 0.7]
    F = blocks.prepare_gram_data(X)
    group = blocks.new_group(60, dtype=dtype, **kw)
    data = blocks.DataPanels(group, F.astype(dtype))
    res = nomad_cgm(group, NomadParams(n_clusters=5, max_iter=4, n_inner=5, rmse_tol=0, min_tol=0,
                                       objective_tol=0), data=data)
    return np.asarray(res.Q, dtype=np.float64), res.history


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float64, 1e-10)])
def test_nomad_equal_across_layouts(dtype, rtol, tmp_path, cluster_client):
    ref, ref_hist = short_run(dtype, backend="local", block_size=60)
    variants = {
        "local-b17": dict(backend="local", block_size=17),
        "zarr-b20": dict(backend="zarr", block_size=20, store=str(tmp_path / "z.zarr")),
        "dist-b60": dict(backend="distributed", block_size=60, client=cluster_client),
        "dist-b23": dict(backend="distributed", block_size=23, client=cluster_client),
    }
    for name, kw in variants.items():
        Q, hist = short_run(dtype, **kw)
        err = np.linalg.norm(Q - ref) / np.linalg.norm(ref)
        assert err <= rtol, (name, err)
        assert hist[-1]["objective"] == pytest.approx(ref_hist[-1]["objective"], rel=rtol), name


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_one_vs_two_workers_equal(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            Client(c) as client:
        one, _ = short_run(np.float64, backend="distributed", block_size=20, client=client)
    two, _ = short_run(np.float64, backend="local", block_size=20)
    assert np.linalg.norm(one - two) / np.linalg.norm(two) <= 1e-10



@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("d", [2, 12])
def test_factored_gram_leaves_d_out_and_tracks_its_inner_product(d, tmp_path, rng):
    """With data panels NOMAD never forms D = F F^T: the pass writes G' = Gamma + gamma [Q]_-
    and the solver tracks <D, P> along the Frank-Wolfe steps.  The run equals one over the
    stored D (iterates to round-off), and the tracked <D, P> (kept in the checkpoint, or
    recomputed from P) equals the dense value."""
    import math

    from dnomad.blocks import store as run_store
    from dnomad.nomad.cgm import CHECKPOINT_KEY, _FactoredGram

    F = blocks.prepare_gram_data(rng.standard_normal((N, d)))
    D = F @ F.T
    params = NomadParams(n_clusters=4, max_iter=4, n_inner=5, rmse_tol=0, min_tol=0, objective_tol=0,
                         checkpoint_every=2)
    group = blocks.new_group(N, dtype=np.float64, backend="local", block_size=16)
    data = blocks.DataPanels(group, F)
    store = str(tmp_path / "run.zarr")
    res = nomad_cgm(group, params, data=data, store=store)
    assert "D" not in group.names
    stored = blocks.from_array(D, dtype=np.float64, block_size=16)
    ref = nomad_cgm(stored.group, params)
    # Round-off, grown by 20 eigensolves at loose early tolerances: 2e-12 with AVX-512
    # BLAS kernels, 1e-13 with AVX2 ones.  A D term 1% off moves Q by 8e-3 (d = 2) to 4e-2.
    np.testing.assert_allclose(np.asarray(res.Q), np.asarray(ref.Q), rtol=0, atol=1e-10)
    for key in ("objective", "fw_gap", "rmse_neg"):
        assert res.history[-1][key] == pytest.approx(ref.history[-1][key], rel=1e-9), key
    P = np.asarray(res.P)
    want = np.sum(D * P)
    assert run_store.Checkpoints(store, CHECKPOINT_KEY).latest()["gram_inner_p"] == pytest.approx(want, rel=1e-10)
    ones = np.ones(N) / math.sqrt(N)
    assert _FactoredGram(data, group, ones, None).inner_p == pytest.approx(want, rel=1e-10)
    # The pass itself: G' leaves D out.
    nomad_passes.nomad_pass(group, v=None, step=0.0, vv_scale=3.0, gamma=1.3, tau=0.9, update_gamma=False,
                      data=data, exclude_d=True)
    Gam = np.asarray(blocks.BlockMatrix(group, "Gamma"))
    np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "G")),
                               Gam + 1.3 * np.minimum(P + 1.0 / N, 0), rtol=0, atol=1e-13)


def _operand_layout_and_products(chunk, name, Q):
    V = chunk[name]
    return V.flags.aligned, Q.flags.aligned, V.T @ (1.0 / (1.0 + V @ Q.T)), V @ Q.T


def test_worker_kernels_get_aligned_operands_and_match_in_process(cluster_client, rng):
    """Small arrays reach an actor as views into its message frame, at odd byte offsets;
    NumPy's matmul then bypasses BLAS and sums in another order.  Worker kernels must
    see aligned state and arguments, and so give the in-process products bit for bit."""
    X = rng.standard_normal((300, 3))
    V = rng.random((300, 3))
    Q = rng.random((4, 3))
    out = {}
    for where, client in (("here", None), ("workers", cluster_client)):
        with blocks.RowChunks(X, chunk_rows=40, client=client) as data:
            data.put("V", V)
            out[where] = data.map(_operand_layout_and_products, "V", Q)
    assert all(v_aligned and q_aligned for v_aligned, q_aligned, *_ in out["workers"])
    for here, there in zip(out["here"], out["workers"]):
        np.testing.assert_array_equal(there[2], here[2])
        np.testing.assert_array_equal(there[3], here[3])


def _centred_rows(chunk):
    return chunk["X"]


def test_row_chunks_centre_in_float64_before_a_float32_cast(rng):
    """Rows far from the origin keep their spread in a float32 pass: centred in float64,
    then cast (cast first, float32's spacing at 1e6 is 0.06 and the spread of 0.01-scale
    rows is lost)."""
    X = 1e6 + 0.01 * rng.standard_normal((200, 4))
    exact = X - X.mean(axis=0)
    with blocks.RowChunks(X, chunk_rows=64) as data:
        rows = np.concatenate(data.map(_centred_rows, dtype=np.float32))
    assert rows.dtype == np.float32
    np.testing.assert_allclose(rows, exact, rtol=1e-6, atol=1e-9)


def _row_products(chunk):
    return chunk["X"].T @ chunk["V"], chunk["X"].dtype.name


def _write_rows(chunk):
    chunk["X"] += 1.0


def test_kept_centred_rows_give_the_passes_of_rows_centred_every_time(cluster_client, rng):
    """keep_centred (the default for X in memory) keeps each chunk's centred rows for the
    next pass in the same precision: the same products bit for bit as converting on
    every pass, through precision changes, in this process and on workers; a kernel
    cannot write the kept rows."""
    X = (rng.random((230, 5)) * 255).astype(np.float32)
    V = rng.standard_normal((230, 2))
    out = {}
    for where, client in (("here", None), ("workers", cluster_client)):
        for keep in (False, True):
            with blocks.RowChunks(X, chunk_rows=64, client=client, keep_centred=keep) as data:
                data.put("V", V)
                passes = []
                for dtype in (np.float32, np.float32, np.float64, np.float64, np.float32):
                    parts = data.map(_row_products, dtype=dtype)
                    assert all(name == np.dtype(dtype).name for _, name in parts)
                    passes.append(np.concatenate([p[0].ravel() for p in parts]))
                if keep and client is None:
                    with pytest.raises(ValueError, match="read-only"):
                        data.map(_write_rows)
                out[where, keep] = passes
    for key, passes in out.items():
        for got, want in zip(passes, out["here", False]):
            np.testing.assert_array_equal(got, want, err_msg=str(key))
