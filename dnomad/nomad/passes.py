"""NOMAD's passes over a BlockGroup (Tepper et al., Alg. 2): the fused update-and-gradient
pass and the exact line searches along a Frank-Wolfe direction.  Each is one pass of the
engine's ``map_blocks`` (one task per stored block, reads and writes declared) over the
kernels of :mod:`dnomad.nomad.kernels`."""
from __future__ import annotations

import numpy as np

from ..blocks.device import array_module, to_host
from ..blocks.engine import BlockGroup
from ..blocks.passes import DataPanels, _weight, group_array, group_vector, row_slices
from ..errors import InputValueError
from . import kernels


# ------------------------------------------------------------------ NOMAD's fused pass
def _scratch_block(bundle, name, like):
    """The bundle's block ``name`` to be overwritten: kept where it has ``like``'s shape."""
    out = bundle.get(name)
    if out is None or out.shape != like.shape:
        out = array_module(like).empty_like(like)
        bundle[name] = out
    return out


def _nomad_block_task(bundle, key, vi, vj, Xi, Xj, params, weight, has_d, lowrank):
    P = bundle["P"]
    out_name, direction = params["out_name"], params["direction"]
    # The stored direction is read before G is allocated: it may be the block G reuses.
    V = bundle[direction] if direction is not None else None
    G = _scratch_block(bundle, out_name, P) if params["write_g"] else None
    stats = kernels.nomad_block(
        P, bundle["Gamma"], G, D=bundle["D"] if has_d else None, Xi=Xi, Xj=Xj, vi=vi, vj=vj,
        step=params["step"], vv_scale=params["vv_scale"], gamma=params["gamma"],
        tau=params["tau"], inv_n=params["inv_n"], update_gamma=params["update_gamma"],
        write_g=params["write_g"], weight=weight, full_stats=params["full_stats"],
        shifted=params["shifted"], out_p=params["out_p"], out_g=params["out_g"], lowrank=lowrank,
        direction=V)
    return stats


def nomad_pass(group: BlockGroup, *, v, step, vv_scale, gamma, tau, update_gamma, write_g=True,
               full_stats=True, data: DataPanels | None = None, exclude_d=False, lowrank=None,
               direction=None, shifted=False, out_p=0.0, out_g=1.0, out_name="G"):
    """NOMAD's fused pass (Alg. 2 of Tepper et al.), one read of D, P, Gamma:

    P <- (1 - step) P + step * vv_scale * v v^T      (the pending Frank-Wolfe step)
    Gamma <- [Gamma + tau (P + E_n)]_-               (only when ``update_gamma``)
    G <- -D + Gamma + gamma [P + E_n]_-              (the gradient, for the eigensolver)

    With ``lowrank`` = (A, U) (n x k each) the pending step is P <- (1 - step) P + A U^T
    instead (A already scaled by the step; v is ignored); with ``direction`` = the name of
    a stored matrix V (the rank-k direction as :func:`lowrank_line_search_pass` stored it),
    P <- (1 - step) P + step V, V read in this pass (it may be ``out_name``).  ``shifted`` takes the
    gradient of the classical augmented Lagrangian, G = -D + [Gamma + gamma (P + E_n)]_-.
    The matrix written, named ``out_name``, is out_p P + out_g G (G by default).

    D is the group's matrix "D", or formed per block from ``data`` panels; with
    ``exclude_d`` the pass leaves D out (G <- Gamma + gamma [P + E_n]_-, and ``sum_DQ`` is 0):
    a caller that knows D = X X^T adds its low-rank part itself, and the pass neither
    reads nor forms an n x n D.
    Returns a dict of the statistics of Q = P + E_n (``kernels.NOMAD_STATS``); with
    ``full_stats=False`` (the inner passes, which need only <G, P>) a pass that writes G
    and leaves Gamma reduces ``sum_GP`` alone and the others are NaN: its loop vectorizes.
    Cost: reads 2-3 matrices, writes 2-3 (upper blocks only); one gather.
    """
    if lowrank is not None and direction is not None:
        # Refused here, before any block changes, and by each block's kernel.
        raise InputValueError("nomad_pass takes the rank-k step as lowrank = (A, U) or as its stored "
                              "direction, not both")
    layout = group.layout
    n = layout.n
    has_d = data is None and not exclude_d
    if v is None:
        v = np.zeros(n, group.dtype)
        if lowrank is None and direction is None:
            step = 0.0
    v = group_vector(group, v)
    if exclude_d:
        # Zero-width panels: the kernels' inline D = X_i X_j^T over no features is 0.
        xp = array_module(v)
        data = [xp.zeros((layout.size(i), 0), group.dtype) for i in range(layout.nblocks)]
        pair = lambda key: (data[key[0]], data[key[1]])        # noqa: E731
    elif data is not None:
        pair = data.pair
    params = dict(step=float(step), vv_scale=float(vv_scale), gamma=float(gamma), tau=float(tau),
                  inv_n=1.0 / n, update_gamma=bool(update_gamma), write_g=bool(write_g),
                  full_stats=bool(full_stats), shifted=bool(shifted), out_p=float(out_p),
                  out_g=float(out_g), out_name=str(out_name),
                  direction=None if direction is None else str(direction))
    if lowrank is not None:
        lowrank = (group_array(group, lowrank[0]), group_array(group, lowrank[1]))

    def args(key):
        vi, vj = row_slices(layout, v, key)
        Xi, Xj = (None, None) if has_d else pair(key)
        low = None
        if lowrank is not None:
            low = (row_slices(layout, lowrank[0], key)[0], row_slices(layout, lowrank[1], key)[1])
        return (vi, vj, Xi, Xj, params, _weight(layout, key), has_d, low)

    reads = ["P", "Gamma"] + (["D"] if has_d else []) + ([str(direction)] if direction is not None else [])
    writes = ["P"] + (["Gamma"] if update_gamma else []) + ([out_name] if write_g else [])
    results = group.map_blocks(_nomad_block_task, args, reads=reads, writes=writes, name="nomad")
    stats = np.stack(results)
    out = dict(zip(kernels.NOMAD_STATS, stats.sum(axis=0)))
    out["min_Q"] = stats[:, kernels.MIN_Q].min()
    return {k: float(val) for k, val in out.items()}


