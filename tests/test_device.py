"""Device resolution and host/device transfers (dnomad.blocks.device).  The parts that
need no GPU run everywhere; the CuPy cases are marked gpu_test and skip cleanly where
CuPy or a CUDA device is missing (CI has neither)."""
import numpy as np
import pytest

from devices import DEVICES, needs_gpu
from dnomad.blocks import device as dev
from dnomad.blocks.cluster import workers_info
from dnomad.errors import InputValueError


def test_explicit_device_wins_over_dask_config():
    import dask.config

    assert dev.resolve_device("cpu") == "cpu"
    assert dev.resolve_device("CPU") == "cpu"
    with dask.config.set({"dnomad.device": "cuda"}):
        assert dev.resolve_device("cpu") == "cpu"


def test_dask_config_and_its_environment_variable_set_the_default(monkeypatch):
    import dask.config

    assert dev.resolve_device() == "cpu"                     # nothing set
    with dask.config.set({"dnomad.device": "auto"}):
        assert dev.resolve_device() == ("cuda" if dev.cuda_available() else "cpu")
    monkeypatch.setenv("DASK_DNOMAD__DEVICE", "auto")
    # dask reads the environment when its configuration is refreshed
    config = dask.config.collect(env=dict(__import__("os").environ))
    assert config["dnomad"]["device"] == "auto"


def test_bad_device_values_name_the_source_and_the_choices():
    import dask.config

    with pytest.raises(InputValueError, match=r"device must be one of \('cpu', 'cuda', 'auto'\); got 'gpu'"):
        dev.resolve_device("gpu")
    with pytest.raises(InputValueError, match="must be one of"):
        dev.resolve_device(0)
    with dask.config.set({"dnomad.device": "tpu"}):
        with pytest.raises(InputValueError, match="dask config 'dnomad.device' must be one of"):
            dev.resolve_device()


@pytest.mark.skipif(dev.cuda_available(), reason="a GPU is present: cuda resolves")
def test_cuda_without_cupy_or_a_gpu_is_a_clear_error_and_auto_falls_back():
    import dask.config

    with pytest.raises(InputValueError, match="asks for 'cuda', but (CuPy is not installed|CuPy is installed but)"):
        dev.resolve_device("cuda")
    with dask.config.set({"dnomad.device": "cuda"}):
        with pytest.raises(InputValueError, match="dask config 'dnomad.device' asks for 'cuda'"):
            dev.resolve_device()
    assert dev.resolve_device("auto") == "cpu"
    with pytest.raises(InputValueError, match="needs CuPy and a GPU"):
        dev.cupy()
    with pytest.raises(InputValueError, match="needs CuPy and a GPU"):
        dev.to_device(np.ones(3), "cuda")


def test_host_arrays_stay_numpy():
    a = np.arange(6.0).reshape(2, 3)
    assert dev.array_module(a) is np and dev.device_of(a) == "cpu" and not dev.is_device_array(a)
    assert dev.to_host(a) is a and dev.to_device(a, "cpu") is a
    assert dev.resolve_device(None, a, [1, 2]) == "cpu"          # host inputs ask for nothing
    with pytest.raises(InputValueError, match="resolved"):
        dev.to_device(a, "auto")


@pytest.mark.gpu_test
@needs_gpu
def test_cupy_inputs_ask_for_cuda_and_round_trip():
    import cupy

    a = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    d = dev.to_device(a, "cuda")
    assert isinstance(d, cupy.ndarray) and dev.is_device_array(d) and dev.device_of(d) == "cuda"
    assert dev.array_module(d) is cupy
    assert dev.resolve_device(None, d) == "cuda"
    assert dev.resolve_device("cpu", d) == "cpu"                 # an explicit device wins
    np.testing.assert_array_equal(dev.to_host(d), a)
    assert dev.to_device(d, "cuda") is d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block_size", [64, 50])
