"""Symmetric NMF under a simplicial constraint by Frank-Wolfe (Alg. 1 and 2), with the
projected-gradient and penalty baselines (:mod:`.solvers`) and the estimator."""
from .._lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"SymNMF": ".estimator"})     # the estimator on first use
__all__ = ["SymNMF"]
