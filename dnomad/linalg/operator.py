"""The symmetric-operator protocol: what an n x n operator offers the eigensolvers and the
methods, written once.  dnomad's n x n operators implement it: BlockMatrix (blocks in
memory, on workers or in Zarr), LowRankGram (Q = Y Y^T), DataGram (D = F F^T / scale
from the rows of X) and ScaledMatrix (an operator divided by a number)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import InputTypeError


@runtime_checkable
class SymmetricOperator(Protocol):
    """A symmetric n x n operator: ``shape`` (n, n), ``dtype``, ``matmat(V)`` = A V for V
    of shape (n,) or (n, k) (one pass over A), and ``diag()`` (A's diagonal, n)."""

    shape: tuple
    dtype: object

    def matmat(self, V): ...

    def diag(self): ...


def as_matmat(A, n=None):
    """(matmat, n) for a :class:`SymmetricOperator` (n from its shape) or for a callable
    ``A(V)`` = A V with ``n`` given: what the eigensolvers take."""
    if hasattr(A, "matmat") and hasattr(A, "shape"):
        return A.matmat, int(A.shape[0])
    if callable(A):
        if n is None:
            raise InputTypeError("n must be given with a matmat callable (an operator's shape gives it)")
        return A, int(n)
    raise InputTypeError(f"A must be a symmetric operator (shape, dtype, matmat, diag) or a callable; "
                         f"got {type(A).__name__}")
