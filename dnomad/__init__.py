"""dnomad: NOMAD and related clustering solvers on a distributed, out-of-core block engine."""
from .errors import (ConvergenceWarning, DnomadError, InputTypeError, InputValueError, InvalidParameterError,
                     MissingDataError, NotPicklableError, StoreError)

__version__ = "0.1.0"

from . import blocks, data, linalg, metrics  # noqa: E402
from .blocks import BlockMatrix  # noqa: E402
from .api import fit, resume  # noqa: E402
from .bregman.estimator import BregmanClustering  # noqa: E402
from .hottopixx.estimator import Hottopixx  # noqa: E402
from .kmeans_sdp.estimators import NLR, RiemannianKMeans  # noqa: E402
from .memory_plan import Plan, plan  # noqa: E402
from .nomad.estimator import NOMAD  # noqa: E402
from .plotting import plot  # noqa: E402
from .symnmf.estimator import SymNMF  # noqa: E402

__all__ = ["BlockMatrix", "BregmanClustering", "Hottopixx", "NLR", "NOMAD", "Plan", "RiemannianKMeans", "SymNMF",
           "blocks", "data", "fit", "linalg", "metrics", "plan", "plot", "resume",
           "ConvergenceWarning", "DnomadError", "InputTypeError", "InputValueError", "InvalidParameterError",
           "MissingDataError", "NotPicklableError", "StoreError",
           "__version__"]
