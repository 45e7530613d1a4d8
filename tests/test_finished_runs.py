"""A finished run stays finished: resuming it changes nothing, and a crash after the run's
last checkpoint (before its result was written) resumes to the uninterrupted result, bit
for bit (issue 23)."""
import hashlib
import os

import numpy as np
import pytest

import dnomad
from dnomad.blocks import runs
from dnomad.blocks import store as run_store
from dnomad.data import gaussian_blobs, two_rings


def blobs():
    return gaussian_blobs(60, n_centers=3, separation=12.0)[0]


# Small runs to each stop: NOMAD's by its tolerances, SymNMF's at max_iter (a finished run
# whatever made it stop).
RUNS = {
    "cgm": (blobs, dict(method="nomad", n_clusters=3, sdp_k=3)),
    "cgm-float64-every-7": (blobs, dict(method="nomad", n_clusters=3, sdp_k=3, dtype=np.float64, checkpoint_every=7)),
    "bm": (blobs, dict(method="nomad", solver="bm", n_clusters=3, sdp_k=3, random_state=0)),
    "layers": (blobs, dict(method="nomad", n_clusters=3, layers=[6, 3])),
    "symnmf": (blobs, dict(method="symnmf", n_clusters=3, init="random", max_iter=30, random_state=0)),
    "symnmf-pgd": (blobs, dict(method="symnmf", solver="pgd", n_clusters=3, init="random", max_iter=30, random_state=0)),
}
pytestmark = pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")


def store_digest(store):
    """Every file of a local store and its content: what a resume must leave as it is."""
    out = {}
    for root, _, files in os.walk(store):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, store)] = hashlib.sha1(f.read()).hexdigest()
    return out


def learned(est):
    return {"labels": np.asarray(est.labels_), "n_iter": est.n_iter_, "stop_reason": est.stop_reason_,
            "objective": est.objective_, "history": [r["objective"] for r in est.history_]}


def assert_same(a, b):
    np.testing.assert_array_equal(a["labels"], b["labels"])
    assert (a["n_iter"], a["stop_reason"]) == (b["n_iter"], b["stop_reason"])
    assert a["objective"] == b["objective"] and a["history"] == b["history"]


@pytest.mark.parametrize("case", list(RUNS))
def test_resume_of_a_finished_run_changes_nothing(case, tmp_path):
    make, kw = RUNS[case]
    store = str(tmp_path / "run.zarr")
    est = dnomad.fit(make(), store=store, **kw)
    assert est.stop_reason_ == ("tolerance" if kw["method"] == "nomad" else "max_iter")
    before = store_digest(store)
    again = dnomad.resume(store)
    assert store_digest(store) == before
    assert_same(learned(again), learned(est))
    if kw["method"] == "nomad":
        np.testing.assert_array_equal(np.asarray(again.Q_), np.asarray(est.Q_))
        np.testing.assert_array_equal(again.embedding_, est.embedding_)
        assert [layer["sdp_k"] for layer in again.layers_] == [layer["sdp_k"] for layer in est.layers_]
        assert [layer["n_iter"] for layer in again.layers_] == [layer["n_iter"] for layer in est.layers_]
    # fit(..., resume=True) on the finished store is the same no-op
    refit = dnomad.fit(make(), store=store, resume=True, **kw)
    assert store_digest(store) == before
    assert_same(learned(refit), learned(est))


class Crash(Exception):
    pass


def crash(*args, **kwargs):
    """Stands for _write_result: the process dies after the last checkpoint, before the result."""
    raise Crash


