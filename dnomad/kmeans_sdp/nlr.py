"""NLR: the nonnegative low-rank K-means SDP by a primal-dual projected gradient method
(Zhuang, Chen, Yang, Zhang, ICLR 2024; the baseline of the Riemannian Newton paper,
its ref. [47]).

    min_U  -<X X^T, U U^T>   over U >= 0 (n x r, r = 2K), ||U||_F^2 = K,  U U^T 1 = 1,

the last constraint through the augmented Lagrangian
L(U, y) = -<X X^T, U U^T> + <y, e> + beta/2 ||e||^2, e = U U^T 1 - 1:

    U <- Pi(U - alpha grad_U L(U, y)),   Pi(W) = sqrt(K) max(W, 0) / ||max(W, 0)||_F,
    y <- y + beta e(U)    once the relative change ||U_new - U||_F / sqrt(K) < dual_tol

(the projection onto the nonnegative part of the sphere of radius sqrt(K); the dual
step's trigger follows the authors' MATLAB code).  With s = U^T 1 the gradient's rows
are -2 x_i^T (X^T U) + y'_i s^T + (U^T y')^T, y' = y + beta e: everything is a sum
over rows, so an iteration is one pass over the row chunks of X (X centred), and the
scale of the projection is carried to the next pass instead of costing one.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from .._checks import check_numbers
from ..blocks.rows import random_rows, stream_key
from ..errors import InputValueError, warn_convergence
from ..rounding import kmeans_partition
from . import lloyd, starts

INITS = ("kmeans", "random")
# beta="scale": the authors' penalty on X scaled to ||X||_2^2 = n.
BETA_SCALE = 10.0


@dataclass(frozen=True, eq=False)
class NLRResult:
    """U (n x r; None where it was left in the row chunks' state "U"), the stop reason,
    history rows (iteration, loss = -<XX^T, UU^T>,
    infeasibility ||UU^T 1 - 1|| / sqrt(n), change, seconds, passes; a row's loss and
    infeasibility are at the iterate its step started from), iterations, dual steps,
    passes over X, seconds, the step alpha, the penalty beta and <XX^T, UU^T> of the
    returned U."""

    U: np.ndarray
    stop_reason: str
    history: list
    n_iter: int
    dual_steps: int
    passes: int
    seconds: float
    step: float
    beta: float
    final_objective: float | None = None      # None in checkpoints saved before it was kept

    @property
    def objective(self):
        """<X X^T, U U^T> of the returned U (the last row's loss is one step earlier's)."""
        return float(-self.history[-1]["loss"] if self.final_objective is None else self.final_objective)


def nlr(data, K, *, rank=None, beta="scale", step=None, tol=1e-6, dual_tol=1e-3, max_iter=100000,
        record_every=1, U0=None, random_state=None, callback=None, state=None, checkpoint=None,
        checkpoint_every=1000, keep_rows=False):
    """Run NLR on the row chunks ``data`` (a :class:`dnomad.blocks.RowChunks`).

    ``beta``: the penalty; "scale" is BETA_SCALE ||X||_2^2 / n (X centred), the
    authors' beta = 10 on X scaled to ||X||_2^2 = n: the K-means partition does not
    change with X's units, and a fixed beta's balance against the data term does.
    ``step`` (alpha): default 1 / (2 (||X||_2^2 + beta n)), a bound on the gradient's
    Lipschitz constant near feasible points (the data term's 2 ||X||_2^2 and the
    augmented term's 2 beta ||U^T 1||^2 = 2 beta n).  ``U0``: a nonnegative n x r start
    (projected), or the name of a state of ``data`` holding one (it becomes the run's
    iterate); default |N(0, 1)| entries, projected, as the authors', drawn by the chunks
    (:func:`dnomad.blocks.rows.random_rows`: the same however the rows are chunked).
    ``keep_rows``: U is left in the chunks' state "U" (the result's U is None) instead
    of gathered into this process.  Stops when the
    relative change and the infeasibility are both below ``tol`` ("tolerance"), after
    ``max_iter`` iterations ("max_iter", with a ConvergenceWarning), or when
    ``callback(row, current_u)`` returns True (``current_u()`` gathers U after the
    iteration; its time is left out).

    ``checkpoint(state)`` is called every ``checkpoint_every`` iterations with W, y, the
    sums the next pass needs, the history and the counters; given back as ``state``
    (``U0`` and ``random_state`` are then not used), the run goes on from there as if it
    had not stopped.
    """
    n = data.n
    r = checked_rank(n, K, rank)
    _check_numbers(beta, step, tol, dual_tol)
    top = float(np.linalg.eigvalsh(data.gram)[-1])
    beta = BETA_SCALE * top / n if isinstance(beta, str) else float(beta)
    if step is None:
        step = 1.0 / (2.0 * (top + beta * n))
    if state is not None:
        return _nlr_loop(data, K, r, beta, step, tol, dual_tol, max_iter, record_every, callback, checkpoint,
                         checkpoint_every, keep_rows=keep_rows, **_resumed(data, state))
    if U0 is None:
        data.map(_random_factor, stream_key(np.random.default_rng(random_state)), r, read_x=False,
                 with_span=True)
    elif isinstance(U0, str):
        data.rename(U0, "W")
    else:
        U0 = np.asarray(U0, dtype=np.float64)
        if U0.shape != (n, r) or not np.isfinite(U0).all() or not (U0 > 0).any():
            raise InputValueError(f"U0 must be a finite (n, rank) = ({n}, {r}) array with a positive entry")
        data.put("W", np.maximum(U0, 0.0))
    data.map(_zero_duals, read_x=False)
    passes0 = data.passes
    # The pass of iteration t needs the sums of U_t; the start's come from a first pass
    # that changes nothing (alpha = 0).
    zero = {"scale": 1.0, "s": np.zeros(r), "XtU": np.zeros((data.d, r)), "Uty": np.zeros(r),
            "beta": beta, "alpha": 0.0, "dual": False}
    sums = _totals(data.map(_nlr_kernel, zero))
    if not sums["ww"] > 0:
        data.drop("W")
        data.drop("y")
        raise InputValueError(f"U0 must be a finite (n, rank) = ({n}, {r}) array with a positive entry")
    return _nlr_loop(data, K, r, beta, step, tol, dual_tol, max_iter, record_every, callback, checkpoint,
                     checkpoint_every, sums=sums, scale=math.sqrt(K / sums["ww"]), history=[], dual_steps=0,
                     dual_next=False, first=1, passes0=passes0, t0=time.perf_counter(), keep_rows=keep_rows)


def _check_numbers(beta, step, tol, dual_tol):
    """beta "scale" or a number, step None or a number, tol and dual_tol numbers; numbers finite and > 0."""
    if isinstance(beta, str) and beta != "scale":
        raise InputValueError(f"beta must be 'scale' or a finite number > 0; got {beta!r}")
    given = SimpleNamespace(beta=beta, step=step, tol=tol, dual_tol=dual_tol)
    names = [name for name in ("beta", "step", "tol", "dual_tol")
             if not (name == "beta" and beta == "scale") and not (name == "step" and step is None)]
    check_numbers(given, names, positive=True)


def default_rank(n, K):
    """U's columns by default: 2 K (the NLR paper's), at most n."""
    return min(2 * K, n)


def checked_rank(n, K, rank):
    """r, U's columns (:func:`default_rank` for None), once K, the rank and n are checked
    against each other."""
    if not (isinstance(K, (int, np.integer)) and not isinstance(K, bool) and K >= 2):
        raise InputValueError(f"n_clusters (K) must be an integer >= 2; got {K!r}")
    if K > n:
        raise InputValueError(f"n_clusters must be at most the number of samples ({n}); got {K}")
    r = default_rank(n, K) if rank is None else rank
    if not (isinstance(r, (int, np.integer)) and not isinstance(r, bool) and r >= K):
        raise InputValueError(f"rank must be an integer >= K = {K}; got {rank!r}")
    if n < r:
        raise InputValueError(f"rank must be at most the number of samples ({n}); got {r}")
    return r


def _resumed(data, state):
    """The loop's variables from a checkpoint: W and y back into the row chunks."""
    data.put("W", state["W"], dtype=np.float64)
    y = state["y"]                      # n x 1 as the chunks wrote it (a vector before)
    data.put("y", y if np.ndim(y) == 2 else np.reshape(y, (-1, 1)), dtype=np.float64)
    sums = {key: state[f"sum_{key}"] for key in _SUM_KEYS}
    # Counters continue the saved run's: putting W and y back is not one of its passes.
    return dict(sums=sums, scale=float(state["scale"]), history=[dict(row) for row in state["history"]],
                dual_steps=int(state["dual_steps"]), dual_next=bool(state["dual_next"]),
                first=int(state["iteration"]) + 1, passes0=data.passes - int(state["passes"]),
                t0=time.perf_counter() - float(state["seconds"]))


