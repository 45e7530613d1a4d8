"""NOMAD on two rings: a hard 2-group labeling from K = 16, and a 2-D embedding of Q."""
import numpy as np

import dnomad
from dnomad.data import two_rings

if __name__ == "__main__":
    X, y = two_rings(300)
    est = dnomad.NOMAD(n_clusters=16).fit(X)
    print("groups:", len(np.unique(est.labels_)),
          "ARI:", dnomad.metrics.adjusted_rand_score(y, est.labels_),
          "outer iterations:", est.n_iter_, est.stop_reason_)
