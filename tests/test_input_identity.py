"""A run's input is identified by content: a Zarr input rewritten under an interrupted
run (same path, same shape) is refused by name on resume, from the API and the CLI, for
every method that resumes from a Zarr input; the same input, restored, resumes to the
uninterrupted result.  A resume whose parameters or in-memory input differ says what
changed."""
import os
import warnings

import numpy as np
import pytest
import zarr

import dnomad
from dnomad import cli
from dnomad.blocks import digest
from dnomad.blocks import store as run_store
from dnomad.errors import InputChangedError
from dnomad.data import gaussian_blobs, separable_nmf

N = 120


class Interrupted(Exception):
    pass


def _stop_after(iterations):
    def callback(row, *_):
        if row.get("iteration", row.get("epoch", 0)) >= iterations:
            raise Interrupted
    return callback


def _inputs():
    X = gaussian_blobs(N, n_centers=3, random_state=0)[0]
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return {"data": X, "gram": X @ X.T, "affinity": np.exp(-sq / np.median(sq)),
            "columns": separable_nmf(20, N, 3, random_state=2)["X"]}


# method -> (estimator, its parameters, input kind, Zarr chunks of the input); runs
# capped at a few iterations (the reference stops there too).
CASES = {
    "nomad-cgm-gram-loaded": (dnomad.NOMAD, dict(n_clusters=3, sdp_k=3, precomputed=True, backend="local",
                                                 block_size=40, max_iter=8), "gram", (40, 40)),
    "nomad-cgm-gram-in-place": (dnomad.NOMAD, dict(n_clusters=3, sdp_k=3, precomputed=True, backend="zarr",
                                                   block_size=40, max_iter=8), "gram", (40, 40)),
    "nomad-cgm-gram-rechunked": (dnomad.NOMAD, dict(n_clusters=3, sdp_k=3, precomputed=True, backend="zarr",
                                                    block_size=60, max_iter=8), "gram", (40, 40)),
    "nomad-bm-data": (dnomad.NOMAD, dict(n_clusters=3, sdp_k=3, solver="bm", max_iter=6), "data", (40, 2)),
    "nomad-bm-gram": (dnomad.NOMAD, dict(n_clusters=3, sdp_k=3, solver="bm", precomputed=True, max_iter=6), "gram",
                      (40, 40)),
    "symnmf-affinity": (dnomad.SymNMF, dict(n_clusters=3, affinity="precomputed", max_iter=40), "affinity",
                        (40, 40)),
    "riemannian": (dnomad.RiemannianKMeans, dict(n_clusters=3, max_iter=8), "data", (40, 2)),
    "nlr": (dnomad.NLR, dict(n_clusters=3, record_every=1, max_iter=20), "data", (40, 2)),
    "hottopixx": (dnomad.Hottopixx, dict(rank=3, n_epochs=8), "columns", (10, 40)),
}


def _write(path, A, chunks):
    zarr.create_array(store=str(path), data=A, chunks=chunks, overwrite=True)


def _changed(A):
    B = A.copy()
    B[-1, -1] *= 1.5                  # one entry of the last chunk (on a Gram's diagonal: it stays symmetric)
    return B


