"""What every estimator shares: scikit-learn's BaseEstimator with the input gate
(parameters checked before any data is read), the store's claim, and a finished run's
result loaded back."""
from __future__ import annotations

import functools
import logging
import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin

from . import blocks
from ._checks import params_checked
from .blocks import runs
from .blocks import store as run_store
from .blocks.operators import LowRankGram
from .errors import InputTypeError, InputValueError, InvalidParameterError
from .progress import Progress, with_progress
from .validation import Interval, validate_params


logger = logging.getLogger(__name__)


def _n_features(X):
    """The column count of a fit's input (n for a precomputed n x n matrix), read from
    its metadata; None where the input does not say."""
    shape = blocks.input_metadata(X).get("shape")
    if shape is None:
        shape = np.shape(X)
    return int(shape[1]) if len(shape) == 2 else None


def _gated(fit):
    """The input gate around an estimator's ``fit``: every parameter checked against
    ``_parameter_constraints`` first (``fit`` checks its solver's parameters against the
    data's size before reading it, so the solvers it calls do not check them again); the
    store, claimed inside ``fit`` (after its data passed
    :func:`dnomad.validation.check_data`) by :meth:`_Estimator._claim_store`, is released
    when ``fit`` ends, however it ends, as is the fit's progress report; and a run refused
    for its input after the claim (content found bad where lazy data is read) leaves no
    store behind."""
    @functools.wraps(fit)
    def gated(self, X, y=None, *, resume=False):
        validate_params(self)
        if not isinstance(resume, (bool, np.bool_)):
            raise InvalidParameterError(f"{type(self).__name__}.fit: resume must be a bool; got {resume!r}")
        self._store_claim = None
        self.__dict__.pop("n_features_in_", None)
        ended = "interrupted"
        try:
            with params_checked():
                fitted = fit(self, X, y, resume=bool(resume))
            ended = getattr(self, "stop_reason_", None)
            n_features = _n_features(X)
            if n_features is not None:
                self.n_features_in_ = n_features
            return fitted
        except (InputValueError, InputTypeError):
            if self._store_claim is not None and not resume:
                try:
                    run_store.abandon(self.store, created=self._store_claim[1])
                except OSError as exc:          # the input's error is the one to report
                    logger.warning("could not release store %s: %s", run_store.redact(str(self.store)), exc)
            raise
        finally:
            claim = self.__dict__.pop("_store_claim", None)
            if claim is not None:
                claim[0].release()
            self.__dict__.pop("_fit_callback", None)
            progress = self.__dict__.pop("_fit_progress", None)
            if progress is not None:
                progress.close(ended)
    return gated


# Parameter constraints shared by several estimators (see dnomad.validation).
_POSITIVE_INT = [Interval(numbers.Integral, 1, None)]
_OPTIONAL_POSITIVE_INT = [None] + _POSITIVE_INT
_POSITIVE = [Interval(numbers.Real, 0, None, closed="neither")]
_NONNEGATIVE = [Interval(numbers.Real, 0, None)]
_RUN_CONSTRAINTS = {"store": [None, "path"], "overwrite": ["boolean"], "random_state": ["random_state"],
                    "verbose": [Interval(numbers.Integral, 0, 2)]}


