"""The input gate, table-driven: every bad parameter and bad data set of every method is
refused with a clear error (a DnomadError of the expected builtin type whose message
names the argument), before any pass over the data, and without writing a store (issue
23).  Bad parameter values are made for each constraint an estimator declares, and the
issue's own cases are listed by hand; bad data covers dtypes, shapes, content and kinds."""
import os

import dask.array
import numpy as np
import pandas
import pytest
import scipy.sparse
import xarray

import dnomad
from dnomad import validation
from dnomad.blocks import store as run_store
from dnomad.data import gaussian_blobs, separable_nmf
from dnomad.errors import DnomadError, InputTypeError, InputValueError

from dnomad.api import ESTIMATORS
BLOBS = gaussian_blobs(40, n_centers=2, separation=8.0, random_state=0)[0] + 5.0     # positive, for every divergence
HOTT = separable_nmf(12, 40, 3, random_state=0)["X"]


def good_data(method):
    return HOTT if method == "hottopixx" else BLOBS


def base_params(method):
    return {"rank": 3} if method == "hottopixx" else {"n_clusters": 2}


# ------------------------------------------------------------------ parameters
class _Thing:
    pass


def bad_values(constraints):
    """Values that satisfy none of ``constraints`` (each checked below, so a value that
    happens to be allowed is dropped rather than asserted wrongly)."""
    candidates = ["abc", "", -1, 0, 1.5, -2.5, float("nan"), float("inf"), True, None, 10**30, b"x",
                  [1, 2], {"a": 1}, _Thing(), np.float64(np.nan), "false", 3j, np.int64(-7), 1e-400 - 1]
    return [v for v in candidates if not any(validation._holds(c, v) for c in constraints)]


def parameter_cases():
    cases = []
    for method, est in ESTIMATORS.items():
        for name, constraints in est._parameter_constraints.items():
            for i, value in enumerate(bad_values(constraints)):
                cases.append(pytest.param(method, {name: value}, InputValueError, name,
                                          id=f"{method}-{name}-{i}"))
    return cases


# The issue's own list, and values that slipped through before it.
ISSUE_CASES = [
    ("bregman", {"max_iter": -1}, "max_iter"), ("bregman", {"max_iter": -5}, "max_iter"),
    ("bregman", {"max_iter": 0}, "max_iter"), ("bregman", {"tol": float("nan")}, "tol"),
    ("bregman", {"tol": 0}, "tol"), ("nomad", {"rmse_tol": "1e-4"}, "rmse_tol"),
    ("nomad", {"component_threshold": "0.5"}, "component_threshold"),
    ("hottopixx", {"cluster_threshold": "0.8"}, "cluster_threshold"),
    ("riemannian-kmeans", {"kappa_plus": "1.3"}, "kappa_plus"),
    ("riemannian-kmeans", {"boundary_fraction": "0.9"}, "boundary_fraction"),
    ("nomad", {"store": 123}, "store"), ("symnmf", {"store": 123}, "store"),
    ("nomad", {"block_size": True}, "block_size"), ("nomad", {"random_state": "abc"}, "random_state"),
    ("nomad", {"callback": 5}, "callback"), ("nomad", {"callback": lambda: None}, "callback"),
    ("symnmf", {"callback": lambda a, b: None}, "callback"),
    ("nomad", {"overwrite": "false"}, "overwrite"), ("nomad", {"overwrite": "no"}, "overwrite"),
    ("symnmf", {"overwrite": 0}, "overwrite"), ("nomad", {"precomputed": "yes"}, "precomputed"),
    ("riemannian-kmeans", {"second_order": 1}, "second_order"), ("nomad", {"dtype": "int32"}, "dtype"),
    ("nomad", {"dtype": np.float16}, "dtype"), ("symnmf", {"dtype": int}, "dtype"),
    ("nlr", {"n_clusters": 2.0}, "n_clusters"), ("hottopixx", {"rank": np.float64(3)}, "rank"),
    ("bregman", {"divergence": "cosine"}, "divergence"), ("bregman", {"divergence": 3}, "divergence"),
    ("nomad", {"layers": "thirds"}, "layers"), ("nomad", {"n_clusters": 1}, "n_clusters"),
    ("nomad", {"n_clusters": 40}, "n_clusters"), ("symnmf", {"n_clusters": 41}, "n_clusters"),
    ("hottopixx", {"rank": 13}, "rank"), ("nomad", {"solver": "bm", "rank": 1}, "rank"),
    ("nomad", {"solver_options": {"sigma": 2.0}}, "solver_options"),
    ("symnmf", {"init": "kmeans++"}, "init"), ("symnmf", {"init": np.ones((3, 2))}, "init"),
    ("riemannian-kmeans", {"mu": [0.1, 0.2]}, "mu"), ("riemannian-kmeans", {"mu": -1.0}, "mu"),
    ("nlr", {"rank": 1}, "rank"), ("nomad", {"sdp_k": 2, "n_clusters": 3}, "sdp_k"),
    ("nlr", {"tol": 10**400}, "tol"), ("nomad", {"random_state": np.random.RandomState(0)}, "random_state"),
    # sizes against the 40 samples (issue 69): named, not an internal r or a silent cap
    ("nomad", {"n_components": 39}, "n_components"), ("riemannian-kmeans", {"n_clusters": 40}, "n_clusters"),
    ("riemannian-kmeans", {"rank": 41}, "rank"), ("nlr", {"n_clusters": 41}, "n_clusters"),
    ("nlr", {"rank": 41}, "rank"), ("riemannian-kmeans", {"n_components": 3}, "n_components"),
]


