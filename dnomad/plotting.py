"""Pictures of a result: what the method has, from a fitted estimator or a run's store.

:func:`plot` draws, side by side and each with labelled axes: the data coloured by
predicted label (a legend; the first two principal components when X has more than two
columns), Q with rows and columns sorted by label and a colour bar, the 2-D embedding,
W (SymNMF) or C's diagonal with the hott rows and F (HOTTOPIXX), and the history's
stopping residuals against their targets on log axes.  matplotlib is the only
dependency.
"""
from __future__ import annotations

import os

import numpy as np


# Q is drawn densely up to this n (an n x n image); beyond, its panel is left out.
MAX_Q_N = 4000
# Points drawn from a stored X (evenly spaced beyond it).
MAX_POINTS = 20000

# History columns that are stopping residuals, by method, and the estimator parameter
# (or fixed default) each must fall to; a name ending in "_" is a result the run
# resolved (its summary key, the learned attribute's name).
_RESIDUALS = {
    "nomad": {"rmse_neg": "rmse_tol", "max_violation": "min_tol"},
    "nomad-bm": {"row_sum_violation": ("feasibility_tol", 1e-4), "trace_violation": ("feasibility_tol", 1e-4),
                 "change": ("tol", 1e-5)},
    "symnmf": {"gap": None},
    "hottopixx": {"error": None},
    "riemannian-kmeans": {"grad_norm": "grad_tol_"},
    "nlr": {"change": "tol", "infeasibility": "tol"},
    "bregman": {"gap": None, "primal_residual": ("tol", 1e-5), "dual_residual": ("tol", 1e-5)},
}


def plot(result, path=None, *, X=None):
    """Draw a result; return the matplotlib Figure (and save it to ``path`` if given).

    Parameters
    ----------
    result : fitted estimator, or str / os.PathLike
        An estimator after ``fit``, or a run store (path or URL) written by one.
    path : str, optional
        Where to save the figure (PNG, PDF, SVG: by its extension).
    X : array (n, d), optional
        The data, for the panel coloured by label (a store that keeps its input,
        ``input/X``, gives it itself).
    """
    from matplotlib.figure import Figure

    _check_plot_arguments(result, path)
    view = _from_store(result) if isinstance(result, (str, os.PathLike)) else _from_estimator(result)
    if X is not None:
        view["X"] = _checked_data(X, view)
        view.pop("points", None)
    panels = [draw for draw, wanted in ((_data_panel, view.get("X") is not None and view.get("labels") is not None),
                                        (_q_panel, view.get("Q") is not None and view.get("labels") is not None),
                                        (_embedding_panel, view.get("embedding") is not None
                                         and np.ndim(view["embedding"]) == 2 and view["embedding"].shape[1] >= 2),
                                        (_w_panel, view.get("W") is not None),
                                        (_hott_panel, view.get("hott_rows") is not None),
                                        (_history_panel, bool(view.get("history"))))
              if wanted]
    if not panels:
        raise ValueError(f"nothing to draw: the {view['method']} result holds no labels, matrix or history")
    # A Figure of its own (not pyplot's): drawing leaves the caller's backend and open
    # figures alone; in a notebook the returned Figure shows itself.
    fig = Figure(figsize=(4.9 * len(panels), 4.4))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for draw, ax in zip(panels, axes[0]):
        draw(fig, ax, view)
    fig.suptitle(view["title"], fontsize=11)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# ------------------------------------------------------------------ what a result has
def _check_plot_arguments(result, path):
    """What plot's arguments must be, checked as an estimator checks its own."""
    from .base import _Estimator
    from .errors import InputTypeError, InputValueError

    if not isinstance(result, (str, os.PathLike)):
        if not isinstance(result, _Estimator):
            raise InputTypeError(f"plot: result must be a fitted dnomad estimator or the path or URL of a run store; "
                                 f"got {type(result).__name__}")
        from sklearn.exceptions import NotFittedError
        from sklearn.utils.validation import check_is_fitted

        try:
            check_is_fitted(result)
        except NotFittedError:
            raise InputValueError(f"plot: this {type(result).__name__} is not fitted yet; call fit(X) first") from None
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"plot: path must be a file name (str or os.PathLike) or None; got "
                             f"{type(path).__name__}{' (the data goes in X=...)' if hasattr(path, 'shape') else ''}")


