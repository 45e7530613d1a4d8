"""Negative curvature of the K-means problem on V x Orth(r), with every n-row vector kept
in the row chunks beside X: the Riemannian Hessian's smallest eigenpair by Lanczos on its
shift-inverse (each product a Newton solve, two passes) and the step along it that
lowers the cost.  This process holds the Lanczos basis's r x r parts and scalars only."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..blocks.rows import ordered_sum, random_rows, stream_key
from ..errors import warn_convergence
from ..linalg.eigen import lanczos_extreme
from .riemannian import Step, u_rows

# Lanczos basis size: the basis and its products (2 ncv vectors of n x (r - 1)) stay in
# the row chunks during the eigensolve.
LANCZOS_NCV = 20
# Restarts of the eigensolve before it gives up (with a ConvergenceWarning).
LANCZOS_MAX_RESTARTS = 100


@dataclass
class TangentVector:
    """A tangent vector (dV, dQ): dV in the row chunks' state ``name``, dQ (r x r) here."""

    name: str
    dQ: np.ndarray


class TangentRows:
    """The tangent space at an iterate as :func:`dnomad.linalg.eigen.lanczos_extreme`'s
    vectors: inner products and linear combinations are passes over the row chunks'
    states (not over X), and ``apply`` is (H + shift I)^-1 by a Newton solve."""

    _names = itertools.count()

    def __init__(self, problem, it, shift):
        M = problem.manifold
        self.problem, self.it, self.shift = problem, it, float(shift)
        self.data = problem.data
        # n (r - 1) entries less the r - 1 column sums and <V, dV>; skew dQ Q^T
        self.dim = M.n * (M.r - 1) - M.r + M.r * (M.r - 1) // 2
        self.live = set()           # the states made and not released

    def _new(self):
        name = f"tangent{next(self._names)}"
        self.live.add(name)
        return name

    def release_all(self, but=None):
        """Drop every state made here and not released (but ``but``'s)."""
        for name in self.live - {getattr(but, "name", None)}:
            self.data.drop(name)
        self.live &= {getattr(but, "name", None)}

    def dots(self, vectors, w):
        parts = self.data.map(_dots_kernel, [v.name for v in vectors], w.name, read_x=False)
        return ordered_sum(parts) + np.array([float(np.vdot(v.dQ, w.dQ)) for v in vectors])

    def combine(self, coeffs, vectors, base=None):
        coeffs = [float(c) for c in coeffs]
        name = self._new()
        parts = self.data.map(_combine_kernel, name, coeffs, [v.name for v in vectors],
                              None if base is None else base.name, read_x=False)
        dQ = sum((c * v.dQ for c, v in zip(coeffs, vectors)), np.zeros_like(vectors[0].dQ))
        if base is not None:
            dQ = dQ + base.dQ
        return TangentVector(name, dQ), float(ordered_sum(parts)) + float(np.sum(dQ * dQ))

    def rotate(self, vectors, S):
        """The vectors sum_j S_jk v_j, made chunk by chunk in place of the vs."""
        names = [self._new() for _ in range(S.shape[1])]
        self.data.map(_rotate_kernel, [v.name for v in vectors], S, names, read_x=False)
        dQ = np.tensordot(S, np.stack([v.dQ for v in vectors]), axes=(0, 0))
        return [TangentVector(name, q) for name, q in zip(names, dQ)]

    def release(self, v):
        self.data.drop(v.name)
        self.live.discard(v.name)

    def apply(self, v):
        """(H + shift I)^-1 v on the tangent space."""
        sol = self.problem.solve(self.it, self.shift, rhs=(v.name, v.dQ))
        name = self._new()
        self.problem.back_substitute(self.it, sol, out=name)
        return TangentVector(name, sol.dQ)

    def random(self, seed=0):
        """A random tangent vector: Gaussian rows drawn by the chunks (the same whatever the
        chunking) and a Gaussian dQ, projected onto the tangent space."""
        M, it = self.problem.manifold, self.it
        rng = np.random.default_rng(seed)
        name, key = self._new(), stream_key(rng)
        parts = self.data.map(_draw_kernel, name, key, it.name, with_span=True, read_x=False)
        mean = ordered_sum(p[0] for p in parts) / M.n
        along = (float(ordered_sum(p[1] for p in parts)) - float(mean @ it.vsum)) / M.radius2
        self.data.map(_project_kernel, name, it.name, mean, along, read_x=False)
        A = rng.standard_normal(it.Q.shape) @ it.Q.T
        return TangentVector(name, 0.5 * (A - A.T) @ it.Q)


