"""HOTTOPIXX's pieces: the projection onto Phi_0, the exact LP of Alg. 3, the components
LP, the block-nested epoch, the synthetic generator, and bad input."""
import itertools

import numpy as np
import pytest

from dnomad.blocks import kernels
from dnomad.data import separable_nmf
from dnomad.errors import InputValueError
from dnomad.metrics import inf1_norm, robust_simplicial_constant
from dnomad.solvers import hottopixx as H


def phi0_vertices(m):
    """Vertices of {x in R^m: 0 <= x_i <= x_0 <= 1}: 0, and x_0 = 1 with x_i in {0, 1}."""
    yield np.zeros(m)
    for rest in itertools.product([0.0, 1.0], repeat=m - 1):
        yield np.r_[1.0, rest]


@pytest.mark.parametrize("seed", range(6))
def test_column_squishing_is_the_euclidean_projection(seed):
    """Certificate of optimality: x = proj(z) iff x is feasible and <z - x, v - x> <= 0 for
    every vertex v of the (polytope) feasible set.  Ties and entries outside [0, 1]."""
    rng = np.random.default_rng(seed)
    f = 7
    C = rng.standard_normal((f, f)) * [0.3, 1.0, 3.0][seed % 3]
    if seed % 2:
        C = np.round(C * 2) / 2                      # many ties
    out = kernels.squish_columns(C)
    for j in range(f):
        others = [i for i in range(f) if i != j]
        z = np.r_[C[j, j], C[others, j]]
        x = np.r_[out[j, j], out[others, j]]
        assert 0 <= x[0] <= 1 and (x[1:] >= 0).all() and (x[1:] <= x[0] + 1e-15).all()
        worst = max(float((z - x) @ (v - x)) for v in phi0_vertices(f))
        assert worst <= 1e-12
    assert np.all(np.diagonal(out) <= 1) and out.min() >= 0
    assert np.all(out <= np.diagonal(out)[None, :] + 1e-15)


def test_clipping_keeps_diagonal_bound_and_sign():
    C = np.array([[1.5, -0.2], [0.7, 0.3]])
    np.testing.assert_array_equal(kernels.clip_phi(C), [[1.0, 0.0], [0.7, 0.3]])


def test_robust_simplicial_constant_of_unit_vectors_is_two():
    # e_i is at l1 distance 2 from the hull of the other unit vectors.
    assert robust_simplicial_constant(np.eye(4)) == pytest.approx(2.0, abs=1e-9)
    W = np.eye(3)
    W = np.r_[W, [[1 / 3, 1 / 3, 1 / 3]]]      # a point inside the hull: alpha = 0
    assert robust_simplicial_constant(W) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("noise", [0.0, 0.95])
def test_generator_matches_the_papers_model(noise):
    inst = separable_nmf(40, 300, 4, duplicates=1, noise=noise, random_state=3)
    X = inst["X"]
    assert X.shape == (40, 300) and X.min() >= 0
    np.testing.assert_allclose(X.sum(axis=1), 1, atol=1e-12)
    np.testing.assert_allclose(X[inst["hott"]], inst["W"], atol=inst["epsilon"] + 1e-15)
    assert sorted(np.bincount(inst["copies"][inst["copies"] >= 0])) == [2, 2, 2, 2]
    assert inst["alpha"] > 0
    assert inf1_norm(X - inst["F"] @ inst["W"]) <= inst["epsilon"] + 1e-12
    assert inst["epsilon"] == pytest.approx(noise * inst["alpha"] ** 2 / (20 + 13 * inst["alpha"]))


@pytest.mark.parametrize("f,n,r,d,seed", [(40, 400, 3, 0, 0), (40, 400, 5, 1, 1), (30, 300, 3, 1, 2)])
def test_exact_lp_recovers_hott_rows_of_separable_data(f, n, r, d, seed):
    inst = separable_nmf(f, n, r, duplicates=d, random_state=seed)
    X = H.check_data(inst["X"])
    cost = np.random.default_rng(seed).permutation(f) / f
    C = H.exact_lp(X, r, 0.0, cost)
    hott = H.hott_rows_from_diagonal(np.diagonal(C), r)
    assert np.allclose(np.diagonal(C)[hott], 1.0, atol=1e-7)
    assert sorted(inst["copies"][hott]) == list(range(r))      # one row of each topic
    F = H.exact_components(X, hott)
    assert F.min() >= -1e-12
    assert inf1_norm(X - F @ X[hott]) <= 1e-6


def test_epoch_does_not_depend_on_row_blocking():
    inst = separable_nmf(37, 200, 3, random_state=4)
    X = H.check_data(inst["X"])
    Xt = np.ascontiguousarray(X.T)
    order = np.random.default_rng(0).permutation(200)
    diag_step = np.linspace(0.001, 0.002, 37)
    results = []
    for row_block in (37, 8, 1):
        C = np.full((37, 37), 0.01)
        for _ in range(3):
            H.blocks.hottopixx_epoch(C, Xt, order, 0.1, diag_step, row_block=row_block)
        results.append(C)
    for C in results[1:]:
        np.testing.assert_array_equal(C, results[0])


