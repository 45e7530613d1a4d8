"""K-means as smooth optimization on a product manifold (Xu, Hou, Chen, Zhang, Sec. 3,
App. C, E, G), split as pymanopt does: the manifold (:class:`KMeansManifold`), the
problem (:class:`KMeansProblem`: cost, gradient, Hessian, the Newton system) and the
optimizer (:func:`riemannian_newton`, Alg. 1); :func:`riemannian_kmeans` adds random
starts and mu continuation.  Every quantity is a sum over row chunks of X and V
(:class:`dnomad.blocks.RowChunks`, in this process or on a cluster's workers).

The nonnegative low-rank K-means SDP  max <X X^T, U U^T> + mu sum log U  over
U U^T 1 = 1, Tr(U U^T) = K  is written through the submersion (Theorem 2)

    U = phi(V, Q) = [1/sqrt(n) 1, V] Q,   V in {1^T V = 0, ||V||_F^2 = K - 1} (n x (r-1)),
                                          Q in Orth(r)   (Q Q^T = I),

so that the row-sum and trace constraints hold for every (V, Q) and only U > 0 (the
log barrier) remains: the cost (13) is f(V, Q) = -||X^T V||_F^2 - mu sum_ij log U_ij
with X centred.  Symbols -> code: C = -X X^T is never formed (C V = -X (X^T V)).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..blocks import HeldRows, RowState
from ..blocks.rows import ordered_sum, random_rows, stream_key
from ..errors import InputValueError, warn_convergence
from ..linalg.indefinite import solve_with_inertia
from ..rounding import factor_labels, kmeans_partition
from . import lloyd, starts

INITS = ("kmeans", "random")


class KMeansManifold:
    """V x Orth(r) with the Euclidean metric of R^{n x (r-1)} x R^{r x r}.

    Points and tangent vectors are pairs (V, Q).  The tangent space at (V, Q) is
    {1^T dV = 0, <V, dV> = 0} x {dQ Q^T skew}; the retraction is the metric projection
    (second order: App. C / Boumal Sec. 5.12), O(n r + r^3).
    """

    def __init__(self, n, r, K):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (n, r, K)):
            raise InputValueError(f"n, r and K must be integers; got n={n!r}, r={r!r}, K={K!r}")
        if K < 2:
            raise InputValueError(f"n_clusters (K) must be >= 2; got {K}")
        if r <= K:
            raise InputValueError(f"rank r must exceed K = {K} (no strictly positive U exists for r = K, "
                                  f"Lemma 3); got r = {r}")
        if n < r:
            raise InputValueError(f"need at least r = {r} points; got n = {n}")
        self.n, self.r, self.K = int(n), int(r), int(K)
        self.radius2 = float(K - 1)                 # ||V||_F^2

    # -- the submersion ----------------------------------------------------
    def phi(self, point):
        """U = [1/sqrt(n) 1, V] Q (n x r)."""
        V, Q = point
        return np.outer(np.full(self.n, 1.0 / math.sqrt(self.n)), Q[0]) + V @ Q[1:]

    def phi_differential(self, point, tangent):
        """dU for a tangent (dV, dQ)."""
        V, Q = point
        dV, dQ = tangent
        return np.outer(np.full(self.n, 1.0 / math.sqrt(self.n)), dQ[0]) + dV @ Q[1:] + V @ dQ[1:]

    def point_from_u(self, U):
        """(V, Q) with phi(V, Q) = U for U on M_r (App. C.4: U = P S W^T, V the columns
        2..r of P S and Q = W^T, signs fixed so that the first column is +1/sqrt(n))."""
        U = np.asarray(U, dtype=np.float64)
        P, s, Wt = np.linalg.svd(U, full_matrices=False)
        sign = 1.0 if P[0, 0] >= 0 else -1.0
        PS = P * s
        return sign * PS[:, 1:], sign * Wt

    def point_from_u_reflected(self, U):
        """(V, Q) with phi(V, Q) = U for U on M_r whose singular values may coincide (a
        partition's are all 1, and App. C.4's SVD then need not put 1/sqrt(n) first):
        Q is the Householder reflection taking e_1 to q = U^T 1 / sqrt(n) (a unit vector,
        as U q = U U^T 1 / sqrt(n) = 1 / sqrt(n)), so U Q^T has first column 1 / sqrt(n)
        and V is the rest (centred: 1^T U Q^T = sqrt(n) q^T Q^T = sqrt(n) e_1^T)."""
        U = np.asarray(U, dtype=np.float64)
        Q = self.reflection(U.sum(axis=0))
        return (U @ Q.T)[:, 1:], Q

    def reflection(self, column_sums):
        """Q of :meth:`point_from_u_reflected` from U's column sums (U^T 1)."""
        q = np.asarray(column_sums, dtype=np.float64) / math.sqrt(self.n)
        q /= np.linalg.norm(q)
        # v = q + sign(q_0) e_1 (no cancellation); H = I - 2 v v^T / v^T v maps q to
        # -sign(q_0) e_1, so Q = -sign(q_0) H has first row q.
        sign = 1.0 if q[0] >= 0 else -1.0
        v = q.copy()
        v[0] += sign
        return -sign * (np.eye(self.r) - (2.0 / float(v @ v)) * np.outer(v, v))

    def interior_rows(self):
        """The r x r matrix B whose rows repeat down Lemma 5's strictly positive U on M_r:
        U[i] = B[i mod r].

        n divisible by r: U is q = n / r stacked copies of U0 / sqrt(q), U0 =
        (x - y) I + y 1 1^T with x + (r - 1) y = 1 and x^2 + (r - 1) y^2 = K / r, so
        x = (1 + sqrt((r-1)(K-1))) / r and y = (1 - sqrt((K-1)/(r-1))) / r (the paper
        prints y without the division by sqrt(r - 1), which breaks both equations).

        Otherwise (n = q r + p): the first n rows of q + 1 stacked copies of the block
        matrix B of Lemma 5, case 2, its x, y, z, w from (29), (31) and (33) (the
        paper's [I_n 0](1_q (x) B) has q r < n rows: q + 1 copies are meant, as its
        column sums in (28) count).
        """
        n, r, K = self.n, self.r, self.K
        q, p = divmod(n, r)
        if p == 0:
            x = (1 + math.sqrt((r - 1) * (K - 1))) / r
            y = (1 - math.sqrt((K - 1) / (r - 1))) / r
            B = ((x - y) * np.eye(r) + y) / math.sqrt(q)
        else:
            B = _lemma5_case2(n, r, K, q, p)
        if not (np.isfinite(B).all() and B.min() > 0):          # every row of B is used: q >= 1
            raise InputValueError(f"Lemma 5's interior point does not exist for n = {n}, r = {r}, K = {K} "
                                  f"(it needs n large enough against r); use more points or a smaller r")
        return B

    def interior_point(self):
        """Lemma 5's interior point (:meth:`interior_rows`) as arrays (V, Q), by App. C.4's SVD."""
        return self.point_from_u(self.interior_rows()[np.arange(self.n) % self.r])

    def interior_factor(self):
        """Lemma 5's interior point as (W, Q) with V[i] = W[i mod r] (W: r x (r - 1)): Q
        is :meth:`reflection` of U^T 1 = B^T c, c_j the rows i < n with i mod r = j, so
        V is centred and nothing of n rows is made."""
        B = self.interior_rows()
        q, p = divmod(self.n, self.r)
        Q = self.reflection(B.T @ (q + (np.arange(self.r) < p)))
        return (B @ Q.T)[:, 1:], Q

    # -- geometry --------------------------------------------------------------
    def proj(self, point, Z):
        """The orthogonal projection of an ambient pair Z onto the tangent space."""
        V, Q = point
        ZV, ZQ = Z
        PV = ZV - ZV.mean(axis=0)
        PV = PV - (np.vdot(PV, V) / self.radius2) * V
        return PV, _skew(ZQ @ Q.T) @ Q

    def retract(self, point, tangent):
        """Projection of (V + dV, Q + dQ) onto the manifold: centred and scaled V, the
        polar factor of Q (App. C, below (13))."""
        V, Q = point
        dV, dQ = tangent
        W = V + dV
        W = W - W.mean(axis=0)
        W *= math.sqrt(self.radius2) / np.linalg.norm(W)
        return W, _polar(Q + dQ)

    @staticmethod
    def inner(point, a, b):
        return float(np.vdot(a[0], b[0]) + np.vdot(a[1], b[1]))

    def norm(self, point, a):
        return math.sqrt(self.inner(point, a, a))

    def feasibility(self, point):
        """(max |1^T V|, | ||V||^2 - (K - 1) |, max |Q Q^T - I|, min U)."""
        V, Q = point
        return (float(np.abs(V.sum(axis=0)).max()), abs(float(np.vdot(V, V)) - self.radius2),
                float(np.abs(Q @ Q.T - np.eye(self.r)).max()), float(self.phi(point).min()))

    def random_tangent(self, point, rng, scale=1.0):
        V, Q = point
        Z = (rng.standard_normal(V.shape), rng.standard_normal(Q.shape))
        T = self.proj(point, Z)
        s = scale / self.norm(point, T)
        return T[0] * s, T[1] * s


def _lemma5_case2(n, r, K, q, p):
    """Lemma 5, case 2's r x r block (NaN where its w^2 is not positive)."""
    a1 = n * r - q * r + p - p * (2 * q + 1) / n
    a2 = 2 * p * (1 + 2 * q - n) / n
    a3 = n - p * (2 * q + 1) / n
    b1 = (r + p / n - 1) * (n - q)
    b2 = (1 - p / n) * (n - q) + q * (r + p / n - 1)
    b3 = q * (1 - p / n)
    c1, c2 = -K, -1.0
    det = a1 * b2 - a2 * b1
    a, b = (a3 * b1 - a1 * b3) / det, (c1 * b1 - a1 * c2) / det
    quad, lin = a * a * b1 + a * b2 + b3, 2 * a * b * b1 + b * b2 + c2
    disc = lin * lin - 4 * quad * b * b * b1
    w2 = (-lin + math.sqrt(disc)) / (2 * quad) if disc >= 0 and quad != 0 else -1.0
    if not w2 > 0:
        return np.full((r, r), np.nan)
    w = math.sqrt(w2)
    z = a * w + b / w
    x, y = (1 - 1 / n) * w + z / n, (1 + 1 / n) * z - w / n
    B = np.empty((r, r))
    B[:p, :p] = (x - y) * np.eye(p) + y
    B[:p, p:] = z
    B[p:, :p] = y
    B[p:, p:] = (w - z) * np.eye(r - p) + z
    return B