def test_matmat_pass_on_each_device_equals_the_dense_product(device, dtype, block_size):
    """One matmat pass on the host (symmetric blocks, i <= j stored) and on the GPU (all
    blocks): A V for a host V (host answer) and a device V (device answer).  On the GPU
    one float32 vector with blocks of 64 goes through the CUDA row-dot kernel; blocks of
    50 (rows not 16-byte aligned) and float64 through cuBLAS."""
    from dnomad.blocks import from_array

    rng = np.random.default_rng(3)
    n = 300
    B = rng.normal(size=(n, n))
    A = (B + B.T).astype(dtype)
    V = rng.normal(size=(n, 5))
    bm = from_array(A, block_size=block_size, dtype=dtype, device=device)
    assert bm.device == device and bm.group.layout.nblocks == -(-n // block_size)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    want = A.astype(np.float64) @ V
    got = bm.matmat(V)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    np.testing.assert_allclose(bm.matmat(V[:, 0]), want[:, 0], rtol=rtol, atol=rtol * np.abs(want).max())
    if device == "cuda":
        Vd = dev.to_device(V, "cuda")
        Yd = bm.matmat(Vd)
        assert dev.is_device_array(Yd)
        np.testing.assert_allclose(dev.to_host(Yd), want, rtol=rtol, atol=rtol * np.abs(want).max())
    # The reductions run where the blocks are, and their results come to the host.
    np.testing.assert_array_equal(bm.diag(), np.diag(A))
    s = bm.summary()
    assert s["sum"] == pytest.approx(A.sum(dtype=np.float64), rel=1e-9)
    assert s["fro"] == pytest.approx(np.linalg.norm(A.astype(np.float64)), rel=1e-9)
    assert (s["min"], s["max"]) == (A.min(), A.max())


def test_cuda_blocks_need_the_local_backend_and_a_gpu():
    from dnomad.blocks import BlockGroup, BlockLayout

    layout = BlockLayout(100, 50, symmetric=True)
    expected = "runs with backend='local'" if dev.cuda_available() else "asks for 'cuda', but"
    with pytest.raises(InputValueError, match=expected):
        BlockGroup(layout, backend="zarr", store="memory://x", device="cuda")


def _visible_device():
    import os

    import dask.config

    return os.environ.get("CUDA_VISIBLE_DEVICES"), dask.config.get("dnomad.device", None)


def test_gpu_worker_layout_pins_one_worker_per_device():
    """The GPU layout without dask-cuda: one worker process per GPU, each seeing only its
    device and defaulting dnomad's blocks to it, each offering one GPU resource.  Runs on
    any machine (no CUDA call is made); on a GPU machine each worker's device 0 is its GPU."""
    from distributed import Client

    with dev.gpu_cluster(2, prefer_dask_cuda=False, dashboard_address=None) as cluster, Client(cluster) as client:
        assert sorted(client.run(_visible_device).values()) == [("0", "cuda"), ("1", "cuda")]
        workers = workers_info(client).values()
        assert [w["resources"] for w in workers] == [{"GPU": 1}, {"GPU": 1}]
        assert all(w["nthreads"] == 1 for w in workers)
        futures = [client.submit(_visible_device, resources={"GPU": 1}, pure=False) for _ in range(4)]
        assert {seen for seen, _ in client.gather(futures)} <= {"0", "1"}


def test_gpu_cluster_errors_before_starting_anything():
    with pytest.raises(InputValueError, match="n_gpus must be a positive integer; got 0"):
        dev.gpu_worker_specs(0)
    if not dev.cuda_available():
        with pytest.raises(InputValueError, match="gpu_cluster needs a CUDA GPU"):
            dev.gpu_cluster()


@pytest.mark.skipif(dev.cuda_available(), reason="a GPU is present: the checks would run")
def test_gpu_check_script_stops_at_once_without_a_gpu_and_says_why(tmp_path):
    """deploy/gpu/check.sh on a machine without CuPy or a GPU: exit 1 before any part
    runs, and its log names what is missing."""
    import os
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    proc = subprocess.run(["bash", str(root / "deploy" / "gpu" / "check.sh")], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OUT=str(tmp_path)))
    assert proc.returncode == 1
    log = (tmp_path / "check.log").read_text()
    assert dev.cuda_status()[1] in log and "the environment check failed" in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.log"]


def _nomad_fit_with_the_workers_default_device(X, **params):
    """Runs on a worker: ``dnomad.fit`` with no device given (the worker's dask config
    picks it), the device that resolved to, and the bytes CuPy's pool holds after it."""
    import dnomad

    est = dnomad.fit(X, method="nomad", **params)
    device = dev.resolve_device()
    return est, device, dev.cupy().get_default_memory_pool().total_bytes() if device == "cuda" else 0


def test_fit_submitted_to_a_cuda_worker_runs_on_its_gpu_or_says_why_not():
    """A user's fit submitted with ``resources={"GPU": 1}`` to a worker of gpu_cluster's
    layout (no device given: the worker's ``dnomad.device`` config says "cuda").  With a
    GPU it runs on the worker's GPU and the fitted estimator comes back to the client
    with the host fit's answer; without one the worker's error reaches the client and
    names the config that asked for CUDA and why it cannot."""
    from distributed import Client
    from sklearn.metrics import adjusted_rand_score

    import dnomad
    from dnomad.blocks import prepare_gram_data
    from dnomad.data import two_rings

    X = two_rings(120)[0]
    params = dict(n_clusters=8, dtype=np.float64)
    with dev.gpu_cluster(1, prefer_dask_cuda=False, dashboard_address=None) as cluster, Client(cluster) as client:
        future = client.submit(_nomad_fit_with_the_workers_default_device, X, resources={"GPU": 1}, pure=False,
                               **params)
        if not dev.cuda_available():
            with pytest.raises(InputValueError, match="dask config 'dnomad.device' asks for 'cuda', but"):
                future.result()
            return
        est, device, pool_bytes = future.result()
    assert device == "cuda" and pool_bytes > 0
    host = dnomad.fit(X, method="nomad", device="cpu", **params)
    assert est.stop_reason_ == host.stop_reason_ == "tolerance"
    Q, Qh = np.asarray(est.Q_), np.asarray(host.Q_)
    F = prepare_gram_data(X)
    D = F @ F.T
    assert np.sum(D * Q) == pytest.approx(np.sum(D * Qh), rel=1e-2)
    assert np.linalg.norm(Q - Qh) / np.linalg.norm(Qh) <= 0.05
    assert adjusted_rand_score(est.labels_, host.labels_) == 1.0