def issue_cases():
    return [pytest.param(m, kw, InputValueError, name, id=f"issue-{m}-{name}-{i}")
            for i, (m, kw, name) in enumerate(ISSUE_CASES)]


# ------------------------------------------------------------------ data
def _data(method):
    n = good_data(method)
    neg = n.copy()
    neg[3, 1] = -1.0
    nan = n.copy()
    nan[2, 0] = np.nan
    inf = n.copy()
    inf[0, 1] = -np.inf
    huge = n.copy()
    huge[1, 1] = 1e200
    zero_row = n.copy()
    zero_row[4] = 0.0
    return {
        "complex": (n.astype(complex), InputTypeError, "complex"),
        "complex-list": (n.astype(complex).tolist(), InputTypeError, "complex"),
        "bool": (n > n.mean(), InputTypeError, "boolean"),
        "object": (n.astype(object), InputTypeError, "object"),
        "strings": (n.astype(str), InputTypeError, "string"),
        "numeric-string-list": ([[str(v) for v in row] for row in n.tolist()], InputTypeError, "string"),
        "ragged-list": ([[1.0, 2.0], [3.0]], InputTypeError, "X"),
        "datetime": (np.zeros(n.shape, "datetime64[s]"), InputTypeError, "datetime"),
        "dict": ({"a": n}, InputTypeError, "X must be an array"),
        "none": (None, InputTypeError, "X must be an array"),
        "scalar": (np.float64(3.0), InputValueError, "2-D"),
        "1-D": (n[:, 0], InputValueError, "2-D"),
        "3-D": (n[None], InputValueError, "2-D"),
        "empty": (np.zeros((0, 2)), InputValueError, "while a minimum of"),
        "no-columns": (np.zeros((30, 0)), InputValueError, "while a minimum of"),
        "nan": (nan, InputValueError, "NaN"),
        "inf": (inf, InputValueError, "NaN or Inf"),
        "huge": (huge, InputValueError, "magnitude"),
        "missing-zarr-path": ("/nonexistent/dir/X.zarr", InputValueError, "not a readable Zarr array"),
        "masked": (np.ma.masked_greater(n, np.median(n)), InputValueError, "masked"),
        "dask-of-masked": (dask.array.from_array(np.ma.masked_greater(n, np.median(n)), chunks=(10, 2)),
                           InputValueError, "masked"),
        "pandas-strings": (pandas.DataFrame({"a": n[:, 0], "b": ["x"] * len(n)}), InputTypeError, "columns b"),
        "pandas-missing": (pandas.DataFrame(nan).astype("Float64"), InputValueError, "NaN"),
        "negative": (neg, InputValueError, "nonnegative") if method == "hottopixx" else None,
        "zero-row": (zero_row, InputValueError, "all zero") if method == "hottopixx" else None,
        # every row the same point: no clustering is better than another (SymNMF's all-ones
        # affinity is a well-posed factorization, HOTTOPIXX's rows are features)
        "constant": (np.ones((30, 3)), InputValueError, "same point") if method not in ("hottopixx", "symnmf")
        else None,
        "sparse": (scipy.sparse.csr_matrix(n), InputTypeError, "sparse") if method != "hottopixx" else None,
        "sparse-nan": (scipy.sparse.csr_matrix(nan), InputValueError, "NaN") if method == "hottopixx" else None,
        "kl-domain": (n - n.max(), InputValueError, "X") if method == "bregman" else None,
    }


