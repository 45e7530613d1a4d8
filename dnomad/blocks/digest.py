"""What a run read of a Zarr input, by content: the crc32c of every stored chunk's bytes
(as stored, before decoding), taken while the run's first pass over the input reads
them, so that a resumed run can tell that the array behind a path was rewritten.

The first pass opens the input under a *digesting* generation (:func:`new_generation`):
its reads go through :class:`_DigestStore`, which notes each chunk's checksum in the
process that read it; :func:`collect` gathers the notes from this process and from a
cluster's workers.  A chunk that is absent (the array's fill value) is noted as such.  A
shard read in parts (a sharded array) is read once more whole when the notes are
collected: which parts a pass reads depends on its blocks, the whole shard does not."""
from __future__ import annotations

import threading
import uuid

import numpy as np

_PREFIX = "digest:"
_SEEN = {}                      # generation -> {chunk: [crc32c, bytes] or None}
_PARTIAL = {}                   # generation -> {chunk read in byte ranges: its store}
_LOCK = threading.Lock()
_METADATA = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


def new_generation():
    """A generation under which reads are digested (see :func:`open_array`)."""
    return _PREFIX + uuid.uuid4().hex


def is_digesting(generation):
    return isinstance(generation, str) and generation.startswith(_PREFIX)


def crc32c(data):
    """The crc32c of an array's or a buffer's bytes (C order)."""
    import google_crc32c           # zarr's own dependency (its crc32c codec)

    return int(google_crc32c.value(np.ascontiguousarray(data).reshape(-1).view(np.uint8)))


def _note(generation, store, key, byte_range, buffer):
    if key.rsplit("/", 1)[-1] in _METADATA:
        return
    if byte_range is not None:
        # A part of a shard (its index, an inner chunk): which parts a pass reads depends
        # on its blocks, so the shard is digested whole when the notes are collected.
        with _LOCK:
            _PARTIAL.setdefault(generation, {})[key] = store
        return
    seen = None if buffer is None else [crc32c(buffer.as_numpy_array()), len(buffer)]
    with _LOCK:
        _SEEN.setdefault(generation, {})[key] = seen


def _whole(store, key):
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    buffer = sync(store.get(key, default_buffer_prototype()))
    return None if buffer is None else [crc32c(buffer.as_numpy_array()), len(buffer)]


def _digest_store_class():
    from zarr.storage import WrapperStore

    class _DigestStore(WrapperStore):
        """A store that notes the checksum of every chunk read through it."""

        def __init__(self, store, generation):
            super().__init__(store)
            self.generation = generation

        def _with_store(self, store):
            return type(self)(store, self.generation)

        async def get(self, key, prototype, byte_range=None):
            buffer = await self._store.get(key, prototype, byte_range)
            _note(self.generation, self._store, key, byte_range, buffer)
            return buffer

        async def get_partial_values(self, prototype, key_ranges):
            key_ranges = list(key_ranges)
            buffers = await self._store.get_partial_values(prototype, key_ranges)
            for (key, byte_range), buffer in zip(key_ranges, buffers):
                _note(self.generation, self._store, key, byte_range, buffer)
            return buffers

    return _DigestStore


_DIGEST_STORE = None


def open_array(url, path, generation):
    """The Zarr array at ``url`` (``path`` inside it), read-only, its chunk reads
    digested under ``generation``."""
    global _DIGEST_STORE
    import zarr

    if _DIGEST_STORE is None:
        _DIGEST_STORE = _digest_store_class()
    url = str(url)
    if "://" in url:
        inner = zarr.storage.FsspecStore.from_url(url, read_only=True)
    else:
        inner = zarr.storage.LocalStore(url, read_only=True)
    kw = {"path": path} if path else {}
    return zarr.open_array(store=_DIGEST_STORE(inner, generation), mode="r", **kw)


def pop(generation, complete=True):
    """The chunks noted under ``generation`` in this process (and forget them); shards
    read in parts are read whole here (``complete``; else only forgotten)."""
    with _LOCK:
        seen = _SEEN.pop(generation, {})
        partial = _PARTIAL.pop(generation, {})
    if complete:
        for key, store in partial.items():
            if key not in seen:
                seen[key] = _whole(store, key)
    return seen


def collect(generation, client=None):
    """Every chunk noted under ``generation``: in this process and, with ``client``, in
    each of its workers (a worker that cannot answer, e.g. one lost since the pass,
    gives none: its chunks are then not part of the digest)."""
    seen = pop(generation)
    if client is not None:
        for part in client.run(pop, generation, on_error="return").values():
            if isinstance(part, dict):
                seen.update(part)
    return seen


def discard(generation, client=None):
    """Forget the notes of a pass that did not finish (here and on the workers)."""
    pop(generation, complete=False)
    if client is not None:
        try:
            client.run(pop, generation, False, on_error="return")
        except Exception:  # noqa: BLE001 - a closed client: its workers' notes went with them
            pass


def compare(recorded, seen):
    """The chunks whose content differs between two digests (read in both), and whether
    any chunk was read in both."""
    common = sorted(set(recorded) & set(seen))
    return [part for part in common if recorded[part] != seen[part]], bool(common)


def zarr_location(X):
    """(url, path) of a Zarr input given as its path or URL, or as an array in a local
    directory store; None for anything else."""
    import os

    if isinstance(X, (str, os.PathLike)):
        return os.fspath(X), ""
    if type(X).__module__.startswith("zarr") and hasattr(getattr(X, "store", None), "root"):
        return str(X.store.root), X.path
    return None
