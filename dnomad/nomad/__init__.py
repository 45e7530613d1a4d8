"""NOMAD (Tepper et al., "Clustering is semidefinite programmable"): the nonnegative SDP
solved by conditional gradient (:mod:`.cgm`, Sec. 5, Alg. 1 and 2), its low-rank form by
Burer-Monteiro with symmetric NMF by ADMM as its start (:mod:`.bm`, App. D and E) over the
row-space optimizers of :mod:`.box_optim`, multi-layer NOMAD (Sec. 3.1) and the estimator."""
from .._lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"NOMAD": ".estimator"})     # the estimator on first use
__all__ = ["NOMAD"]
