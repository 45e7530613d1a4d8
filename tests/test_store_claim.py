"""Two processes on one store: one claims it, the other is told who holds it (issue 23)."""
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import dnomad
from dnomad.blocks import store as run_store
from dnomad.errors import StoreError


def _fit(store, barrier, results, tag):
    from dnomad.data import two_rings

    X = two_rings(200)[0]
    barrier.wait()
    try:
        est = dnomad.NOMAD(n_clusters=8, sdp_k=8, max_iter=60, rmse_tol=0, min_tol=0, objective_tol=0, store=store)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X)
        results[tag] = "finished"
    except StoreError as exc:
        results[tag] = f"StoreError: {exc}"
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results[tag] = f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("round_", range(3))
def test_two_processes_racing_for_one_store(tmp_path, round_):
    ctx = multiprocessing.get_context("spawn")
    store = str(tmp_path / "run.zarr")
    with ctx.Manager() as manager:
        barrier, results = manager.Barrier(2), manager.dict()
        procs = [ctx.Process(target=_fit, args=(store, barrier, results, tag)) for tag in ("a", "b")]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        outcome = dict(results)
    assert sorted(v == "finished" for v in outcome.values()) == [False, True], outcome
    loser = next(v for v in outcome.values() if v != "finished")
    # The loser is told the store is in use (by whom), or, had the winner finished
    # before it tried, that the store holds a run: never a misleading error.
    assert loser.startswith("StoreError") and ("is in use by process" in loser or "already holds" in loser), loser
    assert run_store.read_json(store, "result")["n_iter"] == 60
    assert not os.path.exists(store + ".lock")


def _hold(store, ready):
    lock = run_store.StoreLock(store).acquire()
    ready.set()
    time.sleep(600)
    lock.release()


def test_a_lock_held_by_a_live_process_names_it_and_dies_with_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    store = str(tmp_path / "run.zarr")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(store, ready))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(StoreError, match=f"in use by process {holder.pid} on "):
            dnomad.NOMAD(n_clusters=2, sdp_k=2, store=store).fit(np.random.default_rng(0).random((20, 2)))
        assert not os.path.exists(os.path.join(store, "zarr.json")), "the refused run wrote the store"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
    # killed, its lock went with it: the store can be claimed again
    est = dnomad.NOMAD(n_clusters=2, sdp_k=2, max_iter=5, store=store)
    with pytest.warns(dnomad.ConvergenceWarning):
        est.fit(np.random.default_rng(0).random((20, 2)))
    assert not os.path.exists(store + ".lock")


def test_a_checkpoint_state_round_trips_through_the_store(tmp_path, rng):
    """The one checkpoint protocol's store format: a solver's state (arrays, scalars, the
    history, the n x n blocks it names) saved twice and loaded back as the last one saved,
    arrays bit for bit and blocks into another group; a record from before the format
    is refused with the way out."""
    from dnomad import blocks

    url = str(tmp_path / "run.zarr")
    checkpoints = run_store.Checkpoints(url, "demo_checkpoint")
    assert checkpoints.load() is None
    A = rng.standard_normal((30, 30))
    group = blocks.from_array(A + A.T, block_size=8, dtype=np.float64).group
    for it in (1, 2):
        Y, mu = rng.random((30, 3)), rng.random(30)
        history = [{"iteration": i, "objective": 1.0 / i} for i in range(1, it + 1)]
        checkpoints.save({"Y": Y, "mu": mu, "lam": 0.5 * it, "stop_reason": None, "history": history,
                          "blocks": ["D"]}, group=group)
    other = blocks.new_group(30, dtype=np.float64, backend="local", block_size=8)
    state = checkpoints.load(group=other)
    np.testing.assert_array_equal(state["Y"], Y)
    np.testing.assert_array_equal(state["mu"], mu)
    assert (state["lam"], state["stop_reason"], state["iteration"]) == (1.0, None, 2)
    assert state["history"] == history
    np.testing.assert_array_equal(np.asarray(blocks.BlockMatrix(other, "D")), A + A.T)
    assert set(state) == {"Y", "mu", "lam", "stop_reason", "history", "blocks", "iteration"}

    run_store.write_json(url, "old_checkpoint", {"iteration": 3, "slot": "a"})
    with pytest.raises(dnomad.InputValueError, match="older format.*overwrite=True"):
        run_store.Checkpoints(url, "old_checkpoint").load()
