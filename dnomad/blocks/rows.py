"""Tall data read by row chunks, with per-chunk state, and passes that map a kernel
over the chunks: the map-reduce that the row-separable solvers (Riemannian K-means,
NLR) are made of.

A :class:`RowChunks` cuts X (n x d) into chunks of rows.  Next to each chunk's rows it
keeps named state arrays with the same rows (the solver's n x k iterates).  A pass
calls ``kernel(chunk, *args)`` on every chunk -- ``chunk`` is a dict holding ``"X"``
(the chunk's rows, centred) and the state arrays, which the kernel may replace -- and
returns the kernels' small results in chunk order, so that sums formed from them do
not depend on where or in which order the chunks ran.

Backends: ``"local"`` runs the chunks on a thread pool in this process;
``"distributed"`` keeps each chunk's state in a dask.distributed worker's memory (one
actor per worker, as :class:`~dnomad.blocks.engine.BlockGroup`), so a pass is one call
per worker and only the small results and the arguments travel.  X held in memory is
sent to the workers once; X in Zarr is read chunk by chunk in every pass, by the
worker that runs the chunk (out of core: a pass holds one chunk of X per thread).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputValueError
from . import digest
from . import store as run_store
from .cluster import log_pass, workers_info, workers_to_hold_blocks
from .engine import _n_threads, _open_zarr_array, _Shard, close_actors, wait_for_actors

logger = logging.getLogger(__name__)

# Rows per chunk for X in memory; Zarr X uses its own chunking (or a multiple of it).
DEFAULT_CHUNK_ROWS = 8192
# A smaller X in memory is cut into up to SPREAD chunks of at least MIN_CHUNK_ROWS rows.
SPREAD, MIN_CHUNK_ROWS = 8, 1024


def default_chunk_rows(n):
    """Rows per chunk for an in-memory X of n rows: DEFAULT_CHUNK_ROWS, or, where that
    would leave fewer than SPREAD chunks, n split evenly into as many chunks of at least
    MIN_CHUNK_ROWS as fit, up to SPREAD (no short tail chunk).  The kernels
    run one chunk per thread, with BLAS on one thread where the solver asks for it
    (Burer-Monteiro), so one chunk used one core: on the 6,903 MNIST zeros at r = 1,024,
    an evaluation took 1.0 s in one chunk, 0.56 s in 7 of 1,024 rows and a 759-row tail,
    0.52 s in the 6 even chunks this gives, on 2 cores.  The count does
    not depend on the machine's cores, so neither do the sums' round-off and results."""
    count = max(1, min(SPREAD, n // MIN_CHUNK_ROWS))
    return min(DEFAULT_CHUNK_ROWS, -(-n // count))


def chunk_rows_for(X, n):
    """The rows per chunk :class:`RowChunks` gives X (n rows) by default: a Zarr array's
    own chunking (X is read where it is), else :func:`default_chunk_rows`."""
    if isinstance(X, str) or hasattr(X, "__fspath__") or type(X).__module__.startswith("zarr"):
        from .builders import input_metadata

        chunks = input_metadata(X).get("chunks")
        if chunks:
            return int(chunks[0])
    return default_chunk_rows(n)


# Random rows are drawn in fixed blocks of this many rows, each from its own stream, so that
# row i's values do not depend on how the rows are chunked.
RANDOM_BLOCK_ROWS = 4096


def stream_key(rng):
    """A key for :func:`random_rows` drawn from the generator ``rng``."""
    return int(rng.integers(2**63))


def random_rows(key, r0, r1, width, draw="standard_normal"):
    """Rows r0..r1 of an n x ``width`` random matrix (``draw``: "standard_normal" or
    "random", uniform in [0, 1)) whose block of RANDOM_BLOCK_ROWS rows b comes from
    ``np.random.default_rng([key, b])``: any chunk draws its own rows, and the matrix is
    the same whatever the chunks."""
    out = np.empty((r1 - r0, width))
    for b in range(r0 // RANDOM_BLOCK_ROWS, -(-r1 // RANDOM_BLOCK_ROWS)):
        b0 = b * RANDOM_BLOCK_ROWS
        rows = getattr(np.random.default_rng([key, b]), draw)((RANDOM_BLOCK_ROWS, width))
        lo, hi = max(r0, b0), min(r1, b0 + RANDOM_BLOCK_ROWS)
        out[lo - r0:hi - r0] = rows[lo - b0:hi - b0]
    return out


class RowChunks:
    """X (n x d, a NumPy array, a Zarr array or a Zarr path) in row chunks.

    Parameters
    ----------
    X : array_like, zarr.Array or str
    chunk_rows : int, optional
        Rows per chunk (default :func:`default_chunk_rows`: 8192 in memory, fewer for
        X under 65,536 rows so that it still makes up to 8 chunks; the Zarr chunking for
        Zarr X).
    client : distributed.Client, optional
        Run the chunks on its workers ("distributed"); else in this process ("local").
    workers : list of str, optional
        The workers (addresses) that hold chunks; default all of the client's.
    center : bool
        Subtract the column mean from every chunk as it is handed to a kernel.
    keep_centred : bool
        Keep each in-memory chunk's centred rows, once in each precision a pass asked
        for, instead of converting them on every pass (the conversion was 35% of a
        float64 pass over all 70,000 MNIST digits); costs those copies' memory (n d 8
        bytes in float64, n d 4 more where passes also ask for float32).  Rows read
        from Zarr are never kept: they stream.

    on_digest : callable, optional
        For X in Zarr: called with the digest of the chunks the construction pass read
        (:mod:`dnomad.blocks.digest`), before any other pass; for a dask X, with the
        crc32c of each chunk's rows once computed.

    Construction makes one pass over X: it checks that X is finite and computes
    ``mean`` and ``gram`` = F^T F for the centred F (d x d).  Attributes ``passes``
    (passes over X so far, construction included), ``rows_read`` and ``seconds`` count
    the work; ``state_passes`` and ``state_seconds`` the passes over the state alone.
    """

    def __init__(self, X, *, chunk_rows=None, client=None, workers=None, center=True, keep_centred=True,
                 on_digest=None):
        self.source = None
        computed = False
        if isinstance(X, str) or hasattr(X, "__fspath__"):
            self.source = (str(X), "")
            X = _open_zarr_array(str(X), "", "input")
        elif type(X).__module__.startswith("zarr"):
            self.source = digest.zarr_location(X)
            if self.source is None:
                raise InputValueError("a Zarr array for X must live in a local directory store; "
                                      "pass its path or URL instead")
        else:
            computed = hasattr(X, "dask")           # a dask array: its content is known once computed
            X = np.asarray(X)
        if getattr(X, "ndim", None) != 2:
            raise InputValueError(f"X must be a 2-D array (n_samples, n_features); got shape "
                                  f"{getattr(X, 'shape', None)}")
        if not np.issubdtype(X.dtype, np.number) or np.issubdtype(X.dtype, np.complexfloating):
            raise InputValueError(f"X must hold real numbers; got dtype {X.dtype}")
        self.n, self.d = (int(v) for v in X.shape)
        if self.n == 0 or self.d == 0:
            raise InputValueError(f"X is empty: shape {X.shape}")
        if chunk_rows is None:
            own = X.chunks[0] if self.source is not None else 0
            chunk_rows = own or default_chunk_rows(self.n)
        if not (isinstance(chunk_rows, (int, np.integer)) and chunk_rows >= 1):
            raise InputValueError(f"chunk_rows must be a positive integer; got {chunk_rows!r}")
        self.chunk_rows = int(chunk_rows)
        self.spans = [(r0, min(self.n, r0 + self.chunk_rows)) for r0 in range(0, self.n, self.chunk_rows)]
        self.client = client
        self._workers = None if workers is None else list(workers)
        self.backend = "distributed" if client is not None else "local"
        self._X = X if self.source is None else None
        self.passes, self.state_passes, self.rows_read, self.seconds, self.state_seconds = 0, 0, 0, 0.0, 0.0
        self._pool = None
        self._keep = False              # until the mean is known
        self._chunks = {}               # local: index -> state dict
        self._shards, self._owner, self._shard_futures = {}, {}, []
        self.mean = np.zeros(self.d)
        generation = self._generation = digest.new_generation() if on_digest and self.source else "input"
        try:
            if self.backend == "distributed":
                self._start_shards()
            stats = self.map(_column_stats)
        except BaseException:
            if digest.is_digesting(generation):
                digest.discard(generation, client)
            raise
        finally:
            self._generation = "input"          # later passes read X without digesting
        if not all(s[2] for s in stats):
            if digest.is_digesting(generation):
                digest.discard(generation, client)
            raise InputValueError("X contains NaN or Inf")
        if digest.is_digesting(generation):
            on_digest(digest.collect(generation, client))
        elif on_digest is not None and computed:
            on_digest({f"rows {r0}:{r1}": [digest.crc32c(X[r0:r1]), X[r0:r1].nbytes] for r0, r1 in self.spans})
        total = sum(s[0] for s in stats)
        xtx = sum(s[1] for s in stats)
        self.mean = total / self.n if center else np.zeros(self.d)
        self.gram = xtx - self.n * np.outer(self.mean, self.mean)
        self._keep = bool(keep_centred) and self.source is None

    # ------------------------------------------------------------ passes
    def map(self, kernel, *args, read_x=True, x_state=None, dtype=np.float64, with_span=False):
        """``[kernel(chunk, *args) for every chunk]``, in chunk order: one pass over X, or,
        with ``read_x=False``, over the state alone (``chunk`` holds no ``"X"``; X in
        Zarr is not read), or, with ``x_state`` a state's name, over the state with that
        state as ``chunk["X"]`` (features derived from X, e.g. its projection on
        principal components, that later passes read in X's place).  ``dtype``: the
        precision of ``chunk["X"]`` (float32 halves the cost of a kernel's products with
        it where that is accurate enough).  ``with_span``: called as ``kernel(chunk, (r0,
        r1), *args)``, the chunk's rows of X.  Passes that read X count in ``passes``, the
        others in ``state_passes``."""
        t0 = time.perf_counter()
        if x_state is not None:
            read_x = False
            rows_of = (lambda i: _StateRows(x_state))
        else:
            rows_of = self._rows_of if read_x else (lambda i: False)
        out = self._run(kernel, args, rows_of, dtype, with_span=with_span)
        if read_x:
            self.passes += 1
            self.rows_read += self.n
        else:
            self.state_passes += 1
            self.state_seconds += time.perf_counter() - t0
        self.seconds += time.perf_counter() - t0
        if self.backend != "local":
            log_pass(self.client, getattr(kernel, "__name__", "rows").lstrip("_"), chunks=len(self.spans),
                     rows=self.n if read_x else 0, seconds=time.perf_counter() - t0)
        return out

    def _run(self, kernel, args, rows_of, dtype=np.float64, with_span=False):
        """The kernel on every chunk (see :meth:`map`), not counted as a pass; with
        ``with_span`` called as ``kernel(chunk, (r0, r1), *args)``, the chunk's place in X."""
        args_of = (lambda i: (self.spans[i],) + args) if with_span else (lambda i: args)
        if self.backend == "local":
            def run(i):
                state = self._chunks.setdefault(i, {})
                return _chunk_task(state, i, kernel, rows_of(i), self.mean, args_of(i), dtype, self._keep)

            if self._pool is None and _n_threads() > 1 and len(self.spans) > 1:
                self._pool = ThreadPoolExecutor(_n_threads(), thread_name_prefix="dnomad-rows")
            indices = range(len(self.spans))
            return list(self._pool.map(run, indices) if self._pool is not None else map(run, indices))
        return self._call_shards(lambda shard, keys: shard.run(
            _chunk_task, keys, [(kernel, rows_of(i), self.mean, args_of(i), dtype, self._keep) for i in keys]))

    def _rows_of(self, i):
        """What a task needs to get chunk i's rows of X: the rows themselves (in memory)
        or where to read them (Zarr)."""
        r0, r1 = self.spans[i]
        if self.source is not None:
            return (self.source[0], self.source[1], self._generation, r0, r1)
        return self._X[r0:r1] if self.backend == "local" else None     # workers hold theirs

    def gather(self):
        """X (n x d, uncentred) in memory: one pass."""
        return np.concatenate(self.map(_chunk_rows), axis=0) + self.mean

    def put(self, name, A, dtype=None):
        """Store the rows of A (n x k; in ``dtype`` if given) as state ``name``, chunk by
        chunk; A in a store (:class:`dnomad.blocks.store.StoredRows`) is read by each chunk
        where it lives."""
        if isinstance(A, run_store.StoredRows):
            _check_rows(name, A.shape, self.n)
            self._run(_read_stored_rows, (name, A, dtype), _no_rows, with_span=True)   # as a put: no pass
            return
        A = np.asarray(A, dtype=dtype)
        _check_rows(name, A.shape, self.n)
        if self.backend == "local":
            for i, (r0, r1) in enumerate(self.spans):
                self._chunks.setdefault(i, {})[name] = np.array(A[r0:r1])
        else:
            self._call_shards(lambda shard, keys: shard.build(
                keys, _state_bundle, [(name, np.array(A[slice(*self.spans[i])])) for i in keys]))

    def get(self, name):
        """State ``name`` as one n x k array."""
        if self.backend == "local":
            parts = [self._chunks[i][name] for i in range(len(self.spans))]
        else:
            parts = [None] * len(self.spans)
            for shard, keys in self._shard_keys():
                for i, part in zip(keys, self._wait(lambda: [shard.get(i, name) for i in keys])):
                    parts[i] = part
        return np.concatenate(parts, axis=0)

    def held(self, name):
        """State ``name`` as a value that stays in the chunks: a checkpoint writes it from
        where it is held (:meth:`save_state`), never through this process."""
        return HeldRows(self, name)

    def save_state(self, name, url, path):
        """Write state ``name`` to a Zarr array at ``path`` in the store ``url``, each chunk
        its own rows, where it lives (the array is chunked as the row chunks are: no two
        tasks write one Zarr chunk).  Returns its shape."""
        url = run_store.absolute_url(str(url))
        tail, dtype = _one_layout(name, self._run(_state_layout, (name,), _no_rows))     # as a get: no pass
        shape = (self.n,) + tail
        run_store.create_rows_array(url, path, shape, dtype, self.chunk_rows)
        try:
            self._run(_write_state_rows, (name, url, path), _no_rows, with_span=True)
            missing = len(self.spans) - run_store.stored_chunks(url, path)
            why = f"{missing} of {len(self.spans)} chunks not in the store" if missing else None
        except OSError as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            # Workers that cannot reach the store (another machine's disk) fail, or write
            # to a path of the same name that this process does not see: from here, then.
            logger.warning("state %r: the row chunks could not write it to %s (%s); written from this "
                           "process", name, run_store.redact(url), why)
            run_store.write_row_span(url, path, 0, self.get(name))
        return shape

    def rename(self, old, new):
        """State ``old`` as state ``new`` (replacing any state of that name), where the
        chunks hold it (a pass over the state alone)."""
        self.map(_renamed_state, old, new, read_x=False)

    def drop(self, name):
        """Forget state ``name`` (no pass over X)."""
        if self.backend == "local":
            for state in self._chunks.values():
                state.pop(name, None)
        else:
            self._wait(lambda: [shard.drop([name]) for shard in self._shards.values()])

    def close(self):
        """Release the state (worker memory, thread pool)."""
        if self._shards:
            close_actors(self.client, self._shards, self._shard_futures, "row chunks")
            self._shards, self._shard_futures, self._owner = {}, [], {}
        self._chunks = {}
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ workers
    def _start_shards(self):
        """One actor per worker; chunks placed in contiguous runs of about equal rows."""
        info = workers_to_hold_blocks(self.client) if self._workers is None else workers_info(self.client)
        workers = sorted(info) if self._workers is None else self._workers
        unknown = sorted(set(workers) - set(info))
        if not workers or unknown:
            raise InputValueError(f"no workers to hold the row chunks (unknown: {unknown}; the "
                                  f"cluster has {sorted(info)})")
        per = -(-len(self.spans) // len(workers))
        for i in range(len(self.spans)):
            self._owner[i] = workers[i // per]
        for w in sorted(set(self._owner.values())):
            fut = self.client.submit(_Shard, int(info[w].get("nthreads", 1)), workers=[w],
                                     allow_other_workers=False, actor=True, pure=False)
            self._shard_futures.append(fut)
            self._shards[w] = fut.result()
        if self.source is None:         # X in memory: each worker keeps its chunks' rows
            self._call_shards(lambda shard, keys: shard.build(
                keys, _state_bundle, [("_X", self._X[slice(*self.spans[i])]) for i in keys]))
        else:
            self._call_shards(lambda shard, keys: shard.build(keys, _state_bundle, [(None, None)] * len(keys)))

    def _shard_keys(self):
        keys = {}
        for i in range(len(self.spans)):
            keys.setdefault(self._owner[i], []).append(i)
        return [(self._shards[w], ks) for w, ks in keys.items()]

    def _call_shards(self, call):
        """``call(shard, keys)`` on every shard; their results, put back in chunk order."""
        pairs = self._shard_keys()
        results = self._wait(lambda: [call(shard, keys) for shard, keys in pairs])
        out = [None] * len(self.spans)
        for (_, keys), res in zip(pairs, results):
            for i, r in zip(keys, res if res is not None else [None] * len(keys)):
                out[i] = r
        return out

    def _wait(self, make_calls):
        return wait_for_actors(self.client, self._shards, make_calls, "row chunks")


class RowState:
    """Per-row state of n rows with no X beside it, in this process: the row space of a
    solver whose products with D come from elsewhere (a block matrix, a low-rank
    factor).  The state interface of :class:`RowChunks` (``map`` with
    ``read_x=False``, ``put``, ``get``, ``held``, ``save_state``, ``rename``, ``drop``, ``close``),
    on one chunk by default."""

    backend = "local"

    def __init__(self, n, *, chunk_rows=None):
        if not (isinstance(n, (int, np.integer)) and n >= 1):
            raise InputValueError(f"n must be a positive integer; got {n!r}")
        self.n = int(n)
        step = int(chunk_rows or n)
        self.spans = [(r0, min(self.n, r0 + step)) for r0 in range(0, self.n, step)]
        self._chunks = [{} for _ in self.spans]
        self.passes, self.state_passes, self.rows_read, self.seconds, self.state_seconds = 0, 0, 0, 0.0, 0.0

    def map(self, kernel, *args, read_x=False, x_state=None, dtype=None, with_span=False):
        """As :meth:`RowChunks.map` over the state alone: ``chunk["X"]`` is state
        ``x_state`` (read-only, in ``dtype`` if given) where that is given; ``with_span``
        passes each chunk's (r0, r1) after it."""
        if read_x:
            raise InputValueError("RowState holds no X to read")
        t0 = time.perf_counter()
        out = []
        for chunk, span in zip(self._chunks, self.spans):
            chunk_args = ((span,) if with_span else ()) + args
            out.append(kernel(chunk, *chunk_args) if x_state is None else
                       _on_state_rows(kernel, chunk, x_state, dtype, chunk_args))
        self.state_passes += 1
        self.state_seconds += time.perf_counter() - t0
        self.seconds += time.perf_counter() - t0
        return out

    def put(self, name, A, dtype=None):
        A = np.asarray(A, dtype=dtype)
        _check_rows(name, A.shape, self.n)
        for chunk, (r0, r1) in zip(self._chunks, self.spans):
            chunk[name] = np.array(A[r0:r1])

    def get(self, name):
        return np.concatenate([chunk[name] for chunk in self._chunks], axis=0)

    def held(self, name):
        return HeldRows(self, name)

    def save_state(self, name, url, path):
        A = self.get(name)
        run_store.write_rows(url, path, A)
        return A.shape

    def rename(self, old, new):
        self.map(_renamed_state, old, new)

    def drop(self, name):
        for chunk in self._chunks:
            chunk.pop(name, None)

    def close(self):
        self._chunks = [{} for _ in self.spans]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HeldRows:
    """State ``name`` of row chunks (a :class:`RowChunks` or :class:`RowState`) as a
    checkpoint's value: :meth:`dnomad.blocks.store.Checkpoints.save` has the chunks write
    it (``save_to``), so a solver's n x r iterate is never gathered into this process to
    be saved; :meth:`~dnomad.blocks.store.Checkpoints.load` gives it back as
    :class:`~dnomad.blocks.store.StoredRows`, which ``put`` reads where the chunks live.
    It refers to the chunks' state as it is, which the solver goes on changing: a
    checkpoint callable that keeps a state writes it, or copies it (``np.asarray``
    gathers the values now) before it returns."""

    def __init__(self, space, name):
        self.space, self.name = space, name

    def save_to(self, url, path):
        return self.space.save_state(self.name, url, path)

    def __array__(self, dtype=None, copy=None):
        A = self.space.get(self.name)
        return A if dtype is None else A.astype(dtype, copy=False)


def running_rows(n, chunk_rows):
    """Rows of n in chunks of ``chunk_rows`` whose tasks run at once in this process (one
    chunk a thread): what their temporaries are counted for."""
    return min(n, _n_threads() * chunk_rows)


def ordered_sum(parts):
    """Per-chunk results (a :meth:`RowChunks.map`'s, or any iterable of them) added in
    chunk order: the same total wherever the chunks ran."""
    total = None
    for p in parts:
        total = p if total is None else total + p
    return total


def _renamed_state(chunk, old, new):
    chunk[new] = chunk.pop(old)


def _on_state_rows(kernel, chunk, name, dtype, args):
    chunk["X"] = np.asarray(chunk[name], dtype=dtype).view()
    chunk["X"].flags.writeable = False          # as RowChunks' state rows: a kernel must not write it
    try:
        return kernel(chunk, *args)
    finally:
        chunk.pop("X", None)


def _no_rows(i):
    return False                # a task over the state alone: X is not read


def _check_rows(name, shape, n):
    if len(shape) == 0 or shape[0] != n:
        raise InputValueError(f"state {name!r} must have {n} rows; got shape {tuple(shape)}")


def _one_layout(name, layouts):
    """The (trailing shape, dtype) every chunk's state ``name`` has."""
    if any(layout != layouts[0] for layout in layouts):
        raise InputValueError(f"state {name!r} differs in shape or dtype between chunks: {sorted(set(layouts))}")
    return layouts[0]


# ------------------------------------------------------------ task functions
# Module-level so that workers import them.
def _state_layout(chunk, name):
    return tuple(chunk[name].shape[1:]), chunk[name].dtype.str


def _write_state_rows(chunk, span, name, url, path):
    run_store.write_row_span(url, path, span[0], chunk[name])


def _read_stored_rows(chunk, span, name, stored, dtype):
    chunk[name] = np.asarray(stored.rows(*span), dtype=dtype)


def _chunk_task(state, index, kernel, rows, mean, args, dtype=np.float64, keep=False):
    """Run ``kernel`` on one chunk: its rows of X (given; read from Zarr when ``rows``
    says where they are; the state's own copy when None; none when False), centred and
    in ``dtype``, and its state; keep the state the kernel leaves, without the states it
    removed (and, with ``keep``, the centred rows, in state "_Xc" by dtype, for the later
    passes in that dtype)."""
    chunk = {k: v for k, v in state.items() if k not in ("_X", "_Xc")}
    kept = state.get("_Xc", {}).get(np.dtype(dtype).str)
    if isinstance(rows, _StateRows):
        chunk["X"] = np.asarray(state[rows.name], dtype=dtype).view()
        chunk["X"].flags.writeable = False          # read by every later pass: a kernel must not write it
    elif rows is not False and kept is not None:
        chunk["X"] = kept
    elif rows is not False:
        if rows is None:
            rows = state["_X"]
        elif isinstance(rows, tuple):
            url, path, generation, r0, r1 = rows
            rows = _open_zarr_array(url, path, generation)[r0:r1]
        rows = np.asarray(rows)
        if rows.dtype == dtype:         # nothing to lose: centred in their own precision
            chunk["X"] = rows - mean.astype(dtype)
        else:
            # centred in float64, then cast: rows far from the origin cast first would
            # lose their spread (float64 data offset by 1e6 moved a float32 start by 13%)
            chunk["X"] = (rows.astype(np.float64) - mean).astype(dtype, copy=False)
        if keep:
            chunk["X"].flags.writeable = False      # shared by every later pass: a kernel must not write it
            state.setdefault("_Xc", {})[np.dtype(dtype).str] = chunk["X"]
    out = kernel(chunk, *args)
    for name in [name for name in state if name not in chunk and name not in ("_X", "_Xc")]:
        del state[name]             # the kernel dropped or renamed it
    for name, value in chunk.items():
        if name not in ("X", "_X", "_Xc"):
            state[name] = value
    return out


class _StateRows:
    """A pass's X taken from the chunk's state ``name`` (see :meth:`RowChunks.map`)."""

    def __init__(self, name):
        self.name = name


def _state_bundle(index, name, block):
    return {} if name is None else {name: block}


def _chunk_rows(chunk):
    return chunk["X"]


def _column_stats(chunk):
    X = chunk["X"]
    return X.sum(axis=0), X.T @ X, bool(np.isfinite(X).all())
