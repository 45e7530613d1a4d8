"""Where blocks live and how a pass runs over them.

A :class:`BlockGroup` holds several n x n matrices that share one
:class:`BlockLayout` (for NOMAD: D, P, Gamma, G).  Their blocks live together, per
block key (i, j), in one of three places:

``"local"``
    a dict of NumPy arrays in this process; a pass runs the kernels on a thread
    pool (the kernels release the GIL).  The in-memory twin of the distributed
    backend, and the fast path for small n where a scheduler round trip per
    matvec would cost more than the matvec.
``"distributed"``
    one bundle (a dict name -> array) per key, held in a dask.distributed
    worker's memory.  A pass is one task per key, pinned to the worker that
    holds the bundle, updating it in place; only the small per-block results
    travel back, in one ``gather``.
``"zarr"``
    one Zarr array per matrix in the run's store; a pass is one task per key that
    reads its blocks, runs the kernel and writes the updated blocks back (out of
    core: a worker holds a few blocks, whatever n is).  Tasks run on the cluster
    when there is a client, else on the local thread pool.

Every pass is recorded in :attr:`BlockGroup.passes` (bytes read and written,
seconds, tasks), so solvers and benchmarks can compare a pass with the machine's
bandwidth.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import InputValueError, NotPicklableError, StoreError, WorkerLostError
from . import digest
from .cluster import log_pass, workers_info, workers_to_hold_blocks
from .device import is_device_array, resolve_device, to_device, to_host
from .layout import BlockLayout
from .store import absolute_url

BACKENDS = ("local", "distributed", "zarr")


@dataclass
class PassRecord:
    """What one pass over the blocks cost."""

    name: str
    tasks: int
    bytes_read: int
    bytes_written: int
    seconds: float


class PassLog:
    """The recent passes a group has made, and running totals since it was created.

    ``mark()`` returns a snapshot of the totals; ``since(mark)`` the cost after it.
    """

    FIELDS = ("passes", "tasks", "bytes_read", "bytes_written", "seconds")

    def __init__(self, keep=1000):
        self.records = []
        self.keep = keep
        self._totals = dict.fromkeys(self.FIELDS, 0)

    def add(self, rec: PassRecord):
        self.records.append(rec)
        if len(self.records) > self.keep:
            del self.records[: len(self.records) - self.keep]
        t = self._totals
        t["passes"] += 1
        t["tasks"] += rec.tasks
        t["bytes_read"] += rec.bytes_read
        t["bytes_written"] += rec.bytes_written
        t["seconds"] += rec.seconds

    def mark(self):
        return dict(self._totals)

    def since(self, mark=None):
        if mark is None:
            return dict(self._totals)
        return {k: self._totals[k] - mark[k] for k in self.FIELDS}


# ---------------------------------------------------------------- zarr helpers
def _zarr():
    import zarr

    return zarr


@lru_cache(maxsize=256)
def _open_zarr_array(url: str, path: str, generation: str):
    """Cached handle to an existing array (``generation`` changes when it is re-created;
    under a digesting one, its chunk reads are digested: :mod:`dnomad.blocks.digest`)."""
    if digest.is_digesting(generation):
        return digest.open_array(url, path, generation)
    zarr = _zarr()
    kw = {"path": path} if path else {}
    try:
        return zarr.open_array(store=url, mode="r+", **kw)
    except (PermissionError, OSError):  # a read-only input store
        return zarr.open_array(store=url, mode="r", **kw)


def create_zarr_array(url, path, n, block_size, dtype, *, overwrite=True, attrs=None):
    """Create an n x n array chunked b x b, uncompressed: scratch state is read hundreds of
    times and zstd decodes at ~1 GB/s per core, far below the memory bandwidth."""
    zarr = _zarr()
    arr = zarr.create_array(
        store=url,
        name=path,
        shape=(n, n),
        chunks=(block_size, block_size),
        dtype=dtype,
        compressors=None,
        fill_value=0,
        overwrite=overwrite,
        config={"write_empty_chunks": True},
    )
    if attrs:
        arr.attrs.update(attrs)
    return arr


def _zarr_read(url, path, gen, key, layout):
    """Block ``key`` of an array (a symmetric layout reads only stored blocks i <= j)."""
    arr = _open_zarr_array(url, path, gen)
    (r0, r1), (c0, c1) = layout.bounds(key[0]), layout.bounds(key[1])
    return np.ascontiguousarray(arr[r0:r1, c0:c1])


def _zarr_read_whole(url, path, gen, key, layout):
    """Block ``key`` of a matrix saved by :meth:`BlockGroup.save`, whatever the layout it
    was saved from: where only its upper blocks were written (``dnomad_layout`` "upper",
    in blocks of its chunk size), the entries that fall in its lower blocks (a full
    layout, as on a GPU, or another block size) are read from their mirror images, not
    from the unwritten zeros."""
    block = _zarr_read(url, path, gen, key, layout)
    arr = _open_zarr_array(url, path, gen)
    if arr.attrs.get("dnomad_layout") != "upper":
        return block
    (r0, r1), (c0, c1) = layout.bounds(key[0]), layout.bounds(key[1])
    saved = arr.chunks[0]
    row_blocks, col_blocks = np.arange(r0, r1) // saved, np.arange(c0, c1) // saved
    if row_blocks[-1] <= col_blocks[0]:           # wholly within the saved upper blocks
        return block
    lower = row_blocks[:, None] > col_blocks[None, :]
    block[lower] = np.asarray(arr[c0:c1, r0:r1]).T[lower]
    return block


def _zarr_write(url, path, gen, key, layout, block):
    arr = _open_zarr_array(url, path, gen)
    (r0, r1), (c0, c1) = layout.bounds(key[0]), layout.bounds(key[1])
    arr[r0:r1, c0:c1] = to_host(block)         # device blocks are staged through host memory


# ------------------------------------------------------------ task functions
# Module-level so that workers import them; they never close over large arrays.
def _aligned(obj):
    """``obj`` with every NumPy array in it (through tuples, lists and dicts) aligned.

    Small arrays sent to an actor arrive as views into the message's frame, at any byte
    offset; NumPy's matmul skips BLAS for unaligned operands and sums in another order
    (and more slowly), so worker results would differ from in-process ones."""
    if isinstance(obj, np.ndarray):
        return obj if obj.flags.aligned else np.array(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_aligned(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _aligned(v) for k, v in obj.items()}
    return obj


class _Shard:
    """One worker's share of a BlockGroup held in memory: its blocks' bundles (dicts
    name -> block), updated in place by passes.  Runs as a dask Actor, so a pass is one
    direct call per worker instead of one scheduled task per block (on a 2-worker
    LocalCluster, 3-9 ms per pass over 1-10 blocks instead of 13-44 ms)."""

    def __init__(self, nthreads):
        self.bundles = {}
        self.pool = ThreadPoolExecutor(nthreads) if nthreads > 1 else None

    def _map(self, fn, items):
        return list(self.pool.map(fn, items) if self.pool is not None else map(fn, items))

    def build(self, keys, builder, args_list):
        args_list = _aligned(args_list)
        made = self._map(lambda ka: builder(ka[0], *ka[1]), list(zip(keys, args_list)))
        for key, bundle in zip(keys, made):
            self.bundles.setdefault(key, {}).update(bundle)

    def run(self, func, keys, args_list):
        args_list = _aligned(args_list)
        return self._map(lambda ka: func(self.bundles[ka[0]], ka[0], *ka[1]), list(zip(keys, args_list)))

    def get(self, key, name):
        return self.bundles[key][name]

    def drop(self, names):
        for bundle in self.bundles.values():
            for name in names:
                bundle.pop(name, None)

    def close(self):
        self.bundles = {}
        if self.pool is not None:
            self.pool.shutdown(wait=False)


def _zarr_task(src, dst, layout, key, func, args):
    """Read blocks from ``src`` (name -> location), run ``func``, write to ``dst``.  A
    matrix that the pass both reads and writes has distinct locations in src and dst
    when tasks may run twice (see :meth:`BlockGroup.map_blocks`)."""
    bundle = {name: _zarr_read(*loc, key, layout) for name, loc in src.items()}
    result = func(bundle, key, *_aligned(args))
    for name, loc in dst.items():
        _zarr_write(*loc, key, layout, bundle[name])
    return result


def _zarr_build_task(locs, layout, key, builder, args):
    bundle = builder(key, *_aligned(args))
    for name, block in bundle.items():
        _zarr_write(*locs[name], key, layout, block)
    return None


def _worker_peak_rss():
    """Peak resident memory of this process in bytes.

    Linux's VmHWM starts afresh at exec; ru_maxrss is carried over from the parent,
    so a child of a large process would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextlib.contextmanager
