"""HOTTOPIXX separable NMF by incremental subgradient epochs (Alg. 4 and 5, Sec. 4.1),
its exact LP reference (:mod:`.solver`) and the estimator."""
from .._lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"Hottopixx": ".estimator"})     # the estimator on first use
__all__ = ["Hottopixx"]