def data_cases():
    cases = []
    for method in ESTIMATORS:
        for name, case in _data(method).items():
            if case is None:
                continue
            X, err, match = case
            params = {"divergence": "kl"} if name == "kl-domain" else {}
            cases.append(pytest.param(method, params, err, match, X, id=f"{method}-data-{name}"))
    # precomputed matrices (NOMAD's Gram, SymNMF's affinity)
    A = BLOBS @ BLOBS.T
    for method, flag in (("nomad", {"precomputed": True}), ("symnmf", {"affinity": "precomputed"})):
        for name, (X, err, match) in {
            "non-square": (A[:, :-1], InputValueError, "square"),
            "non-symmetric": (np.triu(A), InputValueError, "symmetric"),
            "complex": (A.astype(complex), InputTypeError, "complex"),
            "nan": (np.where(np.eye(len(A)) > 0, np.nan, A), InputValueError, "NaN"),
            "float32-overflow": (A * 1e37, InputValueError, "float32"),
        }.items():
            cases.append(pytest.param(method, flag, err, match, X, id=f"{method}-precomputed-{name}"))
    cases.append(pytest.param("symnmf", {"affinity": "precomputed"}, InputValueError, "nonnegative",
                              A - A.mean(), id="symnmf-precomputed-negative"))
    return cases


# ------------------------------------------------------------------ the test
@pytest.fixture
def passes(monkeypatch):
    """Count the passes over data: block passes, row-chunk passes, HOTTOPIXX's epochs."""
    from dnomad.blocks import columns, engine, rows

    calls = []

    def spy(owner, name):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)

    spy(engine.BlockGroup, "map_blocks")
    spy(rows.RowChunks, "map")
    spy(columns, "stream_rows")
    return calls


GOOD = object()          # "the method's good data set" in a case


def _refused(method, params, err, match, X, tmp_path, passes):
    store = tmp_path / "run.zarr"
    kw = dict(base_params(method), store=str(store))
    kw.update(params)
    with pytest.raises(err) as info:
        dnomad.fit(good_data(method) if X is GOOD else X, method=method, **kw)
    assert isinstance(info.value, DnomadError), f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert match.lower() in message.lower(), message
    assert "\n" not in message
    assert passes == [], f"passes ran before the error: {passes}"
    assert not store.exists() and not os.path.exists(f"{store}.lock"), "the refused run wrote its store"


@pytest.mark.parametrize("method,params,err,match", parameter_cases() + issue_cases())
def test_bad_parameters_are_refused_before_any_pass_and_any_store(method, params, err, match, tmp_path,
                                                                  passes):
    _refused(method, params, err, match, GOOD, tmp_path, passes)


@pytest.mark.parametrize("method,params,err,match,X", data_cases())
def test_bad_data_is_refused_before_any_pass_and_any_store(method, params, err, match, X, tmp_path, passes):
    _refused(method, params, err, match, X, tmp_path, passes)


@pytest.mark.parametrize("method", list(ESTIMATORS))
def test_every_parameter_has_its_constraints(method):
    """The table is made from the constraints: a parameter without any would go unchecked."""
    est = ESTIMATORS[method]()
    assert set(est._parameter_constraints) == set(est.get_params())


def test_the_table_is_large_and_covers_every_method():
    cases = parameter_cases() + issue_cases() + data_cases()
    assert len(cases) >= 200
    assert {c.values[0] for c in cases} == set(ESTIMATORS)