def _nlr_loop(data, K, r, beta, step, tol, dual_tol, max_iter, record_every, callback, checkpoint,
              checkpoint_every, *, sums, scale, history, dual_steps, dual_next, first, passes0, t0, keep_rows):
    n = data.n
    stop, it = "max_iter", first - 1
    for it in range(first, max_iter + 1):
        s, XtU = scale * sums["w1"], scale * sums["xtw"]
        UtU, Uty = scale * scale * sums["wtw"], scale * sums["wty"]
        if dual_next:                     # y <- y + beta e, applied to the rows in this pass
            Uty = Uty + beta * (UtU @ s - s)
            dual_steps += 1
        small = {"scale": scale, "s": s, "XtU": XtU, "Uty": Uty + beta * (UtU @ s - s), "beta": beta,
                 "alpha": step, "dual": dual_next}
        new = _totals(data.map(_nlr_kernel, small))
        new_scale = math.sqrt(K / new["ww"])
        change = math.sqrt(max(new_scale ** 2 * new["ww"] - 2 * new_scale * new["wu"] + K, 0.0)) / math.sqrt(K)
        infeas = math.sqrt(new["ee"] / n)           # at U_t, before this step
        sums, scale = new, new_scale
        done = change < tol and infeas < tol
        if it % record_every == 0 or it == 1 or done or it == max_iter:
            row = {"iteration": it, "loss": -_objective(XtU), "infeasibility": infeas,
                   "change": change, "seconds": time.perf_counter() - t0, "passes": data.passes - passes0}
            history.append(row)
            if callback is not None:
                t_cb = time.perf_counter()
                stop_now = callback(dict(row), lambda: scale * data.get("W")) is True
                t0 += time.perf_counter() - t_cb      # a callback's time is not the solver's
                if stop_now:
                    stop = "callback"
                    break
        if done:
            stop = "tolerance"
            break
        dual_next = change < dual_tol
        if checkpoint is not None and it % checkpoint_every == 0 and it < max_iter:
            checkpoint({"W": data.held("W"), "y": data.held("y"), "scale": scale,
                        "history": [dict(row) for row in history],
                        "dual_steps": dual_steps, "dual_next": dual_next, "iteration": it,
                        "passes": data.passes - passes0, "seconds": time.perf_counter() - t0,
                        **{f"sum_{key}": np.asarray(value) if np.ndim(value) else float(value)
                           for key, value in sums.items()}})
    if stop == "max_iter":
        last = history[-1]
        warn_convergence(f"NLR stopped at max_iter={max_iter} before meeting its tolerance: last relative "
                         f"change {last['change']:.3g} and infeasibility {last['infeasibility']:.3g} "
                         f"(both must fall below tol {tol:g})")
    data.map(_scaled_state, "W", scale, "U", read_x=False)
    data.drop("y")
    U = None if keep_rows else data.get("U")
    if not keep_rows:
        data.drop("U")
    return NLRResult(U, stop_reason=stop, history=history, n_iter=it, dual_steps=dual_steps,
                     passes=data.passes - passes0, seconds=time.perf_counter() - t0, step=step, beta=beta,
                     final_objective=_objective(scale * sums["xtw"]))