def _fit_interrupted(make, X, store):
    with pytest.raises(Interrupted), warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        make(store=store, checkpoint_every=2, callback=_stop_after(3)).fit(X)
    assert run_store.read_input_digest(store) is not None       # the first pass recorded it


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_rewritten_zarr_input_is_refused_on_resume_and_the_restored_one_resumes(case, tmp_path):
    cls, params, kind, chunks = CASES[case]
    A = _inputs()[kind]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, A, chunks)

    def make(**kw):
        return cls(**params, random_state=0, **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        reference = make(store=str(tmp_path / "ref.zarr")).fit(str(src))
    _fit_interrupted(make, str(src), store)
    _write(src, _changed(A), chunks)
    with pytest.raises(InputChangedError) as info:
        dnomad.resume(store)
    message = str(info.value)
    assert str(src) in message and "chunks the run read differ" in message and "overwrite=True" in message
    assert run_store.read_result(store) is None                  # nothing written past the checkpoint
    _write(src, A, chunks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        resumed = dnomad.resume(store)
    result = "hott_rows_" if cls is dnomad.Hottopixx else "labels_"
    np.testing.assert_array_equal(getattr(resumed, result), getattr(reference, result))


def test_the_cli_refuses_a_rewritten_input_in_one_line(tmp_path, capsys):
    A = _inputs()["data"]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, A, (40, 2))
    _fit_interrupted(lambda **kw: dnomad.RiemannianKMeans(3, random_state=0, **kw), str(src), store)
    _write(src, _changed(A), (40, 2))
    assert cli.main(["resume", store]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "X at" in err[0] and "is not the input the run" in err[0], err


def test_rows_read_on_workers_are_digested_there(cluster_client, tmp_path):
    """Row chunks on a cluster's workers: their digests come back from the workers."""
    A = _inputs()["data"]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, A, (40, 2))
    _fit_interrupted(lambda **kw: dnomad.RiemannianKMeans(3, backend="distributed", random_state=0, **kw),
                     str(src), store)
    assert sorted(run_store.read_input_digest(store)["chunks"]) == ["c/0/0", "c/1/0", "c/2/0"]
    _write(src, _changed(A), (40, 2))
    with pytest.raises(InputChangedError, match="c/2/0"):
        dnomad.resume(store)


def test_a_sharded_input_is_digested_by_whole_shards_however_it_is_read(tmp_path):
    """Which parts of a shard a pass reads depends on its blocks; the digest does not."""
    A = _inputs()["data"]
    src = str(tmp_path / "X.zarr")
    zarr.create_array(store=src, data=A, chunks=(20, 2), shards=(60, 2))
    digests = []
    for read in (lambda arr: arr[...], lambda arr: [arr[r0:r0 + 20] for r0 in range(0, N, 20)],
                 lambda arr: arr[50:70]):
        generation = digest.new_generation()
        read(digest.open_array(src, "", generation))
        digests.append(digest.collect(generation))
    assert sorted(digests[0]) == ["c/0/0", "c/1/0"] and digests[0] == digests[1]
    assert digests[2] == digests[0]                    # both shards, read in part, digested whole
    store = str(tmp_path / "run.zarr")
    _fit_interrupted(lambda **kw: dnomad.RiemannianKMeans(3, chunk_rows=20, max_iter=8, random_state=0, **kw),
                     src, store)
    zarr.create_array(store=src, data=_changed(A), chunks=(20, 2), shards=(60, 2), overwrite=True)
    with pytest.raises(InputChangedError, match="c/1/0"):
        dnomad.resume(store)


def test_the_same_input_read_by_another_backend_resumes(tmp_path):
    """A Gram read in place (the zarr backend) by the first session and loaded into memory
    by the resumed one: the same chunks, the same digest."""
    G = _inputs()["gram"]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, G, (40, 40))
    params = dict(n_clusters=3, sdp_k=3, precomputed=True, block_size=40, max_iter=8, random_state=0)
    _fit_interrupted(lambda **kw: dnomad.NOMAD(**params, backend="zarr", **kw), str(src), store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        resumed = dnomad.resume(store, backend="local")
        reference = dnomad.NOMAD(**params, backend="local").fit(str(src))
    np.testing.assert_array_equal(resumed.labels_, reference.labels_)


def test_a_chunk_written_where_there_was_none_is_a_change(tmp_path):
    """A chunk absent at the start (all fill value) is recorded as absent."""
    A = _inputs()["data"]
    A[80:] = 0.0
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    arr = zarr.create_array(store=str(src), shape=A.shape, dtype=A.dtype, chunks=(40, 2), fill_value=0.0,
                            config={"write_empty_chunks": False})
    arr[...] = A
    assert not os.path.exists(src / "c" / "2")
    _fit_interrupted(lambda **kw: dnomad.RiemannianKMeans(3, random_state=0, **kw), str(src), store)
    assert run_store.read_input_digest(store)["chunks"]["c/2/0"] is None
    arr[100, 0] = 1.0
    with pytest.raises(InputChangedError, match="c/2/0"):
        dnomad.resume(store)


def test_an_input_rewritten_in_other_chunks_or_format_is_refused(tmp_path):
    """The same values in other chunks: the chunks read in both differ; in Zarr v2 (other
    chunk keys): none was read in both."""
    A = _inputs()["data"]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, A, (40, 2))
    _fit_interrupted(lambda **kw: dnomad.NLR(3, record_every=1, chunk_rows=40, random_state=0, **kw),
                     str(src), store)
    _write(src, A, (30, 2))
    with pytest.raises(InputChangedError, match="3 of the chunks the run read differ"):
        dnomad.resume(store)
    zarr.create_array(store=str(src), data=A, chunks=(40, 2), overwrite=True, zarr_format=2)
    with pytest.raises(InputChangedError, match="none of the chunks read now was read when the run began"):
        dnomad.resume(store)


