"""dnomad: NOMAD and related clustering solvers on a distributed, out-of-core block engine."""
from ._lazy import lazy_attributes
from .errors import (DnomadError, InputTypeError, InputValueError, InvalidParameterError, MissingDataError,
                     NotPicklableError, StoreError)

__version__ = "0.1.0"

# Imported on first use (dnomad/_lazy.py): a worker running dnomad's kernels needs none.
_LAZY = {"BlockMatrix": ".blocks", "fit": ".api", "resume": ".api", "BregmanClustering": ".bregman.estimator",
         "Hottopixx": ".hottopixx.estimator", "NLR": ".kmeans_sdp.estimators",
         "RiemannianKMeans": ".kmeans_sdp.estimators", "Plan": ".memory_plan", "plan": ".memory_plan",
         "NOMAD": ".nomad.estimator", "plot": ".plotting", "SymNMF": ".symnmf.estimator",
         "ConvergenceWarning": ".errors"}


__getattr__ = lazy_attributes(__name__, _LAZY)


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = ["BlockMatrix", "BregmanClustering", "Hottopixx", "NLR", "NOMAD", "Plan", "RiemannianKMeans", "SymNMF",
           "blocks", "data", "fit", "linalg", "metrics", "plan", "plot", "resume",
           "ConvergenceWarning", "DnomadError", "InputTypeError", "InputValueError", "InvalidParameterError",
           "MissingDataError", "NotPicklableError", "StoreError",
           "__version__"]