# ------------------------------------------------------------------ line search
def _line_search_task(bundle, key, name, vi, vj, vv_scale, inv_n, weight):
    return kernels.line_search_block(bundle[name], vi=vi, vj=vj, vv_scale=vv_scale, inv_n=inv_n,
                                     weight=weight)


def line_search_pass(group: BlockGroup, *, v, vv_scale, name="P"):
    """The penalty term's slope along a Frank-Wolfe direction, for an exact line search.

    With P the group's matrix ``name``, Q = P + E_n and Delta = vv_scale v v^T - P, returns
    h(alpha) = <[Q + alpha Delta]_-, Delta> at alpha = 0 and at the grid alpha_m = 2^(-m / kernels.LS_BINS_PER_OCTAVE), m = 0..LS_BINS,
    exactly (each entry's breakpoint -Q/Delta is binned between grid points).  h is
    continuous, piecewise linear and nondecreasing.  One read of P; one gather.
    Returns (alphas, h_at_alphas, h_at_0).
    """
    layout = group.layout
    n = layout.n
    v = group_vector(group, v)

    def args(key):
        vi, vj = row_slices(layout, v, key)
        return (name, vi, vj, float(vv_scale), 1.0 / n, _weight(layout, key))

    res = np.sum(group.map_blocks(_line_search_task, args, reads=[name], writes=[],
                                  name="line_search"), axis=0)
    return _line_search_curve(res)


def _line_search_curve(res):
    """(alphas, h(alphas), h(0)) from the binned sums of the line-search kernels."""
    m1 = kernels.LS_BINS + 1
    a0, b0 = res[0], res[1]
    a_dec, b_dec = res[2:2 + m1], res[2 + m1:2 + 2 * m1]
    a_rise, b_rise = res[2 + 2 * m1:2 + 3 * m1], res[2 + 3 * m1:]
    alphas = 2.0 ** (-np.arange(m1) / kernels.LS_BINS_PER_OCTAVE)
    # Decreasing entries binned at b are active at alpha_m for m > b; rising ones for m <= b.
    dec_a = np.concatenate([[0.0], np.cumsum(a_dec)[:-1]])
    dec_b = np.concatenate([[0.0], np.cumsum(b_dec)[:-1]])
    rise_a = np.cumsum(a_rise[::-1])[::-1]
    rise_b = np.cumsum(b_rise[::-1])[::-1]
    h = a0 + dec_a + rise_a + alphas * (b0 + dec_b + rise_b)
    return alphas, h, a0 + a_dec.sum()


def _lowrank_line_search_task(bundle, key, Ai, Uj, shift, inv_n, weight, store):
    P = bundle["P"]
    return kernels.lowrank_line_search_block(P, bundle["Gamma"] if shift else None, Ai=Ai, Uj=Uj,
                                             shift=shift, inv_n=inv_n, weight=weight,
                                             store=None if store is None else _scratch_block(bundle, store, P))


def lowrank_line_search_pass(group: BlockGroup, *, A, U, shift, store=None):
    """:func:`line_search_pass` along Delta = A U^T - P (A, U: n x k; the rank-k step
    of NOMAD's projected direction), for the entries R = P + E_n + shift Gamma
    (shift = 1/gamma: the classical augmented Lagrangian; 0: eq. 13, Gamma not read).
    Returns (alphas, h_at_alphas, h_at_0, <P, A U^T>).  One read of P (and Gamma); with
    ``store`` (a name), the direction A U^T is also written there, for
    :func:`nomad_pass`'s ``direction``."""
    layout = group.layout
    n = layout.n
    A, U = group_array(group, A), group_array(group, U)

    def args(key):
        return (row_slices(layout, A, key)[0], row_slices(layout, U, key)[1], float(shift), 1.0 / n,
                _weight(layout, key), store)

    reads = ["P"] + (["Gamma"] if shift else [])
    writes = [store] if store is not None else []
    res = np.sum([to_host(r) for r in group.map_blocks(_lowrank_line_search_task, args, reads=reads,
                                                       writes=writes, name="line_search")], axis=0)
    alphas, h, h0 = _line_search_curve(res[:-1])
    return alphas, h, h0, float(res[-1])
