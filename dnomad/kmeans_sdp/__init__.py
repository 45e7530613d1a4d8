"""K-means' SDP on its low-rank manifold: Riemannian cubic-regularized Newton
(:mod:`.riemannian`, Sec. 3, App. C, E, G), its baseline NLR (:mod:`.nlr`, the paper's
ref. [47]) and their estimators."""
from .._lazy import lazy_attributes

# the estimators on first use
__getattr__ = lazy_attributes(__name__, {"NLR": ".estimators", "RiemannianKMeans": ".estimators"})
__all__ = ["NLR", "RiemannianKMeans"]
