"""The engine: passes equal the NumPy expressions, and results agree across layouts
(in process, Zarr on disk, a real 2-worker cluster, CuPy blocks on a GPU; block sizes
dividing n or not).  The "cuda" backend is the in-process one with device blocks; its
cases skip where no GPU is present.  NOMAD's own passes over these layouts are tested in
test_nomad_passes.py."""
import numpy as np
import pytest

from backends import N, TOL, make_group
from dnomad import blocks
from dnomad.errors import InputValueError


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


@pytest.mark.parametrize("block_size", [N, 16, 25])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_pass_equals_the_matrix_where_the_blocks_are(backend, client_for, block_size, dtype, tmp_path, rng):
    """``blocks.dense``: the whole matrix (lower blocks of a symmetric layout mirrored) in
    the group's dtype, a CuPy array for device blocks, in one recorded pass."""
    from dnomad.blocks.device import is_device_array, to_host

    A = rng.standard_normal((N, N))
    A = A + A.T
    bm = blocks.from_array(A, **make_group(backend, block_size, dtype, tmp_path, client_for))
    full = blocks.dense(bm.group, bm.name)
    assert is_device_array(full) == (backend == "cuda") and full.dtype == dtype
    np.testing.assert_array_equal(to_host(full), A.astype(dtype))
    rec = bm.group.passes.records[-1]
    assert rec.name == "dense" and rec.bytes_read == bm.group.matrix_nbytes and rec.bytes_written == 0
    with pytest.raises(InputValueError, match="does not hold"):
        blocks.dense(bm.group, "no such matrix")


@pytest.mark.parametrize("block_size", [16, 25])
def test_dense_pass_of_a_full_host_layout(block_size, rng):
    """``blocks.dense`` on host blocks stored whole (every block, none mirrored): an
    asymmetric matrix comes back as it is."""
    from dnomad.blocks.engine import BlockGroup
    from dnomad.blocks.layout import BlockLayout

    A = rng.standard_normal((N, N))
    layout = BlockLayout(N, block_size, symmetric=False)
    group = BlockGroup(layout, np.float64)
    blocks.zeros_like_layout(group, ["A"])
    group.map_blocks(_set_block_task, lambda key: (A[slice(*layout.bounds(key[0])), slice(*layout.bounds(key[1]))],),
                     reads=["A"], writes=["A"], name="set")
    np.testing.assert_array_equal(blocks.dense(group, "A"), A)
    group.close()