def nlr_kmeans(data, K, *, init="kmeans", n_init=1, random_state=None, state=None, checkpoint=None,
               checkpoint_every=1000, keep_rows=False, **nlr_kw):
    """:func:`nlr` from ``n_init`` starts drawn from one generator; the largest final
    <X X^T, U U^T> wins.  Returns its :class:`NLRResult` with history rows tagged by
    ``init``.

    ``init``: "kmeans", the partition of :func:`dnomad.rounding.kmeans_partition`
    (k-means++ and Lloyd's iterations) as the feasible point of
    :func:`dnomad.kmeans_sdp.lloyd.partition_factor`, a new seeding for every start; or
    "random", |N(0, 1)| entries (the authors').

    ``checkpoint(state)`` is called every ``checkpoint_every`` iterations with the
    running start's state (see :func:`nlr`), which start it is, the generator's state,
    the best start so far and the history of every start so far; given back as
    ``state``, the run goes on from there as if it had not stopped.  Every start's U and
    the best one's stay in the row chunks (the best written from there by a checkpoint);
    ``keep_rows`` as in :func:`nlr`."""
    if init not in INITS:
        raise InputValueError(f"init must be one of {INITS}; got {init!r}")
    rank = nlr_kw.pop("rank", None)
    r = checked_rank(data.n, K, rank)
    defaults = inspect.signature(nlr).parameters               # checked before the k-means passes
    _check_numbers(**{name: nlr_kw.get(name, defaults[name].default) for name in ("beta", "step", "tol", "dual_tol")})
    rng = np.random.default_rng(random_state)
    best, done, first, run_state = None, [], 0, None
    if state is not None:
        rng, best, done, first, run_state = _resumed_starts(state)
        if best is not None:
            data.put(_BEST, best.U, dtype=np.float64)
            best = dataclasses.replace(best, U=None)
    for index in range(first, n_init):
        save = None if checkpoint is None else functools.partial(
            _save_starts, checkpoint, init=index, rng=rng, done=done,
            best=None if best is None else dataclasses.replace(best, U=data.held(_BEST)))
        U0, before = None, data.passes
        if init == "kmeans" and run_state is None:
            # K nonempty groups (a centre Lloyd's iterations emptied is refilled by a cut).
            groups = lloyd.split_groups(data, kmeans_partition(data, K, rng), K)
            U0 = lloyd.put_partition_factor(data, groups, K, r, "nlr_start")
        start_passes = data.passes - before
        res = nlr(data, K, rank=rank, U0=U0, random_state=rng, state=run_state, checkpoint=save,
                  checkpoint_every=checkpoint_every, keep_rows=True, **nlr_kw)
        res = dataclasses.replace(res, passes=res.passes + start_passes)      # the k-means start's too
        run_state = None
        res = dataclasses.replace(res, history=[dict(row, init=index) for row in res.history])
        done += res.history
        if best is None or res.objective > best.objective:
            best = res
            data.rename("U", _BEST)
        else:
            data.drop("U")
    data.rename(_BEST, "U")
    if keep_rows:
        return best
    U = data.get("U")
    data.drop("U")
    return dataclasses.replace(best, U=U)


