"""What a fit holds on each worker, from what its method declares (:class:`MemoryParts`)
and the engine's own rules: whole row chunks per worker, a worker's footprint, the blocks
one task holds, n x n matrices in the workers' memory or in Zarr, the nanny's bound.
:func:`dnomad.plan` prints it before a run; a fit on a cluster refuses, before any pass,
workers that cannot hold their share of the row chunks' state."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputValueError
from . import builders, cluster


# What a client driving a fit on a cluster holds beyond the method's own parts (futures,
# messages, the history): at 10^6 rows NOMAD bm's client rose 63 MiB against the 35 MiB
# of its labels and seeding sample (graphs/scale.json).
CLIENT_TRAFFIC_BYTES = 32 << 20


@dataclass
class MemoryParts:
    """What a method holds for a problem of n rows of d features, as its estimator's
    ``_memory_parts(n, d)`` declares it.

    ``rows``: bytes per row of X of each state kept in row chunks beside X (X's own
    copies included), spread over the workers chunk by chunk.  ``chunk_rows``: bytes per
    row of one chunk that a task holds on top while it runs (its temporaries).
    ``matrices``: how many n x n matrices of ``itemsize`` bytes it stores as blocks (their
    upper triangles).  ``client``: bytes the client holds above its start, by part.
    ``passes``: what the run reads, in words, by step."""

    rows: dict = field(default_factory=dict)
    chunk_rows: dict = field(default_factory=dict)
    matrices: int = 0
    itemsize: int = 8
    client: dict = field(default_factory=dict)
    passes: dict = field(default_factory=dict)


@dataclass
class WorkerShare:
    """Bytes by part on the most loaded of ``n_workers`` workers (``worker``) and in the
    store (``disk``), where the state lives, and the row chunks' or blocks' size."""

    where: str
    worker: dict
    disk: dict
    chunk_rows: int | None = None
    block_size: int | None = None
    matrices_in_memory: bool = True

    @property
    def total(self):
        return int(sum(self.worker.values()))


def worker_share(parts, n, n_workers, worker_memory, chunk_rows=None):
    """:class:`WorkerShare` of a fit whose method declared ``parts``, on ``n_workers``
    workers of ``worker_memory`` bytes; ``chunk_rows``: the row chunks' rows (X's)."""
    worker, disk = {"a worker's own footprint": cluster.WORKER_FOOTPRINT_BYTES}, {}
    share = WorkerShare(where="", worker=worker, disk=disk)
    if parts.rows:
        chunks = math.ceil(n / chunk_rows)
        rows_held = min(n, math.ceil(chunks / n_workers) * chunk_rows)        # chunks go to workers whole
        share.where, share.chunk_rows = "state in X's row chunks", int(chunk_rows)
        for name, per_row in parts.rows.items():
            worker[f"{name} ({rows_held:,} rows)"] = int(per_row * rows_held)
        for name, per_row in parts.chunk_rows.items():
            worker[f"{name} (one task, a chunk of {chunk_rows:,} rows)"] = int(per_row * chunk_rows)
    if parts.matrices:
        upper = parts.matrices * n * n / 2 * parts.itemsize
        share.matrices_in_memory = upper <= 0.5 * n_workers * worker_memory       # as cluster.choose_backend
        room = cluster.TERMINATE_FRACTION * worker_memory - cluster.WORKER_FOOTPRINT_BYTES
        share.block_size = builders.choose_block_size(
            n, np.dtype(f"f{parts.itemsize}"),
            target_bytes=min(builders.TARGET_BLOCK_BYTES, max(room, 1) / cluster.TASK_BLOCKS))
        if share.matrices_in_memory:
            share.where = "n x n matrices in blocks in the workers' memory"
            worker[f"{parts.matrices} n x n matrices' blocks (a share)"] = int(upper / n_workers)
        else:
            share.where = "n x n matrices in blocks in Zarr (the store)"
            disk[f"{parts.matrices} n x n matrices' upper blocks"] = int(upper)
        worker[f"one task's blocks ({cluster.TASK_BLOCKS})"] = cluster.TASK_BLOCKS * share.block_size**2 * parts.itemsize
    return share


def needed_limit(total):
    """The least worker memory limit under which ``total`` bytes stay below the nanny's
    bound."""
    return int(math.ceil(total / cluster.TERMINATE_FRACTION))


def refuse_unless_workers_hold(parts, n, chunk_rows, client, what):
    """Before any pass: refuse (InputValueError) workers of ``client`` whose tightest
    memory limit cannot hold their share of the row chunks' state as ``parts`` declares
    it, naming the limit they would need and how many such workers would do; nothing
    where the workers have no limits."""
    memory = cluster.tightest_worker_memory(client)
    if memory is None or not parts.rows:
        return
    n_workers = len(cluster.workers_info(client))
    limit = memory[0]
    share = worker_share(parts, n, n_workers, limit, chunk_rows)
    if share.total <= cluster.TERMINATE_FRACTION * limit:
        return
    chunks = math.ceil(n / chunk_rows)
    enough = next((w for w in range(n_workers + 1, chunks + 1)
                   if worker_share(parts, n, w, limit, chunk_rows).total <= cluster.TERMINATE_FRACTION * limit),
                  None)
    more = f", or {enough} workers of this limit" if enough else ""
    raise InputValueError(
        f"{what} needs about {share.total / 2**30:.2f} GiB on each of the {n_workers} workers (its row chunks' "
        f"state, a task's temporaries and the worker's footprint; dnomad.plan itemizes it), above 95% of the "
        f"tightest worker's memory limit of {limit / 2**30:.2f} GiB: start workers with a memory limit of at "
        f"least {needed_limit(share.total) / 2**30:.2f} GiB{more}")