def _checked_data(X, view):
    """plot's X: the gate's data checks, and one row per label of the result."""
    from .errors import InputValueError
    from .validation import check_data

    X = check_data(X, owner="plot", min_rows=1, lazy=False)
    labels = view.get("labels")
    if labels is not None and len(X) != len(labels):
        raise InputValueError(f"plot: X has {len(X)} rows but the result has {len(labels)} labels; X must be the data "
                              f"the result was fitted on")
    return X


def _from_estimator(est):
    from .api import ESTIMATORS
    from .blocks import runs

    method = next((name for name, cls in ESTIMATORS.items() if isinstance(est, cls)), type(est).__name__)
    params = est.get_params()
    view = {"method": method, "params": params, "labels": getattr(est, "labels_", None),
            "embedding": getattr(est, "embedding_", None), "history": list(getattr(est, "history_", []) or []),
            "hott_rows": getattr(est, "hott_rows_", None), "diag": getattr(est, "diag_", None),
            "results": {key: getattr(est, f"{key}_") for key in runs.RESULT_SUMMARY if hasattr(est, f"{key}_")}}
    if method == "symnmf":
        view["W"] = est.components_
    if method == "hottopixx":
        view["F"] = est.components_
    Q, labels = getattr(est, "Q_", None), view["labels"]
    # NOMAD's n x n Q (RiemannianKMeans's Q_ is its r x r rotation, not drawn).
    if Q is not None and labels is not None and tuple(Q.shape) == (len(labels),) * 2 and len(labels) <= MAX_Q_N:
        view["Q"] = np.asarray(Q, dtype=np.float64)
    return _finish(view)