def test_good_values_of_every_kind_pass_the_gate():
    """The gate refuses what it must and no more: NumPy ints and bools, path-likes,
    Generators and dtype spellings are accepted."""
    est = dnomad.NOMAD(np.int64(3), sdp_k=np.int64(3), overwrite=np.bool_(False), store=None, random_state=np.random.default_rng(0),
                       dtype="float64", block_size=np.int32(16), component_threshold=np.float32(0.5),
                       callback=lambda row: None)
    validation.validate_params(est)
    validation.validate_params(dnomad.SymNMF(2, store=os.path.join("a", "b.zarr"), dtype=np.float32))
    import pathlib

    validation.validate_params(dnomad.NOMAD(4, layers=np.array([4, 2]), device="CPU", store=pathlib.Path("r.zarr"),
                                            random_state=np.random.SeedSequence(1)))
    validation.validate_params(dnomad.NOMAD(4, layers=range(4, 1, -2), random_state=np.random.PCG64(1)))
    validation.validate_params(dnomad.BregmanClustering(2, divergence=dnomad.bregman.get_divergence("kl")))
    X = validation.check_data(np.arange(12, dtype=np.int16).reshape(6, 2), owner="T")
    assert X.dtype == np.float64


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_a_store_claimed_for_a_run_refused_late_is_released(tmp_path):
    """Content the gate cannot see before the claim (a Zarr input read at fit time) is
    refused where it is read; the store the run had claimed is removed again, and the
    corrected rerun is not refused as 'already holds a dnomad run'."""
    import zarr

    bad = BLOBS.copy()
    bad[7, 0] = np.nan
    path = str(tmp_path / "X.zarr")
    zarr.create_array(store=path, shape=bad.shape, dtype=bad.dtype, chunks=(16, 2))[...] = bad
    store = str(tmp_path / "run.zarr")
    for method in ("nomad", "riemannian-kmeans", "nlr", "bregman"):
        kw = {"model": "cond"} if method == "bregman" else {}
        with pytest.raises(InputValueError, match="NaN"):
            dnomad.fit(path, method=method, n_clusters=2, store=store, **kw)
        assert not os.path.exists(store) and not os.path.exists(store + ".lock"), method
    est = dnomad.fit(BLOBS, method="nlr", n_clusters=2, store=store, max_iter=50)
    assert run_store.read_json(store, "result") is not None and est.labels_.shape == (len(BLOBS),)


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("method,params_class,params", [
    ("nomad", "dnomad.nomad.cgm.NomadParams", {"n_clusters": 2, "sdp_k": 2, "max_iter": 3}),
    ("nomad", "dnomad.nomad.bm.BurerMonteiroParams", {"n_clusters": 2, "sdp_k": 2, "solver": "bm", "rank": 4, "max_iter": 2}),
    ("nomad", "dnomad.nomad.cgm.NomadParams", {"n_clusters": 2, "layers": [3, 2], "max_iter": 3}),
    ("symnmf", "dnomad.symnmf.solvers.SymNMFParams", {"n_clusters": 2, "max_iter": 3}),
    ("hottopixx", "dnomad.hottopixx.solver.HottopixxParams", {"rank": 3, "n_epochs": 2}),
])
def test_a_fit_checks_its_solver_parameters_once(method, params_class, params, monkeypatch):
    """One validation layer: the solver's parameters are checked once per layer at fit,
    before the data is read, and the solver the fit calls does not check them again; a
    solver called directly still checks them (tests of each solver's bad parameters)."""
    import importlib

    module, name = params_class.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    calls = []
    original = cls.validate
    monkeypatch.setattr(cls, "validate", lambda self, size: (calls.append(size), original(self, size))[1])
    ESTIMATORS[method](**params).fit(good_data(method))
    assert len(calls) == len(params.get("layers", [None])), calls


def _input_kinds(X, tmp_path):
    """X as each array-like a scientific Python user hands over."""
    path = tmp_path / "X.npy"
    np.save(path, X)
    read_only = X.copy()
    read_only.flags.writeable = False
    unknown = dask.array.from_array(X, chunks=(7, X.shape[1]))
    unknown = unknown[unknown[:, 0] > -np.inf]                  # chunk sizes unknown (NaN)
    assert np.isnan(unknown.shape[0])
    return {"masked-none": np.ma.masked_array(X), "pandas": pandas.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])]),
            "xarray": xarray.DataArray(X, dims=("sample", "feature")),
            "xarray-dask": xarray.DataArray(X, dims=("sample", "feature")).chunk({"sample": 9}),
            "memmap": np.load(path, mmap_mode="r"), "read-only": read_only, "dask-unknown-chunks": unknown}


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("method", list(ESTIMATORS))
def test_every_input_kind_gives_the_labels_of_its_numpy_array(method, tmp_path):
    """Masked arrays without masked entries, pandas and xarray objects (NumPy- or
    dask-backed), read-only memmaps and arrays, dask arrays of unknown chunk sizes: each
    fits to the labels (HOTTOPIXX: the anchor rows) the NumPy array gives, with its d."""
    X = good_data(method)
    params = dict(base_params(method), random_state=0)
    expected = dnomad.fit(X, method=method, **params)
    for kind, Xk in _input_kinds(X, tmp_path).items():
        est = dnomad.fit(Xk, method=method, **params)
        assert est.n_features_in_ == expected.n_features_in_, kind
        result = "hott_rows_" if method == "hottopixx" else "labels_"
        np.testing.assert_array_equal(getattr(est, result), getattr(expected, result), err_msg=kind)
