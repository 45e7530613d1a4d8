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


def local_cluster_client(n_workers):
    """A real dask.distributed cluster: ``n_workers`` worker processes, 1 thread each
    (a generator for fixtures: yields the client, closes both after)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def cluster_client():
    """2 worker processes, 1 thread each."""
    yield from local_cluster_client(2)


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
