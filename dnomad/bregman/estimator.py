"""The BregmanClustering estimator: relax, round, re-optimize (Sec. 6)."""
from __future__ import annotations

import numbers
import time

import numpy as np

from .. import blocks
from ..base import (_OPTIONAL_POSITIVE_INT, _POSITIVE, _POSITIVE_INT, _RUN_CONSTRAINTS, _Clustering, _Estimator,
                    _gated)
from ..blocks import memory, runs
from ..blocks.rows import running_rows
from ..errors import InputValueError
from ..validation import Interval, Options, check_data
from .clustering import ROUNDINGS
from .divergences import DIVERGENCES, BregmanDivergence


class BregmanClustering(_Clustering, _Estimator):
    """Hard clustering under a Bregman divergence by the convex relaxations of Cheng,
    Zhang and Schuurmans over normalized equivalence matrices M, rounded by spectral
    clustering and re-optimized by Bregman hard clustering (Sec. 6).

    Parameters
    ----------
    n_clusters : int, >= 2
    model : {"cond-jc", "cond", "disc", "joint"}, default "cond-jc"
        "cond-jc": min D_F(X, M X) over M in M1 by ADMM (Sec. 3.1; jointly convex
        divergences: Euclidean, KL, logistic); "cond": min D_F*(T, f(X)) + alpha/2 Xi^2(T)
        over T = M A, M in M2 (Sec. 3.2; divergences whose conjugate is finite at 0);
        "disc": the discriminative model (30) (softmax loss, gamma); "joint": the joint
        model (34) with a learned cluster prior (alpha, beta), re-optimized with the prior.
        The last three by generalized conditional gradient.
    divergence : {"euclidean", "logistic", "kl", "itakura-saito"} or BregmanDivergence
        The divergence of the model and of the re-optimization ("disc" uses it only to
        re-optimize; the paper uses the logistic one there).
    alpha, beta, gamma : float
        The regularizers (defaults: the paper's 1e-5, 1e-5 and 1e-6).  The discriminative
        loss scales V by 1/t, so gamma's effect scales as gamma t^3.
    max_iter, tol : optional
        The relaxation's iterations and tolerance (defaults: 1000 and 1e-5 for ADMM;
        300 ("cond", with App. C's local refinement after every step), 1000 ("joint")
        or 100 ("disc") and 1e-6 for conditional gradient).
    rounding_repeats : int, default 10
        Spectral-clustering roundings (k-means seeds), each re-optimized; the lowest hard
        objective wins.
    n_init : int, default 10
        Hard Bregman clusterings from Bregman k-means++ seedings
        (:func:`dnomad.bregman.bregman_seeding`), run beside the roundings: the lowest
        hard objective among all wins, so the result is never worse (in the model's
        objective) than the standard hard clustering from n_init seeds.  0: the paper's
        pipeline, roundings alone.
    rounding : {"ng-jordan-weiss", "shi-malik"}, default "ng-jordan-weiss"
        How SC rounding reads M's top d eigenvectors: rows normalized to unit length (Ng,
        Jordan and Weiss), or as they are (Shi and Malik, the rounding the paper cites:
        for M 1 = 1 their generalized eigenvectors are M's own).
    chunk_rows : int, optional
        "cond": rows per chunk when X is a Zarr array or path (T is kept in row chunks
        next to X, out of core; default the Zarr chunking).  "cond-jc": rows per chunk
        of M and Lambda (t x t; default one chunk per thread).
    store : str, optional
        A Zarr path or URL for the result (labels, the relaxation's history, a summary);
        the run keeps no checkpoints (relaxations take seconds to minutes).
    overwrite : bool, default False
    random_state
    verbose : int, default 0
        Progress on stderr: 0 none, 1 a live line, 2 a line per iteration (:mod:`dnomad.progress`).

    Attributes
    ----------
    labels_ : ndarray (t,)
    objective_ : float
        The hard objective of labels_ after re-optimization: D_F(X, Y Gamma), and for
        "joint" the negative log joint likelihood -1'Y log q + D_F(X, Y Gamma).
    rounded_objectives_, reoptimized_objectives_ : list of float
        Per rounding, before and after re-optimization.
    rounded_labels_ : list of ndarray
        The roundings (before re-optimization).
    seeded_objectives_ : list of float
        Per seeding (``n_init``), after its hard clustering.
    start_ : str
        Where labels_ came from: "rounding i" or "seeding i" (from 0).
    M_ : (Phi, sigma), M = Phi diag(sigma) Phi' + 1 1'/t (for "cond-jc": Z, the
        projection of ADMM's M onto M2, which equals M at convergence)
    posteriors_ : ndarray (t, d), "joint" only
        p(j | x_i) proportional to q_j exp(-D_F(x_i, mu_j)) at the final labels.
    relaxation_objective_, history_, stop_reason_, n_iter_, fit_seconds_
    """

    MODELS = ("cond-jc", "cond", "disc", "joint")

    _parameter_constraints = {
        "n_clusters": [Interval(numbers.Integral, 2, None)], "model": [Options(*MODELS)],
        "divergence": [Options(*DIVERGENCES), BregmanDivergence],
        "alpha": _POSITIVE, "beta": _POSITIVE, "gamma": _POSITIVE, "max_iter": _OPTIONAL_POSITIVE_INT,
        "tol": [None] + _POSITIVE, "rounding_repeats": _POSITIVE_INT,
        "n_init": [Interval(numbers.Integral, 0, None)], "rounding": [Options(*ROUNDINGS)],
        "chunk_rows": _OPTIONAL_POSITIVE_INT,
        **_RUN_CONSTRAINTS}

    def __init__(self, n_clusters=2, *, model="cond-jc", divergence="euclidean", alpha=1e-5, beta=1e-5,
                 gamma=1e-6, max_iter=None, tol=None, rounding_repeats=10, n_init=10, rounding="ng-jordan-weiss",
                 chunk_rows=None, store=None, overwrite=False, random_state=None, verbose=0):
        self.n_clusters = n_clusters
        self.model = model
        self.divergence = divergence
        self.alpha = alpha
        self.beta = beta
        self.gamma = gamma
        self.max_iter = max_iter
        self.tol = tol
        self.rounding_repeats = rounding_repeats
        self.n_init = n_init
        self.rounding = rounding
        self.chunk_rows = chunk_rows
        self.store = store
        self.overwrite = overwrite
        self.random_state = random_state
        self.verbose = verbose

    def _check_input_kind(self, x_kind):
        if x_kind == "zarr" and self.model in ("disc", "joint"):
            raise InputValueError(f"X from Zarr is read by row chunks for model='cond' and 'cond-jc' only; "
                                  f"model={self.model!r} needs X in memory (np.asarray(zarr_array[:]))")

    def _memory_parts(self, n, d, x_kind="numpy"):
        """What a fit on t = n points of d features holds (:func:`dnomad.plan`), all in
        this process (the relaxations use no workers), at its peak: for "cond-jc", M and
        Lambda (t x t each) and the larger of the ADMM row step's temporaries (about 11
        rows of t for each row whose step runs) and the projection's five t x t copies;
        for "cond", L-BFGS-B's refinement of T over its t d entries (a Zarr X: T, S and
        a chunk's temporaries instead); for "disc", the loss's three t x t arrays; for
        "joint", W, S and G with the loss's t x d temporaries.  The roundings and the
        hard clusterings after them hold O(t (d + rounding_repeats)) (the larger is
        counted).  X itself is not, unless read from a store (for "cond", a chunk's
        temporaries are counted for all rows at once: the Zarr chunks are not known
        here)."""
        from .admm import row_step_chunking

        self._check_input_kind(x_kind)
        t, R = n, self.rounding_repeats
        from_store = x_kind == "zarr"
        tail = 8 * t * (6 * d + R + 11)
        if self.model == "cond-jc":
            running = row_step_chunking(t, self.chunk_rows)[1]
            client = {"M and Lambda (t x t each)": 16 * t * t,
                      f"the row step's temporaries ({running:,} rows at once) or the projection's t x t copies":
                          8 * max(11 * t * running, 5 * t * t),
                      "X's centred copy" + (" and X read from the store" if from_store else ""):
                          8 * t * d * (2 if from_store else 1)}
        elif self.model == "cond" and from_store:
            running = t if self.chunk_rows is None else running_rows(t, self.chunk_rows)
            client = {"T, S and T gathered (t x d each)": 24 * t * d, "the passes' per-row states": 160 * t,
                      f"a chunk's temporaries ({running:,} rows at once)": 8 * running * (5 * d + 50)}
        elif self.model == "cond":
            client = {"T and L-BFGS-B's refinement of it (10 pairs), or the hard clusterings":
                          max(8 * 43 * t * d, 8 * t * (5 * d + R + 8))}
        elif self.model == "disc":
            client = {"the loss's three t x t arrays": 24 * t * t, "W, S and their gradients (t x d)": 40 * t * d}
        else:
            client = {"W, S, G and the loss's t x d temporaries, or the hard clusterings":
                          max(56 * t * (d + 1), tail)}
        return memory.MemoryParts(client=client, passes={
            "the relaxation": "in this process (X read by row chunks from the store)"
                              if from_store and self.model == "cond" else "in this process (X read whole)"})

    @_gated
    def fit(self, X, y=None, *, resume=False):
        """Cluster the rows of X (points x features, in the divergence's domain; NumPy,
        or for model "cond" also a Zarr array or path read by row chunks).  Returns self."""
        from .. import bregman

        if resume:
            raise InputValueError("BregmanClustering keeps no checkpoints to resume from: fit again")
        start = time.perf_counter()
        div = bregman.get_divergence(self.divergence)
        d = self.n_clusters
        rng = np.random.default_rng(self.random_state)
        chunked = isinstance(X, str) or hasattr(X, "__fspath__") or type(X).__module__.startswith("zarr")
        self._check_input_kind("zarr" if chunked else "numpy")
        X = check_data(X, owner="BregmanClustering", min_rows=d, not_constant=True)
        if isinstance(X, np.ndarray):
            div.check_domain(X)
        if self.store is not None:
            runs.start_run_without_checkpoints(self, "bregman", runs.jsonable_params(self.get_params()), X)
        if chunked and self.model == "cond-jc":
            # cvxCondJC's state is t x t: X (t x n) is read whole, M and Lambda are chunked
            with blocks.RowChunks(X, center=False) as whole:
                X, chunked = whole.gather(), False
        max_iter = self.max_iter if self.max_iter is not None else \
            {"cond-jc": 1000, "cond": 300, "disc": 100}.get(self.model, 1000)
        tol = self.tol if self.tol is not None else (1e-5 if self.model == "cond-jc" else 1e-6)
        # The relaxation's progress: ADMM's residuals, or the conditional gradient's
        # duality gap against tol (1 + |objective|), shown as the gap.
        targets = {"primal_residual": tol, "dual_residual": tol} if self.model == "cond-jc" else {}
        report = self._report_progress(f"Bregman clustering ({self.model})", show=("objective", "gap"),
                                       targets=targets, max_iter=max_iter, passes=None)
        chunks = None
        if chunked:
            # X stays in Zarr: the relaxation, the rounding's objectives and the
            # re-optimization all read it by row chunks
            chunks = blocks.RowChunks(X, chunk_rows=self.chunk_rows, center=False)
            try:
                with blocks.single_threaded_blas():
                    res = bregman.cond(chunks, d, div, alpha=self.alpha, max_iter=max_iter, tol=tol,
                                       callback=report)
            except BaseException:
                chunks.close()
                raise
            X = chunks
        else:
            X = np.asarray(X, dtype=np.float64)
            if X.ndim != 2:
                raise InputValueError(f"X must be a 2-D array (points x features); got shape {X.shape}")
            div.check_domain(X)
            if self.model == "cond-jc":
                with blocks.single_threaded_blas():
                    res = bregman.cond_jc(X, d, div, max_iter=max_iter, tol=tol, chunk_rows=self.chunk_rows,
                                          callback=report)
            elif self.model == "cond":
                res = bregman.cond(X, d, div, alpha=self.alpha, max_iter=max_iter, tol=tol, callback=report)
            elif self.model == "disc":
                res = bregman.disc(X, d, gamma=self.gamma, max_iter=max_iter, tol=tol, callback=report)
            else:
                res = bregman.joint(X, d, div, alpha=self.alpha, beta=self.beta, max_iter=max_iter, tol=tol,
                                    callback=report)
        # SC rounding from the top d eigenvectors of M (of Z, its projection onto M2, for
        # "cond-jc"), which every model keeps factored
        self.M_ = (res.Phi, res.sigma)
        roundings = bregman.kmeans_roundings(res.membership_eigenvectors(d), d, repeats=self.rounding_repeats,
                                             random_state=rng, normalize_rows=self.rounding == "ng-jordan-weiss")
        joint = self.model == "joint"
        self.rounded_labels_, self.rounded_objectives_, self.reoptimized_objectives_ = roundings, [], []
        self.seeded_objectives_ = []
        best = None
        try:
            for i, labels in enumerate(roundings):
                self.rounded_objectives_.append(bregman.hard_objective(X, labels, d, div, joint=joint))
                final, objective, _ = bregman.hard_clustering(X, d, div, labels, joint=joint)
                self.reoptimized_objectives_.append(objective)
                if best is None or objective < best[1]:
                    best = (final, objective, f"rounding {i}")
            for i, seed in enumerate(rng.integers(2 ** 32, size=self.n_init)):
                seeded = bregman.bregman_seeding(X, d, div, int(seed))
                final, objective, _ = bregman.hard_clustering(X, d, div, seeded, joint=joint)
                self.seeded_objectives_.append(objective)
                if objective < best[1]:
                    best = (final, objective, f"seeding {i}")
        finally:
            if chunks is not None:
                chunks.close()
        self.labels_, self.objective_, self.start_ = best
        if joint:
            self.posteriors_ = bregman.cluster_posteriors(X, self.labels_, d, div)
        self.relaxation_objective_ = res.objective
        self.history_, self.stop_reason_, self.n_iter_ = res.history, res.stop_reason, res.n_iter
        self.fit_seconds_ = time.perf_counter() - start
        if self.store is not None:
            arrays = {"labels": self.labels_}
            if joint:
                arrays["posteriors"] = self.posteriors_
            runs.write_result(self.store, arrays, {
                "model": self.model, "divergence": div.name, "objective": self.objective_,
                "relaxation_objective": self.relaxation_objective_, "stop_reason": self.stop_reason_,
                "n_iter": self.n_iter_, "reoptimized_objectives": self.reoptimized_objectives_,
                "seeded_objectives": self.seeded_objectives_, "start": self.start_},
                self.history_, self.fit_seconds_)
        return self
