"""The K-means SDP's point of a partition and the refinement of a partition into more
groups, over the row chunks of X: with :func:`dnomad.rounding.kmeans_partition`, the start
of NLR and Riemannian K-means (the K-means SDP papers' experiments compare against
k-means++, and a relaxation started from its partition ends no worse than it on real
data)."""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError


def partition_factor(labels, K, r, counts=None):
    """The K-means SDP's point of a partition into K nonempty groups: U (n x r) >= 0 with
    U U^T = sum_k 1_k 1_k^T / n_k (each group's indicator over the square root of its
    size), group k spread evenly over the columns k, k + K, k + 2K, ... below r (so no
    column is empty for K <= r); then U U^T 1 = 1 and ||U||_F^2 = K, NLR's feasible set.
    A group without rows leaves its columns zero and the trace short of K.  ``counts``:
    the groups' sizes, where ``labels`` are some of the rows (default: theirs)."""
    labels = np.asarray(labels)
    n = len(labels)
    counts = np.bincount(labels, minlength=K) if counts is None else counts
    U = np.zeros((n, r))
    for k in range(K):
        columns = np.arange(k, r, K)
        if counts[k]:
            U[np.ix_(labels == k, columns)] = 1.0 / np.sqrt(counts[k] * len(columns))
    return U


def put_partition_factor(data, labels, K, r, name):
    """:func:`partition_factor` of ``labels`` as state ``name`` of the row chunks
    ``data``, each chunk making its own rows (U is not formed here).  Returns ``name``."""
    data.put(name, np.asarray(labels)[:, None])
    data.map(_partition_rows, name, K, r, np.bincount(labels, minlength=K), read_x=False)
    return name


def _partition_rows(chunk, name, K, r, counts):
    chunk[name] = partition_factor(chunk[name][:, 0], K, r, counts)


def split_groups(data, labels, groups, *, x_state=None):
    """A refinement of the partition ``labels`` into exactly ``groups`` nonempty groups
    (numbered 0..groups-1): the largest group cut in two at the median of its rows'
    projections on their first principal direction, again while there are too few (two
    passes a cut: the group's moments, then its projections).  Needs n >= groups.
    ``x_state`` as in :func:`dnomad.rounding.kmeans_partition`."""
    labels = np.unique(np.asarray(labels), return_inverse=True)[1]       # nonempty groups 0..c-1
    if groups > data.n:
        raise InputValueError(f"cannot split {data.n} rows into {groups} nonempty groups")
    while labels.max() + 1 < groups:
        big = int(np.argmax(np.bincount(labels)))
        data.put("split_labels", labels[:, None])
        parts = data.map(_group_moments, big, x_state=x_state)
        count = sum(p[0] for p in parts)
        mean = sum(p[1] for p in parts) / count
        scatter = sum(p[2] for p in parts) - count * np.outer(mean, mean)
        direction = np.linalg.eigh(scatter)[1][:, -1]
        projections = np.concatenate(data.map(_group_projections, big, direction, x_state=x_state))
        data.drop("split_labels")
        rows = np.flatnonzero(labels == big)
        upper = rows[np.argsort(projections, kind="stable")[len(rows) // 2:]]
        labels = labels.copy()
        labels[upper] = labels.max() + 1
    return labels


def _group_moments(chunk, group):
    rows = chunk["X"][chunk["split_labels"][:, 0] == group]
    return len(rows), rows.sum(axis=0), rows.T @ rows


def _group_projections(chunk, group, direction):
    return chunk["X"][chunk["split_labels"][:, 0] == group] @ direction
