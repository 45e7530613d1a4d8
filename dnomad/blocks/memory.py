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
    ``_memory_parts(n, d, x_kind)`` declares it (``x_kind``: X's kind as
    :func:`dnomad.blocks.input_metadata` names it, "shape" for a shape alone; some
    methods read a Zarr or dask X from where it is instead of holding it).

    ``rows``: bytes per row of X of each state kept in row chunks beside X, spread over
    the workers chunk by chunk.  ``x_rows``: bytes per row of the copies of X's centred
    rows the chunks keep for their passes (where X is in memory: a Zarr X is read and
    centred by each task instead).  ``chunk_rows``: bytes per row of one chunk that a
    task holds on top while it runs (its temporaries).
    ``matrices``: how many n x n matrices of ``itemsize`` bytes it stores as blocks (their
    upper triangles).  ``client``: bytes the client holds above its start, by part.
    ``passes``: what the run reads, in words, by step.
    ``task``: bytes one task holds on a worker whatever the layout (a method whose tasks
    read X from the store); ``each_worker``: bytes sent once to every worker; ``disk``:
    bytes it writes to the store, by part.  A method
    that declares no rows, matrices or tasks runs in this process (its threads' parts
    are in ``client``)."""

    rows: dict = field(default_factory=dict)
    x_rows: dict = field(default_factory=dict)
    chunk_rows: dict = field(default_factory=dict)
    matrices: int = 0
    itemsize: int = 8
    client: dict = field(default_factory=dict)
    passes: dict = field(default_factory=dict)
    task: dict = field(default_factory=dict)
    each_worker: dict = field(default_factory=dict)
    disk: dict = field(default_factory=dict)

    @property
    def in_process(self):
        return not (self.rows or self.matrices or self.task)


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


def worker_share(parts, n, n_workers, worker_memory, chunk_rows=None, *, d=0, x_in_zarr=False, x_itemsize=8,
                 threads=1, backend=None, block_size=None):
    """:class:`WorkerShare` of a fit whose method declared ``parts``, on ``n_workers``
    workers of ``worker_memory`` bytes running ``threads`` tasks at once; ``chunk_rows``:
    the row chunks' rows, of X's d features of ``x_itemsize`` bytes: in memory, a
    worker keeps its rows of X as given beside the chunks' centred copies (``x_rows``);
    in Zarr (``x_in_zarr``) each task reads and centres its chunk instead.  The n x n
    matrices' place follows the fit's ``backend`` ("zarr": the store; "local" or
    "distributed": memory; else the engine's rule) and their blocks ``block_size``
    where it is given."""
    if parts.in_process:
        return WorkerShare(where="in this process (no workers)", worker={}, disk=dict(parts.disk))
    footprint = cluster.WORKER_FOOTPRINT_BYTES if parts.matrices else cluster.ROW_WORKER_FOOTPRINT_BYTES
    worker, disk = {"a worker's own footprint": footprint}, dict(parts.disk)
    share = WorkerShare(where="", worker=worker, disk=disk)
    if parts.task:
        share.where = "tasks on the workers, reading X from the store"
        tasks = f"{threads} tasks" if threads > 1 else "one task"
        for name, nbytes in parts.task.items():
            worker[f"{name} ({tasks})"] = int(nbytes * threads)
        worker.update({name: int(nbytes) for name, nbytes in parts.each_worker.items()})
    if parts.rows:
        chunks = math.ceil(n / chunk_rows)
        rows_held = min(n, math.ceil(chunks / n_workers) * chunk_rows)        # chunks go to workers whole
        share.where, share.chunk_rows = "state in X's row chunks", int(chunk_rows)
        held, per_task = dict(parts.rows), dict(parts.chunk_rows)
        if x_in_zarr:
            per_task["a chunk of X read and centred"] = x_itemsize * d + sum(parts.x_rows.values())
        else:
            held = dict({"X's rows as given": x_itemsize * d}, **parts.x_rows, **held)
        for name, per_row in held.items():
            worker[f"{name} ({rows_held:,} rows)"] = int(per_row * rows_held)
        tasks = f"{threads} tasks" if threads > 1 else "one task"
        for name, per_row in per_task.items():
            worker[f"{name} ({tasks}, a chunk of {chunk_rows:,} rows each)"] = int(per_row * chunk_rows * threads)
    if parts.matrices:
        upper = parts.matrices * n * n / 2 * parts.itemsize
        share.matrices_in_memory = backend in ("local", "distributed") or (
            backend != "zarr" and upper <= 0.5 * n_workers * worker_memory)      # as cluster.choose_backend
        room = cluster.TERMINATE_FRACTION * worker_memory - footprint
        share.block_size = min(int(block_size), n) if block_size else builders.choose_block_size(
            n, np.dtype(f"f{parts.itemsize}"),
            target_bytes=min(builders.TARGET_BLOCK_BYTES, max(room, 1) / cluster.TASK_BLOCKS))
        if share.matrices_in_memory:
            share.where = "n x n matrices in blocks in the workers' memory"
            worker[f"{parts.matrices} n x n matrices' blocks (a share)"] = int(upper / n_workers)
        else:
            share.where = "n x n matrices in blocks in Zarr (the store)"
            disk[f"{parts.matrices} n x n matrices' upper blocks"] = int(upper)
        task_blocks = cluster.TASK_BLOCKS * share.block_size**2 * parts.itemsize
        worker[f"one task's blocks ({cluster.TASK_BLOCKS})"] = task_blocks
    return share


def needed_limit(total):
    """The least worker memory limit under which ``total`` bytes stay below the nanny's
    bound."""
    return int(math.ceil(total / cluster.TERMINATE_FRACTION))


def refuse_unless_workers_hold(parts, n, chunk_rows, client, what, *, d=0, x_in_zarr=False, x_itemsize=8):
    """Before any pass: refuse (InputValueError) ``client``'s workers where the busiest
    one's share of the row chunks' state, as ``parts`` declares it, passes the nanny's
    bound under the smallest memory limit, naming the limit they would need and how many
    such workers would do (or the chunk rows that would let more workers share it);
    nothing where the workers have no limits.  X's place and size as for
    :func:`worker_share`."""
    workers = list(cluster.workers_info(client).values())
    limits = [w.get("memory_limit") or 0 for w in workers]
    if not parts.rows or not workers or not all(limits):
        return
    limit, threads = min(limits), max(int(w.get("nthreads") or 1) for w in workers)
    tasks = "one task's" if threads == 1 else f"{threads} tasks'"
    where = dict(d=d, x_in_zarr=x_in_zarr, x_itemsize=x_itemsize, threads=threads)
    bound = cluster.TERMINATE_FRACTION * limit

    def total(n_workers, rows=chunk_rows):
        return worker_share(parts, n, n_workers, limit, rows, **where).total

    need = total(len(workers))
    if need <= bound:
        return
    chunks = math.ceil(n / chunk_rows)
    enough = next((w for w in range(len(workers) + 1, chunks + 1) if total(w) <= bound), None)
    if enough:
        more = f", or {enough} workers of this limit"
    else:
        # each worker holds at least one chunk: smaller chunks are what lets more workers share it
        rows = next((r for r in (chunk_rows // 2 ** k for k in range(1, 20)) if r >= 1 and total(math.ceil(n / r), r)
                     <= bound), None)
        more = (f"; or X rechunked to at most {rows:,} rows a chunk (it has {chunk_rows:,}) and more workers"
                if rows else "")
    raise InputValueError(
        f"{what} needs about {need / 2**30:.2f} GiB on the busiest of the {len(workers)} workers (its share of the "
        f"row chunks' state, {tasks} temporaries and the worker's footprint; "
        f"dnomad.plan itemizes it), above 95% of the smallest worker memory limit, {limit / 2**30:.2f} GiB: "
        f"start workers with a memory limit of at least {needed_limit(need) / 2**30:.2f} GiB{more}")


def parse_size(value, what):
    """Bytes from a positive number or a size such as "8 GiB" or "400MB" (dask's
    parser); InputValueError naming ``what`` otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
        return int(value)
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            out = parse_bytes(value)
        except ValueError:
            out = None
        if out:
            return int(out)
    raise InputValueError(f"{what} must be a positive number of bytes or a size such as '8 GiB'; got {value!r}")