def _set_block_task(bundle, key, block):
    bundle["A"][...] = block


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
    """keep_centred (the default for X in memory) keeps each chunk's centred rows once in
    each precision a pass asked for: the same products bit for bit as converting on
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
                    assert all(set(state["_Xc"]) == {"<f4", "<f8"} for state in data._chunks.values())
                    with pytest.raises(ValueError, match="read-only"):
                        data.map(_write_rows)
                out[where, keep] = passes
    for key, passes in out.items():
        for got, want in zip(passes, out["here", False]):
            np.testing.assert_array_equal(got, want, err_msg=str(key))


def _state_names(chunk):
    return sorted(chunk)


def _overwrite_in_place(chunk, name):
    chunk[name][...] = -1.0


def test_states_a_kernel_drops_or_swaps_are_gone_from_the_chunks(cluster_client, rng):
    """A kernel that pops or swaps states (drop_states, swap_states) leaves the chunk's
    kept state as it left its dict, here and on workers: it was kept before, so dropped
    states held their memory and a moved state stayed under both names, one array,
    which a later kernel writing the old name in place changed under the new one."""
    from dnomad.nomad.box_optim import drop_states, swap_states

    X = rng.standard_normal((130, 3))
    V = rng.standard_normal((130, 2))
    for client in (None, cluster_client):
        with blocks.RowChunks(X, chunk_rows=50, client=client) as data:
            for k, name in enumerate(("a", "b", "c", "e")):
                data.put(name, V + 10 * k)
            data.map(drop_states, ["a"], read_x=False)
            data.map(swap_states, "d", "b", read_x=False)      # d absent: b moves to d
            data.map(swap_states, "c", "e", read_x=False)
            assert all(names == ["c", "d", "e"] for names in data.map(_state_names, read_x=False))
            np.testing.assert_array_equal(data.get("c"), V + 30)
            np.testing.assert_array_equal(data.get("e"), V + 20)
            data.put("b", V + 1.0)
            data.map(_overwrite_in_place, "b", read_x=False)
            np.testing.assert_array_equal(data.get("d"), V + 10)


def test_a_checkpoint_of_held_rows_is_written_by_the_chunks_and_read_back_by_others(cluster_client, rng,
                                                                                    tmp_path):
    """A state held in row chunks (``held``) is a checkpoint's value that the chunks write
    themselves, here or on workers; the record lists it as held, ``load`` gives it back
    unread (StoredRows), and row chunks of another cut, here or on workers, read their own
    rows of it to the bit; ``np.asarray`` reads it whole."""
    from dnomad.blocks.store import Checkpoints, StoredRows, read_json

    X = rng.standard_normal((130, 3))
    Y, mu = rng.random((130, 4)), rng.standard_normal(130)
    for i, (client, other) in enumerate(((None, cluster_client), (cluster_client, None))):
        url = str(tmp_path / f"run{i}.zarr")
        with blocks.RowChunks(X, chunk_rows=50, client=client) as data:
            data.put("Y", Y)
            data.put("mu", mu)
            ck = Checkpoints(url, "ck")
            ck.save({"Y": data.held("Y"), "mu": data.held("mu"), "small": np.arange(3), "lam": 0.5,
                     "history": [{"a": 1}]})
        record = read_json(url, "ck")
        assert record["held"] == ["Y", "mu"] and record["arrays"] == ["Y", "mu", "small"]
        assert record["shapes"] == {"Y": [130, 4], "mu": [130], "small": [3]}
        state = ck.load()
        assert isinstance(state["Y"], StoredRows) and state["Y"].shape == (130, 4)
        assert isinstance(state["small"], np.ndarray) and state["lam"] == 0.5
        with blocks.RowChunks(X, chunk_rows=33, client=other) as data:
            data.put("Y", state["Y"])
            data.put("mu", state["mu"])
            np.testing.assert_array_equal(data.get("Y"), Y)
            np.testing.assert_array_equal(data.get("mu"), mu)
        np.testing.assert_array_equal(np.asarray(state["Y"]), Y)
        space = blocks.RowState(130, chunk_rows=40)
        space.put("Y", state["Y"])
        np.testing.assert_array_equal(space.get("Y"), Y)


def test_held_rows_the_chunks_cannot_store_are_written_from_this_process(monkeypatch, tmp_path, rng, caplog):
    """Chunks whose writes do not reach the store (workers on another machine, writing to
    a path of the same name there) leave chunks missing: the state is then written from
    this process, with a warning, and reads back whole."""
    from dnomad.blocks import rows
    from dnomad.blocks.store import Checkpoints

    Y = rng.random((130, 4))
    monkeypatch.setattr(rows, "_write_state_rows", lambda chunk, span, name, url, path: None)
    with blocks.RowChunks(rng.standard_normal((130, 3)), chunk_rows=50) as data:
        data.put("Y", Y)
        ck = Checkpoints(str(tmp_path / "run.zarr"), "ck")
        with caplog.at_level("WARNING", logger="dnomad.blocks.rows"):
            ck.save({"Y": data.held("Y"), "history": []})
    assert "3 of 3 chunks not in the store" in caplog.text
    np.testing.assert_array_equal(np.asarray(ck.load()["Y"]), Y)


def test_held_rows_of_the_wrong_length_are_refused(tmp_path, rng):
    from dnomad.blocks.store import StoredRows, write_rows

    write_rows(str(tmp_path / "s.zarr"), "Y", rng.random((20, 2)))
    with blocks.RowChunks(rng.standard_normal((21, 2)), chunk_rows=8) as data:
        with pytest.raises(InputValueError, match="must have 21 rows; got shape \\(20, 2\\)"):
            data.put("Y", StoredRows(str(tmp_path / "s.zarr"), "Y", (20, 2)))


def _project_to_state(chunk, W):
    chunk["Xw"] = chunk["X"] @ W


def _x_and_its_sum(chunk):
    return chunk["X"].copy(), chunk["X"].sum()


def test_a_state_is_read_as_x_by_a_pass_that_names_it(cluster_client, rng):
    """map(x_state=name) hands the chunk's state ``name`` to the kernel as X (here the
    centred rows projected on W, written by an earlier pass), here and on workers, and
    counts a pass over the state, not over X."""
    X = rng.standard_normal((130, 4)) + 5.0
    W = rng.standard_normal((4, 2))
    for client in (None, cluster_client):
        with blocks.RowChunks(X, chunk_rows=50, client=client) as data:
            data.map(_project_to_state, W)
            passes, state_passes = data.passes, data.state_passes
            parts = data.map(_x_and_its_sum, x_state="Xw")
            assert (data.passes, data.state_passes) == (passes, state_passes + 1)
            np.testing.assert_allclose(np.concatenate([p[0] for p in parts]), (X - X.mean(axis=0)) @ W,
                                       rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(data.get("Xw"), (X - X.mean(axis=0)) @ W, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_passes_on_a_cluster_are_in_its_event_log_while_the_fit_runs(cluster_client):
    """Every pass a fit runs on a cluster's workers (blocks, and row chunks) is published
    to the scheduler's event log as it ends, named and with its bytes and seconds: the
    dashboard's /events page draws the "all" topic, and a callback during the fit already
    finds the passes of the iterations before."""
    import dnomad
    from dnomad.blocks.cluster import PASS_EVENTS
    from dnomad.data import gaussian_blobs, two_rings

    # The scheduler keeps the newest events of a topic only (distributed's
    # admin.low-level-log-length), so events are told apart by their time stamps, not by
    # their count: earlier tests on the same cluster may have filled the log.
    def last_stamp():
        events = cluster_client.get_events(PASS_EVENTS)
        return events[-1][0] if events else float("-inf")

    def since(stamp):
        return [msg for t, msg in cluster_client.get_events(PASS_EVENTS) if t > stamp]

    start, during = last_stamp(), []
    dnomad.NOMAD(6, sdp_k=6, backend="distributed", max_iter=3,
                 callback=lambda row: during.append(len(since(start)))).fit(two_rings(120)[0])
    events = since(start)
    assert 0 < during[0] < during[1] < during[2] <= len(events)
    nomad = [msg for msg in events if msg["pass"] == "nomad"]
    assert nomad and all(m["bytes_read"] > 0 and m["seconds"] > 0 and m["blocks"] > 0 for m in nomad)
    assert any(msg.get("action") == "dnomad nomad" for _, msg in cluster_client.get_events("all"))

    start = last_stamp()
    dnomad.RiemannianKMeans(3, backend="distributed", random_state=0).fit(
        gaussian_blobs(80, n_centers=3, random_state=0)[0])
    rows = since(start)
    assert rows and {"chunks", "rows", "seconds"} <= set(rows[0]) and any(m["rows"] == 80 for m in rows)


@pytest.mark.parametrize("block_size,symmetric", [(25, True), (30, True), (40, False), (70, False)])
def test_saved_upper_blocks_load_whole_into_any_layout(block_size, symmetric, tmp_path, rng):
    """A checkpoint saved from a symmetric layout holds only its upper blocks; loaded into
    a full layout (a GPU's) or one with another block size, the entries that fall in its
    lower blocks come from their mirror images, not from the unwritten zeros."""
    from dnomad.blocks.engine import BlockGroup
    from dnomad.blocks.layout import BlockLayout

    n = 70
    A = rng.standard_normal((n, n))
    A = A + A.T
    saved = blocks.from_array(A, name="P", dtype=np.float64, block_size=25)
    saved.group.save(["P"], str(tmp_path / "run.zarr"), "checkpoint")
    saved.group.close()
    group = BlockGroup(BlockLayout(n, block_size, symmetric=symmetric), np.float64)
    group.load(["P"], str(tmp_path / "run.zarr"), "checkpoint")
    np.testing.assert_array_equal(blocks.BlockMatrix(group, "P").to_numpy(), A.astype(np.float64))
    group.close()


def test_a_zarr_matrix_is_probed_by_corners_of_its_blocks(tmp_path, rng):
    """from_zarr checks a sample of the matrix before any pass -- finite and symmetric --
    reading only the leading PROBE_SIDE x PROBE_SIDE corner of each block it probes:
    this process then holds Zarr's decode of one chunk and the corners (2.5 blocks of
    17 MiB here at its peak), where reading whole blocks and their transposes took 4.3;
    a NaN or an asymmetry in a probed corner is refused with the block named, and
    ``check=False`` (a matrix the caller has just written) reads nothing."""
    import tracemalloc

    import zarr

    from dnomad.blocks.builders import PROBE_SIDE

    n = 1500
    A = rng.random((n, n))
    A = A + A.T

    def write(M, name):
        path = str(tmp_path / name)
        zarr.create_array(store=path, shape=M.shape, dtype=M.dtype, chunks=(n, n))[...] = M
        return path

    kw = dict(backend="zarr", store=str(tmp_path / "run.zarr"))
    good = write(A, "A.zarr")
    tracemalloc.start()
    try:
        D = blocks.from_zarr(good, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * A.nbytes
    np.testing.assert_array_equal(np.asarray(D), A)
    bad = A.copy()
    bad[3, PROBE_SIDE - 1] += 1.0
    with pytest.raises(InputValueError, match=r"symmetric; blocks \(0,0\)"):
        blocks.from_zarr(write(bad, "asym.zarr"), **kw)
    bad = A.copy()
    bad[PROBE_SIDE - 1, 0] = np.nan
    with pytest.raises(InputValueError, match=r"NaN or Inf \(block 0,0\)"):
        blocks.from_zarr(write(bad, "nan.zarr"), **kw)
    reads = []
    get = zarr.Array.__getitem__
    try:
        zarr.Array.__getitem__ = lambda self, sel: reads.append(sel) or get(self, sel)
        blocks.from_zarr(str(tmp_path / "asym.zarr"), check=False, **kw)
    finally:
        zarr.Array.__getitem__ = get
    assert reads == []
