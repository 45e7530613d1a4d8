"""K-means' SDP on its low-rank manifold: Riemannian cubic-regularized Newton
(:mod:`.riemannian`, Sec. 3, App. C, E, G), its baseline NLR (:mod:`.nlr`, the paper's
ref. [47]) and their estimators."""

from .estimators import NLR, RiemannianKMeans

__all__ = ["NLR", "RiemannianKMeans"]
