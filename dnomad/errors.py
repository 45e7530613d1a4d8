"""Error and warning classes: each subclasses both DnomadError and the matching builtin."""


class DnomadError(Exception):
    """Base class of every error dnomad raises on purpose."""


class InputValueError(DnomadError, ValueError):
    """An argument has a value, shape or content that is not allowed."""


class InputTypeError(DnomadError, TypeError):
    """An argument has a type that is not supported."""


class StoreError(DnomadError, OSError):
    """A store cannot be used: not writable, or holds another run."""


class WorkerLostError(DnomadError, RuntimeError):
    """A worker holding blocks in memory died (killed, preempted, out of memory): the
    blocks it held are gone.  Estimators restart from the run's last checkpoint."""


class ConvergenceWarning(UserWarning):
    """A solver stopped at max_iter before meeting its tolerance."""


class MissingDataError(DnomadError, ImportError):
    """A data set's files come from a package that is not installed."""
