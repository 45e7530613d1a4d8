"""The run store: a Zarr group holding results, checkpoints, and JSON metadata.

Layout (``dnomad info STORE`` prints it)::

    attrs["dnomad_run"]          method, run_id, parameters, input, versions, host, started
    attrs["<method>_checkpoint"] the last complete checkpoint: iteration, slot, solver state
    attrs["result"]              stop reason, objective, passes, timings (when finished)
    input/X                      the data, so that `dnomad resume` needs only the store
    checkpoint/a, checkpoint/b   two checkpoint slots written in turn (arrays + history/)
    result/...                   Q or W or F, labels, embedding; result/history/
    state/...                    the zarr backend's working matrices

Histories are tables: a group of 1-D arrays, one per column (``read_table``).
Only JSON attributes and Zarr arrays: never pickle (a store may come from someone
else), never credentials.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re

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
    shown = redact(url)
    if "://" not in url:
        parent = os.path.dirname(os.path.abspath(url)) or "."
        target = url if os.path.exists(url) else parent
        if not os.path.isdir(target) and not os.path.exists(url):
            raise StoreError(f"store {shown!r}: parent directory {parent!r} does not exist")
        if not os.access(target, os.W_OK):
            raise StoreError(f"store {shown!r} is not writable (no write permission on {target!r}); "
                             f"choose another path")
    try:
        g = _group(url, mode="a")
    except Exception as exc:  # noqa: BLE001 - any backend error means unusable
        raise StoreError(f"store {shown!r} cannot be opened for writing: {redact(str(exc))}") from exc
    attrs = dict(g.attrs)
    existing = attrs.get(RUN_MARKER)
    if existing is not None and not overwrite:
        if existing.get("run_id") != run_id or not resume:
            raise StoreError(f"store {shown!r} already holds a dnomad run ({existing.get('method')}, "
                             f"started {existing.get('started')}); pass overwrite=True "
                             f"(--overwrite) to replace it, or resume it with `dnomad resume {shown}`")
    elif existing is None and len(list(g.keys())) > 0 and not overwrite:
        raise StoreError(f"store {shown!r} is not empty and holds no dnomad run; use an empty path "
                         f"or overwrite=True")
    if overwrite and (existing is not None or len(list(g.keys())) > 0):
        g = _group(url, mode="w")
    return g


# user:password@ in a URL (fsspec accepts credentials there): never written to a store.
_URL_USERINFO = re.compile(r"([a-zA-Z][\w+.-]*://)[^/@\s]+@")


def redact(text):
    """``text`` with the credentials of any URL in it removed."""
    return _URL_USERINFO.sub(r"\1", text)


def _redacted(obj):
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: _redacted(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redacted(v) for v in obj]
    return obj


def write_json(url, key, obj):
    """Store ``obj`` as JSON under ``key`` of the store's attributes (URLs redacted)."""
    _group(url).attrs[key] = _redacted(json.loads(json.dumps(obj, default=_jsonable)))


def read_json(url, key, default=None):
    try:
        return dict(_group(url, mode="r").attrs).get(key, default)
    except FileNotFoundError:
        return default


def write_vector(url, path, v, chunks=None):
    """An array at ``path`` (one chunk unless ``chunks`` is given)."""
    import zarr

    v = np.asarray(v)
    arr = zarr.create_array(store=str(url), name=path, shape=v.shape, dtype=v.dtype,
                            chunks=chunks or (v.shape if v.ndim else None), overwrite=True,
                            compressors=None)
    arr[...] = v


def read_vector(url, path):
    import zarr

    return np.asarray(zarr.open_array(store=str(url), path=path, mode="r")[...])


def write_table(url, path, rows):
    """A list of dicts (a history) as a columnar table: one 1-D array per column under
    ``path``, int64 where every value is an integer, else float64 (a missing value is
    NaN); the column order is kept in the group's attributes."""
    import zarr

    columns = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    g = zarr.open_group(store=str(url), path=path, mode="w")
    for name in columns:
        values = [row.get(name) for row in rows]
        integral = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
        col = np.array(values, dtype=np.int64) if integral else \
            np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        arr = g.create_array(name, shape=col.shape, dtype=col.dtype, chunks=(max(len(col), 1),),
                             compressors=None)
        arr[...] = col
    g.attrs["columns"] = columns
    g.attrs["rows"] = len(rows)


def read_table(url, path):
    """The rows written by :func:`write_table` (a list of dicts), or None if absent."""
    import zarr

    try:
        g = zarr.open_group(store=str(url), path=path, mode="r")
    except (FileNotFoundError, KeyError):
        return None
    columns = g.attrs.get("columns")
    if columns is None:
        return None
    cols = {name: np.asarray(g[name][...]) for name in columns}
    return [{name: cols[name][i].item() for name in columns} for i in range(int(g.attrs["rows"]))]


# Errors that mean the store cannot take more writes, not that dnomad is wrong.
_STORE_ERRNOS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
                 errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                 errno.EPERM: "operation not permitted", errno.EIO: "I/O error"}


@contextlib.contextmanager
def writing(url, what, *, keep=None):
    """Turn a failed write into a :class:`StoreError` naming the store, what was being
    written and why, and ``keep`` (what is still intact), before heavy work goes on."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        reason = _STORE_ERRNOS.get(exc.errno, exc.strerror or str(exc))
        tail = f"; {keep}" if keep else ""
        raise StoreError(f"store {redact(str(url))!r}: writing {what} failed ({reason}: {exc}){tail}") from exc


class Checkpoints:
    """A run's checkpoints: two slots (``checkpoint/a``, ``checkpoint/b``) written in turn,
    the record naming the complete one (``attrs[key]``) written last, so that a crash,
    a full disk or a store turned read-only mid-write leaves the previous checkpoint
    whole.  A checkpoint's history is a table in its slot."""

    def __init__(self, url, key):
        self.url = str(url)
        self.key = key

    def latest(self):
        """The last complete checkpoint's record with its ``prefix`` and ``history``, or None."""
        record = read_json(self.url, self.key)
        if record is None:
            return None
        prefix = f"checkpoint/{record['slot']}"
        return dict(record, prefix=prefix, history=read_table(self.url, f"{prefix}/history") or [])

    @contextlib.contextmanager
    def write(self, record, history):
        """``with ckpts.write(record, history) as prefix:`` write the state's arrays under
        ``prefix``; on leaving, the history table and then the record are written."""
        last = read_json(self.url, self.key)
        slot = "b" if last is not None and last.get("slot") == "a" else "a"
        prefix = f"checkpoint/{slot}"
        keep = (f"the last complete checkpoint ({last.get('iteration')} iterations, "
                f"checkpoint/{last['slot']}) is intact: make room or restore write access, then "
                f"`dnomad resume {redact(self.url)}`" if last is not None else "no checkpoint had been written")
        with writing(self.url, f"the checkpoint at iteration {record.get('iteration')}", keep=keep):
            yield prefix
            write_table(self.url, f"{prefix}/history", history)
            write_json(self.url, self.key, dict(record, slot=slot))


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
