"""NOMAD's passes and its solver over the engine's layouts: the fused pass equals the
NumPy expressions on every backend, and short runs agree across layouts, worker counts
and a factored D."""
import numpy as np
import pytest

from backends import N, make_group
from dnomad import blocks
from dnomad.nomad import passes as nomad_passes
from dnomad.nomad.cgm import NomadParams, nomad_cgm


@pytest.mark.parametrize("block_size", [N, 16])
@pytest.mark.parametrize("from_data,d", [(True, 3), (True, 12), (False, 3)])
def test_nomad_pass_equals_numpy(backend, client_for, block_size, from_data, d, tmp_path, rng):
    """D given, or formed in the pass from few features (inline) or many (a GEMM per block)."""
    dtype = np.float64
    X = rng.standard_normal((N, d))
    F = blocks.prepare_gram_data(X)
    D = F @ F.T
    kw = make_group(backend, block_size, dtype, tmp_path, client_for)
    if from_data:
        group = blocks.new_group(N, **kw)
        data = blocks.DataPanels(group, F)
    else:
        group = blocks.from_array(D, **kw).group
        data = None
    blocks.zeros_like_layout(group, ["P", "Gamma"])
    P = np.zeros((N, N))
    Gam = np.zeros((N, N))
    v = rng.standard_normal(N)
    v -= v.mean()
    v /= np.linalg.norm(v)
    # The last pass is an inner pass as the solver runs it: only <G, P> is reduced.
    for step, upd, full in [(0.5, False, True), (0.25, True, True), (0.1, True, True),
                            (0.3, False, False)]:
        stats = nomad_passes.nomad_pass(group, v=v, step=step, vv_scale=7.0, gamma=1.3, tau=0.9,
                                  update_gamma=upd, full_stats=full, data=data)
        P = (1 - step) * P + step * 7.0 * np.outer(v, v)
        v = np.roll(v, 7)
        Q = P + 1.0 / N
        if upd:
            Gam = np.minimum(Gam + 0.9 * Q, 0)
        G = -D + Gam + 1.3 * np.minimum(Q, 0)
        np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "P")), P, atol=1e-12)
        np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "Gamma")), Gam, atol=1e-12)
        np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "G")), G, atol=1e-12)
        neg = Q[Q < 0]
        assert stats["sum_GP"] == pytest.approx(np.sum(G * P), rel=1e-10)
        if not full:
            assert all(np.isnan(val) for key, val in stats.items() if key != "sum_GP")
            continue
        assert stats["sum_DQ"] == pytest.approx(np.sum(D * Q), rel=1e-10)
        assert stats["neg_count"] == neg.size
        assert stats["neg_sumsq"] == pytest.approx(np.sum(neg ** 2), rel=1e-10)
        assert stats["min_Q"] == pytest.approx(Q.min(), rel=1e-12)
    rec = group.passes.records[-1]
    assert rec.name == "nomad" and rec.bytes_read > 0 and rec.bytes_written > 0 and rec.seconds > 0


def short_run(dtype, **kw):
    X = np.c_[np.cos(np.linspace(0, 6, 60)), np.sin(np.linspace(0, 6, 60)) * 0.7]
    F = blocks.prepare_gram_data(X)
    group = blocks.new_group(60, dtype=dtype, **kw)
    data = blocks.DataPanels(group, F.astype(dtype))
    res = nomad_cgm(group, NomadParams(n_clusters=5, max_iter=4, n_inner=5, rmse_tol=0, min_tol=0,
                                       objective_tol=0), data=data)
    return np.asarray(res.Q, dtype=np.float64), res.history


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("dtype,rtol", [(np.float32, 1e-5), (np.float64, 1e-10)])
def test_nomad_equal_across_layouts(dtype, rtol, tmp_path, cluster_client):
    ref, ref_hist = short_run(dtype, backend="local", block_size=60)
    variants = {
        "local-b17": dict(backend="local", block_size=17),
        "zarr-b20": dict(backend="zarr", block_size=20, store=str(tmp_path / "z.zarr")),
        "dist-b60": dict(backend="distributed", block_size=60, client=cluster_client),
        "dist-b23": dict(backend="distributed", block_size=23, client=cluster_client),
    }
    for name, kw in variants.items():
        Q, hist = short_run(dtype, **kw)
        err = np.linalg.norm(Q - ref) / np.linalg.norm(ref)
        assert err <= rtol, (name, err)
        assert hist[-1]["objective"] == pytest.approx(ref_hist[-1]["objective"], rel=rtol), name


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_one_vs_two_workers_equal(cluster_client):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            Client(c) as client:
        one, _ = short_run(np.float64, backend="distributed", block_size=20, client=client)
    two, _ = short_run(np.float64, backend="distributed", block_size=20, client=cluster_client)
    here, _ = short_run(np.float64, backend="local", block_size=20)
    assert np.linalg.norm(one - two) / np.linalg.norm(two) <= 1e-10
    assert np.linalg.norm(two - here) / np.linalg.norm(here) <= 1e-10



@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("d", [2, 12])
def test_factored_gram_leaves_d_out_and_tracks_its_inner_product(d, rng):
    """With data panels NOMAD never forms D = F F^T: the pass writes G' = Gamma + gamma [Q]_-
    and the solver tracks <D, P> along the Frank-Wolfe steps.  The run equals one over the
    stored D (iterates to round-off), and the tracked <D, P> (kept in the checkpoint, or
    recomputed from P) equals the dense value."""
    import math

    from dnomad.nomad.cgm import _FactoredGram

    F = blocks.prepare_gram_data(rng.standard_normal((N, d)))
    D = F @ F.T
    params = NomadParams(n_clusters=4, max_iter=4, n_inner=5, rmse_tol=0, min_tol=0, objective_tol=0)
    group = blocks.new_group(N, dtype=np.float64, backend="local", block_size=16)
    data = blocks.DataPanels(group, F)
    states = []
    res = nomad_cgm(group, params, data=data, checkpoint=states.append, checkpoint_every=2)
    assert "D" not in group.names
    stored = blocks.from_array(D, dtype=np.float64, block_size=16)
    ref = nomad_cgm(stored.group, params)
    # Round-off, grown by 20 eigensolves at loose early tolerances: 2e-12 with AVX-512
    # BLAS kernels, 1e-13 with AVX2 ones.  A D term 1% off moves Q by 8e-3 (d = 2) to 4e-2.
    np.testing.assert_allclose(np.asarray(res.Q), np.asarray(ref.Q), rtol=0, atol=1e-10)
    for key in ("objective", "fw_gap", "rmse_neg"):
        assert res.history[-1][key] == pytest.approx(ref.history[-1][key], rel=1e-9), key
    P = np.asarray(res.P)
    want = np.sum(D * P)
    assert [s["iteration"] for s in states] == [2, 4]
    assert states[-1]["gram_inner_p"] == pytest.approx(want, rel=1e-10)
    ones = np.ones(N) / math.sqrt(N)
    assert _FactoredGram(data, group, ones, None).inner_p == pytest.approx(want, rel=1e-10)
    # The pass itself: G' leaves D out.
    nomad_passes.nomad_pass(group, v=None, step=0.0, vv_scale=3.0, gamma=1.3, tau=0.9, update_gamma=False,
                      data=data, exclude_d=True)
    Gam = np.asarray(blocks.BlockMatrix(group, "Gamma"))
    np.testing.assert_allclose(np.asarray(blocks.BlockMatrix(group, "G")),
                               Gam + 1.3 * np.minimum(P + 1.0 / N, 0), rtol=0, atol=1e-13)
