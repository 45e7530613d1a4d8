"""K-means as smooth optimization on a product manifold (Xu, Hou, Chen, Zhang, Sec. 3,
App. C): the manifold / problem split (as pymanopt); the cubic-regularized Newton
optimizer comes on top of it.

The nonnegative low-rank K-means SDP  max <X X^T, U U^T> + mu sum log U  over
U U^T 1 = 1, Tr(U U^T) = K  is written through the submersion (Theorem 2)

    U = phi(V, Q) = [1/sqrt(n) 1, V] Q,   V in {1^T V = 0, ||V||_F^2 = K - 1} (n x (r-1)),
                                          Q in Orth(r)   (Q Q^T = I),

so that the row-sum and trace constraints hold for every (V, Q) and only U > 0 (the
log barrier) remains: the cost (13) is f(V, Q) = -||X^T V||_F^2 - mu sum_ij log U_ij
with X centred.  Symbols -> code: C = -X X^T is never formed (C V = -X (X^T V)).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InputValueError


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

    def interior_point(self):
        """A strictly positive U = phi(V, Q) on M_r (Lemma 5).

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
            U = np.tile((x - y) * np.eye(r) + y, (q, 1)) / math.sqrt(q)
        else:
            U = _lemma5_case2(n, r, K, q, p)
        if not (np.isfinite(U).all() and U.min() > 0):
            raise InputValueError(f"Lemma 5's interior point does not exist for n = {n}, r = {r}, K = {K} "
                                  f"(it needs n large enough against r); use more points or a smaller r")
        return self.point_from_u(U)

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
        A, _, Bt = np.linalg.svd(Q + dQ)
        return W, A @ Bt

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
        return np.full((n, r), np.nan)
    w = math.sqrt(w2)
    z = a * w + b / w
    x, y = (1 - 1 / n) * w + z / n, (1 + 1 / n) * z - w / n
    B = np.empty((r, r))
    B[:p, :p] = (x - y) * np.eye(p) + y
    B[:p, p:] = z
    B[p:, :p] = y
    B[p:, p:] = (w - z) * np.eye(r - p) + z
    return np.tile(B, (q + 1, 1))[:n]


def _skew(A):
    return 0.5 * (A - A.T)


def _sym(A):
    return 0.5 * (A + A.T)


