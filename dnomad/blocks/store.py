"""The run store: a Zarr group holding results, checkpoints, and JSON metadata.

Only JSON attributes and Zarr arrays: never pickle (a store may come from someone
else), never credentials.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import StoreError

RUN_MARKER = "dnomad_run"


def _group(url, mode="a"):
    import zarr

    return zarr.open_group(store=str(url), mode=mode)


def check_store(url, run_id, *, overwrite=False, resume=False):
    """Make sure ``url`` can hold this run: writable, and empty or holding the same run.

    ``run_id`` identifies the run (method and parameters); a store holding another
    run is refused unless ``overwrite``.
    """
    url = str(url)
    if "://" not in url:
        parent = os.path.dirname(os.path.abspath(url)) or "."
        target = url if os.path.exists(url) else parent
        if not os.path.isdir(target) and not os.path.exists(url):
            raise StoreError(f"store {url!r}: parent directory {parent!r} does not exist")
        if not os.access(target, os.W_OK):
            raise StoreError(f"store {url!r} is not writable (no write permission on {target!r}); "
                             f"choose another path")
    try:
        g = _group(url, mode="a")
    except Exception as exc:  # noqa: BLE001 - any backend error means unusable
        raise StoreError(f"store {url!r} cannot be opened for writing: {exc}") from exc
    attrs = dict(g.attrs)
    existing = attrs.get(RUN_MARKER)
    if existing is not None and not overwrite:
        if existing.get("run_id") != run_id or not resume:
            raise StoreError(f"store {url!r} already holds a dnomad run ({existing.get('method')}, "
                             f"started {existing.get('started')}); pass overwrite=True "
                             f"(--overwrite) to replace it, or resume it with `dnomad resume {url}`")
    elif existing is None and len(list(g.keys())) > 0 and not overwrite:
        raise StoreError(f"store {url!r} is not empty and holds no dnomad run; use an empty path "
                         f"or overwrite=True")
    if overwrite and (existing is not None or len(list(g.keys())) > 0):
        g = _group(url, mode="w")
    return g


def write_json(url, key, obj):
    _group(url).attrs[key] = json.loads(json.dumps(obj, default=_jsonable))


def read_json(url, key, default=None):
    try:
        return dict(_group(url, mode="r").attrs).get(key, default)
    except FileNotFoundError:
        return default


def write_vector(url, path, v):
    import zarr

    v = np.asarray(v)
    arr = zarr.create_array(store=str(url), name=path, shape=v.shape, dtype=v.dtype,
                            chunks=v.shape if v.ndim else None, overwrite=True, compressors=None)
    arr[...] = v


def read_vector(url, path):
    import zarr

    return np.asarray(zarr.open_array(store=str(url), path=path, mode="r")[...])


def has_array(url, path):
    try:
        g = _group(url, mode="r")
        g[path]
        return True
    except (KeyError, FileNotFoundError):
        return False


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
