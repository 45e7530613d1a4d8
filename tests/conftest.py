import numpy as np
import pytest


@pytest.fixture(scope="session")
def cluster_client():
    """A real dask.distributed cluster: 2 worker processes, 1 thread each."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