def _skew(A):
    return 0.5 * (A - A.T)


def _polar(A):
    """The orthogonal polar factor of A (the nearest orthogonal matrix)."""
    U, _, Vt = np.linalg.svd(A)
    return U @ Vt


def _sym(A):
    return 0.5 * (A + A.T)


class KMeansProblem:
    """The cost (13) on :class:`KMeansManifold`: its value, Euclidean and Riemannian
    gradient and Hessian-vector product (App. C.3), and the Newton system of App. E.

    X (n x d: a NumPy array, a Zarr array or path, or a :class:`dnomad.blocks.RowChunks`)
    is read by row chunks and centred as it is read; C V = -X (X^T V) costs O(n d r) and
    nothing n x n is formed.  ``mu`` > 0 weighs the log barrier.

    Two views of the same math: the methods on points (V, Q) given as arrays (``cost``,
    ``egrad``, ``ehess``, ``grad``, ``hess``: small n, the reference the tests check)
    and the methods on :class:`Iterate` (V kept in the row chunks, every quantity a sum
    over rows: what the optimizer runs; the client holds only small matrices).

    A Newton step is three passes: the Schur sums (:meth:`solve`), the back-substitution
    (:meth:`back_substitute`), the retraction with the new point's sums
    (:meth:`retract`).  The last two cannot be one pass, as App. E has them, because the
    step length that keeps U > 0 is a minimum over all rows of the back-substituted step.
    """

    def __init__(self, manifold, X, mu, *, chunk_rows=None, client=None, sketch=None):
        from ..blocks import RowChunks

        if not (isinstance(mu, (int, float, np.floating)) and not isinstance(mu, bool) and mu > 0
                and math.isfinite(mu)):
            raise InputValueError(f"mu must be a finite number > 0; got {mu!r}")
        data = X if isinstance(X, RowChunks) else RowChunks(X, chunk_rows=chunk_rows, client=client)
        if data.n != manifold.n:
            raise InputValueError(f"X must have n = {manifold.n} rows; got {data.n}")
        self.manifold = manifold
        self.data = data
        self.sketch = sketch
        self.d = data.d if sketch is None else sketch.components.shape[1]
        self.mu = float(mu)
        self.layout = _SmallLayout(manifold.r, self.d)
        self._X = None

    @property
    def X(self):
        """The centred X (or its sketch) as one array (one pass; for the reference
        methods, small n)."""
        if self._X is None:
            self._X = np.concatenate(self._map(_centred_rows), axis=0)
        return self._X

    def _map(self, kernel, *args):
        """One pass of ``kernel`` over the rows the problem reads: X, or its sketch."""
        return self.data.map(kernel, *args, x_state=None if self.sketch is None else self.sketch.name)

    @property
    def passes(self):
        """Passes over the rows the problem reads (X or its sketch) so far."""
        return self.data.passes + self.data.state_passes

    # -- the reference methods on (V, Q) arrays ----------------------------------
    def _CV(self, V):
        return -(self.X @ (self.X.T @ V))

    def cost(self, point):
        V, _ = point
        U = self.manifold.phi(point)
        if U.min() <= 0:
            return math.inf
        return -float(np.sum((self.X.T @ V) ** 2)) - self.mu * float(np.log(U).sum())

    def egrad(self, point):
        """(G_V, G_Q): the Euclidean gradient of f = f1 + mu f2 at (V, Q)."""
        V, Q = point
        Uinv = 1.0 / self.manifold.phi(point)
        GV = 2.0 * self._CV(V) - self.mu * Uinv @ Q[1:].T
        GQ = -self.mu * np.vstack([Uinv.sum(axis=0)[None] / math.sqrt(self.manifold.n), V.T @ Uinv])
        return GV, GQ

    def ehess(self, point, tangent):
        """The Euclidean Hessian of f applied to (dV, dQ)."""
        V, Q = point
        dV, dQ = tangent
        U = self.manifold.phi(point)
        Uinv = 1.0 / U
        dUinv2 = self.manifold.phi_differential(point, tangent) * Uinv * Uinv   # -d(U^-1)
        HV = 2.0 * self._CV(dV) + self.mu * (dUinv2 @ Q[1:].T - Uinv @ dQ[1:].T)
        rn = math.sqrt(self.manifold.n)
        HQ = self.mu * (np.vstack([dUinv2.sum(axis=0)[None] / rn, V.T @ dUinv2])
                        - np.vstack([np.zeros((1, self.manifold.r)), dV.T @ Uinv]))
        return HV, HQ

    def grad(self, point):
        """The Riemannian gradient (App. C.3, with the multipliers (26))."""
        return self.manifold.proj(point, self.egrad(point))

    def hess(self, point, tangent):
        """The Riemannian Hessian applied to a tangent vector (App. C.3): the projected
        Hessian of the Lagrangian (:meth:`lagrangian_hess`)."""
        return self.manifold.proj(point, self.lagrangian_hess(point, tangent))

    def lagrangian_hess(self, point, tangent):
        """The Hessian of the Lagrangian at the multipliers (26), on ambient pairs:
        ehess - <G_V, V>/(K - 1) dV and - sym(G_Q Q^T) dQ.  On tangent vectors its
        projection is :meth:`hess`; the Newton system uses it with the constraints."""
        V, Q = point
        dV, dQ = tangent
        GV, GQ = self.egrad(point)
        HV, HQ = self.ehess(point, tangent)
        return (HV - (np.vdot(GV, V) / self.manifold.radius2) * dV, HQ - _sym(GQ @ Q.T) @ dQ)

    def newton_step(self, point, lam, rhs=None):
        """The tangent (dV, dQ) minimizing <g, p> + 1/2 <p, (H + lam I) p> over the
        tangent space (App. E; :meth:`solve`), for a point given as arrays.  With
        ``rhs`` = (bV, bQ), a tangent vector, the solution of (H + lam I) p = rhs."""
        it = self.load(point)
        sol = self.solve(it, lam, rhs=rhs)
        self.back_substitute(it, sol)
        return self.data.get("dV"), sol.dQ

    # -- the row-chunked methods --------------------------------------------------
    def load(self, point):
        """An :class:`Iterate` for (V, Q): V an array or a checkpoint's stored rows, put
        into the row chunks, or a state of the row chunks (:class:`dnomad.blocks.HeldRows`),
        which the iterate takes over."""
        V, Q = point
        if isinstance(V, HeldRows):
            if V.space is not self.data:
                raise InputValueError(f"state {V.name!r} is held by other row chunks than this problem's")
            name = V.name
        else:
            name = self._new_name()
            self.data.put(name, V, dtype=np.float64)
        return self._evaluate(name, np.asarray(Q, dtype=np.float64), self._map(
            _point_kernel, name, np.asarray(Q, dtype=np.float64), self.manifold.n, self.mu))

    def point(self, it):
        """(V, Q) of an iterate as arrays (V gathered from the row chunks)."""
        return self.data.get(it.name), it.Q

    def held(self, it):
        """An iterate's V where the row chunks hold it, for a checkpoint to write from there."""
        return self.data.held(it.name)

    def u(self, it):
        """U = phi(V, Q) of an iterate (n x r, gathered)."""
        return self.manifold.phi(self.point(it))

    # Names of iterates' states, unique across the problems (stages) that share row chunks.
    _names = itertools.count()

    def _new_name(self):
        return f"V{next(self._names)}"

    def _evaluate(self, name, Q, parts):
        """An Iterate from the point kernel's per-chunk sums (cost inf when U <= 0)."""
        M = self.manifold
        min_u = min(p[0] for p in parts)
        if not min_u > 0:
            return Iterate(name, Q, math.inf, min_u)
        xtv, logsum, wsum, vtw, bsum, bv, xsum, vsum, vv = (ordered_sum(p[k] for p in parts)
                                                            for k in range(1, 10))
        it = Iterate(name, Q, -float(np.sum(xtv ** 2)) - self.mu * logsum, min_u)
        it.XtV = xtv
        it.GQ = -self.mu * np.vstack([wsum[None] / math.sqrt(M.n), vtw])
        # G_V = -2 X (X^T V) + B_V with B_V = -mu U^-1 Q1^T (rows); its column sums and
        # <G_V, V> follow from sums over rows, so G_V itself is never formed.
        gv_sum = -2.0 * xsum @ xtv + bsum
        it.GVV = -2.0 * float(np.sum(xtv ** 2)) + bv
        it.m = gv_sum / M.n
        it.c = (it.GVV - float(it.m @ vsum)) / M.radius2
        it.gQ = _skew(it.GQ @ Q.T) @ Q
        it.vsum, it.vv = vsum, vv
        return it

    def solve(self, it, lam, rhs=None):
        """One pass over the rows: the Schur complement of App. E at shift ``lam`` and its
        right-hand side (-grad, or the tangent ``rhs`` = (dV, dQ), dV an array or the name of
        a state of the row chunks), solved on the client.

        The V-V block of the Lagrangian Hessian is D - B B^T: D block diagonal (one
        (r-1) x (r-1) block per row of V: mu Q1 diag(u_i^-2) Q1^T + (lam - <G_V, V>/(K-1)) I)
        and B = sqrt(2) X (x) I.  With z = -B^T dV as an extra unknown the rows of dV
        couple only to the small unknowns s = (dQ, z, the multipliers of 1^T dV = 0,
        <V, dV> = 0 and sym(dQ Q^T) = 0); S = L22 - sum_i L_i^T D_i^-1 L_i (size r^2 +
        d(r-1) + r + r(r+1)/2) and its right-hand side are sums over rows, formed from the
        Kronecker structure of B and a closed-form D_i^-1 by GEMMs over blocks of rows
        (:class:`_Rows`): O(n (r^4 + d r^3 + d^2 r^2)) work (:func:`schur_pass_flops`), where
        the dense L_i^T D_i^-1 L_i cost O(n r^3 (r + d)^2).  The d^2 r^2 term is the z-z block's:
        (d (r-1))^2 entries, each a sum over the rows; App. E's count O(n r^3 (d + r))
        leaves it out (it is within that count while d <= r).  Also returns ||grad|| and
        the number of eigenvalues of the Riemannian Hessian below -lam (Sylvester's law of
        inertia: the negative eigenvalues of D and S, less the m constraint rows, since
        [[D, L], [L^T, L22]] is congruent to the constraint system of the tangent space
        with the z rows added); S is solved and its inertia read from one Bunch-Kaufman
        factorization (:func:`dnomad.linalg.indefinite.solve_with_inertia`).
        """
        M = self.manifold
        r, d = M.r, self.d
        Q = it.Q
        shift = lam - it.GVV / M.radius2
        small = self._small(it, shift)
        rhs_name = None if rhs is None else rhs[0]
        if rhs is not None and not isinstance(rhs_name, str):
            self.data.put("rhsV", rhs[0])
            rhs_name = "rhsV"
        parts = self._map(_schur_kernel, it.name, small, self.layout, rhs_name)
        S, b, HQQ, gg, neg_d = (ordered_sum(p[k] for p in parts) for k in range(5))
        lay = self.layout
        HQQ = HQQ.reshape(r * r, r * r) - np.kron(_sym(it.GQ @ Q.T), np.eye(r)) + lam * np.eye(r * r)
        S[lay.q, lay.q] += HQQ
        S[lay.z, lay.z] += np.eye(d * (r - 1))
        Jq = _orth_constraint_rows(Q)
        S[lay.sq, lay.q] += Jq
        S[lay.q, lay.sq] += Jq.T
        b[lay.q] += (-it.gQ if rhs is None else rhs[1]).ravel()
        s, negative_s = solve_with_inertia(_sym(S), b)
        n_constraints = lay.size - r * r - d * (r - 1)
        negative = int(neg_d) + negative_s - n_constraints
        grad_norm = math.sqrt(max(float(gg), 0.0) + float(np.sum(it.gQ ** 2)))
        return NewtonSolve(lam, shift, small, s, s[lay.q].reshape(r, r), grad_norm, negative, rhs_name)

    def _small(self, it, shift):
        """What every chunk needs of the small quantities (sent with each pass)."""
        return {"Q": it.Q, "n": self.manifold.n, "mu": self.mu, "XtV": it.XtV, "m": it.m, "c": it.c,
                "shift": shift}

    def back_substitute(self, it, sol, out="dV"):
        """The second pass: dV_i = D_i^-1 (b_i - L_i s) into the row chunks (state ``out``);
        returns what the retraction and the model decrease need (:class:`Step`)."""
        parts = self._map(_back_substitute_kernel, it.name, sol.small, self.layout, sol.s, sol.dQ,
                          sol.rhs_name, out)
        dv_sum, vdv, dvdv, bdv = (ordered_sum(p[k] for p in parts) for k in range(4))
        t_max = min(p[4] for p in parts)
        gp = -float(bdv) + float(np.vdot(it.gQ, sol.dQ))          # <grad, p>
        return Step(sol.dQ, dv_sum, float(vdv), float(dvdv), gp, float(dvdv + np.sum(sol.dQ ** 2)), t_max)

    def retract(self, it, step, t):
        """The iterate at R(x, t p) (centred and scaled V, polar factor of Q), evaluated
        in the same pass that writes its V."""
        M = self.manifold
        mean = (it.vsum + t * step.dv_sum) / M.n
        norm2 = it.vv + 2 * t * step.vdv + t * t * step.dvdv - M.n * float(mean @ mean)
        scale = math.sqrt(M.radius2 / norm2)
        Q = _polar(it.Q + t * step.dQ)
        name = self._new_name()
        parts = self._map(_retract_kernel, it.name, name, t, mean, scale, Q, M.n, self.mu)
        return self._evaluate(name, Q, parts)

    def release(self, it):
        """Drop an iterate's V from the row chunks."""
        self.data.drop(it.name)

    def min_eigenvalue(self, it, *, tol=1e-8, shift=None):
        """The smallest eigenvalue of the Riemannian Hessian at ``it``
        (:func:`dnomad.kmeans_sdp.curvature.smallest_eigenpair`, its eigenvector kept in
        the row chunks only while it is found)."""
        from .curvature import smallest_eigenpair

        value, vector = smallest_eigenpair(self, it, tol=tol, shift=shift)
        self.data.drop(vector.name)
        return value

    def negative_curvature_step(self, it, boundary_fraction):
        """The retracted step along the Hessian's most negative direction that lowers the
        cost (:func:`dnomad.kmeans_sdp.curvature.negative_curvature_step`), or None."""
        from .curvature import negative_curvature_step

        return negative_curvature_step(self, it, boundary_fraction)