def smallest_eigenpair(problem, it, *, tol=1e-8, shift=None):
    """The smallest eigenvalue of the Riemannian Hessian at the iterate ``it`` and its unit
    eigenvector (a :class:`TangentVector`; the caller releases it), by Lanczos on (H + s
    I)^-1 over the tangent space.  s is raised until H + s I is positive definite on the
    tangent space (its inertia, from the Newton solve), so the largest eigenvalue 1 /
    (lam_min + s) of the inverse is the one sought; the spectrum of H spans orders of
    magnitude (mu / u_ij^2 near the boundary), which Lanczos on H itself does not
    resolve."""
    s = shift if shift is not None else 1e-3
    for _ in range(60):
        if problem.solve(it, s).negative == 0:
            break
        s *= 4.0
    else:
        raise RuntimeError("no positive definite shift of the Hessian found")
    space = TangentRows(problem, it, s)
    e = None
    try:
        theta, x, converged = lanczos_extreme(space.apply, space.random(), which="LA", tol=tol,
                                              ncv=min(LANCZOS_NCV, space.dim - 1),
                                              maxiter=LANCZOS_MAX_RESTARTS, vectors=space)
        e, _ = space.combine([1.0 / math.sqrt(space.dots([x], x)[0])], [x])
    finally:
        space.release_all(but=e)           # the start and the basis, or all on an error
    if not converged:
        warn_convergence(f"the Hessian's smallest eigenvalue: Lanczos stopped after {LANCZOS_MAX_RESTARTS} "
                         f"restarts before its tolerance {tol:g}")
    return 1.0 / float(theta) - s, e


def negative_curvature_step(problem, it, boundary_fraction, min_t=1e-12):
    """From a first-order point with an eigenvalue of the Hessian below the threshold: the
    retracted step t e along the unit eigenvector e (either sign, the larger t first,
    halving) that lowers the cost; None when none does."""
    _, e = smallest_eigenpair(problem, it)
    M = problem.manifold
    try:
        for sign in (1.0, -1.0):
            dQ = sign * e.dQ
            parts = problem.data.map(_direction_kernel, it.name, e.name, sign, it.Q, dQ, M.n, read_x=False)
            dv_sum, vdv, dvdv = (ordered_sum(p[k] for p in parts) for k in range(3))
            t_max = min(p[3] for p in parts)
            step = Step(dQ, dv_sum, float(vdv), float(dvdv), 0.0, 1.0, t_max)
            t = min(1.0, (boundary_fraction or 1.0) * t_max)
            while t > min_t:
                trial = problem.retract(it, step, t)
                if trial.cost < it.cost:
                    return trial
                problem.release(trial)
                t /= 2
        return None
    finally:
        problem.data.drop(e.name)


# -- per-chunk kernels (module level: they run on workers) ---------------------
def _dots_kernel(chunk, names, name):
    w = chunk[name]
    return np.array([float(np.vdot(chunk[v], w)) for v in names])


def _combine_kernel(chunk, out, coeffs, names, base):
    """State ``out`` = base + sum_j coeffs[j] names[j]; its squared norm."""
    total = np.array(chunk[base]) if base is not None else np.zeros_like(chunk[names[0]])
    for c, v in zip(coeffs, names):
        total += c * chunk[v]
    chunk[out] = total
    return float(np.vdot(total, total))


def _rotate_kernel(chunk, names, S, outs):
    """States ``outs`` = the combinations S[:, k] of states ``names``, which are dropped
    (accumulated term by term: no stacked copy of the inputs)."""
    made = [np.zeros_like(chunk[names[0]]) for _ in outs]
    for j, v in enumerate(names):
        for k, out in enumerate(made):
            out += S[j, k] * chunk[v]
        del chunk[v]
    chunk.update(zip(outs, made))


def _draw_kernel(chunk, span, name, key, vname):
    """Gaussian rows into state ``name``; their column sums and inner product with V."""
    V = chunk[vname]
    Z = random_rows(key, span[0], span[1], V.shape[1])
    chunk[name] = Z
    return Z.sum(axis=0), float(np.vdot(Z, V))


def _project_kernel(chunk, name, vname, mean, along):
    """The tangent projection of the rows: centred (``mean``), less ``along`` V."""
    chunk[name] = chunk[name] - mean[None] - along * chunk[vname]


def _direction_kernel(chunk, name, ename, sign, Q, dQ, n):
    """State "dV" = sign e; its column sums, <V, dV>, ||dV||^2, and the largest t with
    U + t dU > 0 on the chunk's rows (inf when no entry of dU is negative)."""
    V = chunk[name]
    dV = sign * chunk[ename]
    chunk["dV"] = dV
    U = u_rows(V, Q, n)
    dU = dQ[0][None, :] / math.sqrt(n) + dV @ Q[1:] + V @ dQ[1:]
    falling = dU < 0
    t_max = float(np.min(-U[falling] / dU[falling])) if falling.any() else math.inf
    return dV.sum(axis=0), float(np.vdot(V, dV)), float(np.vdot(dV, dV)), t_max