class KMeansProblem:
    """The cost (13) on :class:`KMeansManifold`, its Euclidean and Riemannian gradient
    and Hessian-vector product (App. C.3).

    X (n x d) is centred here; C V = -X (X^T V) costs O(n d r) and nothing n x n is
    formed.  ``mu`` > 0 weighs the log barrier.
    """

    def __init__(self, manifold, X, mu):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] != manifold.n:
            raise InputValueError(f"X must be ({manifold.n}, d); got shape {X.shape}")
        if not np.isfinite(X).all():
            raise InputValueError("X contains NaN or Inf")
        if not (isinstance(mu, (int, float, np.floating)) and mu > 0 and math.isfinite(mu)):
            raise InputValueError(f"mu must be a finite number > 0; got {mu!r}")
        self.manifold = manifold
        self.X = X - X.mean(axis=0)
        self.mu = float(mu)

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

    # -- the Newton system (App. E) -------------------------------------------
    def lagrangian_hess(self, point, tangent):
        """The Hessian of the Lagrangian at the multipliers (26), on ambient pairs:
        ehess - <G_V, V>/(K - 1) dV and - sym(G_Q Q^T) dQ.  On tangent vectors its
        projection is :meth:`hess`; the Newton system uses it with the constraints."""
        V, Q = point
        dV, dQ = tangent
        GV, GQ = self.egrad(point)
        HV, HQ = self.ehess(point, tangent)
        return (HV - (np.vdot(GV, V) / self.manifold.radius2) * dV, HQ - _sym(GQ @ Q.T) @ dQ)

    def newton_step(self, point, lam, chunk_rows=4096):
        """The tangent (dV, dQ) minimizing <g, p> + 1/2 <p, (H + lam I) p> over the
        tangent space, by the Schur complement of App. E.

        The V-V block of the Lagrangian Hessian is D - B B^T: D block diagonal (one
        (r-1) x (r-1) block per row of V: mu Q1 diag(u_i^-2) Q1^T + (lam - <G_V, V>/(K-1)) I)
        and B = sqrt(2) X (x) I.  With z = -B^T dV as an extra unknown the rows of dV
        couple only to the small unknowns s = (dQ, z, the multipliers of 1^T dV = 0,
        <V, dV> = 0 and sym(dQ Q^T) = 0); the Schur complement
        S = L22 - sum_i L_i^T D_i^-1 L_i (size r^2 + d(r-1) + r + r(r+1)/2) and its
        right-hand side are sums over rows, made chunk by chunk; then
        dV_i = D_i^-1 (b_i - L_i s) in a second pass.  O(n r^3 (d + r)) work,
        O(chunk_rows r (r^2 + d r)) memory.
        """
        M = self.manifold
        V, Q = point
        n, r, d = M.n, M.r, self.X.shape[1]
        GV, GQ = self.egrad(point)
        gV, gQ = M.proj(point, (GV, GQ))
        shift = lam - np.vdot(GV, V) / M.radius2
        layout = _SmallLayout(r, d)
        chunks = [slice(r0, min(n, r0 + chunk_rows)) for r0 in range(0, n, chunk_rows)]
        # First pass over the rows: the Schur complement, its right-hand side and the
        # Q-Q block of the Hessian, all sums over rows.
        S = np.zeros((layout.size, layout.size))
        rhs = np.zeros(layout.size)
        HQQ = np.zeros((r, r, r, r))            # [l, j, l', j']
        for rows in chunks:
            Di, Li, Vhat, u2 = self._row_blocks(point, rows, shift, layout)
            Dinv_L = np.linalg.solve(Di, Li)                          # (c, r-1, s)
            Dinv_b = np.linalg.solve(Di, -gV[rows][..., None])[..., 0]
            S -= np.einsum("cka,ckb->ab", Li, Dinv_L)
            rhs -= np.einsum("cka,ck->a", Li, Dinv_b)
            HQQ += self.mu * np.einsum("cl,cj,cm->ljm", Vhat, u2, Vhat)[:, :, :, None] * \
                np.eye(r)[None, :, None, :]
        # L22: the Q-Q block, the identity on z, the constraint rows on dQ.
        HQQ = HQQ.reshape(r * r, r * r) - np.kron(_sym(GQ @ Q.T), np.eye(r)) + lam * np.eye(r * r)
        q, z = layout.q, layout.z
        S[q, q] += HQQ
        S[z, z] += np.eye(d * (r - 1))
        Jq = _orth_constraint_rows(Q)
        S[layout.sq, q] += Jq
        S[q, layout.sq] += Jq.T
        rhs[q] += -gQ.ravel()
        s = np.linalg.solve(S, rhs)
        # Second pass: back-substitution, the row blocks made again (keeping them all
        # would take n r (r^2 + d r) numbers).
        dV = np.empty_like(V)
        for rows in chunks:
            Di, Li, _, _ = self._row_blocks(point, rows, shift, layout)
            dV[rows] = np.linalg.solve(Di, (-gV[rows] - Li @ s)[..., None])[..., 0]
        return dV, s[q].reshape(r, r)

    def _row_blocks(self, point, rows, shift, layout):
        """D_i and L_i (the coupling of row i's dV to the small unknowns) for ``rows``."""
        M = self.manifold
        V, Q = point
        r = M.r
        Q1 = Q[1:]
        Vr = V[rows]
        c = Vr.shape[0]
        U = np.outer(np.full(c, 1.0 / math.sqrt(M.n)), Q[0]) + Vr @ Q1
        uinv = 1.0 / U
        u2 = uinv * uinv
        Di = self.mu * np.einsum("kj,cj,mj->ckm", Q1, u2, Q1) + shift * np.eye(r - 1)[None]
        Vhat = np.hstack([np.full((c, 1), 1.0 / math.sqrt(M.n)), Vr])
        Li = np.zeros((c, r - 1, layout.size))
        # dQ: mu [(u_i^-2 * (Vhat_i dQ)) Q1^T - u_i^-1 dQ[1:]^T]
        cq = self.mu * np.einsum("cj,cl,kj->cklj", u2, Vhat, Q1)
        cq[:, np.arange(r - 1), np.arange(1, r), :] -= self.mu * uinv[:, None, :]
        Li[:, :, layout.q] = cq.reshape(c, r - 1, r * r)
        # z (d x (r-1)): row i of B z is sqrt(2) x_i^T z.
        Xr = self.X[rows]
        cz = math.sqrt(2.0) * np.einsum("cd,km->ckdm", Xr, np.eye(r - 1))
        Li[:, :, layout.z] = cz.reshape(c, r - 1, -1)
        Li[:, :, layout.ones] = np.eye(r - 1)[None]                  # 1^T dV = 0
        Li[:, :, layout.sphere] = Vr[:, :, None]                      # <V, dV> = 0
        return Di, Li, Vhat, u2


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
def default_mu(problem_data_X, manifold, point, ratio=20.0):
    """App. F: the largest mu with the barrier term mu * (-sum log U) at ``point`` no more
    than ``ratio`` times the data term ||X^T V||_F^2 there (X centred)."""
    X = np.asarray(problem_data_X, dtype=np.float64)
    X = X - X.mean(axis=0)
    data = float(np.sum((X.T @ point[0]) ** 2))
    barrier = -float(np.log(manifold.phi(point)).sum())
    if barrier <= 0 or data <= 0:
        raise InputValueError("mu cannot be set from the data: give mu explicitly")
    return ratio * data / barrier