class Iterate:
    """A point of the optimizer: V in the row chunks (state ``name``), Q (r x r), the cost
    and the sums over rows the gradient and the Newton system need."""

    def __init__(self, name, Q, cost, min_u):
        self.name, self.Q, self.cost, self.min_u = name, Q, cost, min_u


class NewtonSolve:
    """The small part of a Newton system's solution (s = (dQ, z, multipliers)), the
    gradient norm at the iterate and the count of Hessian eigenvalues below -lam."""

    def __init__(self, lam, shift, small, s, dQ, grad_norm, negative, rhs_name):
        self.lam, self.shift, self.small, self.s, self.dQ = lam, shift, small, s, dQ
        self.grad_norm, self.negative, self.rhs_name = grad_norm, negative, rhs_name


class Step:
    """A tangent step p = (dV in the row chunks, dQ) and its sums: column sums of dV,
    <V, dV>, ||dV||^2, <grad, p>, ||p||^2, and the largest t with U + t dU > 0 (first
    order; inf when no entry of dU is negative)."""

    def __init__(self, dQ, dv_sum, vdv, dvdv, gp, pp, t_max):
        self.dQ, self.dv_sum, self.vdv, self.dvdv = dQ, dv_sum, vdv, dvdv
        self.gp, self.pp, self.t_max = gp, pp, t_max


# -- per-chunk kernels (module level: they run on workers) ---------------------
# Entries of the largest per-row temporary in a block of rows (the packed left factors
# of the Schur sums' GEMMs, :func:`_packed_size` a row; 16 MB): the rows are the GEMMs'
# inner dimension, so larger blocks run nearer GEMM speed, up to the caches.
_BLOCK_ENTRIES = 1 << 21


def _centred_rows(chunk):
    return chunk["X"]


def u_rows(V, Q, n):
    return Q[0][None, :] / math.sqrt(n) + V @ Q[1:]


def _point_kernel(chunk, name, Q, n, mu):
    """Sums over the chunk's rows at (V, Q): min U, X^T V, sum log U, column sums of
    U^-1, V^T U^-1, column sums of B_V = -mu U^-1 Q1^T, <B_V, V>, column sums of X and V,
    ||V||^2."""
    X, V = chunk["X"], chunk[name]
    U = u_rows(V, Q, n)
    min_u = float(U.min()) if U.size else math.inf
    if not min_u > 0:
        return (min_u,)
    W = 1.0 / U
    BV = -mu * (W @ Q[1:].T)
    return (min_u, X.T @ V, float(np.log(U).sum()), W.sum(axis=0), V.T @ W, BV.sum(axis=0),
            float(np.vdot(BV, V)), X.sum(axis=0), V.sum(axis=0), float(np.vdot(V, V)))


def schur_pass_flops(n, r, d):
    """Floating-point operations of one Schur pass (:meth:`KMeansProblem.solve`) over n
    rows of d features at rank r: its GEMMs over the rows (2 flops a multiply-add), the
    elementwise work (O(r^2 + d r + d^2) a row) left out."""
    m = r - 1
    per_row = (2 * r * m * m + 2 * r * m * r                    # Q1^T D^-1, P^T D^-1 P
               + 2 * r ** 4 + 2 * r * r * r * m                  # Vhat Vhat^T (x) T, the cross term
               + _packed_size(r, d) * m * (m + 1)                # every product with D^-1 (pairs once)
               + 2 * (d + 1) * r * r * m                         # [x; 1] Vhat^T with D^-1 P
               + 2 * m * m * r * r + 2 * r ** 3)                 # D^-1 = Q1 C Q1^T, the Q-Q Hessian
    return n * per_row


def _packed_size(r, d):
    """Rows of :func:`_packed_factors` (a row of X's entries in the largest temporary)."""
    return r * (r + 1) // 2 + (d + 1) * r + d * (d + 1) // 2 + d + 1


