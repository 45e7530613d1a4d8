"""A damaged run store is named, never crashed on (issue 69): every field of the run record,
of the checkpoint record and of the result record, every array they point at and the
history tables, removed or of the wrong type, and a truncated zarr.json: ``dnomad.resume``
and ``dnomad resume`` raise a StoreError that names the part and what to do, and ``dnomad
info`` says "damaged: ..." (or refuses a damaged run record) instead of reporting a healthy
run.  Each case damages a copy of a real store of each method."""
import json
import re
import shutil
import warnings

import numpy as np
import pytest
import zarr

import dnomad
from dnomad.blocks import store as run_store
from dnomad.cli import main
from dnomad.errors import StoreError

# method -> fit parameters (each run keeps checkpoints where its method does)
METHODS = {"nomad": {"n_clusters": 2, "checkpoint_every": 5},
           "symnmf": {"n_clusters": 2, "checkpoint_every": 5, "max_iter": 30},
           "riemannian-kmeans": {"n_clusters": 2, "checkpoint_every": 2},
           "nlr": {"n_clusters": 2, "checkpoint_every": 5},
           "hottopixx": {"rank": 2},
           "bregman": {"n_clusters": 2}}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A finished store of each method, fitted on a Zarr X (so that every one resumes)."""
    root = tmp_path_factory.mktemp("integrity")
    X = np.abs(np.random.default_rng(0).standard_normal((60, 3))) + 0.1
    z = zarr.create_array(store=str(root / "X.zarr"), shape=X.shape, dtype=X.dtype, chunks=(30, 3))
    z[...] = X
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method, params in METHODS.items():
            store = root / f"{method}.zarr"
            dnomad.fit(str(root / "X.zarr"), method=method, store=str(store), **params)
            out[method] = store
    return out


def _attrs(store):
    return dict(zarr.open_group(str(store), mode="r").attrs)


def _set_attr(store, key, value):
    g = zarr.open_group(str(store), mode="a")
    attrs = dict(g.attrs)
    attrs[key] = value
    g.attrs.put(attrs)


def _edit_record(key, edit):
    def damage(store):
        record = _attrs(store)[key]
        _set_attr(store, key, edit(dict(record)) if callable(edit) else edit)
    return damage


def _without(field):
    def edit(record):
        record.pop(field)
        return record
    return edit


def _with(**fields):
    return lambda record: dict(record, **fields)


def _remove(path):
    return lambda store: shutil.rmtree(store / path)


def _checkpoint_key(method):
    return f"{method}_checkpoint"


def _slot(store, method):
    return f"checkpoint/{_attrs(store)[_checkpoint_key(method)]['slot']}"


def _first_array(store, method):
    return _attrs(store)[_checkpoint_key(method)]["arrays"][0]


def _history_column(prefix):
    def damage(store):
        column = _attrs_of(store, f"{prefix}/history")["columns"][0]
        shutil.rmtree(store / prefix / "history" / column)
    return damage


def _attrs_of(store, path):
    return dict(zarr.open_group(str(store), path=path, mode="r").attrs)


def _shorten(store, prefix, name):
    """The array ``prefix/name`` rewritten one row short (its dtype kept)."""
    path = f"{prefix}/{name}"
    A = run_store.read_vector(str(store), path)
    run_store.write_vector(str(store), path, A[:-1] if A.ndim else np.atleast_1d(A))


def _set_digest_chunks(store, value):
    zarr.open_group(str(store), path=run_store.INPUT_DIGEST, mode="a").attrs["chunks"] = value


def _truncate_metadata(folder):
    meta = folder / "zarr.json"
    meta.write_text(meta.read_text()[: len(meta.read_text()) // 2])


def _truncate_root_metadata(store):
    _truncate_metadata(store)


def _bad_param(method):
    return {"rank": -3} if method == "hottopixx" else {"n_clusters": -3}


# (record, state, name, damage(store) -> None, the part the message names); state
# "finished": the finished store, "interrupted": its result withdrawn (the last checkpoint
# stands); a damaged run record is refused by `dnomad info` too, the others it shows.
def run_record_cases(method):
    key = run_store.RUN_MARKER
    cases = [("record-is-a-list", _edit_record(key, [1, 2]), "the run record"),
             ("method-wrong-type", _edit_record(key, _with(method=5)), "has method = 5"),
             ("method-unknown", _edit_record(key, _with(method="kmeans")), "names the method 'kmeans'"),
             ("params-a-list", _edit_record(key, _with(estimator_params=[1])), "has estimator_params = [1]"),
             ("params-unknown", _edit_record(key, lambda r: dict(r, estimator_params=dict(
                 r["estimator_params"], bogus=1))), "parameters it does not have: bogus"),
             ("params-bad-value", _edit_record(key, lambda r: dict(r, estimator_params=dict(
                 r["estimator_params"], **_bad_param(method)))), "holds parameters"),
             ("input-not-a-table", _edit_record(key, _with(input="x")), "has input = 'x'"),
             ("zarr-json-truncated", _truncate_root_metadata, "its metadata (zarr.json) cannot be read")]
    cases += [(f"no-{field}", _edit_record(key, _without(field)), f"lacks its field {field!r}")
              for field in ("method", "run_id", "estimator_params", "input")]
    return [("run", "finished") + case for case in cases]


def result_cases(method):
    cases = [("result-a-list", _edit_record("result", [1]), "the result record"),
             ("result-no-finished", _edit_record("result", _without("finished")), "lacks its field 'finished'"),
             ("result-arrays-not-names", _edit_record("result", _with(arrays="labels")), "has arrays = 'labels'"),
             ("result-array-deleted", lambda s: shutil.rmtree(s / "result" / _attrs(s)["result"]["arrays"][0]),
              "the result's array result/"),
             ("result-history-column-deleted", _history_column("result"), "the table result/history"),
             ("result-array-metadata-truncated", lambda s: _truncate_metadata(
                 s / "result" / _attrs(s)["result"]["arrays"][0]), "the array result/"),
             ("result-array-wrong-shape", lambda s: _shorten(s, "result", _attrs(s)["result"]["arrays"][0]),
              "not the ("),
             ("result-shapes-not-a-map", _edit_record("result", _with(shapes=[3])), "has shapes = [3]"),
             ("result-lazy-arrays-not-its-arrays", _edit_record("result", _with(lazy_arrays=["Z"])),
              "has lazy_arrays = ['Z']")]
    if method == "nomad":
        cases.append(("result-no-layers", _edit_record("result", _without("layers")), "lacks what NOMAD wrote"))
    return [("result", "finished") + case for case in cases]


def checkpoint_cases(method):
    if method == "bregman":
        return []                                   # keeps no checkpoints
    key = _checkpoint_key(method)
    cases = [("checkpoint-a-string", _edit_record(key, "a"), "the checkpoint record"),
             ("checkpoint-no-slot", _edit_record(key, _without("slot")), "lacks its field 'slot'"),
             ("checkpoint-slot-c", _edit_record(key, _with(slot="c")), "has slot = 'c'"),
             ("checkpoint-negative-iteration", _edit_record(key, _with(iteration=-1)), "has iteration = -1"),
             ("checkpoint-iteration-string", _edit_record(key, _with(iteration="7")), "has iteration = '7'"),
             ("checkpoint-arrays-not-names", _edit_record(key, _with(arrays=3)), "has arrays = 3"),
             ("checkpoint-array-deleted", lambda s: shutil.rmtree(s / _slot(s, method) / _first_array(s, method)),
              "the checkpoint's array checkpoint/"),
             ("checkpoint-history-column-deleted", lambda s: _history_column(_slot(s, method))(s),
              "the table checkpoint/"),
             ("checkpoint-array-wrong-shape", lambda s: _shorten(s, _slot(s, method), _first_array(s, method)),
              "not the (")]
    if method in ("riemannian-kmeans", "nlr", "hottopixx"):
        # the methods that read a Zarr X where it is (the others copy it into the store):
        # the digest of its chunks that a resume checks the input against
        cases.append(("input-digest-not-a-map", lambda s: _set_digest_chunks(s, "crc"), "the input's digest"))
    return [("checkpoint", "interrupted") + case for case in cases]


def cases():
    out = []
    for method in METHODS:
        for record, state, name, damage, part in (run_record_cases(method) + result_cases(method)
                                                  + checkpoint_cases(method)):
            out.append(pytest.param(method, record, state, damage, part, id=f"{method}-{name}"))
    return out


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("method,record,state,damage,part", cases())
def test_a_damaged_store_is_named_by_the_api_resume_and_info(method, record, state, damage, part, stores,
                                                            tmp_path, capsys):
    store = tmp_path / "run.zarr"
    shutil.copytree(stores[method], store)
    if state == "interrupted":
        run_store.drop_json(str(store), "result")
    damage(store)
    with pytest.raises(StoreError) as info:
        dnomad.resume(str(store))
    message = str(info.value)
    assert "is damaged" in message and part in message and "overwrite=True" in message, message
    assert "\n" not in message
    for command in (["resume", str(store)], ["info", str(store)]):
        status = main(command)
        out = capsys.readouterr()
        assert status != 0, (command, out.out)
        assert "Traceback" not in out.err
        text = out.out + out.err
        assert part in text, (command, text)
        if command[0] == "info" and record != "run":
            assert "status      damaged: " in out.out, out.out          # the rest of the record is shown


def test_the_table_covers_every_record_and_array_of_every_method():
    names = {c.id.split("-", 1)[1] for c in cases()}
    assert len(cases()) >= 100
    assert {"no-method", "no-run_id", "no-estimator_params", "no-input", "result-array-deleted",
            "checkpoint-array-deleted", "checkpoint-negative-iteration", "zarr-json-truncated",
            "result-array-wrong-shape", "checkpoint-array-wrong-shape", "input-digest-not-a-map"} <= names


def test_an_undamaged_store_stays_healthy_and_resumes(stores, tmp_path, capsys):
    """The checks refuse damage only: every method's finished store resumes to its result,
    `dnomad info` reports it finished, and its result record lists the arrays it wrote."""
    for method, source in stores.items():
        store = tmp_path / f"{method}.zarr"
        shutil.copytree(source, store)
        est = dnomad.resume(str(store))
        assert est.stop_reason_ is not None
        assert main(["info", str(store)]) == 0
        assert "status      finished" in capsys.readouterr().out
        arrays = _attrs(store)["result"]["arrays"]
        assert arrays and all(run_store.has_array(str(store), f"result/{a}") for a in arrays)
        json.dumps(arrays)


@pytest.mark.parametrize("held,why", [(["Z"], "has held = ['Z']"), ("Y", "has held = 'Y'")])
def test_a_checkpoint_whose_held_rows_are_not_its_arrays_is_damage(held, why, tmp_path):
    """A checkpoint record's ``held`` (the arrays the row chunks wrote, given back unread)
    must name arrays the record lists."""
    from dnomad.blocks import RowState

    url = str(tmp_path / "run.zarr")
    space = RowState(10)
    space.put("Y", np.ones((10, 2)))
    ck = run_store.Checkpoints(url, "ck")
    ck.save({"Y": space.held("Y"), "history": []})
    assert run_store.read_json(url, "ck")["held"] == ["Y"]
    _set_attr(tmp_path / "run.zarr", "ck", dict(run_store.read_json(url, "ck"), held=held))
    with pytest.raises(StoreError, match=re.escape(f"the checkpoint record 'ck' {why}, not a list of the arrays")):
        ck.load()