class _Estimator(BaseEstimator):
    """scikit-learn's estimator: __init__ stores its arguments as given (get_params,
    set_params, clone and the repr come from BaseEstimator); fit checks them against
    ``_parameter_constraints`` (:func:`_gated`) and sets ``n_features_in_``."""

    _parameter_constraints = {}
    _checkpoints = False          # fit(resume=True) continues from a checkpoint (all but BregmanClustering)
    _max_iter_param = "max_iter"  # the parameter a resumed run may raise to go on

    def _report_progress(self, name, **report):
        """Start this fit's progress report (:class:`dnomad.progress.Progress` at
        ``verbose``; :func:`_gated` closes it when fit ends) and return the callback the
        solvers get: the report, then the user's ``callback``."""
        self._fit_progress = Progress(name, verbose=self.verbose, logger=type(self).__module__.rsplit(".", 1)[0],
                                      **report)
        self._fit_callback = with_progress(getattr(self, "callback", None), self._fit_progress)
        return self._fit_callback

    def _start_matrix_run(self, method, id_params, X, resume, max_iter=None):
        """The store's side of a checkpointed run on X as given (HOTTOPIXX, the K-means
        estimators): the run's identity claimed, its marker written (a new run), and its
        :class:`Checkpoints`; None without a store, or when resuming a run that finished
        (its result is then loaded, as :meth:`_load_finished`)."""
        if resume and self.store is None:
            raise InputValueError("resume=True needs the run's store")
        if self.store is None:
            return None
        record = runs.start_matrix_run(self, method, id_params, X, resume)
        if resume and self._load_finished(max_iter):
            return None
        if not resume:
            runs.write_run_record(self.store, record)
        return run_store.Checkpoints(self.store, f"{method}_checkpoint")

    def _claim_store(self, run_id, resume=False, record=None):
        """Claim ``store`` for this run (lock, then the run-identity check: see
        :func:`dnomad.blocks.store.claim`; ``record``, this run's record, names what
        differs from the stored run's where a resume's identity does not match);
        :func:`_gated` releases it."""
        self._store_claim = run_store.claim(self.store, run_id, overwrite=self.overwrite and not resume,
                                            resume=resume, record=record)

    def _load_finished(self, max_iter=None):
        """If ``store`` holds this run's result, set the learned attributes from it
        (nothing is computed or written) and return True: resuming a finished run leaves
        it as it is.  Else return False; also for a run that stopped at max_iter when
        ``max_iter`` (this fit's, resolved) is larger: its result is withdrawn (so that a
        crash while it goes on leaves no stale result standing) and the run's record
        takes the new max_iter, and resuming goes on from the last checkpoint."""
        summary = run_store.read_result(self.store)
        if summary is None:
            return False
        if summary.get("stop_reason") == "max_iter" and max_iter is not None and \
                max_iter > summary.get("n_iter", max_iter):
            run_store.drop_json(self.store, "result")
            marker = run_store.read_run_record(self.store)
            marker["estimator_params"][self._max_iter_param] = int(max_iter)
            run_store.write_json(self.store, run_store.RUN_MARKER, marker)
            return False
        lazy = summary.get("lazy_arrays", [])
        for path, attr in runs.RESULT_ARRAYS.items():
            if run_store.has_array(self.store, f"result/{path}"):
                # Arrays the workers wrote stay in the store: read when used.
                read = run_store.lazy_rows if path in lazy else run_store.read_vector
                setattr(self, attr, read(self.store, f"result/{path}"))
        if run_store.has_array(self.store, "result/Q"):
            self.Q_ = blocks.from_zarr(self.store, "result/Q", backend="zarr", store=self.store)
        elif run_store.has_array(self.store, "result/Y"):
            self.Q_ = LowRankGram(self.Y_)
        for key in runs.RESULT_SUMMARY:
            if key in summary:
                setattr(self, f"{key}_", summary[key])
        self.history_ = run_store.read_table(self.store, "result/history") or []
        self.fit_seconds_ = summary.get("fit_seconds")
        logger.info("the run in %s finished on %s (%s): nothing to resume", run_store.redact(str(self.store)),
                    summary.get("finished"), summary.get("stop_reason"))
        return True


class _Clustering(ClusterMixin):
    """The estimators that learn ``labels_`` (not Hottopixx): scikit-learn's clusterer."""

    def fit_predict(self, X, y=None, **kwargs):
        """Fit on X and return ``labels_`` (ClusterMixin's, defined here so that a
        warning from the fit points at the caller's line, not at scikit-learn's)."""
        return self.fit(X, **kwargs).labels_
