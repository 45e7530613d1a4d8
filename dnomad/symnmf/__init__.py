"""Symmetric NMF under a simplicial constraint by Frank-Wolfe (Alg. 1 and 2), with the
projected-gradient and penalty baselines (:mod:`.solvers`) and the estimator."""

from .estimator import SymNMF

__all__ = ["SymNMF"]
