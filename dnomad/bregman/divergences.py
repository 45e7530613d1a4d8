"""Bregman divergences: D_F(x, y) = F(x) - F(y) - <x - y, f(y)> for a strictly convex F
with gradient f (the "transfer"), and D_F(x, y) = D_F*(f(y), f(x)) with F* the Fenchel
conjugate (f^-1 = grad F*).  Divergences act on rows: ``div(X, Y)`` sums over the last
axis, so a t x n data matrix gives t values."""
from __future__ import annotations

import abc

import numpy as np

from ..errors import InputValueError


class BregmanDivergence(abc.ABC):
    """The divergence of F (elementwise, summed over features).  A subclass gives F, f,
    f^-1 and F* (and may give a stable ``_elementwise`` and an exact ``curvature``).

    Attributes: ``name``; ``jointly_convex`` (convex in (x, y) together: what the ADMM
    of Sec. 3.1 needs); ``domain`` (a description for error messages).
    """

    name = None
    jointly_convex = False
    domain = "all reals"

    @abc.abstractmethod
    def F(self, x):
        """The generating function, elementwise."""

    @abc.abstractmethod
    def f(self, x):
        """The transfer, grad F."""

    @abc.abstractmethod
    def f_inv(self, theta):
        """grad F*, the inverse of the transfer."""

    @abc.abstractmethod
    def F_conj(self, theta):
        """The Fenchel conjugate F*(theta) = sup_x <theta, x> - F(x)."""

    def curvature(self, x):
        """F''(x), elementwise (central differences of f unless a subclass knows it)."""
        x = np.asarray(x, dtype=np.float64)
        h = 1e-6 * np.maximum(1.0, np.abs(x))
        return (self.f(x + h) - self.f(x - h)) / (2 * h)

    def in_domain(self, x):
        return np.isfinite(x)

    def check_domain(self, x, what="X"):
        """Raise InputValueError when an entry of ``x`` is outside F's domain."""
        x = np.asarray(x, dtype=np.float64)
        bad = ~self.in_domain(x)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InputValueError(f"{what} must lie in the domain of the {self.name} divergence "
                                  f"({self.domain}); {int(bad.sum())} entries do not, the first at "
                                  f"{where}: {x[where]!r}")
        return x

    def _elementwise(self, x, y):
        """D_F(x, y) entry by entry (a numerically careful form)."""
        return self.F(x) - self.F(y) - (x - y) * self.f(y)

    def __call__(self, x, y):
        """D_F(x, y), summed over the last axis (rows of a matrix give one value each)."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        return np.sum(self._elementwise(x, y), axis=-1)

    def conjugate(self, theta1, theta2):
        """D_F*(theta1, theta2) = F*(theta1) - F*(theta2) - <theta1 - theta2, f^-1(theta2)>,
        summed over the last axis."""
        theta1 = np.asarray(theta1, dtype=np.float64)
        theta2 = np.asarray(theta2, dtype=np.float64)
        return np.sum(self.F_conj(theta1) - self.F_conj(theta2) - (theta1 - theta2) * self.f_inv(theta2),
                      axis=-1)

    def __repr__(self):
        return f"{type(self).__name__}()"


class SquaredEuclidean(BregmanDivergence):
    """F(x) = x^2 / 2, f(x) = x: D_F(x, y) = ||x - y||^2 / 2 (Gaussian clusters)."""

    name = "euclidean"
    jointly_convex = True

    def F(self, x):
        return 0.5 * np.square(x)

    def f(self, x):
        return np.asarray(x, dtype=np.float64)

    def f_inv(self, theta):
        return np.asarray(theta, dtype=np.float64)

    def F_conj(self, theta):
        return 0.5 * np.square(theta)

    def curvature(self, x):
        return np.ones_like(np.asarray(x, dtype=np.float64))

    def _elementwise(self, x, y):
        return 0.5 * np.square(x - y)


class Logistic(BregmanDivergence):
    """F(x) = x log x + (1 - x) log(1 - x) on (0, 1), the sigmoid transfer's inverse
    f(x) = log(x / (1 - x)); F*(theta) = log(1 + e^theta): D_F is the Bernoulli
    relative entropy (jointly convex)."""

    name = "logistic"
    jointly_convex = True
    domain = "the open interval (0, 1)"

    def in_domain(self, x):
        return (x > 0) & (x < 1)

    def F(self, x):
        return _xlogx(x) + _xlogx(1.0 - x)

    def f(self, x):
        return np.log(x) - np.log1p(-x)

    def f_inv(self, theta):
        return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(theta, dtype=np.float64)))    # the sigmoid

    def F_conj(self, theta):
        return np.logaddexp(0.0, theta)

    def curvature(self, x):
        return 1.0 / (x * (1.0 - x))

    def _elementwise(self, x, y):
        return _xlogx_over(x, y) + _xlogx_over(1.0 - x, 1.0 - y)


class _PositiveDomain(BregmanDivergence):
    """Divergences defined for x > 0."""

    domain = "x > 0"

    def in_domain(self, x):
        return (x > 0) & np.isfinite(x)


class KL(_PositiveDomain):
    """F(x) = x log x - x on x > 0, f(x) = log x, F*(theta) = e^theta: the generalized
    I-divergence x log(x / y) - x + y (KL for distributions; Poisson clusters; jointly
    convex)."""

    name = "kl"
    jointly_convex = True

    def F(self, x):
        return _xlogx(x) - x

    def f(self, x):
        return np.log(x)

    def f_inv(self, theta):
        return np.exp(theta)

    def F_conj(self, theta):
        return np.exp(theta)

    def curvature(self, x):
        return 1.0 / np.asarray(x, dtype=np.float64)

    def _elementwise(self, x, y):
        return _xlogx_over(x, y) - x + y


class ItakuraSaito(_PositiveDomain):
    """F(x) = -log x on x > 0, f(x) = -1/x, F*(theta) = -1 - log(-theta) (theta < 0):
    x / y - log(x / y) - 1 (exponential clusters).  Not jointly convex, whatever the
    paper's Sec. 3.1 list says: at (x, y) = (2, 1) its Hessian has determinant -1/4."""

    name = "itakura-saito"
    jointly_convex = False

    def F(self, x):
        return -np.log(x)

    def f(self, x):
        return -1.0 / np.asarray(x, dtype=np.float64)

    def f_inv(self, theta):
        return -1.0 / np.asarray(theta, dtype=np.float64)

    def F_conj(self, theta):
        return -1.0 - np.log(-np.asarray(theta, dtype=np.float64))

    def curvature(self, x):
        return 1.0 / np.square(x)

    def _elementwise(self, x, y):
        ratio = x / y
        return ratio - np.log(ratio) - 1.0


DIVERGENCES = {cls.name: cls for cls in (SquaredEuclidean, Logistic, KL, ItakuraSaito)}


def get_divergence(divergence):
    """A :class:`BregmanDivergence` from its name ("euclidean", "logistic", "kl",
    "itakura-saito") or itself."""
    if isinstance(divergence, BregmanDivergence):
        return divergence
    if divergence not in DIVERGENCES:
        raise InputValueError(f"divergence must be one of {sorted(DIVERGENCES)} or a BregmanDivergence; "
                              f"got {divergence!r}")
    return DIVERGENCES[divergence]()


def _xlogx(x):
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _xlogx_over(x, y):
    """x log(x / y), 0 at x = 0."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    safe = np.where(x > 0, x, 1.0)
    return np.where(x > 0, x * (np.log(safe) - np.log(y)), 0.0)
