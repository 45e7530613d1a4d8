import os

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from devices import CUDA

# Under xdist the workers share the machine's cores (CI: two workers on two cores), so
# each runs BLAS on one thread, as do the processes they start: OpenBLAS's threads
# spin on the small products most solvers make on test-sized inputs (cvxDisc's
# 12 x 4 test ran 3x slower with two threads in each of two workers).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    threadpool_limits(1)


def local_cluster_client(n_workers, set_as_default=True):
    """A real dask.distributed cluster: ``n_workers`` worker processes, 1 thread each
    (a generator for fixtures: yields the client, closes both after)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    client = Client(cluster, set_as_default=set_as_default)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def session_cluster():
    """2 worker processes, 1 thread each, started once; nobody's default client."""
    yield from local_cluster_client(2, set_as_default=False)


def _only_default_client(monkeypatch, client=None):
    """Make ``client`` (None: no client) the one default dask.distributed client until
    the test's teardown: distributed's registry of default clients, the current-client
    context and dask's scheduler setting (a client that closes while another is the
    default leaves "dask.distributed" set) are restored after it."""
    import weakref

    import dask
    from distributed import client as distributed_client

    monkeypatch.setattr(distributed_client, "_global_clients", weakref.WeakValueDictionary())
    monkeypatch.setitem(dask.config.config, "scheduler", None)
    token = distributed_client._current_client.set(None)
    if client is not None:
        distributed_client._set_global_client(client)
    return lambda: distributed_client._current_client.reset(token)


@pytest.fixture
def cluster_client(session_cluster, monkeypatch):
    """The session's cluster, the connected client for this test only: as the session's
    default client it would send every later test's "auto" paths (on its xdist worker)
    to its workers, whichever files ran first."""
    restore = _only_default_client(monkeypatch, session_cluster)
    yield session_cluster
    restore()


@pytest.fixture
def no_default_client(monkeypatch):
    """No connected dask.distributed client for the test's duration (a module-scoped
    fixture's client would otherwise be its tests' default)."""
    restore = _only_default_client(monkeypatch)
    yield
    restore()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(params=["local", "zarr", "distributed", CUDA])
def backend(request):
    """Each layout of the engine (see backends.make_group); "cuda" skips without a GPU."""
    return request.param


@pytest.fixture
def client_for(backend, request):
    return request.getfixturevalue("cluster_client") if backend == "distributed" else None
