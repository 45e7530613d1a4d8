"""Faults, for real: a worker process killed during a run, the client process killed
after a checkpoint, a store that fills up or turns read-only mid-run."""
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import dnomad
from dnomad.blocks import store as run_store
from dnomad.data import gaussian_blobs, two_rings
from dnomad.errors import StoreError

# Runs every iteration (no tolerance stop), so that runs compare iteration for iteration.
EXACT = dict(n_clusters=6, sdp_k=6, dtype=np.float64, rmse_tol=0, min_tol=0, objective_tol=0)


def reference_Q(X, **kw):
    with pytest.warns(dnomad.ConvergenceWarning):
        est = dnomad.NOMAD(**EXACT, **kw).fit(X)
    return np.asarray(est.Q_), est


@pytest.fixture
def fresh_cluster():
    """A LocalCluster of 2 nanny-managed worker processes of its own (a killed worker is
    restarted by its nanny), and a map worker address -> pid."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


class KillWhenATaskOfManyFinishes:
    """A scheduler plugin: once armed, the first time a task finishes while other tasks
    of its group (by default its function: the key before its token, a uuid) are still
    to finish, SIGKILL the worker holding its result: dask must run it again elsewhere."""

    name = "kill-when-a-task-of-many-finishes"

    def __init__(self, pids, armed=False):
        self.pids = pids
        self.armed, self.killed = armed, None

    async def start(self, scheduler):
        self.scheduler = scheduler

    def group(self, key):
        """The key prefix of ``key``'s group, or None for a task that may not be a target."""
        return key.split("-", 1)[0] + "-"

    def transition(self, key, start, finish, *args, **kwargs):
        key = str(key)
        if not self.armed or self.killed or finish != "memory":
            return
        prefix = self.group(key)
        if prefix is None:
            return
        tasks = self.scheduler.tasks
        if any(str(k).startswith(prefix) and ts.state != "memory" for k, ts in tasks.items()):
            worker = next(iter(tasks[key].who_has)).address
            os.kill(self.pids[worker], signal.SIGKILL)
            self.killed = (key, worker)


class KillWhenAnUpdateTaskFinishes(KillWhenATaskOfManyFinishes):
    """The plugin above for the block tasks of a NOMAD pass that updates P in place
    (armed from the start): dask then runs the finished task again elsewhere, and an
    update in place would be applied twice.  (The first NOMAD pass of an outer iteration
    has no pending step and leaves P as it is, so the first pass seen is skipped.)"""

    name = "kill-when-an-update-task-finishes"

    def __init__(self, pids):
        super().__init__(pids, armed=True)
        self.passes_seen = set()

    def group(self, key):
        if not key.startswith("dnomad-nomad-"):
            return None
        prefix = key.rsplit("-", 2)[0] + "-"
        self.passes_seen.add(prefix)
        return prefix if len(self.passes_seen) >= 2 else None


def _kill_first_worker(pids, killed):
    """SIGKILL the worker first in address order (where a single chunk or block lives)."""
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    killed.append(victim)