def test_epoch_step_equals_dense_reference():
    """Alg. 4 line 6 for one column, written densely: C_i += s sign(X_ik - C_i X_k) X_k^T and
    C_ii -= diag_step_i where X_ik != 0."""
    rng = np.random.default_rng(5)
    f, n = 6, 9
    X = rng.random((f, n))
    X[2, 4] = 0.0
    C = rng.random((f, f)) * 0.2
    diag_step = rng.random(f) * 0.01
    ref = C.copy()
    for k in (4, 1):
        resid = X[:, k] - ref @ X[:, k]
        ref += 0.1 * np.sign(resid)[:, None] * X[:, k][None, :]
        ref[np.arange(f), np.arange(f)] -= np.where(X[:, k] != 0, diag_step, 0.0)
    H.blocks.hottopixx_epoch(C, np.ascontiguousarray(X.T), np.array([4, 1]), 0.1, diag_step, row_block=4)
    np.testing.assert_allclose(C, ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("X,rank,match", [
    (np.array([[0.5, -0.1], [0.2, 0.3]]), 1, "nonnegative"),
    (np.array([[0.5, 0.5], [0.0, 0.0]]), 1, "all-zero rows"),
    (np.array([[0.5, 0.5], [0.2, 0.3]]), 0, "rank"),
    (np.array([[0.5, 0.5], [0.2, 0.3]]), 3, "rank"),
    (np.array([[0.5, np.nan], [0.2, 0.3]]), 1, "NaN"),
])
def test_bad_input_raises(X, rank, match):
    with pytest.raises(InputValueError, match=match):
        H.hottopixx(X, H.HottopixxParams(rank=rank), random_state=0)


def test_sparse_epoch_equals_dense():
    import scipy.sparse as sp

    rng = np.random.default_rng(6)
    f, n = 30, 200
    X = rng.random((f, n)) * (rng.random((f, n)) < 0.15)
    X[:, 0] = 0.0                                          # an empty column
    X = X / np.maximum(X.sum(axis=1, keepdims=True), 1e-300)
    order = rng.permutation(n)
    diag_step = rng.random(f) * 1e-3
    dense = np.full((f, f), 0.02)
    sparse = dense.copy()
    for _ in range(2):
        H.blocks.hottopixx_epoch(dense, np.ascontiguousarray(X.T), order, 0.1, diag_step, row_block=7)
        H.blocks.hottopixx_epoch(sparse, sp.csr_matrix(X.T), order, 0.1, diag_step, row_block=11)
    np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-13)


def test_same_seed_same_result_dense_or_sparse_any_blocking():
    import scipy.sparse as sp

    inst = separable_nmf(30, 250, 3, random_state=7)
    X = inst["X"] * (np.random.default_rng(0).random((30, 250)) < 0.5)   # sparse-ish, rows nonzero
    runs = [H.hottopixx(X_, H.HottopixxParams(rank=3, n_epochs=5, row_block=b), random_state=11)
            for X_, b in ((X, 30), (X, 4), (sp.csr_matrix(X), 7))]
    for res in runs[1:]:
        np.testing.assert_allclose(res.C, runs[0].C, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(res.hott_rows, runs[0].hott_rows)
    assert [r["epoch"] for r in runs[0].history] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("on_cluster", [False, True])
def test_zarr_streamed_epoch_equals_in_memory(on_cluster, tmp_path, request):
    """Out of core: X^T in Zarr chunks of 64 columns, each row-block task streaming every
    chunk (on the 2-worker cluster or the local thread pool); the same blocked column
    order in memory gives the same C."""
    client = request.getfixturevalue("cluster_client") if on_cluster else None
    inst = separable_nmf(33, 300, 3, random_state=8)
    X = H.check_data(inst["X"])
    cols = H.blocks.ZarrColumns.write(X.T, str(tmp_path / "x.zarr"), "Xt", chunk=64)
    assert cols.n_chunks == 5
    rng = np.random.default_rng(1)
    diag_step = rng.random(33) * 1e-3
    mem = np.full((33, 33), 0.01)
    ooc = mem.copy()
    for _ in range(2):
        chunk_order, local = H.blocks.blocked_column_order(rng, 300, 64)
        flat = np.concatenate([c * 64 + loc for c, loc in zip(chunk_order, local)])
        assert sorted(flat) == list(range(300))
        H.blocks.hottopixx_epoch(mem, np.ascontiguousarray(X.T), flat, 0.1, diag_step, row_block=33)
        H.blocks.hottopixx_epoch(ooc, cols, (chunk_order, local), 0.1, diag_step, row_block=10,
                                 client=client)
    np.testing.assert_allclose(ooc, mem, rtol=0, atol=1e-14)
