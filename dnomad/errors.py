"""Error and warning classes: each subclasses both DnomadError and the matching builtin;
and :func:`warn_convergence`, the one way solvers report a stop at ``max_iter``."""
import os
import sys
import warnings


class DnomadError(Exception):
    """Base class of every error dnomad raises on purpose."""


class InputValueError(DnomadError, ValueError):
    """An argument has a value, shape or content that is not allowed."""


class InputTypeError(DnomadError, TypeError):
    """An argument has a type that is not supported."""


class InputChangedError(InputValueError):
    """The input of a run being resumed is not the one the run began with."""


class InvalidParameterError(InputValueError, InputTypeError):
    """A parameter satisfies none of its constraints (a wrong type or a value out of
    range: both a ValueError and a TypeError, as scikit-learn's)."""


class StoreError(DnomadError, OSError):
    """A store cannot be used: not writable, or holds another run."""


class WorkerLostError(DnomadError, RuntimeError):
    """A worker holding blocks in memory died (killed, preempted, out of memory): the
    blocks it held are gone.  Estimators restart from the run's last checkpoint."""


class NotPicklableError(DnomadError, TypeError):
    """An object holds state that cannot leave this process (blocks in a cluster's
    workers): pickling it would not carry what it stands for."""


def _convergence_warning():
    import sklearn.exceptions

    class ConvergenceWarning(sklearn.exceptions.ConvergenceWarning):
        """A solver stopped at max_iter before meeting its tolerance (scikit-learn's
        ConvergenceWarning, so its filters apply)."""

    ConvergenceWarning.__module__, ConvergenceWarning.__qualname__ = __name__, "ConvergenceWarning"
    return ConvergenceWarning


def __getattr__(name):
    # Made on first use: scikit-learn's import (with SciPy's stats and pandas) is ~80 MiB
    # that a dask worker running dnomad's kernels would otherwise hold.
    if name == "ConvergenceWarning":
        global ConvergenceWarning
        ConvergenceWarning = _convergence_warning()
        return ConvergenceWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MissingDataError(DnomadError, ImportError):
    """A data set's files come from a package that is not installed."""


# The package's directory, with a trailing separator so that a sibling directory whose
# name starts with "dnomad" is not taken for it.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def find_stack_level():
    """The ``stacklevel`` that makes a warning point at the first frame outside dnomad
    (the user's call), for a ``warnings.warn`` made in the function that calls this one
    (pandas' ``find_stack_level``).  Counts the frames in the package, this one
    included, walking up from here.  From a thread dnomad started (no user frame above
    it) the count runs past the stack's top and the warning is attributed to ``sys``."""
    frame = sys._getframe()
    level = 0
    try:
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frame = frame.f_back
            level += 1
    finally:
        del frame
    return level


def warn_convergence(message):
    """Warn :class:`ConvergenceWarning` with ``message`` (the method, its ``max_iter``, and
    the last residual against its tolerance), attributed to the user's line that
    started the fit (the first frame outside dnomad), however deep the solver runs."""
    # find_stack_level counts its own frame and this one: from here, that count is the
    # stacklevel of the first frame outside the package.
    warnings.warn(message, sys.modules[__name__].ConvergenceWarning, stacklevel=find_stack_level())


class TimeLimitError(DnomadError, RuntimeError):
    """A solver stopped at the time limit it was given, before it had an answer."""


class LPFailedError(DnomadError, RuntimeError):
    """A linear program that has an optimum was not solved: every HiGHS method tried
    gave up on it (numerical trouble), not an infeasible or unbounded LP."""