def random_start(manifold, rng, scale=0.5, tries=60):
    """A random strictly feasible point: the interior point of Lemma 5 moved along a
    random tangent direction by the largest step (from ``scale``, halving) that keeps U > 0."""
    x = manifold.interior_point()
    v = manifold.random_tangent(x, rng)
    step = scale * math.sqrt(manifold.radius2)
    for _ in range(tries):
        y = manifold.retract(x, (step * v[0], step * v[1]))
        if manifold.phi(y).min() > 0:
            return y
        step /= 2
    return x


def riemannian_newton(problem, x0, *, lam=1.0, kappa_plus=1.3, kappa_minus=1.1, max_iter=1000,
                      max_inner=60, gtol=1e-6, chunk_rows=4096, callback=None):
    """Alg. 1 (App. G): regularized Riemannian Newton steps (H + lam I) p = -g on the
    tangent space (:meth:`KMeansProblem.newton_step`), retracted; a step is taken when
    it lowers the cost (then lam /= kappa_minus), else lam *= kappa_plus and the step is
    solved again.  Every iterate is strictly feasible (a step to U <= 0 has cost inf).

    Stops when ||grad|| <= gtol ("tolerance"), after ``max_iter`` steps ("max_iter"),
    when no step within ``max_inner`` tries lowers the cost ("stalled"), or when
    ``callback(row)`` returns True ("callback").  Returns (point, history, stop_reason);
    history rows: iteration, loss, grad_norm, lam, inner (tries), seconds.
    """
    import time

    M = problem.manifold
    x = x0
    f = problem.cost(x)
    if not math.isfinite(f):
        raise InputValueError("the start must be strictly feasible (U > 0)")
    history, stop = [], "max_iter"
    t0 = time.perf_counter()
    for it in range(1, max_iter + 1):
        gnorm = M.norm(x, problem.grad(x))
        if gnorm <= gtol:
            stop = "tolerance"
            break
        for inner in range(1, max_inner + 1):
            p = problem.newton_step(x, lam, chunk_rows=chunk_rows)
            y = M.retract(x, p)
            fy = problem.cost(y)
            if fy < f:
                x, f = y, fy
                lam /= kappa_minus
                break
            lam *= kappa_plus
        else:
            stop = "stalled"
            break
        history.append({"iteration": it, "loss": f, "grad_norm": gnorm, "lam": lam, "inner": inner,
                        "seconds": time.perf_counter() - t0})
        if callback is not None and callback(dict(history[-1])) is True:
            stop = "callback"
            break
    return x, history, stop


def labels_from_u(U, K):
    """Group labels from the rows of U (Lemma 1: at the optimum Z = U U^T is block
    diagonal, so rows of one group coincide and rows of different groups are
    orthogonal): K representatives by farthest-point traversal, then the nearest
    representative.  O(n r K)."""
    U = np.asarray(U, dtype=np.float64)
    reps = [int(np.argmax(np.einsum("ij,ij->i", U, U)))]
    d2 = np.sum((U - U[reps[0]]) ** 2, axis=1)
    for _ in range(1, K):
        reps.append(int(np.argmax(d2)))
        d2 = np.minimum(d2, np.sum((U - U[reps[-1]]) ** 2, axis=1))
    dist = np.stack([np.sum((U - U[i]) ** 2, axis=1) for i in reps], axis=1)
    return np.argmin(dist, axis=1)
