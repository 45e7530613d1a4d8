"""HOTTOPIXX separable NMF by incremental subgradient epochs (Alg. 4 and 5, Sec. 4.1),
its exact LP reference (:mod:`.solver`) and the estimator."""

from .estimator import Hottopixx

__all__ = ["Hottopixx"]
