"""Out of core: NOMAD on Zarr-backed state, on workers whose memory limit is below the
size of the matrices; their peak memory must not grow with n."""
import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dnomad
from dnomad.blocks.engine import _worker_peak_rss
from dnomad.data import two_rings

# A worker holds about 250 MiB before any block: Python, NumPy, dask, distributed, and
# scikit-learn, which dnomad's ConvergenceWarning subclasses and which imports pandas where
# it is installed (as the test extra installs it).
MEMORY_LIMIT = 450 * 2**20
BLOCK = 500


@pytest.fixture(scope="module")
def small_memory_client():
    # No pausing or spilling: the nanny's terminate threshold (95% of the limit) is the
    # bound, so a worker that held whole matrices would be killed and the run would fail.
    cfg = {"distributed.worker.memory.pause": False, "distributed.worker.memory.spill": False,
           "distributed.worker.memory.target": False}
    with dask.config.set(cfg), LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                            memory_limit=MEMORY_LIMIT, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


def _fit(n, store):
    kw = dict(n_clusters=8, sdp_k=8, dtype=np.float64, backend="zarr", store=store, block_size=BLOCK,
              max_iter=2, n_inner=3, rmse_tol=0, min_tol=0, objective_tol=0)
    with pytest.warns(dnomad.ConvergenceWarning):
        return dnomad.NOMAD(**kw).fit(two_rings(n)[0])


def test_nomad_runs_out_of_core_with_bounded_worker_memory(small_memory_client, tmp_path):
    client = small_memory_client
    peaks = {}
    for n in (1500, 5000):
        est = _fit(n, str(tmp_path / f"run{n}.zarr"))
        assert est.backend_used_ == "zarr" and est.n_iter_ == 2
        Q = est.Q_
        assert Q.row_sums() == pytest.approx(np.ones(n), abs=1e-8)
        # ru_maxrss is the peak over each worker's life, so peaks[n] covers all runs so far.
        peaks[n] = max(client.run(_worker_peak_rss).values())
        state_bytes = 3 * Q.group.matrix_nbytes + n * n * 8   # P, Gamma, G (upper) and Q (full)
        if n == 5000:
            assert state_bytes > MEMORY_LIMIT
    assert peaks[5000] < 0.95 * MEMORY_LIMIT
    # Going from n = 1500 to 5000 adds 11x the matrix bytes; the workers' peak may grow by
    # O(n) vectors, not by anything of order n^2 (one 5000^2 float64 matrix is 200 MB).
    assert peaks[5000] - peaks[1500] < 24 * 2**20


def test_default_blocks_follow_the_workers_memory_limit(tmp_path):
    """NOMAD with its default blocks on workers of 350 MiB: 6,000 rows, whose blocks at
    the 64 MiB target would be 3,000^2 float32 (three matrices of 72 MB upper blocks each;
    with every worker importing the estimators, those had every task killed on 400 MiB
    workers); the block side follows the room the workers' limit leaves beyond a worker's
    footprint and the run ends on them, under the nanny's bound.  Workers too small for
    any block are refused before a pass, with the memory limit they would need."""
    from dnomad.blocks import cluster as engine_cluster

    limit = 350 * 2**20
    cfg = {"distributed.worker.memory.pause": False, "distributed.worker.memory.spill": False,
           "distributed.worker.memory.target": False, "distributed.scheduler.allowed-failures": 0}
    with dask.config.set(cfg), LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit=limit,
                                            dashboard_address=None) as cluster, Client(cluster) as client:
        X, truth = two_rings(6000)
        est = dnomad.NOMAD(n_clusters=2, sdp_k=16, backend="zarr", store=str(tmp_path / "run.zarr"), max_iter=3)
        with pytest.warns(dnomad.ConvergenceWarning):
            est.fit(X)
        assert est.backend_used_ == "zarr" and est.n_iter_ == 3
        assert est.Q_.block_size < 3000
        assert max(client.run(_worker_peak_rss).values()) < 0.95 * limit
        with pytest.raises(dnomad.InputValueError, match=r"memory limit of at least \d+ MiB"):
            engine_cluster.block_bytes_for_workers(client, smallest_bytes=limit)


def test_workers_are_asked_of_the_scheduler_not_the_clients_cache(small_memory_client, tmp_path, monkeypatch):
    """The client's periodic refresh caches an identity without workers; a fit that read
    that cache placed its blocks on no worker (seen in CI: ``min() arg is an empty
    sequence``).  A cluster that has no workers is refused, after a wait, by name."""
    from dnomad.blocks import cluster as engine_cluster

    client = small_memory_client
    refresh = client._update_scheduler_info

    async def refreshed_then_overwritten(n_workers=0):
        # The periodic refresh (n_workers=0) landing between a fetch and its read (what
        # distributed before 2026.11 read back; since then scheduler_info returns the value)
        await refresh(n_workers=n_workers)
        return await refresh(n_workers=0)

    monkeypatch.setattr(client, "_update_scheduler_info", refreshed_then_overwritten)
    assert client.scheduler_info(n_workers=-1)["workers"] == {}
    assert len(engine_cluster.workers_info(client)) == 2
    M = dnomad.blocks.from_array(np.eye(40), backend="distributed", block_size=20, client=client)
    assert np.array_equal(M.row_sums(), np.ones(40))

    monkeypatch.setattr(engine_cluster, "WORKER_WAIT_SECONDS", 1)
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as empty, Client(empty) as no_workers:
        with pytest.raises(dnomad.InputValueError, match="has no workers after 1 s"):
            dnomad.blocks.from_array(np.eye(40), backend="distributed", block_size=20, client=no_workers)