def _row_blocks(c, d, r):
    step = max(64, _BLOCK_ENTRIES // _packed_size(r, d))
    return [slice(a, min(c, a + step)) for a in range(0, c, step)]


class _Rows:
    """A block of rows' share of the Newton system (see :meth:`KMeansProblem.solve`).

    Row i's dV_i (r - 1 unknowns) couples to the small unknowns through
    L_i = [L_i^Q, sqrt(2) x_i^T (x) I, I, V_i] (columns dQ, z, the multipliers of
    1^T dV = 0 and of <V, dV> = 0), with
    L_i^Q[a, (l, j)] = mu Q1[a, j] u_ij^-2 Vhat_il - mu [l = a + 1] u_ij^-1,
    and its diagonal block is D_i = Q1 diag(Lambda_i) Q1^T, Lambda_i = mu u_i^-2 + shift.
    Nothing of size (r - 1) x (r^2 + d (r - 1)) is formed per row: each block of
    sum_i L_i^T D_i^-1 L_i is a GEMM over the rows of the factors the Kronecker structure
    leaves (x_i, Vhat_i, u_i^-1, u_i^-2, D_i^-1), O(r^3 (r + d) + d^2 r^2) a row against
    the dense (r - 1) (r^2 + d (r - 1))^2.  Per-row quantities are kept rows-last
    (``Et`` is D_i^-1 as an (r-1) x (r-1) x rows array): numpy's elementwise loops then
    run along the rows, not along axes of length r."""

    def __init__(self, X, V, small, rhs):
        Q, n, mu = small["Q"], small["n"], small["mu"]
        self.X, self.V, self.Q, self.Q1, self.mu = X, V, Q, Q[1:], mu
        c = V.shape[0]
        self.Vhat = np.hstack([np.full((c, 1), 1.0 / math.sqrt(n)), V])
        self.uinv = 1.0 / u_rows(V, Q, n)
        self.u2 = self.uinv * self.uinv
        self.Et, self.negative = _inverse_blocks((mu * self.u2 + small["shift"]).T, Q)
        # grad_V rows: G_V - 1 m^T - c V with G_V = -2 X (X^T V) - mu U^-1 Q1^T.
        self.g = (-2.0 * (X @ small["XtV"]) - mu * (self.uinv @ self.Q1.T) - small["m"][None]
                  - small["c"] * V)
        self.b = -self.g if rhs is None else rhs

    def e_times(self, W):
        """D_i^-1 w_i for the rows w_i of W, rows-last ((r - 1) x rows)."""
        return np.einsum("abi,ib->ai", self.Et, W)

    def coupling_times(self, s, layout):
        """The rows L_i s for the small unknowns s."""
        r, d = self.Q.shape[0], self.X.shape[1]
        Sq = s[layout.q].reshape(r, r)
        Lq = self.mu * (((self.Vhat @ Sq) * self.u2) @ self.Q1.T - self.uinv @ Sq[1:].T)
        Z = s[layout.z].reshape(d, r - 1)
        return Lq + math.sqrt(2.0) * (self.X @ Z) + s[layout.ones][None] + s[layout.sphere][0] * self.V

    def add_schur_terms(self, S, rhs, layout, HQQ, packed):
        """S[:coupled, :coupled] += sum_i L_i^T D_i^-1 L_i, rhs[:coupled] += sum_i L_i^T
        D_i^-1 b_i (the caller subtracts both), and the rows' share of the Q-Q block of
        the Hessian, HQQ[l, l', j] (diagonal in j).

        Each block is sum_i f_i g_i^T for per-row vectors f_i, g_i built from
        x_i, Vhat_i, u_i^-1, u_i^-2 and D_i^-1 (L^Q_i = mu (Vhat_i^T (x) P_i - Sh (x)
        u_i^-T) with P_i = Q1 diag(u_i^-2) and Sh = [0 I]): one GEMM over the rows each,
        with both sides of length O(r^2 + d r + d^2), so they run at GEMM speed.  The
        products with D_i^-1 itself are summed into ``packed`` (:func:`_packed_factors`),
        which the caller scatters into S once for all its blocks."""
        X, V, Q1, Et, mu = self.X, self.V, self.Q1, self.Et, self.mu
        c, m = V.shape
        r, d = m + 1, X.shape[1]
        rt2 = math.sqrt(2.0)
        q, z, ones, sphere = layout.q, layout.z, layout.ones, layout.sphere.start
        ui, u2, Vh = self.uinv.T, self.u2.T, self.Vhat.T                # rows-last
        XT = np.vstack([X.T, np.ones((1, c))])                          # [x_i; 1]
        # EP[j, a, i] = (P_i^T D_i^-1)[j, a] = u_ij^-2 (Q1^T D_i^-1)[j, a] (D_i^-1 symmetric).
        EP = (Q1.T @ Et.reshape(m, m * c)).reshape(r, m, c)
        EP *= u2[:, None]
        # T_i = P_i^T D_i^-1 P_i: T[j', j, i].
        T = (Q1.T @ EP.transpose(1, 0, 2).reshape(m, r * c)).reshape(r, r, c)
        T *= u2[:, None]
        EP2 = EP.reshape(r * m, c)
        VV = (Vh[:, None] * Vh[None]).reshape(r * r, c)                 # [(l, l'), i]
        # Q-Q: mu^2 (sum Vhat Vhat^T (x) T - C - C^T + sum [u^-1 u^-T] (x) D^-1 on l, l' >= 1), C the cross term.
        qq = (VV @ T.reshape(r * r, c).T).reshape(r, r, r, r).transpose(0, 3, 1, 2)    # [l, j, l', j']
        cross = ((Vh[:, None] * ui[None]).reshape(r * r, c) @ EP2.T).reshape(r, r, r, m)   # [l, j', j, b]
        qq[:, :, 1:, :] -= cross.transpose(0, 2, 3, 1)                  # [l, j, l' = b + 1, j']
        qq[1:, :, :, :] -= cross.transpose(3, 1, 0, 2)                  # [l = b + 1, j, l', j']
        S[q, q] += (mu * mu) * qq.reshape(r * r, r * r)
        # z-Q and ones-Q: mu sum_i [x_i; 1]_l ((D^-1 P)[b, j'] Vhat_il' - D^-1[b, l' - 1] u_ij'^-1);
        # the second part is in the packed sums.
        xq = ((XT[:, None] * Vh[None]).reshape((d + 1) * r, c) @ EP2.T).reshape(d + 1, r, r, m)  # [l, l', j', b]
        xq = mu * xq.transpose(0, 3, 1, 2)                              # [l, b, l', j']
        zq = rt2 * xq[:d].reshape(d * m, r * r)
        S[z, q] += zq
        S[q, z] += zq.T
        S[ones, q] += xq[d].reshape(m, r * r)
        S[q, ones] += xq[d].reshape(m, r * r).T
        # Every product with D^-1 itself (u^-1 u^-T, [x; 1] u^-T, x x^T, [x; 1]) goes
        # into the packed sums, scattered into S once a chunk (_add_packed_terms).
        packed += _packed_factors(XT, ui) @ Et[np.triu_indices(m)].T
        # The sphere column: L_i's column V_i.
        EV = self.e_times(V)                                            # [a, i]
        qs = mu * (Vh @ np.einsum("jai,ia->ji", EP, V).T)               # [l', j']
        qs[1:] -= mu * (EV @ ui.T)
        S[sphere, q] += qs.ravel()
        S[q, sphere] += qs.ravel()
        zs = rt2 * (EV @ X).T.ravel()
        S[z, sphere] += zs
        S[sphere, z] += zs
        os_ = EV.sum(axis=1)
        S[ones, sphere] += os_
        S[sphere, ones] += os_
        S[sphere, sphere] += float(np.vdot(V.T, EV))
        HQQ += mu * (VV @ u2.T).reshape(r, r, r)
        # The right-hand side's L_i^T D_i^-1 b_i.
        Eb = self.e_times(self.b).T                                     # [i, a]
        rq = mu * (self.Vhat.T @ ((Eb @ Q1) * self.u2))                 # [l, j]
        rq[1:] -= mu * (Eb.T @ self.uinv)                               # [l - 1, j]
        rhs[q] += rq.ravel()
        rhs[z] += rt2 * (X.T @ Eb).ravel()
        rhs[ones] += Eb.sum(axis=0)
        rhs[sphere] += float(np.vdot(V, Eb))


def _inverse_blocks(LamT, Q):
    """The D_i^-1 = (Q1 diag(Lambda_i) Q1^T)^-1 of a block of rows, rows-last (LamT: the
    Lambda_i as columns; returns (r - 1) x (r - 1) x rows), and the count of non-positive
    eigenvalues among the D_i.

    Where every Lambda_ij > 0, D_i is positive definite and, Q being orthogonal, the
    trailing block of Q diag(Lambda_i) Q^T, whose inverse is Q A_i Q^T with A_i =
    diag(Lambda_i)^-1; the inverse of a trailing block from the whole inverse gives
    D_i^-1 = Q1 C_i Q1^T, C_i = A_i - (A_i q0)(A_i q0)^T / s_i, s_i = sum_j A_ij q0_j^2.
    C_i's diagonal is formed as A_ij (sum over k != j of A_ik q0_k^2) / s_i, sums of
    positive terms: where one Lambda_ij is far below the others (a row near a solution:
    one large u_ij, the rest small) A_ij - A_ij^2 q0_j^2 / s_i would cancel all but
    eps Lambda_max / Lambda_min of it (measured: 2e-9 relative at a ratio of 1e8); C_i q0 = 0,
    so Q1 C_i Q1^T keeps C_i's scale.  One GEMM over the rows; accurate to round-off where
    Lambda_i spans many orders (np.linalg.inv on the formed D_i kept 8 digits of a row
    near the boundary).  The other rows (a shift below -mu u_ij^-2, as in the first
    iterations and near a solution) are inverted by elimination with partial pivoting
    (the same formula with mixed signs cancelled digits the Schur complement's inertia
    needs: a converged GMM run's smallest Hessian eigenvalue came out -1.5e-4 against
    the dense -8.3e-9) and their inertia counted by Haynsworth: 1 / s_i is the Schur
    complement of D_i in Q diag(Lambda_i) Q^T, so D_i has the negative eigenvalues of
    Lambda_i less one if s_i < 0; rows with a Lambda_ij exactly 0 by their eigenvalues."""
    Q1, q0 = Q[1:], Q[0]
    m, r = Q1.shape
    c = LamT.shape[1]
    outer = (Q1[:, None, :, None] * Q1[None, :, None, :]).reshape(m * m, r * r)   # [(a, b), (j, k)]
    outer_diag = outer[:, ::r + 1]                                      # [(a, b), j]: D_i = outer_diag Lambda_i
    definite = LamT.min(axis=0) > 0 if c else np.zeros(0, dtype=bool)
    A = 1.0 / np.where(definite[None], LamT, 1.0)
    Aq = A * q0[:, None]
    t = Aq * q0[:, None]                                                # A_ij q0_j^2 >= 0
    before = np.zeros_like(t)                                           # sums over k < j, k > j
    np.cumsum(t[:-1], axis=0, out=before[1:])
    after = np.zeros_like(t)
    np.cumsum(t[:0:-1], axis=0, out=after[-2::-1])
    s = before[-1] + t[-1]
    C = Aq[:, None] * (-Aq[None] / s)
    C[np.arange(r), np.arange(r)] = A * ((before + after) / s)
    Et = (outer @ C.reshape(r * r, c)).reshape(m, m, c)
    negative = 0
    if not definite.all():
        Lam = LamT[:, ~definite]
        Et[:, :, ~definite] = _inverse_rows_last((outer_diag @ Lam).reshape(m, m, -1))
        zero = (Lam == 0).any(axis=0)
        with np.errstate(divide="ignore"):
            sign = (q0 * q0) @ (1.0 / Lam[:, ~zero])
        negative = int(np.sum(Lam[:, ~zero] < 0)) - int(np.sum(sign < 0))
        if zero.any():
            D = (outer_diag @ Lam[:, zero]).reshape(m, m, -1).transpose(2, 0, 1)
            negative += int(np.sum(np.linalg.eigvalsh(D) <= 0))
    return Et, negative


def _inverse_rows_last(D):
    """The inverses of the m x m matrices D[:, :, i] by Gauss-Jordan elimination with
    partial pivoting, vectorized along the last axis: m steps of whole-array operations
    where np.linalg.inv on a stack calls LAPACK once per matrix."""
    m, _, c = D.shape
    A = D.copy()
    inv = np.zeros_like(A)
    inv[np.arange(m), np.arange(m)] = 1.0
    cols = np.arange(c)
    for k in range(m):
        p = k + np.argmax(np.abs(A[k:, k]), axis=0)
        for M in (A, inv):
            row = M[k].copy()
            M[k] = M[p, :, cols].T
            M[p, :, cols] = row.T
        pivot = A[k, k].copy()
        if not np.all(pivot != 0):
            raise np.linalg.LinAlgError("a row's (r-1) x (r-1) block of the Hessian is singular")
        A[k] /= pivot
        inv[k] /= pivot
        f = A[:, k].copy()
        f[k] = 0.0
        A -= f[:, None] * A[k][None]
        inv -= f[:, None] * inv[k][None]
    return inv


def _packed_factors(XT, ui):
    """The left factors of the Schur sums' products with D_i^-1, one row per product
    and the rows last: u_ij^-1 u_ij'^-1 (j <= j'), [x_i; 1]_l u_ij'^-1, x_ip x_iq (p <= q)
    and [x_i; 1]_l.  Symmetric pairs once each: with D_i^-1's (a <= b) entries on the
    right, the z-z block's d^2 (r - 1)^2 sums a row become d (d + 1) r (r - 1) / 4."""
    r, c = ui.shape
    d = XT.shape[0] - 1
    out = np.empty((_packed_size(r, d), c))
    start = 0
    for j in range(r):
        np.multiply(ui[j], ui[j:], out=out[start:start + r - j])
        start += r - j
    np.multiply(XT[:, None], ui[None], out=out[start:start + (d + 1) * r].reshape(d + 1, r, c))
    start += (d + 1) * r
    for p in range(d):
        np.multiply(XT[p], XT[p:d], out=out[start:start + d - p])
        start += d - p
    out[start:] = XT
    return out


@functools.lru_cache(maxsize=8)
def _pair_index(m):
    """The m x m symmetric table of each pair's position in np.triu_indices(m)."""
    index = np.zeros((m, m), dtype=np.intp)
    index[np.triu_indices(m)] = np.arange(m * (m + 1) // 2)
    return np.maximum(index, index.T)


def _unpack_pairs(G, m):
    """G's last axis indexed by the pairs a <= b of np.triu_indices(m), as the m x m
    symmetric last two axes."""
    return G[..., _pair_index(m)]


def _add_packed_terms(S, packed, layout, r, d, mu):
    """S += the Schur sums' products with D_i^-1, from the packed sums of
    :func:`_packed_factors`' rows against D_i^-1's (a <= b) entries (signs as in
    :meth:`_Rows.add_schur_terms`: the caller subtracts S)."""
    m = r - 1
    rt2 = math.sqrt(2.0)
    q, z, ones = layout.q, layout.z, layout.ones
    k1 = r * (r + 1) // 2
    k2 = k1 + (d + 1) * r
    k3 = k2 + d * (d + 1) // 2
    # Q-Q: mu^2 sum [u^-1 u^-T] (x) D^-1 on l, l' >= 1.
    uu = _unpack_pairs(_unpack_pairs(packed[:k1], m).transpose(1, 2, 0), r)     # [a, b, j, j']
    qq = np.zeros((r, r, r, r))
    qq[1:, :, 1:, :] = uu.transpose(0, 2, 1, 3)                                 # [a + 1, j, b + 1, j']
    S[q, q] += (mu * mu) * qq.reshape(r * r, r * r)
    # z-Q and ones-Q: - mu sum_i [x_i; 1]_l D_i^-1[b, l' - 1] u_ij'^-1.
    xe = _unpack_pairs(packed[k1:k2], m).reshape(d + 1, r, m, m)                # [l, j', b, b']
    xq = np.zeros((d + 1, m, r, r))
    xq[:, :, 1:, :] = -mu * xe.transpose(0, 2, 3, 1)                            # [l, b, b' + 1, j']
    zq = rt2 * xq[:d].reshape(d * m, r * r)
    S[z, q] += zq
    S[q, z] += zq.T
    S[ones, q] += xq[d].reshape(m, r * r)
    S[q, ones] += xq[d].reshape(m, r * r).T
    # z-z: 2 sum_i x_ip x_iq D_i^-1[a, b] at ((p, a), (q, b)), a view of S by (p, a, q, b).
    zz = S[z, z].reshape(d, m, d, m)
    start = k2
    for p in range(d):
        block = 2.0 * _unpack_pairs(packed[start:start + d - p], m)            # [q - p, a, b]
        zz[p, :, p:, :] += block.transpose(1, 0, 2)
        zz[p + 1:, :, p, :] += block[1:]                                        # D_i^-1 symmetric
        start += d - p
    # z-ones and ones-ones: sqrt(2) sum_i x_ip D_i^-1[a, b], sum_i D_i^-1.
    xo = _unpack_pairs(packed[k3:], m)
    zo = rt2 * xo[:d].reshape(d * m, m)
    S[z, ones] += zo
    S[ones, z] += zo.T
    S[ones, ones] += xo[d]


def _schur_kernel(chunk, name, small, layout, rhs_name):
    """The chunk's share of S, of its right-hand side and of the Q-Q block, of
    ||grad_V||^2, and its count of non-positive eigenvalues of the D_i (:class:`_Rows`).
    The L_i have no entries in the sym(dQ Q^T) multipliers' columns, so only the leading
    block of S is touched."""
    X, V = chunk["X"], chunk[name]
    r, d = small["Q"].shape[0], X.shape[1]
    m = r - 1
    S = np.zeros((layout.size, layout.size))
    rhs = np.zeros(layout.size)
    HQQ3 = np.zeros((r, r, r))              # [l, l', j]: HQQ[l, j, l', j'] is diagonal in j
    packed = np.zeros((_packed_size(r, d), m * (m + 1) // 2))
    gg, neg = 0.0, 0
    for rows in _row_blocks(V.shape[0], d, r):
        block = _Rows(X[rows], V[rows], small, None if rhs_name is None else chunk[rhs_name][rows])
        block.add_schur_terms(S, rhs, layout, HQQ3, packed)
        gg += float(np.sum(block.g * block.g))
        neg += block.negative
    _add_packed_terms(S, packed, layout, r, d, small["mu"])
    HQQ = HQQ3.transpose(0, 2, 1)[:, :, :, None] * np.eye(r)[None, :, None, :]
    return -S, -rhs, HQQ, gg, neg


def _back_substitute_kernel(chunk, name, small, layout, s, dQ, rhs_name, out):
    """dV_i = D_i^-1 (b_i - L_i s) into state ``out``; its sums (see :class:`Step`)."""
    X, V = chunk["X"], chunk[name]
    Q, n = small["Q"], small["n"]
    dV = np.empty_like(V)
    bdv, t_max = 0.0, math.inf
    for rows in _row_blocks(V.shape[0], X.shape[1], Q.shape[0]):
        block = _Rows(X[rows], V[rows], small, None if rhs_name is None else chunk[rhs_name][rows])
        dV[rows] = block.e_times(block.b - block.coupling_times(s, layout)).T
        bdv += float(np.vdot(block.b, dV[rows]))
        # The largest t with U + t dU > 0 (first order), from the block's own U^-1.
        dU = dQ[0][None, :] / math.sqrt(n) + dV[rows] @ Q[1:] + V[rows] @ dQ[1:]
        falling = dU < 0
        if falling.any():
            t_max = min(t_max, float(np.min(-1.0 / (block.uinv[falling] * dU[falling]))))
    chunk[out] = dV
    return dV.sum(axis=0), float(np.vdot(V, dV)), float(np.vdot(dV, dV)), bdv, t_max


def _retract_kernel(chunk, name, new_name, t, mean, scale, Q, n, mu):
    """V_new = (V + t dV - mean) * scale into state ``new_name``; the point kernel's sums
    at (V_new, Q)."""
    chunk[new_name] = (chunk[name] + t * chunk["dV"] - mean[None]) * scale
    return _point_kernel(chunk, new_name, Q, n, mu)


class _SmallLayout:
    """Slices of the small unknowns of the Newton system: dQ (r^2), z (d (r-1)), the
    multipliers of 1^T dV = 0 (r-1), of <V, dV> = 0 (1) and of sym(dQ Q^T) = 0
    (r (r+1)/2)."""

    def __init__(self, r, d):
        sizes = {"q": r * r, "z": d * (r - 1), "ones": r - 1, "sphere": 1, "sq": r * (r + 1) // 2}
        start = 0
        for name, size in sizes.items():
            setattr(self, name, slice(start, start + size))
            start += size
        self.size = start
        self.coupled = self.sq.start            # the columns a row of dV couples to


def _orth_constraint_rows(Q):
    """The rows of the linear map dQ -> (dQ Q^T + Q dQ^T)_ab, a <= b, on vec(dQ)."""
    r = Q.shape[0]
    rows = []
    for a in range(r):
        for b in range(a, r):
            J = np.zeros((r, r))
            J[a] += Q[b]
            J[b] += Q[a]
            rows.append(J.ravel())
    return np.array(rows)


# ------------------------------------------------------------------ the optimizer
# Cohen et al.'s epsilon for the default sketch: its K / epsilon principal components.
SKETCH_EPSILON = 0.2


def sketch_size(n_components, d, K):
    """The principal components the problem is solved on: all d for None; ``"auto"``,
    min(d, ceil(K / SKETCH_EPSILON)); else ``n_components`` (at most d).

    The Newton system's small unknowns include z = X^T dV, d (r - 1) of them, and a Schur
    pass costs O(n d^2 r^2) (:func:`schur_pass_flops`): at d = 784 (MNIST) the Schur
    complement is a dense 8,000 x 8,000 solve, several an iteration.  Projecting the
    centred rows on their top ceil(K / eps) principal components preserves the k-means
    cost of every partition into K groups within a factor 1 + eps, up to a constant
    (Cohen, Elder, Musco, Musco, Persu, STOC 2015: a projection-cost-preserving sketch);
    the bound is affine in the projection, so it holds for every Z of the SDP (doubly
    stochastic, PSD and of trace K: a convex combination of rank-K projections)."""
    if n_components is None:
        return d
    if isinstance(n_components, str):
        if n_components != "auto":
            raise InputValueError(f"n_components must be 'auto', None or an integer >= 1; got {n_components!r}")
        return min(d, math.ceil(K / SKETCH_EPSILON))
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) or n_components < 1:
        raise InputValueError(f"n_components must be 'auto', None or an integer >= 1; got {n_components!r}")
    if n_components > d:
        raise InputValueError(f"n_components must be at most X's {d} features; got {n_components}")
    return int(n_components)


@dataclass(frozen=True, eq=False)
class PrincipalSketch:
    """X's centred rows projected on its top principal components (``components``, d x
    m, orthonormal columns), held as the row chunks' state ``name``; ``variance``: the
    fraction of X's variance they keep."""

    name: str
    components: np.ndarray
    variance: float


def principal_sketch(data, m, name="X_sketch"):
    """The projection of the row chunks' centred X on its m top principal components
    (the eigenvectors of the d x d Gram the chunks computed when built), written as
    state ``name`` in one pass; None when m is all of X's d features."""
    if m >= data.d:
        return None
    values, vectors = np.linalg.eigh(data.gram)
    components = np.ascontiguousarray(vectors[:, ::-1][:, :m])
    total = float(values.sum())
    data.map(_project_rows, components, name)
    return PrincipalSketch(name, components, float(values[::-1][:m].sum()) / total if total > 0 else 1.0)


def _project_rows(chunk, components, name):
    chunk[name] = chunk["X"] @ components


def default_mu(X, manifold, point, ratio=20.0, sketch=None):
    """App. F: the largest mu with the barrier term mu * (-sum log U) at ``point`` no more
    than ``ratio`` times the data term ||X^T V||_F^2 there (X centred, or its ``sketch``;
    X an array, a Zarr array or path, or a :class:`dnomad.blocks.RowChunks`; V an array,
    or, X being row chunks, a state of theirs, a :class:`dnomad.blocks.HeldRows`; one pass)."""
    from ..blocks import RowChunks

    data = X if isinstance(X, RowChunks) else RowChunks(X)
    V, Q = point
    put = not isinstance(V, HeldRows)
    name = "V_mu" if put else V.name
    if put:
        data.put(name, np.asarray(V, dtype=np.float64))
    try:
        parts = data.map(_point_kernel, name, np.asarray(Q, dtype=np.float64), manifold.n, 1.0,
                         x_state=None if sketch is None else sketch.name)
    finally:
        if put:
            data.drop(name)
    if not min(p[0] for p in parts) > 0:
        raise InputValueError("default_mu needs a strictly feasible point (U > 0)")
    fit = float(np.sum(ordered_sum(p[1] for p in parts) ** 2))
    barrier = -ordered_sum(p[2] for p in parts)
    if barrier <= 0 or fit <= 0:
        raise InputValueError("mu cannot be set from the data: give mu explicitly")
    return ratio * fit / barrier


def interior_start(manifold, data, name):
    """Lemma 5's interior point with V made by the row chunks ``data`` in state ``name``
    (:meth:`KMeansManifold.interior_factor`).  Returns (:class:`dnomad.blocks.HeldRows`, Q)."""
    W, Q = manifold.interior_factor()
    data.map(_periodic_rows, name, W, with_span=True, read_x=False)
    return data.held(name), Q


def random_start(manifold, rng, scale=0.5, tries=60, *, data=None):
    """A random strictly feasible point: Lemma 5's interior point (:meth:`KMeansManifold.
    interior_factor`) moved along a random unit tangent direction by the largest step
    (from ``scale`` sqrt(K - 1), halving ``tries`` times) that keeps U > 0; the interior
    point itself when none does.

    With row chunks ``data``, V is made there, in the state the first Newton iterate takes
    over, and returned as a :class:`dnomad.blocks.HeldRows`: the direction's rows Z are
    drawn by the chunks (the same whatever the chunking), and every step's point V(t) =
    c(t) ((1 - t a) V + t (Z - 1 m^T) / ||v||) is known from Z's sums (m its column means, a
    = <Z, V> / (||v|| (K - 1)), c(t) the scale back to ||V||^2 = K - 1), so one pass finds
    the step.  Without ``data``, (V, Q) as arrays, made in this process."""
    if data is None:
        with RowState(manifold.n) as space:
            V, Q = random_start(manifold, rng, scale, tries, data=space)
            return np.array(V), Q
    n, R2 = manifold.n, manifold.radius2
    W, Q = manifold.interior_factor()
    parts = data.map(_draw_start_rows, _START, W, stream_key(rng), with_span=True, read_x=False)
    zsum, zz, zv = (ordered_sum(p[k] for p in parts) for k in range(3))
    mean = zsum / n
    dV2 = float(zz) - n * float(mean @ mean) - float(zv) ** 2 / R2      # ||Z - 1 m^T - (<Z, V> / R2) V||^2
    dQ = _skew(rng.standard_normal(Q.shape) @ Q.T) @ Q
    norm = math.sqrt(dV2 + float(np.sum(dQ * dQ)))
    candidates = []
    for t in scale * math.sqrt(R2) / 2.0 ** np.arange(tries):
        c = math.sqrt(R2 / (R2 + (t / norm) ** 2 * dV2))
        candidates.append((c * (1.0 - t * float(zv) / (R2 * norm)), c * t / norm, _polar(Q + (t / norm) * dQ)))
    lowest = np.min(data.map(_start_minima, _START, W, mean, candidates, n, with_span=True, read_x=False), axis=0)
    feasible = np.flatnonzero(lowest > 0)
    a, b, Q = candidates[feasible[0]] if feasible.size else (1.0, 0.0, Q)
    data.map(_start_combine, _START, W, mean, a, b, with_span=True, read_x=False)
    return data.held(_START), Q


def kmeans_start(manifold, data, rng, sketch=None):
    """A strictly feasible point at the k-means partition of the rows (``init="kmeans"``;
    of the rows of X's ``sketch`` when given).

    The partition (:func:`dnomad.rounding.kmeans_partition`) is refined into r
    groups (its largest cut in two while there are fewer, :func:`dnomad.kmeans_sdp.lloyd.
    split_groups`) with normalized indicators E (n x r, E^T E = I) and sizes n_g; then
    U = E M^1/2 with M = (1 - theta) I + theta s s^T, s_g = sqrt(n_g / n) (a unit
    vector, E s = 1 / sqrt(n)), so U U^T = (1 - theta) E E^T + theta 1 1^T / n: row sums
    1, trace (1 - theta) r + theta, which is K for theta = (r - K) / (r - 1), and every
    entry positive (U_ig = (sqrt(1 - theta) [g = own group] + (1 - sqrt(1 - theta))
    s_own s_g) / sqrt(n_own)).  The r groups merged back into K are the k-means
    partition; the Newton run starts next to it instead of at Lemma 5's interior point,
    far from any partition, where the Hessian is indefinite by about 2 ||X||_2^2 and the
    steps regularized by that much are short.

    Returns (V, Q) with V made by the row chunks where they are (a
    :class:`dnomad.blocks.HeldRows`; :meth:`KMeansProblem.load` takes it over): U = E
    M^1/2 as :meth:`KMeansManifold.point_from_u_reflected` maps it, its column sums
    M^1/2 sqrt(n_g) known from the sizes."""
    K, r, n = manifold.K, manifold.r, manifold.n
    x_state = None if sketch is None else sketch.name
    groups = lloyd.split_groups(data, kmeans_partition(data, K, rng, x_state=x_state), r, x_state=x_state)
    theta = (r - K) / (r - 1)
    counts = np.bincount(groups, minlength=r)
    s = np.sqrt(counts / n)
    half = math.sqrt(1.0 - theta) * (np.eye(r) - np.outer(s, s)) + np.outer(s, s)
    Q = manifold.reflection(half @ np.sqrt(counts))
    name = lloyd.put_partition_factor(data, groups, r, r, _START)
    data.map(_start_rows, name, half @ Q.T, read_x=False)
    return data.held(name), Q


# The state in which a start's V is made (the first Newton iterate takes it over).
_START = "riemannian_start_V"


def _start_rows(chunk, name, transform):
    chunk[name] = (chunk[name] @ transform)[:, 1:]


def _periodic(W, span):
    """Rows W[i mod len(W)] for the chunk's rows i (Lemma 5's V)."""
    return W[np.arange(span[0], span[1]) % len(W)]


def _periodic_rows(chunk, span, name, W):
    chunk[name] = _periodic(W, span)


def _draw_start_rows(chunk, span, name, W, key):
    """Gaussian rows Z into state ``name``; their column sums, ||Z||^2 and <Z, V> with V's
    rows W[i mod r]."""
    Z = random_rows(key, span[0], span[1], W.shape[1])
    chunk[name] = Z
    return Z.sum(axis=0), float(np.vdot(Z, Z)), float(np.vdot(Z, _periodic(W, span)))


def _start_minima(chunk, span, name, W, mean, candidates, n):
    """min U over the chunk's rows at each candidate (a, b, Q): V = a W[i mod r] + b (Z - m)."""
    V, Z = _periodic(W, span), chunk[name] - mean
    return np.array([float(u_rows(a * V + b * Z, Q, n).min()) if len(Z) else math.inf for a, b, Q in candidates])


def _start_combine(chunk, span, name, W, mean, a, b):
    chunk[name] = a * _periodic(W, span) + b * (chunk[name] - mean)


@dataclass(frozen=True, eq=False)
class NewtonResult:
    """What :func:`riemannian_newton` returns: the point (V, Q) and U, the stop reason,
    the history (one row per iteration), the final cost, gradient norm and, when asked,
    smallest Riemannian Hessian eigenvalue, the negative-curvature steps taken, the
    passes over X and the seconds.  :func:`riemannian_kmeans` returns its best start's
    with the history of all its stages, ``mu`` (the last stage's), ``costs`` (each
    start's final cost), the passes of all runs and ``labels``."""

    V: np.ndarray | HeldRows
    Q: np.ndarray
    manifold: object
    history: list
    stop_reason: str
    n_iter: int
    cost: float
    grad_norm: float
    min_eigenvalue: float | None
    curvature_steps: int
    passes: int
    seconds: float
    mu: float | None = None
    costs: list | None = None
    labels: np.ndarray | None = None
    sketch: PrincipalSketch | None = None

    @property
    def point(self):
        return self.V, self.Q

    @property
    def U(self):
        return self.manifold.phi((np.asarray(self.V), self.Q))


# riemannian_newton's defaults, which riemannian_kmeans's ConvergenceWarning also reports.
_NEWTON_MAX_ITER = 1000
_NEWTON_GTOL = 1e-6


def riemannian_newton(problem, x0, *, lam=1.0, kappa_plus=1.3, kappa_minus=1.1, max_iter=_NEWTON_MAX_ITER,
                      max_inner=60, gtol=_NEWTON_GTOL, boundary_fraction=0.95, second_order=True,
                      curvature_tol=None, lam_rule="adaptive", cubic_L=1.0, min_eigenvalue=None, callback=None,
                      warn=True, state=None, checkpoint=None, checkpoint_every=10, keep_rows=False):
    """Alg. 1 (App. G): regularized Riemannian Newton steps (H + lam I) p = -g on the
    tangent space (App. E, :meth:`KMeansProblem.solve`), retracted; a step is taken when
    it lowers the cost (then lam /= kappa_minus), else lam *= kappa_plus and the step is
    solved again.  Every iterate is strictly feasible (U > 0).

    Three safeguards, each a departure from the printed Alg. 1 (measured on the paper's
    GMM, n = 500, K = 4, gamma = 1.2, mu = 0.01):

    * lam is raised (as on a rejection) while H + lam I is indefinite on the tangent
      space (the inertia of the Schur complement says so at no extra cost): Lemma 2's
      condition lam > -lam_min, without which the step may point uphill or towards a
      saddle point (seen: a critical point with cost -295 against the optimum's
      -10924, and Hessian eigenvalue -5190);
    * ``boundary_fraction``: the step is cut to that fraction of the largest step that
      keeps U > 0 (to first order), as interior-point methods do; without it a full step
      leaves the domain, is rejected, and lam climbs (to 1e6; 1000 iterations without
      reaching the tolerance).  None takes full steps;
    * a step whose predicted decrease is below the cost's round-off (1e-12 |f|) is taken
      when the cost does not rise above that round-off: near the optimum the decrease
      of a Newton step is smaller than what f resolves, and the printed rule stalls.

    With ``second_order``, a point with ||grad|| <= gtol is accepted only when the
    Hessian has no eigenvalue below -curvature_tol (default sqrt(gtol); checked by the
    inertia at lam = curvature_tol: one pass); otherwise a step along the eigenvector of the smallest
    eigenvalue is taken (:meth:`KMeansProblem.negative_curvature_step`) and the iteration goes on.
    ``min_eigenvalue``: None, "final" (the smallest eigenvalue at the end, in the
    result) or "every" (also in every history row; Lanczos, tens of passes each).

    ``lam_rule="bisection"`` solves the cubic subproblem of Sec. 3 instead: lam is the
    root of 2 lam = L ||p(lam)|| over lam > max(0, -lam_min) (monotone by Lemma 2), found
    by bracketing and bisection to 1% (about ten Newton solves per iteration), and the
    cubic constant L (from ``cubic_L``) is what kappa_minus / kappa_plus adapt.

    Stops with "tolerance", "max_iter", "stalled" (no acceptable step in ``max_inner``
    tries) or "callback": ``callback(row, current_u)`` returned True (``current_u()``
    gathers the iterate's U; the callback's time is left out of ``seconds``).  History rows: iteration,
    loss, grad_norm, lam, inner (tries), seconds, passes (over X, from the start).
    A stop at "max_iter" with ``gtol`` > 0 warns :class:`dnomad.errors.ConvergenceWarning`
    unless ``warn`` is False (:func:`riemannian_kmeans` warns once for all its runs).

    ``checkpoint(state)`` is called at the start of every ``checkpoint_every``-th
    iteration with the point (V, Q), lam, cubic_L, the history and the counters; given
    back as ``state`` (``x0`` is then not used), the run goes on from there as if it had
    not stopped.  ``x0``'s V may be a state of the problem's row chunks (a
    :class:`dnomad.blocks.HeldRows`), which the run takes over; with ``keep_rows`` the
    result's V is the last iterate's, left in the row chunks (a HeldRows), else gathered.
    """
    import time

    if lam_rule not in ("adaptive", "bisection"):
        raise InputValueError(f"lam_rule must be 'adaptive' or 'bisection'; got {lam_rule!r}")
    M = problem.manifold
    passes0 = problem.passes
    if state is not None:
        x0, lam, cubic_L = (state["V"], state["Q"]), float(state["lam"]), float(state["cubic_L"])
    it = problem.load(x0)
    if not math.isfinite(it.cost):
        raise InputValueError("the start must be strictly feasible (U > 0)")
    tau = math.sqrt(gtol) if curvature_tol is None else float(curvature_tol)
    history, stop, escapes, inner = [], "max_iter", 0, 0
    t0 = time.perf_counter()
    if state is not None and state["history"]:
        # Counters continue the saved run's: the point's loading is not one of its passes
        # (a state saved before the run's first iteration is its start: counted afresh).
        history = [dict(row) for row in state["history"]]
        escapes, inner = int(state["escapes"]), int(state["inner"])
        passes0, t0 = problem.passes - int(state["passes"]), t0 - float(state["seconds"])
    first = len(history)
    for k in range(first, max_iter + 1):
        if checkpoint is not None and k > first and k % checkpoint_every == 0:
            checkpoint({"V": problem.held(it), "Q": it.Q, "lam": lam, "cubic_L": cubic_L,
                        "history": [dict(r) for r in history], "escapes": escapes, "inner": inner,
                        "passes": problem.passes - passes0, "seconds": time.perf_counter() - t0})
        sol = problem.solve(it, lam)
        row = {"iteration": k, "loss": it.cost, "grad_norm": sol.grad_norm, "lam": lam, "inner": inner,
               "seconds": time.perf_counter() - t0, "passes": problem.passes - passes0}
        if min_eigenvalue == "every":
            row["min_eigenvalue"] = problem.min_eigenvalue(it)
        history.append(row)
        if callback is not None:
            t_cb = time.perf_counter()
            stop_now = callback(dict(row), lambda: problem.u(it)) is True
            t0 += time.perf_counter() - t_cb          # a callback's time is not the solver's
            if stop_now:
                stop = "callback"
                break
        if sol.grad_norm <= gtol:
            if not second_order or problem.solve(it, tau).negative == 0:
                stop = "tolerance"
                break
            new = problem.negative_curvature_step(it, boundary_fraction)
            if new is None:
                stop = "stalled"
                break
            problem.release(it)
            it, escapes, inner = new, escapes + 1, 0
            continue
        if k == max_iter:
            break
        for inner in range(1, max_inner + 1):
            if lam_rule == "bisection":
                sol, step = _cubic_lam(problem, it, cubic_L, lam)
                lam = sol.lam
            else:
                if inner > 1:
                    sol = problem.solve(it, lam)
                if sol.negative > 0:             # lam <= -lam_min: no minimizer of the model
                    lam *= kappa_plus
                    continue
                step = problem.back_substitute(it, sol)
            t = 1.0 if boundary_fraction is None else min(1.0, boundary_fraction * step.t_max)
            trial = problem.retract(it, step, t)
            # model decrease of the step t p, with <p, H p> = -<g, p> - lam ||p||^2
            predicted = -(t * step.gp + 0.5 * t * t * (-step.gp - lam * step.pp))
            noise = 1e-12 * max(1.0, abs(it.cost))
            if trial.cost < it.cost or (predicted <= noise and trial.cost <= it.cost + noise):
                problem.release(it)
                it = trial
                if lam_rule == "bisection":
                    cubic_L /= kappa_minus
                else:
                    lam /= kappa_minus
                break
            problem.release(trial)
            if lam_rule == "bisection":
                cubic_L *= kappa_plus
            else:
                lam *= kappa_plus
        else:
            stop = "stalled"
            break
    if warn and stop == "max_iter" and gtol > 0:
        warn_convergence(f"Riemannian Newton (mu={problem.mu:g}) stopped at max_iter={max_iter} before "
                         f"meeting its tolerance: "
                         f"{_max_iter_residual(history[-1], gtol, second_order, curvature_tol)}")
    final_eig = problem.min_eigenvalue(it) if min_eigenvalue in ("final", "every") else None
    V, Q = problem.held(it), it.Q
    if not keep_rows:
        V = np.asarray(V)
        problem.release(it)
    return NewtonResult(V, Q, M, history=history, stop_reason=stop, n_iter=history[-1]["iteration"],
                        cost=it.cost, grad_norm=history[-1]["grad_norm"], min_eigenvalue=final_eig,
                        curvature_steps=escapes, passes=problem.passes - passes0,
                        seconds=time.perf_counter() - t0)


def _max_iter_residual(row, gtol, second_order, curvature_tol=None):
    """The last gradient norm against its threshold (or, below it, the curvature test
    that failed), for a ConvergenceWarning."""
    if row["grad_norm"] > gtol:
        return f"last grad_norm {row['grad_norm']:.3g} > its threshold {gtol:.3g}"
    tau = math.sqrt(gtol) if curvature_tol is None else curvature_tol
    return (f"last grad_norm {row['grad_norm']:.3g} <= its threshold {gtol:.3g}, but the Hessian has an "
            f"eigenvalue below {-tau:.3g}" if second_order else
            f"last grad_norm {row['grad_norm']:.3g}, threshold {gtol:.3g}")


def _cubic_lam(problem, it, L, lam0, rtol=1e-2, max_solves=80):
    """The solve and step at the root of 2 lam / L = ||p(lam)|| (Sec. 3, Lemma 2): the
    left side grows and ||p|| shrinks with lam above -lam_min, where ||p|| blows up;
    bracketed from ``lam0`` by factors of 4, then bisected in log lam until the bracket
    is within ``rtol``.  Returns the upper end's (solve, step): ||p|| <= 2 lam / L, the
    cautious side."""
    def evaluate(lam):
        sol = problem.solve(it, lam)
        if sol.negative > 0:
            return sol, None, -math.inf
        step = problem.back_substitute(it, sol)
        return sol, step, 2.0 * lam / L - math.sqrt(step.pp)

    lam = max(lam0, 1e-12)
    sol, step, phi = evaluate(lam)
    lo = hi = None
    if phi < 0:
        lo = lam
    else:
        hi, best = lam, (sol, step)
    for _ in range(max_solves):
        if lo is None:
            lam = hi / 4
            if lam < 1e-12:                      # lam = 0 already gives a short enough step
                break
        elif hi is None:
            lam = lo * 4
        elif hi / lo <= 1 + rtol:
            break
        else:
            lam = math.sqrt(lo * hi)
        sol, step, phi = evaluate(lam)
        if phi < 0:
            lo = lam
        else:
            hi, best = lam, (sol, step)
    if hi is None:
        raise InputValueError("no lam with 2 lam = L ||p(lam)|| found: the Hessian or gradient is not finite")
    return best


def labels_from_u(U, K, method="kmeans", random_state=0):
    """Group labels from the rows of U (n x r) in memory: :func:`dnomad.rounding.factor_labels`
    (Lemma 1's farthest-point representatives, then k-means by default)."""
    with RowState(len(U)) as space:
        space.put("U", np.asarray(U, dtype=np.float64))
        return factor_labels(space, "U", K, random_state, method)


def data_curvature(data):
    """||X||_2^2 (X centred; the largest eigenvalue of the row chunks' Gram F^T F): half
    the norm of the data term's Hessian, the unit of the estimator's ``lam`` and ``tol``.
    1 for X = 0."""
    top = float(np.linalg.eigvalsh(data.gram)[-1])
    return top if top > 0 else 1.0


def mu_schedule(mu, data, manifold, sketch=None):
    """The barrier weights of the stages: ``"auto"`` is App. F's heuristic at the
    interior point of Lemma 5 (so it does not depend on the start); a number is one
    stage; a decreasing sequence is continuation (each stage starts from the previous
    one's point, App. F)."""
    if isinstance(mu, str):
        if mu != "auto":
            raise InputValueError(f"mu must be 'auto', a number > 0 or a decreasing sequence of them; "
                                  f"got {mu!r}")
        point = interior_start(manifold, data, "V_mu")
        try:
            return [default_mu(data, manifold, point, sketch=sketch)]
        finally:
            data.drop("V_mu")
    values = [mu] if np.ndim(mu) == 0 else list(mu)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not (v > 0 and math.isfinite(v)):
            raise InputValueError(f"mu must be 'auto', a number > 0 or a decreasing sequence of them; "
                                  f"got {mu!r}")
    if not values or any(b >= a for a, b in zip(values, values[1:])):
        raise InputValueError(f"a sequence mu must be non-empty and strictly decreasing; got {mu!r}")
    return [float(v) for v in values]


def riemannian_kmeans(data, K, *, rank=None, n_components="auto", mu="auto", init="kmeans", n_init=1,
                      random_state=None, state=None, checkpoint=None, checkpoint_every=10, keep_rows=False,
                      **newton):
    """K-means by :func:`riemannian_newton` on the row chunks ``data`` (or on their
    projection on ``n_components`` principal components, :func:`principal_sketch`, the
    start's k-means too): ``n_init`` strictly feasible starts (``init``: "kmeans", :func:`kmeans_start`, a new seeding
    each; "random", :func:`random_start`), each run through the ``mu`` stages; the run with
    the lowest final cost wins.  Returns its :class:`NewtonResult` with ``history``
    rows tagged by ``init`` and ``stage`` (and ``mu``), ``mu`` (the final barrier
    weight), ``labels`` (Lemma 1), ``costs`` (every start's final cost), ``sketch``
    (None without one) and the passes over X or its sketch of all runs.  Runs (a start's stage) that stop at ``max_iter`` are reported
    in one ConvergenceWarning.

    ``checkpoint(state)`` is called every ``checkpoint_every`` Newton iterations, and at
    the start of every stage and start but the first, with the running Newton run's
    state (see :func:`riemannian_newton`), which start and stage it is, the generator's
    state, the best start so far and the history of every run so far; given back as
    ``state``, the run goes on from there as if it had not stopped.

    Every start's point (k-means or random), ``mu="auto"``'s interior point (App. F),
    every stage's iterates and the best start's point stay in the row chunks (the best
    written from there by a checkpoint), and the labels are taken there
    (:func:`dnomad.rounding.factor_labels` on U).  With ``keep_rows`` the result's
    V and U are left in the chunks' states "V" and "U" (the result's V a
    :class:`dnomad.blocks.HeldRows`), else gathered.
    """
    r = K + 1 if rank is None else rank
    manifold = KMeansManifold(data.n, r, K)
    if init not in INITS:
        raise InputValueError(f"init must be one of {INITS}; got {init!r}")
    if not (isinstance(n_init, (int, np.integer)) and not isinstance(n_init, bool) and n_init >= 1):
        raise InputValueError(f"n_init must be an integer >= 1; got {n_init!r}")
    sketch = principal_sketch(data, sketch_size(n_components, data.d, K))
    mus = mu_schedule(mu, data, manifold, sketch)
    rng = np.random.default_rng(random_state)
    best, costs, passes, capped, done = None, [], 0, [], []
    first_init, first_stage, newton_state = 0, 0, None
    if state is not None:
        rng, best, costs, passes, capped, done, first_init, first_stage, newton_state = \
            _resumed_kmeans(state, manifold)
        if best is not None:
            data.put(_BEST, best.V, dtype=np.float64)         # stored rows: the chunks read them
            best = dataclasses.replace(best, V=data.held(_BEST))
    for index in range(first_init, n_init):
        x = None
        if newton_state is None:
            before = data.passes + data.state_passes
            x = (kmeans_start(manifold, data, rng, sketch) if init == "kmeans"
                 else random_start(manifold, rng, data=data))
            passes += data.passes + data.state_passes - before         # the start's passes
        history = [row for row in done if row["init"] == index]
        for stage, mu_stage in enumerate(mus):
            if index == first_init and stage < first_stage:
                continue
            save = None if checkpoint is None else functools.partial(
                _save_kmeans, checkpoint, init=index, stage=stage, mu=mu_stage, rng=rng, best=best, costs=costs,
                passes=passes, capped=capped, done=done)
            if save is not None and newton_state is None and (index, stage) != (0, 0):
                # Each later stage and start is saved at its start too: a run of many short
                # ones (fewer than checkpoint_every iterations each) loses at most one.
                save({"V": x[0], "Q": x[1], "lam": newton.get("lam", 1.0), "cubic_L": newton.get("cubic_L", 1.0),
                      "history": [], "escapes": 0, "inner": 0, "passes": 0, "seconds": 0.0})
            res = riemannian_newton(KMeansProblem(manifold, data, mu_stage, sketch=sketch), x, **newton, warn=False,
                                    state=newton_state, checkpoint=save, checkpoint_every=checkpoint_every,
                                    keep_rows=True)
            newton_state = None
            rows = [dict(row, init=index, stage=stage, mu=mu_stage) for row in res.history]
            history += rows
            done += rows
            passes += res.passes
            if res.stop_reason == "max_iter":
                capped.append((index, stage, mu_stage, res.history[-1]))
            x = res.point
        costs.append(res.cost)
        if best is None or res.cost < best.cost:
            data.rename(res.V.name, _BEST)
            best = dataclasses.replace(res, history=history, V=data.held(_BEST))
        else:
            data.drop(res.V.name)
    gtol = newton.get("gtol", _NEWTON_GTOL)
    if capped and gtol > 0:
        max_iter = newton.get("max_iter", _NEWTON_MAX_ITER)
        second_order = newton.get("second_order", True)
        runs = "; ".join(f"start {init}, stage {stage + 1} of {len(mus)} (mu={mu_stage:g}): "
                         f"{_max_iter_residual(row, gtol, second_order, newton.get('curvature_tol'))}"
                         for init, stage, mu_stage, row in capped[:5])
        more = f"; and {len(capped) - 5} more" if len(capped) > 5 else ""
        warn_convergence(f"Riemannian K-means stopped at max_iter={max_iter} before meeting its tolerance "
                         f"in {len(capped)} of {n_init * len(mus)} Newton runs: {runs}{more}")
    if sketch is not None:
        data.drop(sketch.name)
    data.drop("dV")                     # the last Newton step's
    data.rename(_BEST, "V")
    data.map(_u_state, "V", best.Q, manifold.n, read_x=False)
    labels = factor_labels(data, "U", K)
    V = data.held("V")
    if not keep_rows:
        V = np.asarray(V)
        data.drop("U")
        data.drop("V")
    return dataclasses.replace(best, V=V, mu=mus[-1], costs=costs, passes=passes, labels=labels, sketch=sketch)


# The state of the best start's V while later starts run.
_BEST = "riemannian_best_V"


def _u_state(chunk, name, Q, n):
    chunk["U"] = u_rows(chunk[name], Q, n)


# The best start's scalars a checkpoint keeps (its V and Q are arrays of their own).
_BEST_FIELDS = ("stop_reason", "n_iter", "cost", "grad_norm", "min_eigenvalue", "curvature_steps", "passes",
                "seconds")


def _save_kmeans(checkpoint, newton_state, *, init, stage, mu, rng, best, costs, passes, capped, done):
    """The state of :func:`riemannian_kmeans` around its running Newton run's."""
    checkpoint(starts.wrap(newton_state, tags={"init": init, "stage": stage, "mu": mu}, rng=rng, done=done,
                           best=best, best_fields=_BEST_FIELDS, best_arrays=("V", "Q"), costs=list(costs),
                           runs_passes=passes, capped=[[i, s, m, row] for i, s, m, row in capped]))


def _resumed_kmeans(state, manifold):
    """What :func:`riemannian_kmeans` needs to go on from a state of :func:`_save_kmeans`."""
    rng, newton_state, done, best = starts.unwrap(
        state, match=("init", "stage"), tag_keys=("init", "stage", "mu"),
        run_keys=("V", "Q", "lam", "cubic_L", "escapes", "inner", "passes", "seconds"))
    if best is not None:
        best = NewtonResult(manifold=manifold, **best)
    capped = [(int(i), int(s), float(m), dict(row)) for i, s, m, row in state["capped"]]
    return (rng, best, list(state["costs"]), int(state["runs_passes"]), capped, done, int(state["init"]),
            int(state["stage"]), newton_state)