def single_threaded_blas():
    """BLAS limited to one thread in this process while the block kernels run.

    The client's vector work (ARPACK, Householder lifts: O(n) BLAS calls) otherwise wakes
    OpenBLAS's threads, which spin after each call on the cores the block kernels need:
    measured at n = 16000 on 2 cores, each pass ran 30 to 45% slower inside the solver
    than alone.  Dask's nannies already start workers with one BLAS thread.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _n_threads():
    return max(1, min(len(os.sched_getaffinity(0)), 32))


class BlockGroup:
    """Aligned n x n block matrices that live in one place and are updated by fused passes.

    Parameters
    ----------
    layout : BlockLayout
    dtype : numpy dtype, float32 or float64
    backend : {"local", "distributed", "zarr"}
    client : distributed.Client, optional
        Required for "distributed"; used by "zarr" when given.
    store : str, optional
        Zarr store URL (any fsspec URL); required for "zarr".
    prefix : str
        Group path inside the store for the working arrays.
    device : {"cpu", "cuda", "auto"}, optional
        Where the blocks compute (:func:`dnomad.blocks.device.resolve_device`; default
        dask config ``dnomad.device``, else "cpu").  "cuda" keeps the blocks as CuPy
        arrays on the GPU; it runs with the "local" backend in this version.
    """

    def __init__(self, layout: BlockLayout, dtype=np.float32, *, backend="local", client=None,
                 store=None, prefix="state", device=None):
        if backend not in BACKENDS:
            raise InputValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        self.device = resolve_device(device)
        if self.device == "cuda" and backend != "local":
            raise InputValueError(f"device='cuda' runs with backend='local' (blocks in this process's GPU); "
                                  f"got backend={backend!r}")
        if backend == "distributed" and client is None:
            raise InputValueError("backend='distributed' needs a dask.distributed Client")
        if backend == "zarr" and store is None:
            raise InputValueError("backend='zarr' needs a store URL (a directory path or fsspec URL)")
        self.layout = layout
        self.dtype = np.dtype(dtype)
        self.backend = backend
        self.client = client
        # A local path is kept absolute: the matrices stay reachable after a chdir.
        self.store = absolute_url(None if store is None else os.fspath(store))
        self.prefix = prefix
        self.names: list[str] = []
        self.passes = PassLog()
        self._bundles = {}          # local: key -> dict name -> block
        self._owner = {}            # distributed: key -> worker address
        self._shards = {}           # distributed: worker address -> _Shard actor
        self._shard_futures = []
        self._locs = {}             # zarr: name -> (url, path, generation token)
        self._spare = {}            # zarr: name -> the second array of a matrix (see _zarr_pass)
        self._digest_due = {}       # zarr: name -> what to call with its digest after its first pass
        self._pool = None
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex[:8]
        self._counter = itertools.count()

    # ------------------------------------------------------------ basics
    @property
    def n(self):
        return self.layout.n

    def block_nbytes(self, key):
        r, c = self.layout.block_shape(key)
        return r * c * self.dtype.itemsize

    @property
    def matrix_nbytes(self):
        """Bytes of one stored matrix (upper blocks only when symmetric)."""
        return self.layout.stored_elements() * self.dtype.itemsize

    def _new_zarr(self, name):
        path = f"{self.prefix}/{name}"
        create_zarr_array(self.store, path, self.n, self.layout.block_size, self.dtype)
        self._locs[name] = (self.store, path, uuid.uuid4().hex)

    def attach_zarr(self, name, url, path, on_digest=None):
        """Use an existing Zarr array (read in place, e.g. a user's Gram) as matrix ``name``.
        ``on_digest``: called with the digest of the chunks the first pass that reads it
        read (:func:`dnomad.blocks.digest.collect`), before that pass returns."""
        if self.backend != "zarr":
            raise InputValueError("attach_zarr is for the zarr backend; use load() to read into memory")
        self._locs[name] = (str(url), path, digest.new_generation() if on_digest else uuid.uuid4().hex)
        if on_digest is not None:
            self._digest_due[name] = on_digest
        if name not in self.names:
            self.names.append(name)

    def _executor(self):
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_n_threads(), thread_name_prefix="dnomad-block")
        return self._pool

    def _task_key(self, name, key, pass_no=None):
        """``dnomad-<pass name>-<group>-<pass number>-<i>-<j>``: unique, and the tasks of
        one pass share everything but the block index."""
        pass_no = next(self._counter) if pass_no is None else pass_no
        return f"dnomad-{name}-{self._token}-{pass_no}-{key[0]}-{key[1]}"

    def _placement(self, workers):
        """Workers for each key, balancing stored bytes (largest blocks first)."""
        load = {w: 0 for w in workers}
        owner = {}
        for key in sorted(self.layout.keys, key=lambda k: -self.block_nbytes(k)):
            w = min(workers, key=lambda a: load[a])
            owner[key] = w
            load[w] += self.block_nbytes(key)
        return owner

    def _start_shards(self):
        if self._shards:
            return
        info = workers_to_hold_blocks(self.client)
        self._owner = self._placement(sorted(info))
        for w in sorted(set(self._owner.values())):
            fut = self.client.submit(_Shard, int(info[w].get("nthreads", 1)), workers=[w],
                                     allow_other_workers=False, actor=True, pure=False,
                                     key=self._task_key("shard", (0, 0)))
            self._shard_futures.append(fut)
            self._shards[w] = fut.result()

    def _wait(self, make_calls):
        """The actor calls' results (:func:`wait_for_actors`)."""
        return wait_for_actors(self.client, self._shards, make_calls, "blocks of this run")

    def _shard_keys(self):
        """(shard, its keys in layout order) for every worker holding blocks."""
        keys = {}
        for key in self.layout.keys:
            keys.setdefault(self._owner[key], []).append(key)
        return [(self._shards[w], ks) for w, ks in keys.items()]

    # ------------------------------------------------------------ building
    def build(self, names, builder, args_for):
        """Create matrices ``names`` block by block: ``builder(key, *args_for(key))`` returns
        a dict name -> block.  Existing matrices of the group are kept."""
        new = [n for n in names if n not in self.names]
        self.names.extend(new)
        t0 = time.perf_counter()
        try:
            self._build(names, new, builder, args_for)
        except BaseException:
            # A failed build adds no matrix: the group lists only what it holds.
            self.names = [n for n in self.names if n not in new]
            for name in new:
                self._locs.pop(name, None)
            raise
        nbytes = self.matrix_nbytes * len(names)
        self.passes.add(PassRecord(f"build:{','.join(names)}", len(self.layout.keys), 0, nbytes,
                                   time.perf_counter() - t0))

    def _build(self, names, new, builder, args_for):
        if self.backend == "local":
            def run(key):
                bundle = builder(key, *args_for(key))
                if self.device == "cuda":      # built on the host, then moved once
                    bundle = {name: to_device(block, "cuda") for name, block in bundle.items()}
                with self._lock:
                    self._bundles.setdefault(key, {}).update(bundle)
            list(self._executor().map(run, self.layout.keys))
        elif self.backend == "distributed":
            self._start_shards()
            self._wait(lambda: [shard.build(keys, builder, [args_for(k) for k in keys])
                                for shard, keys in self._shard_keys()])  # re-raises a builder's error
        else:
            from .store import writing

            with writing(self.store, f"the working matrices {sorted(names)} of pass 'build:{','.join(names)}' "
                         f"(under {self.prefix}/)", keep="checkpoints already written are intact",
                         store_errors_only=True):
                for name in new:
                    self._new_zarr(name)
                locs = dict(self._locs)
                self._run_tasks(_zarr_build_task, lambda key: (locs, self.layout, key, builder, args_for(key)))

    def _run_tasks(self, fn, args_for_key, name=None):
        """Run ``fn(*args_for_key(key))`` for every key, on the cluster or the thread pool;
        task keys name the pass (``dnomad-<name>-...``, as the dashboard shows them)."""
        keys = self.layout.keys
        if self.client is not None:
            pass_no, label = next(self._counter), name or fn.__name__
            futs = [self.client.submit(fn, *args_for_key(k), key=self._task_key(label, k, pass_no),
                                       pure=False) for k in keys]
            return self.client.gather(futs)
        return list(self._executor().map(lambda k: fn(*args_for_key(k)), keys))

    # ------------------------------------------------------------ passes
    def map_blocks(self, func, args_for, *, reads, writes, name="pass"):
        """One pass: ``func(bundle, key, *args_for(key))`` for every stored key.

        ``func`` reads the matrices in ``reads`` from ``bundle`` (a dict name ->
        block) and updates or adds those in ``writes`` in place; it returns a small
        result (a NumPy array or a tuple of them).  Returns the list of results in
        the order of ``layout.keys``.  One task per block; one gather.  On the Zarr
        backend a failed write (a full disk, a store turned read-only) raises a
        :class:`dnomad.errors.StoreError` naming the store and the pass.
        """
        if self.backend != "zarr" or not writes:
            return self._map_blocks(func, args_for, reads=reads, writes=writes, name=name)
        from .store import writing

        with writing(self.store, f"the working matrices {sorted(set(writes))} of pass {name!r} (under "
                     f"{self.prefix}/)", keep="checkpoints already written are intact", store_errors_only=True):
            return self._map_blocks(func, args_for, reads=reads, writes=writes, name=name)

    def _map_blocks(self, func, args_for, *, reads, writes, name):
        missing = [n for n in reads if n not in self.names]
        if missing:
            raise InputValueError(f"pass {name!r} reads matrices {missing} that the group does not hold")
        for w in writes:
            if w not in self.names:
                self._add_name(w)
        keys = self.layout.keys
        t0 = time.perf_counter()
        if self.device == "cuda":
            # The GPU runs the blocks' kernels in order on one stream: they are issued
            # from this thread, and the small results come to the host after the last
            # one (one synchronization per pass, not per block).
            results = [_results_to_host(r) for r in
                       [func(self._bundles[k], k, *args_for(k)) for k in keys]]
        elif self.backend == "local":
            results = list(self._executor().map(
                lambda k: func(self._bundles[k], k, *args_for(k)), keys))
        elif self.backend == "distributed":
            shard_keys = self._shard_keys()
            parts = self._wait(lambda: [shard.run(func, keys_w, [args_for(k) for k in keys_w])
                                        for shard, keys_w in shard_keys])
            by_key = {}
            for (_, keys_w), part in zip(shard_keys, parts):
                by_key.update(zip(keys_w, part))
            results = [by_key[k] for k in keys]
        else:
            results = self._zarr_pass(func, args_for, reads, writes, name)
        record = PassRecord(name, len(keys), self.matrix_nbytes * len(reads), self.matrix_nbytes * len(writes),
                            time.perf_counter() - t0)
        self.passes.add(record)
        if self.client is not None:
            log_pass(self.client, name, blocks=record.tasks, bytes_read=record.bytes_read,
                     bytes_written=record.bytes_written, seconds=record.seconds)
        return results

    def _zarr_pass(self, func, args_for, reads, writes, name):
        src = {m: self._locs[m] for m in reads}
        dst = {m: self._locs[m] for m in writes}
        # On a cluster a task runs again when its worker dies (even after it finished,
        # if its result was not yet gathered).  A task that updates a block in place
        # would then apply its update twice; so matrices that the pass reads and writes
        # are written to a second array (created once, 2x their disk) and the two swap
        # roles after the pass: every task reads inputs no task of the pass writes.
        swap = [m for m in writes if m in reads] if self.client is not None else []
        for m in swap:
            dst[m] = self._spare_zarr(m)
        results = self._run_tasks(_zarr_task, lambda k: (src, dst, self.layout, k, func, args_for(k)),
                                  name=name)
        for m in swap:
            self._spare[m], self._locs[m] = self._locs[m], dst[m]
        for m in [m for m in reads if m in self._digest_due]:
            url, path, generation = self._locs[m]
            self._locs[m] = (url, path, uuid.uuid4().hex)      # later passes read without digesting
            self._digest_due.pop(m)(digest.collect(generation, self.client))
        return results

    def _spare_zarr(self, name):
        if name not in self._spare:
            path = f"{self.prefix}/{name}.spare"
            create_zarr_array(self.store, path, self.n, self.layout.block_size, self.dtype)
            self._spare[name] = (self.store, path, uuid.uuid4().hex)
        return self._spare[name]

    def _add_name(self, name):
        self.names.append(name)
        if self.backend == "zarr":
            self._new_zarr(name)

    def drop(self, names):
        """Forget matrices (their memory is freed; Zarr arrays stay on disk)."""
        for name in names:
            if name in self.names:
                self.names.remove(name)
                self._locs.pop(name, None)
                self._spare.pop(name, None)
        if self.backend == "local":
            for bundle in self._bundles.values():
                for name in names:
                    bundle.pop(name, None)
        elif self.backend == "distributed":
            self._wait(lambda: [shard.drop(list(names)) for shard in self._shards.values()])

    # ------------------------------------------------------------ in/out
    def block(self, name, key):
        """One block in this process (for tests and small reads): the stored array itself
        for the local backend (a CuPy array for device blocks), else a NumPy copy."""
        if self.backend == "local":
            return self._bundles[key][name]
        if self.backend == "distributed":
            return self._wait(lambda: [self._shards[self._owner[key]].get(key, name)])[0]
        return _zarr_read(*self._locs[name], key, self.layout)

    def save(self, names, url, prefix, *, mirror=False):
        """Write matrices to Zarr arrays ``{prefix}/{name}`` at ``url`` (a checkpoint or a
        result), one task per block, data-local.  ``mirror`` also writes the lower blocks
        of a symmetric layout, so that any Zarr reader sees the whole matrix."""
        mirror = bool(mirror and self.layout.symmetric)
        dest = {}
        for name in names:
            create_zarr_array(url, f"{prefix}/{name}", self.n, self.layout.block_size, self.dtype,
                              attrs={"dnomad_layout": "upper" if self.layout.symmetric and not mirror
                                     else "full"})
            dest[name] = (str(url), f"{prefix}/{name}", uuid.uuid4().hex)

        def args(key):
            return (dest, self.layout, mirror)

        self.map_blocks(_save_blocks, args, reads=list(names), writes=[], name="save")

    def load(self, names, url, prefix):
        """Replace (or add) matrices from Zarr arrays written by :meth:`save`."""
        src = {name: (str(url), f"{prefix}/{name}", uuid.uuid4().hex) for name in names}
        layout, dtype = self.layout, self.dtype

        def args(key):
            return (src, layout, dtype)

        self.build(list(names), _load_blocks, args)

    def close(self):
        """Release the blocks (worker memory, thread pool) and the notes of a digest whose
        pass never finished."""
        for name in list(self._digest_due):
            self._digest_due.pop(name)
            digest.discard(self._locs[name][2], self.client)
        if self.backend == "distributed" and self._shards:
            close_actors(self.client, self._shards, self._shard_futures, "blocks of this run")
            self._shards, self._shard_futures, self._owner = {}, [], {}
        self._bundles = {}
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # ------------------------------------------------------------ pickling
    # Members that belong to this process's run (threads, a lock, the task counter, the
    # cluster's client and actors): left out of a pickle and made afresh on loading.
    _RUNTIME_MEMBERS = ("_pool", "_lock", "_counter", "_token", "client", "_owner", "_shards",
                        "_shard_futures", "_digest_due")

    def __getstate__(self):
        """What a pickle keeps: the layout, dtype, names, pass log, and the blocks (local
        backend, device blocks staged through host memory) or the Zarr arrays' locations
        (zarr backend: a reference to the store, local paths made absolute; the arrays
        stay where they are and are reopened on first use).  A group on the distributed
        backend holds its blocks in the workers' memory and cannot be pickled."""
        if self.backend == "distributed":
            raise NotPicklableError(
                f"a BlockGroup on the distributed backend cannot be pickled: its matrices {self.names} "
                f"live in the memory of the cluster's workers and end with them.  Bring a matrix into "
                f"this process first (blocks.from_array(np.asarray(matrix), ...)) or save it to a Zarr "
                f"store (group.save(names, url, prefix)) and pickle blocks.from_zarr(url, ...) instead")
        state = {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME_MEMBERS}
        if self.device == "cuda":
            state["_bundles"] = {key: {name: to_host(block) for name, block in bundle.items()}
                                 for key, bundle in self._bundles.items()}
        if self.backend == "zarr":
            state["store"] = absolute_url(self.store)
            for member in ("_locs", "_spare"):
                state[member] = {name: (absolute_url(url), path, gen)
                                 for name, (url, path, gen) in getattr(self, member).items()}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.client = None          # a loaded zarr group runs its passes on this process's threads
        self._owner, self._shards, self._shard_futures = {}, {}, []
        self._pool = None
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex[:8]
        self._counter = itertools.count()
        self._digest_due = {}
        if self.device == "cuda":
            self._bundles = {key: {name: to_device(block, "cuda") for name, block in bundle.items()}
                             for key, bundle in self._bundles.items()}
        # New generation tokens: no handle cached before the pickle is taken for these arrays.
        self._locs = {name: (url, path, uuid.uuid4().hex) for name, (url, path, _) in self._locs.items()}
        self._spare = {name: (url, path, uuid.uuid4().hex) for name, (url, path, _) in self._spare.items()}


def wait_for_actors(client, shards, make_calls, holding):
    """Make the actor calls (``make_calls()`` returns them) and their results, in order.
    A call that failed because a worker in ``shards`` (address -> actor) died raises
    :class:`WorkerLostError` naming what it held (``holding``): that state is gone."""
    out = []
    try:
        for call in make_calls():
            out.append(call.result())
    except Exception as exc:
        lost = _lost_workers(client, shards)
        if lost or _is_lost_worker_error(exc):
            raise WorkerLostError(f"worker(s) {lost or '?'} holding {holding} died ({exc!r}); "
                                  f"what they held is gone") from exc
        raise
    return out


def close_actors(client, shards, futures, holding):
    """Close every actor and release its future; a dead worker's state is gone already."""
    try:
        wait_for_actors(client, shards, lambda: [shard.close() for shard in shards.values()], holding)
    except WorkerLostError:
        pass
    client.cancel(list(futures))


def _lost_workers(client, shards):
    try:
        alive = set(workers_info(client))
    except Exception:  # noqa: BLE001 - the scheduler itself is unreachable
        return sorted(shards)
    return sorted(w for w in shards if w not in alive)


# What distributed's actor calls raise when the worker holding the actor is gone: the
# first while the scheduler still lists it (its comm failed), the second once it knows.
_ACTOR_LOST_MESSAGES = ("Unable to contact Actor's worker", "Actor was lost")


def _is_lost_worker_error(exc):
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError

    return isinstance(exc, (CommClosedError, FutureCancelledError)) or any(
        message in str(exc) for message in _ACTOR_LOST_MESSAGES)


def _results_to_host(result):
    """A task's small result with its CuPy arrays copied to the host."""
    if isinstance(result, tuple):
        return tuple(_results_to_host(r) for r in result)
    return to_host(result) if is_device_array(result) else result


def _save_blocks(bundle, key, dest, layout, mirror):
    for name, loc in dest.items():
        _zarr_write(*loc, key, layout, bundle[name])
        if mirror and key[0] != key[1]:
            _zarr_write(*loc, (key[1], key[0]), layout, bundle[name].T)
    return None


def _load_blocks(key, src, layout, dtype):
    out = {}
    for name, loc in src.items():
        block = _zarr_read_whole(*loc, key, layout)
        if block.dtype != dtype:
            from .store import redact

            raise StoreError(f"array {loc[1]!r} in {redact(loc[0])!r} has dtype {block.dtype}, expected "
                             f"{dtype}")
        out[name] = block
    return out
