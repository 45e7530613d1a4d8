"""The one place that finds a dask.distributed client or starts a LocalCluster, and that picks a
backend for n x n matrices from their size and the memory that would hold them."""
from __future__ import annotations

import contextlib
import logging
import math

from ..errors import InputValueError


logger = logging.getLogger(__name__)


# Below this n the in-process backend runs even when a cluster is connected: a NOMAD
# inner step (6 passes) then takes under 50 ms, and a cluster's round trips add 2 to 9 ms
# per pass (graphs/backend_threshold.py measures both on one machine).
LOCAL_MAX_N = 8000
BACKEND_CHOICES = ("auto", "local", "distributed", "zarr")
# Rows from which "auto" runs the row-chunk solvers on a connected cluster's workers.
ROWS_DISTRIBUTED_MIN = 200_000


def get_client():
    """The connected dask.distributed client, or None."""
    try:
        from distributed import get_client as current_client

        return current_client()
    except (ImportError, ValueError):
        return None


def workers_info(client):
    """{address: identity} of every worker the scheduler knows now, asked of the scheduler.

    Not ``client.scheduler_info()``: that returns the client's cached identity, which the
    client's own periodic refresh (every 2 s, asking for no workers) can overwrite between
    the fetch and the read, leaving ``"workers"`` empty on a cluster that has them."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


# How long a fit waits for a cluster that has no workers yet (a batch system's workers
# may still be queued) before it refuses.
WORKER_WAIT_SECONDS = 60


def workers_to_hold_blocks(client):
    """:func:`workers_info`, waiting up to WORKER_WAIT_SECONDS for a first worker."""
    workers = workers_info(client)
    if not workers:
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
        except TimeoutError:
            raise InputValueError(
                f"the connected dask cluster ({client.scheduler.address}) has no workers after "
                f"{WORKER_WAIT_SECONDS} s; start workers (or scale the cluster) before fitting") from None
        workers = workers_info(client)
    return workers


# The scheduler's event topic of every pass a fit runs on a cluster's workers (also
# published to "all", which the dashboard's /events page draws).
PASS_EVENTS = "dnomad-passes"


def log_pass(client, name, **numbers):
    """Publish one pass (its name, and numbers such as blocks, bytes read and written,
    seconds) to the scheduler's event log: the dashboard's /events page shows each pass
    as it runs, and ``client.get_events("dnomad-passes")`` returns them.  Sent without
    waiting for the scheduler's answer (Client.log_event waits: 0.4 ms, a tenth of a
    4 ms pass on a local cluster)."""
    if getattr(client, "status", None) != "running":
        return
    msg = {"action": f"dnomad {name}", "pass": name, **{k: float(v) if isinstance(v, float) else int(v)
                                                          for k, v in numbers.items()}}
    scheduler = client.scheduler

    async def publish():
        try:
            await scheduler.log_event(topic=["all", PASS_EVENTS], msg=msg)
        except Exception as exc:  # noqa: BLE001 - a closing client: the pass itself went well
            logger.debug("pass event not published: %s", exc)

    client.loop.add_callback(publish)


@contextlib.contextmanager
def cluster_client(n_workers=None):
    """The current dask.distributed client, else an embedded LocalCluster closed on exit."""
    client = get_client()
    if client is not None:
        yield client
        return
    import os

    from distributed import Client, LocalCluster

    ncores = len(os.sched_getaffinity(0))
    cluster = LocalCluster(n_workers=n_workers or max(1, min(ncores, 4)), threads_per_worker=1,
                           processes=True, dashboard_address=":0" if _has_dashboard() else None)
    client = Client(cluster)
    logger.info("started an embedded LocalCluster: %s", cluster)
    if _has_dashboard():
        logger.info("its dashboard: %s (each pass on its /events page)", client.dashboard_link)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _has_dashboard():
    """distributed's dashboard needs bokeh."""
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


# distributed's nanny restarts a worker whose memory passes this fraction of its limit.
TERMINATE_FRACTION = 0.95
# A worker that has run dnomad's passes holds about 245 MiB before any block (the
# interpreter, dask, NumPy/SciPy/Zarr, numba and the kernels' compiled code; not the
# estimators or scikit-learn, which it does not import: 310 MiB when it did), and one task
# of a pass over blocks up to about 2 blocks more (on workers of 400 MiB: NOMAD's default
# path 1.5, SymNMF's affinity and Frank-Wolfe passes 2.1); 3 leaves a block of headroom.
WORKER_FOOTPRINT_BYTES = 256 << 20
# A worker that has run only row-chunk passes (NLR, Burer-Monteiro, Riemannian K-means)
# holds less beyond its rows' states: 146 MiB after NLR's on 20,000 rows, and at 10^6
# rows the measured peaks less the planned states leave 156 (NLR) and 173 MiB (bm).
ROW_WORKER_FOOTPRINT_BYTES = 176 << 20
TASK_BLOCKS = 3


