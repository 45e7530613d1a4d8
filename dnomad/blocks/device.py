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