def _from_store(store):
    from . import blocks
    from .blocks import store as run_store
    from .errors import StoreError

    marker = run_store.read_run_record(store)
    if marker is None:
        raise StoreError(f"store {run_store.redact(str(store))!r} holds no dnomad run")
    result = run_store.read_result(store)
    if result is None:
        raise StoreError(f"the run in {run_store.redact(str(store))!r} has not finished: no result to draw "
                         f"(`dnomad info` shows its history)")

    def array(path):
        return run_store.read_vector(store, path) if run_store.has_array(store, path) else None

    method = marker["method"]
    view = {"method": method, "params": marker["estimator_params"], "labels": array("result/labels"),
            "results": result,
            "embedding": array("result/embedding"), "history": run_store.read_table(store, "result/history") or [],
            "hott_rows": array("result/hott_rows"), "diag": array("result/diag"), "X": None}
    if run_store.has_array(store, "input/X") and view["labels"] is not None:
        import zarr

        # At most MAX_POINTS evenly spaced points of the data (a large X is not read whole).
        stored = zarr.open_array(store=str(store), path="input/X", mode="r")
        step = max(1, -(-stored.shape[0] // MAX_POINTS))
        view["X"], view["points"] = np.asarray(stored[::step], dtype=np.float64), slice(None, None, step)
    if method == "symnmf":
        view["W"] = array("result/W")
    if method == "hottopixx":
        view["F"] = array("result/F")
    n = len(view["labels"]) if view["labels"] is not None else None
    if n is not None and n <= MAX_Q_N:
        if run_store.has_array(store, "result/Q"):
            view["Q"] = np.asarray(blocks.from_zarr(store, "result/Q"), dtype=np.float64)
        elif run_store.has_array(store, "result/Y"):
            Y = array("result/Y")
            view["Q"] = Y @ Y.T
    return _finish(view)


def _finish(view):
    params, method = view["params"], view["method"]
    key = "nomad-bm" if method == "nomad" and params.get("solver") == "bm" else method
    options = params.get("solver_options") or {}
    targets = {}
    for column, source in _RESIDUALS.get(key, {}).items():
        if isinstance(source, tuple):
            name, default = source
            value = options.get(name, params.get(name)) if key == "nomad-bm" else params.get(name)
            targets[column] = default if value is None else value
        elif source is not None and source.endswith("_"):
            targets[column] = view["results"].get(source[:-1])
        elif source is not None:
            targets[column] = params.get(source)
    view["targets"] = targets
    view["residuals"] = list(_RESIDUALS.get(key, {}))
    k = params.get("n_clusters") if method != "hottopixx" else params.get("rank")
    view["title"] = f"{method}{' (Burer-Monteiro)' if key == 'nomad-bm' else ''}, " + (
        f"rank {k}" if method == "hottopixx" else f"n_clusters {k}") + (
        f", {len(view['history'])} history rows" if view["history"] else "")
    return view


# ------------------------------------------------------------------ panels
def _label_colours(labels):
    import matplotlib

    groups = np.unique(labels)
    cmap = matplotlib.colormaps["tab10" if len(groups) <= 10 else "tab20"]
    return groups, {g: cmap(i % cmap.N) for i, g in enumerate(groups)}


def _data_panel(fig, ax, view):
    X, labels = view["X"], view["labels"][view.get("points", slice(None))]
    axes_names = ("x1", "x2")
    if X.shape[1] > 2:
        Xc = X - X.mean(axis=0)
        _, _, Vt = np.linalg.svd(Xc, full_matrices=False)
        X, axes_names = Xc @ Vt[:2].T, ("principal component 1", "principal component 2")
    elif X.shape[1] == 1:
        X, axes_names = np.c_[X[:, 0], np.zeros(len(X))], ("x1", "")
    groups, colours = _label_colours(labels)
    for g in groups:
        ax.scatter(X[labels == g, 0], X[labels == g, 1], s=8, color=colours[g], label=f"label {g}")
    ax.set(title=f"data by predicted label ({len(groups)} group{'s' if len(groups) != 1 else ''})",
           xlabel=axes_names[0], ylabel=axes_names[1])
    if len(groups) <= 12:
        ax.legend(fontsize=7, markerscale=1.5, loc="best")


def _q_panel(fig, ax, view):
    Q, labels = view["Q"], view["labels"]
    order = np.argsort(labels, kind="stable")
    image = ax.imshow(Q[np.ix_(order, order)], cmap="magma", vmin=0, vmax=max(np.percentile(Q, 99.5), 1e-300))
    fig.colorbar(image, ax=ax, label="Q_ij")
    ax.set(title=f"Q sorted by label (n={len(Q)})", xlabel="point j (sorted by label)",
           ylabel="point i (sorted by label)")


def _embedding_panel(fig, ax, view):
    E, labels = view["embedding"], view.get("labels")
    if labels is None:
        ax.scatter(E[:, 0], E[:, 1], s=8)
    else:
        groups, colours = _label_colours(labels)
        for g in groups:
            ax.scatter(E[labels == g, 0], E[labels == g, 1], s=8, color=colours[g])
    ax.set(title="2-D embedding, by label", xlabel="embedding 1", ylabel="embedding 2")


def _w_panel(fig, ax, view):
    W, labels = view["W"], view.get("labels")
    order = np.argsort(labels, kind="stable") if labels is not None else np.arange(len(W))
    image = ax.imshow(W[order], aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="W_ij (rows on the simplex)")
    ax.set(title="W, rows sorted by label", xlabel="component j", ylabel="point i (sorted by label)")


def _hott_panel(fig, ax, view):
    diag, hott = view["diag"], np.asarray(view["hott_rows"])
    ax.bar(np.arange(len(diag)), diag, color="0.6", width=1.0, label="diag C")
    ax.bar(hott, diag[hott], color="C3", width=1.0, label=f"hott rows ({len(hott)})")
    ax.set(title="C's diagonal and the hott rows", xlabel="row of X (feature)", ylabel="C_ii")
    ax.legend(fontsize=7)


def _history_panel(fig, ax, view):
    history, targets = view["history"], view["targets"]
    key = "epoch" if "epoch" in history[0] else "iteration"
    steps = np.arange(1, len(history) + 1) if view.get("method") == "riemannian-kmeans" else \
        np.array([row.get(key, i + 1) for i, row in enumerate(history)])
    drawn = 0
    for i, column in enumerate(view["residuals"]):
        values = np.array([np.nan if row.get(column) is None else float(row[column]) for row in history])
        values = np.where(values > 0, values, np.nan)
        if np.all(np.isnan(values)):
            continue
        line, = ax.plot(steps, values, label=column, color=f"C{i}")
        if targets.get(column):
            ax.axhline(targets[column], color=line.get_color(), linestyle="--", linewidth=1,
                       label=f"{column} target {targets[column]:g}")
        drawn += 1
    if not drawn:                                 # no residual recorded: the objective
        column = next((c for c in ("objective", "loss", "trace") if c in history[0]), None)
        if column is not None:
            ax.plot(steps, [row.get(column, np.nan) for row in history], label=column)
        ax.set_yscale("linear")
    else:
        ax.set_yscale("log")
    xlabel = "Newton iteration (all starts and stages)" if view.get("method") == "riemannian-kmeans" else key
    targeted = any(targets.get(column) for column in view["residuals"])
    ax.set(title="history against the stopping targets" if targeted else "history", xlabel=xlabel,
           ylabel="value")
    ax.legend(fontsize=7)