# The state of the best start's U while later starts run.
_BEST = "nlr_best_U"
# The best start's scalars a checkpoint keeps (its U is an array of its own).
_BEST_FIELDS = ("stop_reason", "n_iter", "dual_steps", "passes", "seconds", "step", "beta", "final_objective")


def _save_starts(checkpoint, run_state, *, init, rng, best, done):
    checkpoint(starts.wrap(run_state, tags={"init": init}, rng=rng, done=done, best=best, best_fields=_BEST_FIELDS,
                           best_arrays=("U",)))


def _resumed_starts(state):
    rng, run_state, done, best = starts.unwrap(state, match=("init",), tag_keys=("init",), run_keys=_RUN_KEYS)
    return rng, None if best is None else NLRResult(**best), done, int(state["init"]), run_state


_SUM_KEYS = ("w1", "xtw", "wtw", "wty", "ww", "wu", "ee")
# What :func:`nlr` keeps in a checkpoint besides its history.
_RUN_KEYS = ("W", "y", "scale", "dual_steps", "dual_next", "iteration", "passes", "seconds",
             *(f"sum_{key}" for key in _SUM_KEYS))


def _objective(XtU):
    """<X X^T, U U^T> = ||X^T U||_F^2."""
    return float(np.sum(XtU ** 2))


def _totals(parts):
    out = {}
    for key in _SUM_KEYS:
        total = None
        for p in parts:
            total = p[key] if total is None else total + p[key]
        out[key] = total
    return out


def _random_factor(chunk, span, key, r):
    """The authors' start on this chunk's rows: |N(0, 1)| entries."""
    chunk["W"] = np.abs(random_rows(key, *span, r))


def _zero_duals(chunk):
    chunk["y"] = np.zeros((len(chunk["W"]), 1))


def _scaled_state(chunk, name, scale, out):
    chunk[out] = scale * chunk.pop(name)


def _nlr_kernel(chunk, small):
    """One NLR step on the chunk's rows (U = scale * W; y updated first when the dual
    step is due) and the sums of the new W the next step needs: W^T 1, X^T W, W^T W,
    W^T y, ||W||^2, <W, U_old> (for the change) and ||e||^2 at U_old."""
    X, W, y = chunk["X"], chunk["W"], chunk["y"]
    U = small["scale"] * W
    s, beta = small["s"], small["beta"]
    e = U @ s - 1.0
    if small["dual"]:
        y = y + beta * e[:, None]
        chunk["y"] = y
    y_aug = y[:, 0] + beta * e
    G = -2.0 * (X @ small["XtU"]) + np.outer(y_aug, s) + small["Uty"][None]
    W = np.maximum(U - small["alpha"] * G, 0.0)
    chunk["W"] = W
    return {"w1": W.sum(axis=0), "xtw": X.T @ W, "wtw": W.T @ W, "wty": W.T @ y[:, 0],
            "ww": float(np.vdot(W, W)), "wu": float(np.vdot(W, U)), "ee": float(e @ e)}
