"""NOMAD on two rings: two clusters (the SDP's K chosen from n and n_clusters), and a 2-D embedding of Q."""
import numpy as np

import dnomad
from dnomad.data import two_rings

if __name__ == "__main__":
    X, y = two_rings(300)
    est = dnomad.NOMAD(n_clusters=2).fit(X)
    print("groups:", len(np.unique(est.labels_)),
          "ARI:", dnomad.metrics.adjusted_rand_score(y, est.labels_),
          "K:", est.sdp_k_, "outer iterations:", est.n_iter_, est.stop_reason_)