def test_a_damaged_digest_record_is_named(tmp_path):
    A = _inputs()["data"]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, A, (40, 2))
    _fit_interrupted(lambda **kw: dnomad.RiemannianKMeans(3, random_state=0, **kw), str(src), store)
    zarr.open_group(store, path=run_store.INPUT_DIGEST, mode="a").attrs["chunks"] = {"c/0/0": "crc"}
    with pytest.raises(dnomad.StoreError, match="input's digest 'input_digest'.*chunk -> \\[crc32c, bytes\\]"):
        dnomad.resume(store)


def test_digests_are_the_chunks_bytes_as_stored(tmp_path):
    """The digest of a chunk is the crc32c of its stored (encoded) bytes."""
    A = _inputs()["data"]
    _write(tmp_path / "X.zarr", A, (40, 2))
    generation = digest.new_generation()
    np.testing.assert_array_equal(digest.open_array(str(tmp_path / "X.zarr"), "", generation)[...], A)
    seen = digest.collect(generation)
    stored = (tmp_path / "X.zarr" / "c" / "1" / "0").read_bytes()
    assert seen["c/1/0"] == [digest.crc32c(np.frombuffer(stored, np.uint8)), len(stored)]
    assert sorted(seen) == ["c/0/0", "c/1/0", "c/2/0"] and digest.collect(generation) == {}


def _refusal(make, X, **changed):
    with pytest.raises(dnomad.StoreError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        make(**changed).fit(X, resume=True)
    return str(info.value)


@pytest.mark.parametrize("cls, params", [(dnomad.NOMAD, dict(sdp_k=3)), (dnomad.RiemannianKMeans, {}),
                                         (dnomad.SymNMF, {})])
def test_a_resume_that_is_not_the_run_says_what_changed(cls, params, tmp_path):
    X = _inputs()["data"]
    store = str(tmp_path / "run.zarr")

    def make(**kw):
        return cls(**{"n_clusters": 3, "max_iter": 3, "store": store, "random_state": 0, **params, **kw})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        make().fit(X)
    if cls is dnomad.RiemannianKMeans:
        assert "changed: tol 1e-10 -> 1e-06" in _refusal(make, X, tol=1e-6)
    else:
        assert "changed: n_clusters 3 -> 4" in _refusal(make, X, n_clusters=4, **(
            {"sdp_k": 4} if cls is dnomad.NOMAD else {}))
    assert "changed: X's content (the same shape, other values)" in _refusal(make, X + 0.5)
    # settings that no run's identity holds are not offered as the change
    message = _refusal(make, X + 0.5, backend="local", checkpoint_every=3)
    assert "changed: X's content" in message and "backend" not in message and "checkpoint_every" not in message
    assert "changed: X's shape [120, 2] -> [100, 2]" in _refusal(make, X[:100])
    assert "holds a different run" in _refusal(make, X[:100]) and "dnomad resume" in _refusal(make, X[:100])


@pytest.mark.parametrize("cls, params, kind, chunks", [
    (dnomad.RiemannianKMeans, dict(n_clusters=3, max_iter=8), "data", (40, 2)),
    (dnomad.NLR, dict(n_clusters=3, record_every=1, max_iter=20), "data", (40, 2)),
    (dnomad.Hottopixx, dict(rank=3, n_epochs=8), "columns", (10, 40))])
def test_a_dask_array_over_a_rewritten_zarr_input_is_refused(cls, params, kind, chunks, tmp_path):
    """dask's token of ``da.from_zarr(path)`` stays the same when the array behind it is
    rewritten: the methods that take a dask X as it is digest its chunks as computed."""
    import dask.array

    A = _inputs()[kind]
    src, store = tmp_path / "X.zarr", str(tmp_path / "run.zarr")
    _write(src, A, chunks)
    _fit_interrupted(lambda **kw: cls(**params, random_state=0, **kw), dask.array.from_zarr(str(src)), store)
    _write(src, _changed(A), chunks)
    lazy = dask.array.from_zarr(str(src))
    with pytest.raises(InputChangedError, match=f"X \\(the dask array {lazy.name}\\) is not the input"):
        cls(**params, random_state=0, store=store, checkpoint_every=2).fit(lazy, resume=True)
    _write(src, A, chunks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        cls(**params, random_state=0, store=store, checkpoint_every=2).fit(dask.array.from_zarr(str(src)),
                                                                         resume=True)