def _kill_during_a_pass(client, backend, armed, killed):
    """Once the run is past its first checkpoint (``armed``), SIGKILL a worker process
    during a pass: for the zarr backend by the plugin above; for the in-memory backend a
    worker holding blocks, as soon as armed (the solver is between or inside passes of
    outer iteration 5; either way that worker's blocks are gone)."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    pids = client.run(os.getpid)
    armed.wait(120)
    if backend == "zarr":
        plugin = type("Killer", (KillWhenAnUpdateTaskFinishes, SchedulerPlugin), {})(pids)
        client.register_plugin(plugin)
        deadline = time.time() + 60
        while time.time() < deadline:
            done = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[
                KillWhenAnUpdateTaskFinishes.name].killed)
            if done:
                killed.append(done)
                return
            time.sleep(0.01)
    else:
        _kill_first_worker(pids, killed)


@pytest.mark.parametrize("backend", ["distributed", "zarr"])
def test_worker_killed_mid_pass_does_not_change_the_result(backend, fresh_cluster, tmp_path):
    """In memory (blocks held by the killed worker are lost): the fit restarts from its
    last checkpoint.  Zarr: dask runs the lost tasks again; writes go to a second array,
    so a task run twice applies its update once."""
    X = two_rings(200)[0]
    kw = dict(max_iter=7, checkpoint_every=3, block_size=50)
    Q_ref, _ = reference_Q(X, **kw)

    armed, killed = threading.Event(), []

    def arm(row):
        if row["iteration"] == 4:
            armed.set()

    killer = threading.Thread(target=_kill_during_a_pass, args=(fresh_cluster, backend, armed, killed))
    killer.start()
    with pytest.warns(dnomad.ConvergenceWarning):
        est = dnomad.NOMAD(**EXACT, **kw, backend=backend, store=str(tmp_path / "run.zarr"),
                           callback=arm).fit(X)
    killer.join()
    assert killed, "no worker was killed"
    assert est.n_iter_ == 7 and est.backend_used_ == backend
    assert est.restarts_ == (1 if backend == "distributed" else 0)
    np.testing.assert_allclose(np.asarray(est.Q_), Q_ref, rtol=0, atol=1e-10)


def test_worker_killed_mid_burer_monteiro_run_restarts_from_its_checkpoint(fresh_cluster, tmp_path):
    """NOMAD by Burer-Monteiro on row chunks in the workers' memory: SIGKILL the worker
    holding them after the second outer step's checkpoint; the fit rebuilds the chunks
    from X, goes on from that checkpoint (restarts_ = 1) and ends where a run on the same
    cluster without the kill ends."""
    X = two_rings(300)[0]
    kw = dict(n_clusters=2, sdp_k=6, solver="bm", backend="distributed", max_iter=4, random_state=0)
    with pytest.warns(dnomad.ConvergenceWarning):
        ref = dnomad.NOMAD(**kw, store=str(tmp_path / "ref.zarr")).fit(X)
    assert ref.restarts_ == 0
    pids = fresh_cluster.run(os.getpid)
    killed = []

    def kill_once(row):
        if row["iteration"] == 2 and not killed:
            _kill_first_worker(pids, killed)          # the worker holding chunk 0 (all of X here)

    with pytest.warns(dnomad.ConvergenceWarning):
        est = dnomad.NOMAD(**kw, store=str(tmp_path / "run.zarr"), callback=kill_once).fit(X)
    assert killed and est.restarts_ == 1 and est.backend_used_ == "distributed"
    assert est.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(est.Y_, ref.Y_, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(est.labels_, ref.labels_)


@pytest.mark.parametrize("method", ["RiemannianKMeans", "NLR"])
def test_worker_killed_mid_kmeans_run_restarts_from_its_checkpoint(method, fresh_cluster, tmp_path):
    """The K-means SDP solvers on row chunks in the workers' memory: SIGKILL the worker
    holding them after a checkpoint; the fit rebuilds the chunks from X, goes on from the
    checkpoint (restarts_ = 1) and ends where an uninterrupted run ends."""
    X = gaussian_blobs(300, n_centers=3, random_state=0)[0]
    kw = dict(n_clusters=3, backend="distributed", random_state=0, max_iter=12, checkpoint_every=4)
    if method == "NLR":
        kw.update(record_every=1, max_iter=30, checkpoint_every=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        ref = getattr(dnomad, method)(**kw, store=str(tmp_path / "ref.zarr")).fit(X)
    assert ref.restarts_ == 0
    pids = fresh_cluster.run(os.getpid)
    killed = []
    after = kw["checkpoint_every"] + 1

    def kill_once(row):
        if row["iteration"] >= after and not killed:
            _kill_first_worker(pids, killed)          # the worker holding chunk 0 (all of X here)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        est = getattr(dnomad, method)(**kw, store=str(tmp_path / "run.zarr"), callback=kill_once).fit(X)
    assert killed and est.restarts_ == 1
    assert est.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(est.U_, ref.U_, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(est.labels_, ref.labels_)


def test_worker_killed_mid_hottopixx_epoch_does_not_change_the_result(fresh_cluster, tmp_path):
    """HOTTOPIXX on X staged in Zarr by columns, on a cluster: its epochs are tasks over
    row blocks of C and X's column chunks with no state kept on the workers, so a worker
    killed while an epoch's tasks run costs only those tasks (dask runs them again
    elsewhere) and the run ends with the uninterrupted run's C and hott rows."""
    import zarr
    from distributed.diagnostics.plugin import SchedulerPlugin

    from dnomad.hottopixx import solver as H
    from dnomad.data import separable_nmf

    X = separable_nmf(36, 300, 3, duplicates=1, noise=0.02, random_state=9)["X"]
    zarr.create_array(store=str(tmp_path / "x.zarr"), name="X", data=X, chunks=(36, 50))
    src = zarr.open_array(str(tmp_path / "x.zarr"), path="X", mode="r")
    data = H.blocks.feature_columns(src, store=str(tmp_path / "run.zarr"), chunk=50, memory_fraction=0)
    params = H.HottopixxParams(rank=3, n_epochs=8, row_block=10)
    whole = H.hottopixx(data, params, random_state=4, client=fresh_cluster)
    pids = fresh_cluster.run(os.getpid)
    fresh_cluster.register_plugin(type("Killer", (KillWhenATaskOfManyFinishes, SchedulerPlugin), {})(pids))

    def arm(row):
        if row["epoch"] == 3:
            fresh_cluster.run_on_scheduler(lambda dask_scheduler: setattr(
                dask_scheduler.plugins[KillWhenATaskOfManyFinishes.name], "armed", True))

    res = H.hottopixx(data, params, random_state=4, client=fresh_cluster, callback=arm)
    killed = fresh_cluster.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins[KillWhenATaskOfManyFinishes.name].killed)
    assert killed, "no worker was killed"
    np.testing.assert_allclose(res.C, whole.C, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(res.hott_rows, whole.hott_rows)
    np.testing.assert_allclose(res.F, whole.F, rtol=0, atol=1e-13)


def test_client_killed_after_a_checkpoint_then_dnomad_resume(tmp_path):
    """`dnomad fit` SIGKILLed once a checkpoint is on disk; `dnomad resume` ends where an
    uninterrupted run ends."""
    X = two_rings(200)[0]
    np.save(tmp_path / "X.npy", X)
    store = str(tmp_path / "run.zarr")
    kw = dict(max_iter=400, checkpoint_every=20)
    params = {k: v for k, v in {**EXACT, **kw}.items() if k not in ("n_clusters", "dtype")}
    cmd = [sys.executable, "-m", "dnomad.cli", "fit", "--input", str(tmp_path / "X.npy"),
           "--n-clusters", "6", "--dtype", "float64", "--backend", "local", "--store", store,
           "--params", __import__("json").dumps(params)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    checkpoints = run_store.Checkpoints(store, "nomad_checkpoint")
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            ck = run_store.read_json(store, "nomad_checkpoint") if os.path.exists(store) else None
            if ck is not None and ck["iteration"] >= 100:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        proc.kill()
    killed_at = checkpoints.latest()["iteration"]
    assert 100 <= killed_at < 400
    assert run_store.read_json(store, "result") is None          # it did not finish
    res = subprocess.run([sys.executable, "-m", "dnomad.cli", "resume", store], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed: 400 iterations" in res.stdout
    Q_ref, ref = reference_Q(X, **kw)
    Q = np.asarray(dnomad.blocks.from_zarr(store, "result/Q"))
    np.testing.assert_allclose(Q, Q_ref, rtol=0, atol=1e-12)
    history = run_store.read_table(store, "result/history")
    assert [r["objective"] for r in history] == pytest.approx([r["objective"] for r in ref.history_],
                                                              rel=1e-12)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 4 MiB tmpfs of this test's own (mounting needs root and CAP_SYS_ADMIN)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_full_or_read_only_store_fails_clearly_and_keeps_the_last_checkpoint(fault, small_filesystem):
    X = two_rings(100)[0]
    kw = dict(max_iter=12, checkpoint_every=4)
    store = str(small_filesystem / "run.zarr")
    filler = small_filesystem / "filler"

    def break_the_store(row):
        if row["iteration"] != 6:          # after the checkpoint at 4, before the one at 8
            return
        if fault == "full":
            # Unbuffered: a buffered file keeps the tail of a short write and raises
            # ENOSPC again when it is closed.
            with open(filler, "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:
                    pass
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(small_filesystem)], check=True)

    with pytest.raises(StoreError) as err:
        dnomad.NOMAD(**EXACT, **kw, store=store, callback=break_the_store).fit(X)
    message = str(err.value)
    assert "the checkpoint at iteration 8" in message
    assert ("no space left" if fault == "full" else "read-only file system") in message
    assert "the last complete checkpoint (4 iterations, checkpoint/a) is intact" in message

    if fault == "full":
        filler.unlink()
    else:
        subprocess.run(["mount", "-o", "remount,rw", str(small_filesystem)], check=True)
    ck = run_store.Checkpoints(store, "nomad_checkpoint").latest()
    assert ck["iteration"] == 4 and len(ck["history"]) == 4
    with pytest.warns(dnomad.ConvergenceWarning):
        resumed = dnomad.resume(store)
    Q_ref, _ = reference_Q(X, **kw)
    np.testing.assert_allclose(np.asarray(resumed.Q_), Q_ref, rtol=0, atol=1e-12)


def test_a_build_on_a_full_disk_is_a_store_error_and_adds_no_matrix(small_filesystem):
    """The Zarr backend's block builds (a run's working matrices) on a full disk: a
    StoreError naming the store and the pass, and the group lists only the matrices it
    holds."""
    from dnomad import blocks

    group = blocks.new_group(600, block_size=100, dtype=np.float64, backend="zarr",
                             store=str(small_filesystem / "run.zarr"))

    def ones(key, *names):
        return {name: np.ones(group.layout.block_shape(key)) for name in names}

    group.build(["A"], ones, lambda key: ("A",))
    free = os.statvfs(small_filesystem).f_bavail * os.statvfs(small_filesystem).f_frsize
    with open(small_filesystem / "filler", "wb") as f:
        f.write(b"\0" * max(free - 64 * 1024, 0))
    with pytest.raises(StoreError, match=r"of pass 'build:B,C'.*no space left") as err:
        group.build(["B", "C"], ones, lambda key: ("B", "C"))
    assert "run.zarr" in str(err.value)
    assert group.names == ["A"]


def test_full_disk_during_the_out_of_core_first_pass_is_a_store_error(small_filesystem):
    """The Zarr backend's first pass on a disk with room for the run's record but not for
    its working matrices: a StoreError naming the store and the pass, not a raw OSError."""
    X = two_rings(300)[0]
    store = str(small_filesystem / "run.zarr")
    free = os.statvfs(small_filesystem).f_bavail * os.statvfs(small_filesystem).f_frsize
    with open(small_filesystem / "filler", "wb") as f:
        f.write(b"\0" * (free - 96 * 1024))
    with pytest.raises(StoreError) as err:
        dnomad.NOMAD(n_clusters=4, sdp_k=4, backend="zarr", block_size=100, store=store).fit(X)
    message = str(err.value)
    assert "no space left" in message and "of pass" in message and "run.zarr" in message
