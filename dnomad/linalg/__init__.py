"""Eigensolvers over the symmetric-operator protocol (:class:`SymmetricOperator`: shape,
dtype, matmat, diag), or over matvec/matmat callables; linear programs by HiGHS
(:mod:`dnomad.linalg.lp`)."""
from .eigen import ComplementBasis, EigResult, extreme_eigenvector, top_eigenvectors
from .operator import SymmetricOperator, as_matmat

__all__ = ["ComplementBasis", "EigResult", "SymmetricOperator", "as_matmat", "extreme_eigenvector",
           "top_eigenvectors"]
