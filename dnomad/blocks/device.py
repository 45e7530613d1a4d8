"""Where blocks compute: the host (NumPy) or a CUDA GPU (CuPy).

A block carries its array module: NumPy arrays compute on the host, CuPy arrays on
the GPU that holds them, and nothing global switches one library for the other.
This module is the one place that imports CuPy, lazily, so that dnomad imports and
runs without it.

The device of a run is resolved once, by :func:`resolve_device`: an explicit
``device=`` argument wins; else an input that already lives on the GPU (a CuPy
array) asks for "cuda"; else dask's configuration key ``dnomad.device`` (set with
``dask.config.set({"dnomad.device": "cuda"})``, in a dask YAML file, or as the
environment variable ``DASK_DNOMAD__DEVICE=cuda`` before dask is imported); else
"cpu".  "auto" picks "cuda" when CuPy sees a device and "cpu" otherwise; "cuda"
where no GPU can be used is an error that says why.
"""
from __future__ import annotations

import functools

import numpy as np

from ..errors import InputValueError

DEVICES = ("cpu", "cuda", "auto")
CONFIG_KEY = "dnomad.device"


@functools.lru_cache(maxsize=1)
def cuda_status():
    """(available, reason): whether CuPy imports and sees at least one CUDA device; the
    reason says what is missing when it does not.  Checked once per process."""
    try:
        import cupy
    except ImportError as exc:
        return False, (f"CuPy is not installed ({exc}); install the wheel that matches the CUDA driver, "
                       f"e.g. pip install cupy-cuda12x")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:        # CUDARuntimeError without a driver or device
        return False, f"CuPy is installed but CUDA reports no usable device ({exc})"
    if count < 1:
        return False, "CuPy is installed but CUDA reports no device"
    return True, f"{count} CUDA device(s)"


def cuda_available():
    return cuda_status()[0]


def cupy():
    """The CuPy module (imported on first use); a clear error where it cannot be used."""
    available, reason = cuda_status()
    if not available:
        raise InputValueError(f"the CUDA device path needs CuPy and a GPU: {reason}")
    import cupy as cp
    import cupy.cublas  # noqa: F401  (a submodule: cp.cublas.gemm accumulates in place)

    return cp


def is_device_array(a):
    """Whether ``a`` is a CuPy array (checked without importing CuPy)."""
    return type(a).__module__.split(".")[0] == "cupy"


def array_module(a):
    """numpy or cupy: the module whose functions compute on ``a``'s device."""
    return cupy() if is_device_array(a) else np


def device_of(a):
    return "cuda" if is_device_array(a) else "cpu"


def resolve_device(device=None, *inputs):
    """"cpu" or "cuda" for a run: ``device`` ("cpu", "cuda", "auto" or None), else
    "cuda" when one of ``inputs`` is a CuPy array, else dask config ``dnomad.device``,
    else "cpu".  Raises :class:`InputValueError` for another value, or for "cuda" where
    CuPy or a GPU is missing (with the reason)."""
    source = "device"
    if device is None and any(is_device_array(a) for a in inputs):
        device, source = "cuda", "the input (a CuPy array)"
    if device is None:
        import dask.config

        device, source = dask.config.get(CONFIG_KEY, "cpu"), f"dask config {CONFIG_KEY!r}"
    if not isinstance(device, str) or device.lower() not in DEVICES:
        raise InputValueError(f"{source} must be one of {DEVICES}; got {device!r}")
    device = device.lower()
    if device == "cpu":
        return "cpu"
    available, reason = cuda_status()
    if device == "auto":
        return "cuda" if available else "cpu"
    if not available:
        raise InputValueError(f"{source} asks for 'cuda', but {reason}; use device='cpu' (or 'auto')")
    return "cuda"


def to_device(a, device):
    """``a`` on ``device`` ("cpu": a NumPy array; "cuda": a CuPy array on the current
    GPU).  No copy when it is already there."""
    if device == "cuda":
        return cupy().asarray(a)
    if device != "cpu":
        raise InputValueError(f"device must be 'cpu' or 'cuda' (resolved); got {device!r}")
    return to_host(a)


def to_host(a):
    """``a`` as a NumPy array (a device-to-host copy for a CuPy array)."""
    return a.get() if is_device_array(a) else np.asarray(a)


# ------------------------------------------------------------------ GPU workers
def gpu_worker_specs(n_gpus, *, nthreads=1, memory_limit="auto"):
    """Worker specs for :class:`distributed.SpecCluster`: one worker process per GPU.

    Worker i runs under a Nanny with ``CUDA_VISIBLE_DEVICES=i`` (so CuPy's device 0 in
    that process is GPU i and no other GPU's memory is touched), advertises the
    resource ``GPU=1`` (tasks submitted with ``resources={"GPU": 1}`` run one per GPU),
    and has dask config ``dnomad.device="cuda"`` in its environment, so blocks built
    there default to the GPU.  One thread each: a GPU runs one stream of block kernels.
    """
    from distributed import Nanny

    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise InputValueError(f"n_gpus must be a positive integer; got {n_gpus!r}")
    return {f"gpu-{i}": {"cls": Nanny, "options": {
        "nthreads": int(nthreads), "memory_limit": memory_limit, "resources": {"GPU": 1},
        "env": {"CUDA_VISIBLE_DEVICES": str(i), "DASK_DNOMAD__DEVICE": "cuda"}}}
        for i in range(n_gpus)}


def gpu_cluster(n_gpus=None, *, prefer_dask_cuda=True, **cluster_kw):
    """A dask cluster on this machine with one worker per GPU (``n_gpus``: default all).

    dask-cuda's ``LocalCUDACluster`` when it is installed (it also pins each worker to
    its device and knows NVLink/UCX), with the ``GPU=1`` resource added; else a
    :class:`distributed.SpecCluster` of :func:`gpu_worker_specs`.  Extra keywords go to
    the cluster class (e.g. ``dashboard_address``).  Raises where CUDA is unusable.
    """
    available, reason = cuda_status()
    if n_gpus is None:
        if not available:
            raise InputValueError(f"gpu_cluster needs a CUDA GPU: {reason}")
        n_gpus = cupy().cuda.runtime.getDeviceCount()
    if prefer_dask_cuda:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            pass
        else:
            import dask.config

            with dask.config.set({CONFIG_KEY: "cuda"}):
                return LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(n_gpus)), resources={"GPU": 1},
                                        threads_per_worker=1, **cluster_kw)
    from distributed import Scheduler, SpecCluster

    scheduler = {"cls": Scheduler, "options": {"dashboard_address": cluster_kw.pop("dashboard_address", ":0")}}
    return SpecCluster(workers=gpu_worker_specs(n_gpus), scheduler=scheduler, **cluster_kw)
