"""Convex relaxations of Bregman-divergence clustering (Cheng, Zhang, Schuurmans) over
normalized equivalence matrices M, with rounding, re-optimization and baselines.

- :mod:`.divergences`: the Bregman divergences (F, f, f^-1, F*).
- :mod:`.norms`: the projection onto M2 (Lemma 1), the induced norms Omega (Alg. 2) and
  Xi (App. B) with their duals and linear minimization oracles.
- :mod:`.admm`: cvxCondJC (Sec. 3.1) by ADMM.
- :mod:`.gcg`: the generalized conditional gradient (Alg. 1, App. C.1) and cvxCond
  (Sec. 3.2), cvxDisc (Sec. 4), cvxJoint (Sec. 5) on it.
- :mod:`.clustering`: hard and soft Bregman clustering (Banerjee et al.) and spectral
  rounding.
"""
from .admm import CondJCResult, cond_jc, project_simplex_rows
from .clustering import (ROUNDINGS, bregman_seeding, centroids_of, cluster_posteriors, hard_clustering, hard_objective,
                         kmeans_roundings, soft_clustering, spectral_rounding)
from .divergences import (DIVERGENCES, KL, BregmanDivergence, ItakuraSaito, Logistic, SquaredEuclidean,
                          get_divergence)
from .estimator import BregmanClustering
from .gcg import GCGResult, cond, disc, gcg, joint
from .norms import (omega, omega_dual, omega_lmo, omega_squared_from_singular_values, project_m2, xi, xi_dual,
                    xi_lmo, xi_minimizer)

__all__ = ["BregmanClustering", "BregmanDivergence", "CondJCResult", "DIVERGENCES", "GCGResult", "ItakuraSaito", "KL", "Logistic",
           "ROUNDINGS",
           "SquaredEuclidean", "centroids_of", "cluster_posteriors", "cond", "cond_jc", "disc", "gcg", "get_divergence",
           "bregman_seeding", "hard_clustering", "hard_objective", "joint", "kmeans_roundings", "omega", "omega_dual", "omega_lmo", "omega_squared_from_singular_values",
           "project_m2", "project_simplex_rows", "soft_clustering", "spectral_rounding", "xi", "xi_dual", "xi_lmo",
           "xi_minimizer"]
