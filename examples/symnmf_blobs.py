"""Probabilistic clustering by simplicial symmetric NMF (Frank-Wolfe) on Gaussian blobs."""
import numpy as np

import dnomad
from dnomad.data import gaussian_blobs

if __name__ == "__main__":
    X, y = gaussian_blobs(600, n_centers=5, separation=6.0, random_state=0)
    est = dnomad.SymNMF(n_clusters=5, bandwidth=4.0, tol=1e-3, random_state=0).fit(X)
    W = est.components_                   # row i: point i's cluster-membership distribution
    print(f"{est.n_iter_} Frank-Wolfe iterations ({est.stop_reason_}), {est.passes_} passes over P, "
          f"f = {est.objective_:.4g}, FW gap = {est.gap_:.3g}")
    print(f"ARI against the blobs: {dnomad.metrics.adjusted_rand_score(y, est.labels_):.3f}; "
          f"most uncertain point's memberships: {np.round(W[np.argmin(W.max(axis=1))], 2)}")
