"""Distributed eigensolvers written against the small operator interface (matvec/matmat)."""
from .eigen import ComplementBasis, EigResult, extreme_eigenvector, top_eigenvectors

__all__ = ["ComplementBasis", "EigResult", "extreme_eigenvector", "top_eigenvectors"]