def tightest_worker_memory(client):
    """(memory limit, memory in use) in bytes of the worker with the least room under its
    limit, from the scheduler's last heartbeats; None where no worker has a limit."""
    workers = [(w["memory_limit"], w.get("metrics", {}).get("memory", 0))
               for w in workers_info(client).values() if w.get("memory_limit")]
    return min(workers, key=lambda w: TERMINATE_FRACTION * w[0] - w[1], default=None)


def block_bytes_for_workers(client, smallest_bytes):
    """The block size in bytes that one task of a pass may hold on ``client``'s workers:
    their room under the tightest memory limit beyond a worker's own footprint, over
    TASK_BLOCKS; at least ``smallest_bytes`` (the smallest block the engine makes), and
    None where the workers have no memory limit.  Refuses, before any pass, workers
    whose room beyond the memory they use now cannot hold TASK_BLOCKS of the smallest
    block, naming the memory limit they would need."""
    memory = tightest_worker_memory(client)
    if memory is None:
        return None
    limit, used = memory
    if TERMINATE_FRACTION * limit - used < TASK_BLOCKS * smallest_bytes:
        need = (max(used, WORKER_FOOTPRINT_BYTES) + TASK_BLOCKS * smallest_bytes) / TERMINATE_FRACTION
        raise InputValueError(
            f"the cluster's workers have too little memory for the smallest blocks "
            f"({smallest_bytes / 2**20:.0f} MiB each, {TASK_BLOCKS} held by a task): the tightest has a "
            f"memory limit of {limit / 2**20:.0f} MiB with {used / 2**20:.0f} MiB in use; start workers with a "
            f"memory limit of at least {math.ceil(need / 2**20)} MiB")
    room = TERMINATE_FRACTION * limit - max(used, WORKER_FOOTPRINT_BYTES)
    return max(int(room / TASK_BLOCKS), int(smallest_bytes))


def choose_backend(backend, n, dtype, *, n_matrices, store, what):
    """The backend for ``n_matrices`` stored n x n symmetric matrices (upper blocks).

    ``backend`` other than "auto" is returned as given (checked).  "auto": in this
    process for n < LOCAL_MAX_N or when no dask client is connected, else the client's
    workers; in Zarr (needs ``store``) when the matrices do not fit in half of the memory
    that would hold them.
    """
    if backend not in BACKEND_CHOICES:
        raise InputValueError(f"backend must be one of {BACKEND_CHOICES}; got {backend!r}")
    if backend != "auto":
        if backend == "zarr" and store is None:
            raise InputValueError("backend='zarr' needs store= (where the n x n matrices live)")
        return backend
    need = n_matrices * n * n / 2 * dtype.itemsize
    client = get_client()
    if client is not None and n >= LOCAL_MAX_N:
        mem = sum(w.get("memory_limit", 0)
                  for w in workers_info(client).values())
        in_memory = "distributed"
    else:
        # Without a cluster (or for small n) the blocks stay in this process: on one
        # machine a LocalCluster runs the same kernels with a round trip per pass on
        # top (graphs/backend_threshold.py: 2.1x slower per NOMAD inner step at
        # n = 8000, 1.36x at 16000 on 2 cores), so starting one would never pay.
        from .matrix import available_memory

        mem = available_memory()
        in_memory = "local"
    if need > 0.5 * mem:
        if store is None:
            raise InputValueError(f"{what} needs {need / 2**30:.1f} GiB, more than half of the "
                                  f"{mem / 2**30:.1f} GiB of memory: give store= to run out of core "
                                  f"in Zarr")
        return "zarr"
    return in_memory


def choose_rows_backend(backend, n):
    """Where the row chunks of X (and a row-chunk solver's state) live: "distributed" when
    asked, or for "auto" when a client is connected and n >= ROWS_DISTRIBUTED_MIN (n None:
    not known before X is read, taken as large); else "local" (this process)."""
    if backend == "distributed" or (backend == "auto" and get_client() is not None
                                    and (n is None or n >= ROWS_DISTRIBUTED_MIN)):
        return "distributed"
    return "local"


def client_context(backend, n):
    """The client a fit runs under: the cluster's for "distributed" (an embedded
    LocalCluster when none is connected); for "zarr", the current one when there is
    one, an embedded one for large n, none (the thread pool here) otherwise."""
    if backend == "distributed" or (backend == "zarr" and (n >= LOCAL_MAX_N or get_client() is not None)):
        return cluster_client()
    return contextlib.nullcontext(None)
