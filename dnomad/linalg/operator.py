"""The symmetric-operator protocol: what an n x n operator offers the eigensolvers and the
methods, written once.  dnomad's n x n operators implement it: BlockMatrix (blocks in
memory, on workers or in Zarr), LowRankGram (Q = Y Y^T), DataGram (D = F F^T / scale
from the rows of X) and ScaledMatrix (an operator divided by a number)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import InputTypeError


@runtime_checkable
class SymmetricOperator(Protocol):
    """A symmetric n x n operator A.

    ``shape`` (n, n) and ``dtype``; ``matmat(V)`` = A V for V of shape (n,) or (n, k)
    (one pass over A); ``diag()``, A's diagonal (n); ``summary()``, a dict of the
    entries' "sum", "fro" (Frobenius norm), "min" and "max" (one pass);
    ``threshold_components(t)``, labels 0..c-1 (by first appearance) of the connected
    components of the graph A_ij > t, t a number or per-node thresholds (an edge then
    needs A_ij > max(t_i, t_j)).  The eigensolvers use ``matmat``; the methods' rounding
    and scaling the rest."""

    shape: tuple
    dtype: object

    def matmat(self, V): ...

    def diag(self): ...

    def summary(self): ...

    def threshold_components(self, threshold): ...


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