@pytest.mark.parametrize("case", list(RUNS))
def test_crash_after_the_last_checkpoint_resumes_to_the_uninterrupted_result(case, tmp_path, monkeypatch):
    make, kw = RUNS[case]
    X = make()
    whole = str(tmp_path / "whole.zarr")
    crashed = str(tmp_path / "crashed.zarr")
    est = dnomad.fit(X, store=whole, **kw)

    with monkeypatch.context() as m:
        m.setattr(runs, "write_result", crash)
        with pytest.raises(Crash):
            dnomad.fit(X, store=crashed, **kw)
    assert run_store.read_json(crashed, "result") is None
    resumed = dnomad.resume(crashed)
    assert_same(learned(resumed), learned(est))
    for path in ("labels", "embedding", "Q", "Y", "W"):
        if run_store.has_array(whole, f"result/{path}"):
            np.testing.assert_array_equal(run_store.read_vector(crashed, f"result/{path}"),
                                          run_store.read_vector(whole, f"result/{path}"))

    def untimed(store):          # the history but its wall times, NaN made comparable
        return [{k: None if v != v else v for k, v in row.items() if k != "seconds"}
                for row in run_store.read_table(store, "result/history")]

    assert untimed(crashed) == untimed(whole)


def test_a_run_stopped_by_its_callback_stays_stopped_on_resume(tmp_path, monkeypatch):
    """The callback is not saved: the final checkpoint's stop reason is what keeps a
    crashed run that its callback had stopped from iterating on."""
    X = two_rings(100)[0]
    store = str(tmp_path / "run.zarr")

    with monkeypatch.context() as m:
        m.setattr(runs, "write_result", crash)
        with pytest.raises(Crash):
            dnomad.NOMAD(n_clusters=6, sdp_k=6, store=store, callback=lambda row: row["iteration"] == 30).fit(X)
    resumed = dnomad.resume(store)
    assert resumed.n_iter_ == 30 and resumed.stop_reason_ == "callback"


def test_a_run_stopped_at_max_iter_goes_on_when_resumed_with_a_larger_max_iter(tmp_path):
    X = blobs()
    store = str(tmp_path / "run.zarr")
    dnomad.NOMAD(n_clusters=3, sdp_k=3, max_iter=20, checkpoint_every=7, store=store).fit(X)
    assert dnomad.resume(store).n_iter_ == 20                       # as it was: nothing to resume
    longer = dnomad.resume(store, max_iter=30)
    whole = dnomad.NOMAD(n_clusters=3, sdp_k=3, max_iter=30).fit(X)
    assert longer.n_iter_ == whole.n_iter_ == 30
    np.testing.assert_array_equal(np.asarray(longer.Q_), np.asarray(whole.Q_))


def test_cli_resume_of_a_finished_run_reports_it_and_changes_nothing(tmp_path, capsys):
    from dnomad.cli import main

    store = str(tmp_path / "run.zarr")
    dnomad.fit(blobs(), method="nomad", n_clusters=3, sdp_k=3, store=store)
    before = store_digest(store)
    assert main(["resume", store]) == 0
    out = capsys.readouterr().out
    assert "finished on" in out and "stop_reason tolerance" in out and "nothing to resume" in out
    assert store_digest(store) == before


def test_a_max_iter_stop_resumed_with_the_default_max_iter_goes_on_to_the_tolerance(tmp_path):
    """max_iter=None resolves to the solver's default (2000 outer iterations), larger than
    the 20 the run stopped at: it goes on; while it does, the old result is withdrawn."""
    X = blobs()
    store = str(tmp_path / "run.zarr")
    dnomad.NOMAD(n_clusters=3, sdp_k=3, max_iter=20, store=store).fit(X)
    est = dnomad.NOMAD(n_clusters=3, sdp_k=3, store=store).fit(X, resume=True)
    assert est.stop_reason_ == "tolerance" and est.n_iter_ > 20
    assert run_store.read_json(store, "result")["n_iter"] == est.n_iter_
    assert run_store.read_json(store, "dnomad_run")["estimator_params"]["max_iter"] == 2000


def test_resume_of_a_store_without_a_run_is_refused_and_writes_nothing(tmp_path):
    store = tmp_path / "empty.zarr"
    with pytest.raises(dnomad.StoreError, match="holds no dnomad run to resume"):
        dnomad.NOMAD(n_clusters=3, sdp_k=3, store=str(store)).fit(blobs(), resume=True)
    assert not store.exists()
