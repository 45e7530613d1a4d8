"""``dnomad.plan``: the memory a fit needs on each worker and in the client, before it
runs, from what each method declares it holds (``_memory_parts`` of its estimator) and
the engine's own rules (row chunks, blocks, a worker's footprint, the nanny's bound)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .api import ESTIMATORS
from .blocks import builders, cluster, memory
from .blocks.matrix import available_memory
from .blocks.rows import chunk_rows_for
from .errors import InputValueError
from .validation import validate_params


@dataclass
class Plan:
    """A fit's memory, before it runs (:func:`plan`).  Bytes by part: ``worker`` on the
    most loaded worker, ``client`` in the client above its start, ``disk`` in the store;
    ``fits``: whether the worker's total stays under the nanny's bound
    (``TERMINATE_FRACTION`` of ``worker_memory``) and the client's under ``client_memory``,
    the memory available to this process (``workers_fit``, ``client_fits``: each alone);
    ``worker_memory_needed``: the least worker memory limit under which the workers'
    would."""

    method: str
    n: int
    d: int
    where: str
    n_workers: int
    worker_memory: int
    chunk_rows: int | None
    block_size: int | None
    worker: dict
    client: dict
    disk: dict
    passes: dict
    client_memory: int = 0
    notes: list = field(default_factory=list)

    @property
    def worker_total(self):
        return int(sum(self.worker.values()))

    @property
    def client_total(self):
        return int(sum(self.client.values()))

    @property
    def worker_memory_needed(self):
        return memory.needed_limit(self.worker_total)

    @property
    def fits(self):
        return self.workers_fit and self.client_fits

    @property
    def workers_fit(self):
        return self.worker_total <= cluster.TERMINATE_FRACTION * self.worker_memory

    @property
    def client_fits(self):
        return self.client_total <= self.client_memory

    def __str__(self):
        lines = [f"dnomad plan: {self.method} on {self.n:,} x {self.d:,}, {self.where}" + (
            f", {self.n_workers} worker{'s' if self.n_workers > 1 else ''} of {_size(self.worker_memory)}"
            if self.worker else "")]
        if self.chunk_rows:
            lines.append(f"  row chunks of {self.chunk_rows:,} rows")
        if self.block_size:
            lines.append(f"  blocks of {self.block_size:,} x {self.block_size:,}")
        for title, parts in (("each worker", self.worker), ("the client", self.client), ("the store", self.disk)):
            if parts:
                lines.append(f"  {title}: {_size(sum(parts.values()))}")
                lines += [f"    {_size(v):>10}  {k}" for k, v in parts.items()]
        if self.worker:
            verdict = ("fits" if self.workers_fit else "does NOT fit") + (
                f" under {cluster.TERMINATE_FRACTION:.0%} of the workers' limit; needs workers of at least "
                f"{_size(self.worker_memory_needed)}")
            lines.append(f"  {verdict}")
        lines.append(f"  the client {'fits' if self.client_fits else 'does NOT fit'} in the "
                     f"{_size(self.client_memory)} available to this process")
        lines += [f"  {note}" for note in self.notes]
        if self.passes:
            lines.append("  passes:")
            lines += [f"    {k}: {v}" for k, v in self.passes.items()]
        return "\n".join(lines)


def _size(nbytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def plan(data, method="nomad", *, n_workers=None, worker_memory=None, threads_per_worker=1, **params):
    """The memory ``dnomad.fit(data, method, **params)`` needs, before it runs.

    ``data``: X (a NumPy array, a Zarr array or its path: its shape, dtype and chunks
    are read, not its values) or its shape ``(n, d)`` (taken as float64 in memory).  The
    cluster: ``n_workers`` workers of ``worker_memory`` bytes (a number or a size such
    as "8 GiB") running ``threads_per_worker`` tasks each; a count or memory left out is
    taken from the connected client's workers (the smallest memory limit), else this
    process alone with the memory available to it.  Returns a :class:`Plan`;
    ``print(plan)`` reads as a table.

    Row-chunk methods (NOMAD's ``solver="bm"``, NLR, RiemannianKMeans) hold their
    state beside X's row chunks: a worker holds its chunks' share (and, for an X in
    memory, its rows of X and their centred copies), its footprint and its tasks'
    temporaries.  NOMAD's ``solver="cgm"`` stores n x n matrices in blocks, in the
    workers' memory or, where they do not fit in half of it, in Zarr (the store): a
    worker holds its share of the blocks or, out of core, the blocks a task reads; the
    block side follows the workers' limit as a fit's does (or the fit's ``backend`` and
    ``block_size`` where given).  Its client part counts the block step's first
    eigenvectors only (their number grows with Q's rank).  SymNMF stores P so, and its
    client holds the local scales' neighbour table.  HOTTOPIXX holds C (f x f) and,
    where X fits in this process, X's columns in the client; a Zarr X too large for it
    is staged in the store by columns and read by tasks on the workers.  Bregman
    clustering runs in this process: all of it is the client's.
    """
    if method not in ESTIMATORS:
        raise InputValueError(f"method must be one of {sorted(ESTIMATORS)}; got {method!r}")
    est = ESTIMATORS[method](**params)
    validate_params(est)
    n, d = _shape_of(data)
    for check in ("_check", "_check_sizes"):          # the checks a fit makes before any pass
        if hasattr(est, check):
            getattr(est, check)(*(() if check == "_check" else (n, d)))
    n_workers, worker_memory = _cluster(n_workers, worker_memory)
    if not (isinstance(threads_per_worker, (int, np.integer)) and threads_per_worker >= 1):
        raise InputValueError(f"threads_per_worker must be a positive integer; got {threads_per_worker!r}")
    meta = {"kind": "shape", "dtype": None} if isinstance(data, tuple) else builders.input_metadata(data)
    parts = est._memory_parts(n, d, x_kind=meta["kind"])
    chunk_rows = int(getattr(est, "chunk_rows", None) or chunk_rows_for(data, n)) if parts.rows else None
    share = memory.worker_share(parts, n, n_workers, worker_memory, chunk_rows, d=d,
                                x_in_zarr=meta["kind"] == "zarr",
                                x_itemsize=np.dtype(meta["dtype"] or np.float64).itemsize,
                                threads=int(threads_per_worker), backend=getattr(est, "backend", None),
                                block_size=getattr(est, "block_size", None))
    notes = []
    if parts.matrices and not share.matrices_in_memory and getattr(est, "store", None) is None:
        notes.append("the matrices exceed half of the workers' memory: the fit needs store= (out of core)")
    if parts.task:
        notes.append("X is staged in the store: the fit needs store=; its tasks run on a connected client's "
                     "workers, else on this process's threads" if getattr(est, "store", None) is None else
                     "its tasks run on a connected client's workers, else on this process's threads")
    return Plan(method=method, n=n, d=d, where=share.where, n_workers=n_workers, worker_memory=int(worker_memory),
                chunk_rows=share.chunk_rows, block_size=share.block_size, worker=share.worker,
                client=dict({k: int(v) for k, v in parts.client.items()},
                            **({} if parts.in_process else
                               {"driving the workers (futures, messages)": memory.CLIENT_TRAFFIC_BYTES})),
                disk=share.disk, passes=dict(parts.passes), client_memory=int(available_memory()),
                notes=notes)


def _shape_of(data):
    """(n, d) of X or of a shape, without reading X's values."""
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(v, (int, np.integer)) for v in data):
        n, d = (int(v) for v in data)
    else:
        meta = builders.input_metadata(data)
        if meta["shape"] is None or len(meta["shape"]) != 2:
            raise InputValueError(f"data must be X (n_samples, n_features) or its shape (n, d); got "
                                  f"{meta['kind']} of shape {meta['shape']}")
        n, d = (int(v) for v in meta["shape"])
    if n < 2 or d < 1:
        raise InputValueError(f"data must have at least 2 rows and 1 column; got shape ({n}, {d})")
    return n, d


def _cluster(n_workers, worker_memory):
    """(workers, memory limit of each) as given, else the connected client's (its
    smallest limit), else this process with the memory available to it."""
    if n_workers is not None and not (isinstance(n_workers, (int, np.integer)) and n_workers >= 1):
        raise InputValueError(f"n_workers must be a positive integer; got {n_workers!r}")
    if worker_memory is not None:
        worker_memory = memory.parse_size(worker_memory, "worker_memory")
    if n_workers is None or worker_memory is None:
        client = cluster.get_client()
        limits = [] if client is None else [w.get("memory_limit") or 0
                                             for w in cluster.workers_info(client).values()]
        if n_workers is None:
            n_workers = len(limits) or 1
        if worker_memory is None:
            worker_memory = min((v for v in limits if v), default=None) or available_memory()
    return int(n_workers), int(worker_memory)
