"""K-means over the row chunks of X: k-means++ seeding on a sample of the rows, then
Lloyd's iterations over all of them (one pass each), and the refinement of a partition
into more groups.  The start of NLR and Riemannian K-means: the K-means SDP papers'
experiments compare against k-means++, and a relaxation started from its partition
ends no worse than it on real data."""
from __future__ import annotations

import numpy as np

from ..errors import InputValueError
from ..rounding import group_sums, kmeans_rows

# Rows the seeding clusters in this process (k-means++ and Lloyd's iterations on them,
# the best of kmeans_rows' seedings): all of X below it, a uniform sample above.
SEED_SAMPLE_ROWS = 20000
LLOYD_MAX_ITER = 300


def kmeans_partition(data, K, random_state=None, *, max_iter=LLOYD_MAX_ITER, x_state=None):
    """Labels (n,) of the rows of ``data`` (a :class:`dnomad.blocks.RowChunks`) by
    k-means: :func:`dnomad.rounding.kmeans_rows` on min(n, SEED_SAMPLE_ROWS) rows drawn
    uniformly, then Lloyd's iterations over every row until no label changes (or
    ``max_iter``).  Costs one pass to draw the sample and one per iteration (O(n d K)
    each); the client holds the sample and K centres.  A centre left without rows keeps
    its place.  ``x_state``: the rows are that state of the chunks (e.g. X's sketch)."""
    rng = np.random.default_rng(random_state)
    n = data.n
    picked = np.zeros((n, 1), dtype=bool)
    picked[rng.choice(n, min(n, SEED_SAMPLE_ROWS), replace=False)] = True
    data.put("kmeans_pick", picked)
    sample = np.concatenate(data.map(_picked_rows, x_state=x_state), axis=0)
    data.drop("kmeans_pick")
    seed = kmeans_rows(sample, K, rng)
    centres = np.stack([sample[seed == k].mean(axis=0) if np.any(seed == k) else sample[rng.integers(len(sample))]
                        for k in range(K)])
    data.put("kmeans_labels", np.full((n, 1), -1, dtype=np.int64))
    for _ in range(max_iter):
        parts = data.map(_lloyd_kernel, centres, x_state=x_state)
        sums = sum(p[0] for p in parts)
        counts = sum(p[1] for p in parts)
        changed = sum(p[2] for p in parts)
        centres = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centres)
        if changed == 0:
            break
    labels = data.get("kmeans_labels")[:, 0]
    data.drop("kmeans_labels")
    return labels


def partition_factor(labels, K, r):
    """The K-means SDP's point of a partition into K nonempty groups: U (n x r) >= 0 with
    U U^T = sum_k 1_k 1_k^T / n_k (each group's indicator over the square root of its
    size), group k spread evenly over the columns k, k + K, k + 2K, ... below r (so no
    column is empty for K <= r); then U U^T 1 = 1 and ||U||_F^2 = K, NLR's feasible set.
    A group without rows leaves its columns zero and the trace short of K."""
    labels = np.asarray(labels)
    n = len(labels)
    counts = np.bincount(labels, minlength=K)
    U = np.zeros((n, r))
    for k in range(K):
        columns = np.arange(k, r, K)
        if counts[k]:
            U[np.ix_(labels == k, columns)] = 1.0 / np.sqrt(counts[k] * len(columns))
    return U


def _picked_rows(chunk):
    return chunk["X"][chunk["kmeans_pick"][:, 0]]


def _lloyd_kernel(chunk, centres):
    """One Lloyd step on the chunk's rows: nearest centres (kept in the chunk), and the
    per-centre sums and counts, and how many labels changed."""
    X = chunk["X"]
    d2 = -2.0 * (X @ centres.T) + np.einsum("ij,ij->i", centres, centres)[None]
    labels = np.argmin(d2, axis=1)
    changed = int(np.sum(labels != chunk["kmeans_labels"][:, 0]))
    chunk["kmeans_labels"] = labels[:, None]
    K = len(centres)
    return group_sums(labels, X, K), np.bincount(labels, minlength=K).astype(np.float64), changed


def split_groups(data, labels, groups, *, x_state=None):
    """A refinement of the partition ``labels`` into exactly ``groups`` nonempty groups
    (numbered 0..groups-1): the largest group cut in two at the median of its rows'
    projections on their first principal direction, again while there are too few (two
    passes a cut: the group's moments, then its projections).  Needs n >= groups.
    ``x_state`` as in :func:`kmeans_partition`."""
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
