"""The Hottopixx estimator: separable NMF by HOTTOPIXX epochs over column chunks of X."""
from __future__ import annotations

import numbers
import time
from dataclasses import asdict

from .. import blocks
from ..base import _OPTIONAL_POSITIVE_INT, _POSITIVE, _POSITIVE_INT, _RUN_CONSTRAINTS, _Estimator, _gated
from ..blocks import memory, runs
from ..blocks.cluster import get_client
from ..blocks.columns import column_pass_chunks, columns_in_memory
from ..validation import Interval, Options, check_data
from . import solver as hott_solver


class Hottopixx(_Estimator):
    """Separable NMF by HOTTOPIXX (Bittorf, Recht, Re, Tropp 2012): the r "hott" rows of a
    nonnegative f x n matrix X whose convex hull holds the other rows, and F >= 0 with
    X ~ F X_hott.

    Rows of X are scaled to sum 1 first, as the paper assumes (an all-zero row cannot be
    and is refused); ``components_`` and ``W_`` factor that scaled X, and
    ``row_sums_`` undo it: X ~ diag(row_sums_) components_ W_.  A factorization
    localizing matrix C (f x f) is found by incremental subgradient epochs on the LP's
    Lagrangian (Alg. 4), each a block-nested loop in which row blocks of C stream X's
    columns (dense, sparse by nonzeros, or out of core from Zarr), then projected onto
    Phi_0 by column squishing (Alg. 5).

    Parameters
    ----------
    rank : int
        r, the number of hott rows; 1 <= r <= f.
    n_epochs : int or "fast", default 50
        The paper's runs use 50; "fast" is its 4-epoch setting.
    primal_step, dual_step : float, default 0.1, 0.01
        s_p and s_d of Alg. 4 (the paper's values).
    projection : {"squish", "clip"}, default "squish"
        The exact projection onto Phi_0, or Sec. 4's clipping (when the factorization is
        known to be unique).
    selection : {"clusters", "diagonal"}, default "clusters"
        How hott rows are read off C: the r largest diagonal entries (Alg. 4 line 11), or
        one per group of rows that express each other in C, the group's most extreme
        member (see :func:`dnomad.hottopixx.solver.hottopixx`; needed for exact recovery
        with duplicated topics after 50 epochs).
    cluster_threshold : float, default 0.8
    fit_components : {"subgradient", "lp"}, default "subgradient"
        F by ``clean_epochs`` incremental-subgradient epochs, or exactly by one LP per
        row (HiGHS; small f and n).
    clean_epochs, clean_step, clean_decay : default 10, 1.0, 0.6
        The cleaning epochs' step starts at ``clean_step`` and shrinks by ``clean_decay``
        per epoch (the paper ran 2 epochs at a constant step, whose noise floor left
        errors of 0.15-0.45 where the LP's is 0).
    row_block : int, optional
        Rows of C per task; default about 1 MB of C (``blocks.default_row_block``).
    cost_scale : float, default 0.1
        The cost p has distinct entries in [0, cost_scale).
    error_every : int, default 1
        Epochs between the history's ||X - C X||_{inf,1} (one more pass over X each).
    random_state : int or Generator, optional
        Seeds p and the column orders.
    store : str, optional
        Zarr store: a dask/Zarr X too large for memory is staged there by columns
        (``input/Xt``); checkpoints and the results (hott rows, F, diag C, history) are
        written there; ``dnomad.resume(store)`` (X in Zarr) or ``fit(X, resume=True)``
        continues a run from its last checkpoint.
    overwrite : bool, default False
    checkpoint_every : int, default 10
        Epochs between checkpoints to ``store`` (C, f x f, and the generator's state).
    callback : callable, optional
        Called with each epoch's history row; returning True stops.
    verbose : int, default 0
        Progress on stderr: 0 none, 1 a live line, 2 a line per iteration (:mod:`dnomad.progress`).

    Attributes
    ----------
    hott_rows_ : ndarray (r,)
    components_ : ndarray (f, r)
        F.
    W_ : ndarray (r, n)
        X_hott (rows scaled to sum 1).
    diag_ : ndarray (f,)
        Diagonal of C.
    row_sums_ : ndarray (f,)
    history_ : list of dict
        Per epoch: epoch, trace (Tr C), beta, error (||X - C X||_{inf,1}), seconds.
    error_ : float
        ||X - F W||_{inf,1} on the scaled X.
    n_epochs_, n_iter_ : int
        Epochs run.
    stop_reason_ : str
        "max_iter" (all epochs ran) or "callback".
    fit_seconds_ : float

    References
    ----------
    V. Bittorf, B. Recht, C. Re, J. A. Tropp. Factoring nonnegative matrices with linear
    programs. NIPS 2012 (arXiv:1206.1270).
    """

    _checkpoints = True
    _max_iter_param = "n_epochs"
    _solver_params = ("primal_step", "dual_step", "projection", "selection", "cluster_threshold",
                      "fit_components", "clean_epochs", "clean_step", "clean_decay", "row_block",
                      "cost_scale", "error_every")

    _parameter_constraints = {
        "rank": _POSITIVE_INT, "n_epochs": [Options("fast")] + _POSITIVE_INT, "primal_step": _POSITIVE,
        "dual_step": _POSITIVE, "projection": [Options(*hott_solver.PROJECTIONS)],
        "selection": [Options(*hott_solver.SELECTIONS)],
        "cluster_threshold": [Interval(numbers.Real, 0, 1, closed="right")],
        "fit_components": [Options(*hott_solver.COMPONENT_FITS)],
        "clean_epochs": [Interval(numbers.Integral, 0, None)], "clean_step": _POSITIVE,
        "clean_decay": [Interval(numbers.Real, 0, 1, closed="right")], "row_block": _OPTIONAL_POSITIVE_INT,
        "cost_scale": _POSITIVE, "error_every": _POSITIVE_INT, "checkpoint_every": _POSITIVE_INT,
        "callback": [None, "callback"],
        **_RUN_CONSTRAINTS}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True        # X >= 0: a nonnegative factorization
        return tags

    def __init__(self, rank=10, *, n_epochs=50, primal_step=0.1, dual_step=0.01, projection="squish",
                 selection="clusters", cluster_threshold=0.8, fit_components="subgradient",
                 clean_epochs=10, clean_step=1.0, clean_decay=0.6, row_block=None, cost_scale=0.1,
                 error_every=1, random_state=None, store=None, overwrite=False, checkpoint_every=10,
                 callback=None, verbose=0):
        self.rank = rank
        self.n_epochs = n_epochs
        self.primal_step = primal_step
        self.dual_step = dual_step
        self.projection = projection
        self.selection = selection
        self.cluster_threshold = cluster_threshold
        self.fit_components = fit_components
        self.clean_epochs = clean_epochs
        self.clean_step = clean_step
        self.clean_decay = clean_decay
        self.row_block = row_block
        self.cost_scale = cost_scale
        self.error_every = error_every
        self.random_state = random_state
        self.store = store
        self.overwrite = overwrite
        self.checkpoint_every = checkpoint_every
        self.callback = callback
        self.verbose = verbose

    def _memory_parts(self, n, d, x_kind="numpy"):
        """What a fit on X of n = f features by d = m samples holds (:func:`dnomad.plan`):
        C (f x f) and the larger of the projection's two f x f copies (an epoch's row
        blocks in flight, out of core) and a residual pass's temporaries (one chunk of
        columns per running task), F and the hott rows in the client; X^T (dense) in the
        client, or, for a dask or Zarr X too large for this process, in the store, read
        by tasks on the workers that each hold a chunk of its columns and its product
        with C (C sent once to each worker)."""
        f, m = n, d
        r = self.rank
        staged = x_kind in ("zarr", "dask") and not columns_in_memory(f, m)
        cols, running_cols = column_pass_chunks(f, m, staged=staged)
        results = {"F (f x r) and the hott rows of X (r x n)": 8 * (f * r + r * m)}
        epochs = self._params().n_epochs
        passes = {"each epoch": "one pass over X's columns (every row block of C streams all of them)",
                  "the history's error": f"one more pass every {self.error_every} epochs",
                  "the result": f"{self.clean_epochs} cleaning passes and one for the error",
                  "all": f"about {epochs * (1 + 1 / self.error_every) + self.clean_epochs + 1:.0f} passes"}
        if staged:
            return memory.MemoryParts(
                client=dict({"C (f x f)": 8 * f * f,
                             "the projection's two f x f copies, or an epoch's row blocks sent and gathered":
                                 16 * f * f}, **results),
                task={"a chunk of X's columns read from the store": 8 * cols * f,
                      "its product with C (a residual pass)": 8 * cols * f},
                each_worker={"C, sent to each worker for a residual pass": 8 * f * f},
                disk={"X^T, staged by columns": 8 * f * m}, passes=passes)
        read = {"X read from where it is (kept while X^T is made)": 8 * f * m} if x_kind in ("zarr", "dask") else {}
        return memory.MemoryParts(
            client=dict({"X^T (n x f), rows scaled to sum 1": 8 * f * m, **read, "C (f x f)": 8 * f * f,
                         f"the projection's two f x f copies, or a residual pass's temporaries (chunks of "
                         f"{cols:,} columns, one a thread)": max(16 * f * f, 8 * running_cols * f)}, **results),
            passes=passes)

    def _params(self):
        epochs = hott_solver.FAST_EPOCHS if self.n_epochs == "fast" else self.n_epochs
        return hott_solver.HottopixxParams(rank=self.rank, n_epochs=epochs,
                                           **{k: getattr(self, k) for k in self._solver_params})

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Find the hott rows of X (n_features, n_samples): NumPy, scipy.sparse, dask, a
        Zarr array or a Zarr path.  ``resume=True`` continues the run in ``store`` from
        its last checkpoint.  Returns self."""
        start = time.perf_counter()
        params = self._params()
        # The gate: in memory, X is checked whole here (nonnegative, finite, no zero row);
        # a dask or Zarr X by its metadata here and by content as it is read.
        X = check_data(X, owner="Hottopixx", sparse=True, nonnegative=True, no_zero_rows=True, min_rows=1)
        params.validate(int(blocks.input_metadata(X)["shape"][0]))     # rank against f, before reading X
        # n_epochs may grow on resume; the start (random_state) is the checkpoint's.
        checkpoints = self._start_matrix_run("hottopixx", {k: v for k, v in asdict(params).items()
                                                           if k != "n_epochs"}, X, resume, params.n_epochs)
        if resume and checkpoints is None:
            return self                                   # finished: its result is loaded
        state = checkpoints.load() if resume else None
        callback = self._report_progress("HOTTOPIXX", show=("trace", "error"), iteration_key="epoch",
                                         max_iter=params.n_epochs, passes=None)
        data = blocks.feature_columns(X, store=self.store, on_digest=runs.content_check(self.store, X))
        client = get_client() if data.kind == "zarr" else None
        res = hott_solver.hottopixx(data, params, random_state=self.random_state, callback=callback,
                                    client=client, state=state,
                                    checkpoint=None if checkpoints is None else checkpoints.save,
                                    checkpoint_every=self.checkpoint_every)
        self.hott_rows_ = res.hott_rows
        self.components_ = res.F
        self.W_ = data.rows(res.hott_rows, client=client)
        self.diag_ = res.diag
        self.row_sums_ = data.row_sums
        self.history_ = res.history
        self.error_ = res.error
        self.n_epochs_ = self.n_iter_ = len(res.history)
        self.stop_reason_ = res.stop_reason
        self.fit_seconds_ = time.perf_counter() - start
        if self.store is not None:
            runs.write_result(self.store, {"hott_rows": self.hott_rows_, "F": self.components_,
                                           "diag": self.diag_, "X_hott": self.W_, "row_sums": self.row_sums_},
                              {"error": res.error, "hott_rows": res.hott_rows.tolist(), "n_epochs": self.n_epochs_,
                               "n_iter": self.n_iter_, "stop_reason": res.stop_reason},
                              res.history, self.fit_seconds_)
        return self

    def fit_transform(self, X, y=None):
        return self.fit(X).components_
