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
import threading

import numpy as np

from ..errors import InputValueError, StoreError

RUN_MARKER = "dnomad_run"


def _group(url, mode="a"):
    import zarr

    return zarr.open_group(store=str(url), mode=mode)


def check_store(url, run_id, *, overwrite=False, resume=False, record=None):
    """Make sure ``url`` can hold this run: writable, and empty or holding the same run.

    ``run_id`` identifies the run (method and parameters); a store holding another
    run is refused unless ``overwrite``, a resume saying what differs from ``record``
    (this run's record, where given).
    """
    url = str(url)
    shown = redact(url)
    if "://" not in url:
        _check_local_store_path(url)
    if resume and read_json(url, RUN_MARKER) is None:           # before anything is created
        raise StoreError(f"store {shown!r} holds no dnomad run to resume; fit without resume to start one")
    try:
        g = _group(url, mode="a")
    except Exception as exc:  # noqa: BLE001 - any backend error means unusable
        # "from None": the chained backend error may quote the credentials (botocore's
        # 'Invalid bucket name "user:pass"'); its text, redacted, is in the message.
        raise StoreError(f"store {shown!r} cannot be opened for writing: {redact(str(exc), url)}") from None
    attrs = dict(g.attrs)
    existing = attrs.get(RUN_MARKER)
    if existing is not None and not overwrite:
        checked_record(url, f"the run record {RUN_MARKER!r}", existing, RUN_RECORD_FIELDS)
        if resume and existing.get("run_id") != run_id:
            raise StoreError(f"store {shown!r} holds a different run ({existing.get('method')}, started "
                             f"{existing.get('started')}): {identity_change(existing, record)}; resume it with "
                             f"the parameters and input it was started with (`dnomad resume {shown}` reads them "
                             f"from the store), or pass overwrite=True (--overwrite) to replace it")
        if not resume:
            raise StoreError(f"store {shown!r} already holds a dnomad run ({existing.get('method')}, "
                             f"started {existing.get('started')}); pass overwrite=True "
                             f"(--overwrite) to replace it, or resume it with `dnomad resume {shown}`")
    elif existing is None and len(list(g.keys())) > 0 and not overwrite:
        raise StoreError(f"store {shown!r} is not empty and holds no dnomad run; use an empty path "
                         f"or overwrite=True")
    if overwrite and (existing is not None or len(list(g.keys())) > 0):
        g = _group(url, mode="w")
    return g


# Settings that define no run of any method (where it is written and runs, how it reports).
_NOT_IDENTITY = ("store", "overwrite", "callback", "verbose", "backend", "checkpoint_every")


def identity_change(stored, record):
    """What differs between the stored run's record and this run's ``record``: the
    method, parameters (old -> new), the input's kind, shape, location or content."""
    if record is None:
        return "its method, parameters or input differ"
    record = json.loads(json.dumps(record, default=_jsonable))        # as it would be stored
    if stored.get("method") != record.get("method"):
        return f"it is a {stored.get('method')} run, not {record.get('method')}"
    was, now = stored.get("input") or {}, record.get("input") or {}
    changes = [f"X's {what} {_short(was[field])} -> {_short(now[field])}"
               for field, what in (("kind", "kind"), ("url", "location"), ("shape", "shape"), ("n", "size"))
               if field in was and field in now and was[field] != now[field]]
    if not changes and "content" in was and was.get("content") != now.get("content"):
        changes.append("X's content (the same shape, other values)")
    old, new = stored.get("estimator_params") or {}, record.get("estimator_params") or {}
    changes += [f"{k} {_short(old.get(k))} -> {_short(new.get(k))}" for k in sorted(set(old) | set(new))
                if k not in _NOT_IDENTITY and old.get(k) != new.get(k)]
    if not changes:
        return "its identity differs in what the run record does not show (a setting of another dnomad version?)"
    return "changed: " + ", ".join(changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")


def _check_local_store_path(url):
    """A local store's parent directory exists and the store (or its parent) is writable."""
    shown = redact(url)
    parent = os.path.dirname(os.path.abspath(url)) or "."
    target = url if os.path.exists(url) else parent
    if not os.path.isdir(target) and not os.path.exists(url):
        raise StoreError(f"store {shown!r}: parent directory {parent!r} does not exist")
    if not os.access(target, os.W_OK):
        raise StoreError(f"store {shown!r} is not writable (no write permission on {target!r}); "
                         f"choose another path")


# user:password@ in a URL (fsspec accepts credentials there): never written to a store,
# never printed.  The rule, for each ``scheme://`` and the text after it up to the next
# whitespace (a URL has none; a quote or a comma does not end it, so that a password
# holding one is still caught):
#   - user:password (a ':' before the first '/'): the userinfo ends at the LAST '@'.  RFC
#     3986 ends it at the last '@' of the authority, but people do not percent-encode their
#     passwords, and a raw '/' in one (AWS secrets hold '/') makes the authority's end
#     unknowable: in s3://AKIA:se@cr/et@bucket/key the text cannot say whether the host is
#     "cr" or "bucket".  Erring towards removing too much only shortens a shown URL;
#     erring the other way prints a secret.  So s3://u:pw@bucket/k@v2 shows as s3://v2.
#   - otherwise (a user or token alone, https://TOKEN@host/...): the userinfo ends at the
#     last '@' before the first '/', so that a path holding '@' (s3://bucket/model@v2.zarr)
#     is kept whole.
# Third-party errors quote pieces of such a URL outside any URL (botocore: 'Invalid
# bucket name "AKIA:se@cr"', s3fs taking what precedes the first '/' as the bucket), so
# every userinfo redact() has removed is remembered (in this process only) and its
# pieces are scrubbed from every later text too (_scrub).
_URL_USERINFO = re.compile(r"[a-zA-Z][\w+.-]*://")
_WHITESPACE = re.compile(r"\s")
_SEPARATORS = re.compile(r"[@:/]")
_REDACTED = "***"
_SECRETS = set()                  # pieces of the userinfos seen, each of 3 characters or more
_SECRETS_LOCK = threading.Lock()


def _userinfo_end(rest):
    """The index of the '@' that ends the userinfo at the start of ``rest`` (the text
    after ``scheme://``, up to whitespace), or -1 when it has none."""
    slash = rest.find("/")
    head = rest if slash < 0 else rest[:slash]
    if ":" in head and "@" not in head and _HOST_PORT.fullmatch(head):
        return -1                 # host:port (http://minio:9000/...), not user:password
    return rest.rfind("@") if ":" in head else head.rfind("@")


# A host and a port: a password of at most 5 digits followed by a '/' would be read as one.
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}")


def _remember(userinfo):
    """Keep the pieces of ``userinfo`` that another tool may quote: each run of it from
    its start or a separator ('@', ':', '/') to its end or a separator (the whole, the
    password, "AKIA:se@cr" as a bucket name, ...) that holds some of the password (all
    of a lone user or token), 3 characters or more, and their percent-encoded forms.
    A user name alone ("admin") is not scrubbed from every text: it would garble paths."""
    from urllib.parse import quote

    colon = userinfo.find(":")
    cuts = [0] + [m.start() for m in _SEPARATORS.finditer(userinfo)] + [len(userinfo)]
    pieces = set()
    for i in cuts:
        for j in cuts:
            piece = userinfo[i + (i > 0):j]
            if len(piece) >= 3 and j > max(colon, 0):
                pieces.update({piece, quote(piece, safe=""), quote(piece)})
    with _SECRETS_LOCK:
        _SECRETS.update(pieces)


def _scrub(text):
    with _SECRETS_LOCK:
        pieces = sorted(_SECRETS, key=len, reverse=True)
    for piece in pieces:
        if piece in text:
            text = text.replace(piece, _REDACTED)
    return text


def redact(text, *urls):
    """``text`` with the userinfo (``user:password@``) of every URL in it removed, and
    every piece of a password seen by ``redact`` in this process (in ``text``, in
    ``urls`` or before) replaced by ``***`` wherever it appears: the error of a tool that
    quotes a URL's bucket string holding a password is shown without it."""
    text = str(text)
    for url in urls:
        redact(str(url))
    out, pos = [], 0
    while (m := _URL_USERINFO.search(text, pos)) is not None:
        end = _WHITESPACE.search(text, m.end())
        rest = text[m.end():end.start() if end else len(text)]
        at = _userinfo_end(rest)
        out.append(text[pos:m.end()])
        pos = m.end()
        if at >= 0:
            _remember(rest[:at])
            pos += at + 1
    out.append(text[pos:])
    return _scrub("".join(out))


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


def drop_json(url, key):
    """Remove ``key`` from the store's attributes (if there)."""
    g = _group(url)
    attrs = dict(g.attrs)
    if attrs.pop(key, None) is not None:
        g.attrs.put(attrs)


def read_json(url, key, default=None):
    """The record ``key`` of the store's attributes (``default`` where the store or the
    record is absent); StoreError where the store's metadata cannot be read."""
    try:
        return dict(_group(url, mode="r").attrs).get(key, default)
    except FileNotFoundError:
        return default
    except Exception as exc:  # noqa: BLE001 - sorted below
        from zarr.errors import ContainsArrayError

        if isinstance(exc, ContainsArrayError):
            return default                                 # an array (the user's input), not a run store
        if isinstance(exc, (json.JSONDecodeError, TypeError, KeyError)) or \
                type(exc).__module__.startswith("zarr"):           # a truncated or rewritten zarr.json
            raise damaged(url, "its metadata (zarr.json)", f"cannot be read ({type(exc).__name__}: "
                          f"{redact(str(exc), str(url))})") from None
        # credentials, network, a bad URL: not damage, but unreadable; "from None": the
        # chained backend error may quote the credentials.
        raise StoreError(f"store {redact(str(url))!r} cannot be read ({type(exc).__name__}: "
                         f"{redact(str(exc), str(url))})") from None


# ---- the store's integrity: one reader per record, each checked before anything runs
def damaged(url, part, what):
    """The StoreError of a damaged part of a run store, saying what to do."""
    return StoreError(f"store {redact(str(url))!r} is damaged: {part} {what}; restore the store from a copy, or "
                      f"start the run again with overwrite=True (--overwrite)")


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_names(v):
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


# (field, test, what it must be) of each record dnomad writes
RUN_RECORD_FIELDS = (("method", lambda v: isinstance(v, str) and bool(v), "a method's name"),
                     ("run_id", lambda v: isinstance(v, str) and bool(v), "a string"),
                     ("estimator_params", lambda v: isinstance(v, dict), "a table of parameters"),
                     ("input", lambda v: isinstance(v, dict) and isinstance(v.get("kind"), str),
                      "a table with the input's kind"))
CHECKPOINT_FIELDS = (("slot", lambda v: v in ("a", "b"), "'a' or 'b'"),
                     ("iteration", _is_count, "an integer >= 0"))
RESULT_FIELDS = (("finished", lambda v: isinstance(v, str), "a time"),)


def checked_record(url, part, record, fields):
    """``record`` if it is a table with every field of ``fields`` as it must be, else
    the StoreError naming the part and the field."""
    if not isinstance(record, dict):
        raise damaged(url, part, f"is {type(record).__name__} {_short(record)}, not a record")
    for name, test, wanted in fields:
        if name not in record:
            raise damaged(url, part, f"lacks its field {name!r}")
        if not test(record[name]):
            raise damaged(url, part, f"has {name} = {_short(record[name])}, not {wanted}")
    return record


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_run_record(url):
    """The run record (RUN_MARKER) checked, or None where the store holds no run."""
    record = read_json(url, RUN_MARKER)
    return None if record is None else checked_record(url, f"the run record {RUN_MARKER!r}", record,
                                                      RUN_RECORD_FIELDS)


def read_result(url):
    """The result record checked, with every array it lists present and its history
    table readable; None where the run has no result."""
    record = read_json(url, "result")
    if record is None:
        return None
    checked_record(url, "the result record", record, RESULT_FIELDS)
    _check_listed_arrays(url, "the result record", record, "result", "the result's")
    lazy = record.get("lazy_arrays", [])
    if not (_is_names(lazy) and set(lazy) <= set(record.get("arrays", []))):
        raise damaged(url, "the result record", f"has lazy_arrays = {_short(lazy)}, not a list of its arrays")
    checked_table(url, "result/history")
    return record


def _check_listed_arrays(url, part, record, prefix, whose):
    """Every array a record lists (its ``arrays``, names under ``prefix``) is there, in the
    shape the record wrote down (its ``shapes``; records written before dnomad kept them
    have none)."""
    arrays = record.get("arrays", [])
    if not _is_names(arrays):
        raise damaged(url, part, f"has arrays = {_short(arrays)}, not a list of names")
    shapes = record.get("shapes", {})
    if not (isinstance(shapes, dict) and all(isinstance(v, list) and all(_is_count(x) for x in v)
                                             for v in shapes.values())):
        raise damaged(url, part, f"has shapes = {_short(shapes)}, not a map of array -> shape")
    for name in arrays:
        shape = array_shape(url, f"{prefix}/{name}")
        if shape is None:
            raise damaged(url, f"{whose} array {prefix}/{name}", "is missing")
        if name in shapes and shape != shapes[name]:
            raise damaged(url, f"{whose} array {prefix}/{name}", f"has shape {tuple(shape)}, not the "
                          f"{tuple(shapes[name])} written there")


# The chunks of a Zarr input that the run's first pass read, by content (see
# dnomad.blocks.digest): a subgroup of its own, so that checkpoints do not rewrite it.
INPUT_DIGEST = "input_digest"


def _is_chunk_digest(v):
    return v is None or (isinstance(v, list) and len(v) == 2 and all(_is_count(x) for x in v))


def read_input_digest(url):
    """The input digest recorded in the store ({"input", "url", "chunks"}), checked; None
    where none was recorded."""
    import zarr

    try:
        record = dict(zarr.open_group(store=str(url), path=INPUT_DIGEST, mode="r").attrs)
    except FileNotFoundError:                       # zarr's GroupNotFoundError is one
        return None
    except Exception as exc:  # noqa: BLE001 - unreadable metadata
        raise damaged(url, f"the input's digest {INPUT_DIGEST!r}", f"cannot be read ({type(exc).__name__})") from None
    chunks = record.get("chunks")
    if not isinstance(chunks, dict) or not all(_is_chunk_digest(v) for v in chunks.values()):
        raise damaged(url, f"the input's digest {INPUT_DIGEST!r}",
                      f"has chunks = {_short(chunks)}, not a map of chunk -> [crc32c, bytes]")
    return record


def write_input_digest(url, record):
    import zarr

    zarr.open_group(store=str(url), path=INPUT_DIGEST, mode="w").attrs.put(_redacted(record))


def checked_table(url, path):
    """The table at ``path`` (:func:`read_table`), or the StoreError naming it."""
    try:
        return read_table(url, path)
    except Exception as exc:  # noqa: BLE001 - a deleted column, a truncated array
        raise damaged(url, f"the table {path}", f"cannot be read ({type(exc).__name__}: {exc})") from None


def write_vector(url, path, v, chunks=None):
    """An array at ``path`` (one chunk unless ``chunks`` is given)."""
    import zarr

    v = np.asarray(v)
    arr = zarr.create_array(store=str(url), name=path, shape=v.shape, dtype=v.dtype,
                            chunks=chunks or (v.shape if v.ndim else None), overwrite=True,
                            compressors=None)
    arr[...] = v


# Rows per chunk of a tall n x r array (a factor Y or W, a vector of n).
ROW_CHUNK = 65536


def write_rows(url, path, A):
    """A tall array at ``path`` in chunks of ROW_CHUNK rows (a scalar in one chunk)."""
    A = np.asarray(A)
    write_vector(url, path, A, chunks=(max(min(len(A), ROW_CHUNK), 1),) + A.shape[1:] if A.ndim else None)


def read_vector(url, path):
    import zarr

    return np.asarray(zarr.open_array(store=str(url), path=path, mode="r")[...])


def lazy_rows(url, path):
    """The array at ``path`` as a dask array over the store, read only when computed
    (a result too large to hold in this process)."""
    import dask.array as da

    return da.from_zarr(str(url), component=path)


def create_rows_array(url, path, shape, dtype, chunk_rows):
    """An empty tall array at ``path`` chunked ``chunk_rows`` rows (as the row chunks that
    write it are, so that no two of them write one Zarr chunk)."""
    import zarr

    zarr.create_array(store=str(url), name=path, shape=tuple(shape), dtype=dtype,
                      chunks=(max(min(int(chunk_rows), int(shape[0])), 1),) + tuple(shape[1:]), overwrite=True,
                      compressors=None, fill_value=0)


def write_row_span(url, path, r0, rows):
    """Rows ``r0:r0 + len(rows)`` of an array made by :func:`create_rows_array`, every
    chunk stored, zeros too (:func:`stored_chunks` counts them)."""
    import zarr

    with zarr.config.set({"array.write_empty_chunks": True}):
        zarr.open_array(store=str(url), path=path, mode="r+")[r0:r0 + len(rows)] = rows


def stored_chunks(url, path):
    """How many chunks of the array at ``path`` the store holds."""
    import zarr

    return int(zarr.open_array(store=str(url), path=path, mode="r").nchunks_initialized)


def read_row_span(url, path, r0, r1):
    import zarr

    return np.asarray(zarr.open_array(store=str(url), path=path, mode="r")[r0:r1])


def absolute_url(url):
    """A local store path made absolute (what a worker or a pickle loaded in another
    directory reads it by); an fsspec URL (``s3://...``, ``file://...``) as it is."""
    if url is None or "://" in url:
        return url
    return os.path.abspath(url)


class StoredRows:
    """A tall array in a store, not read: what :meth:`Checkpoints.load` gives back for a
    state that row chunks wrote themselves.  Put into row chunks
    (:meth:`dnomad.blocks.RowChunks.put`), each chunk reads its own rows where it lives;
    ``np.asarray`` reads them all into this process."""

    def __init__(self, url, path, shape):
        self.url, self.path, self.shape = absolute_url(str(url)), path, tuple(int(v) for v in shape)

    @property
    def ndim(self):
        return len(self.shape)

    def rows(self, r0, r1):
        return read_row_span(self.url, self.path, r0, r1)

    def __array__(self, dtype=None, copy=None):
        A = read_vector(self.url, self.path)
        return A if dtype is None else A.astype(dtype, copy=False)

    def __repr__(self):
        return f"StoredRows({redact(self.url)!r}, {self.path!r}, shape={self.shape})"


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
def writing(url, what, *, keep=None, store_errors_only=False):
    """Turn a failed write into a :class:`StoreError` naming the store, what was being
    written and why, and ``keep`` (what is still intact), before heavy work goes on.
    ``store_errors_only``: convert only the errors that mean the store cannot take more
    writes (a full disk, a read-only or unwritable store, an I/O error); others (a lost
    connection to a cluster) pass as they are."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        if store_errors_only and exc.errno not in _STORE_ERRNOS:
            raise
        reason = _STORE_ERRNOS.get(exc.errno, exc.strerror or str(exc))
        tail = f"; {keep}" if keep else ""
        raise StoreError(f"store {redact(str(url))!r}: writing {what} failed ({reason}: "
                         f"{redact(str(exc), str(url))}){tail}") from exc


class Checkpoints:
    """A run's checkpoints: two slots (``checkpoint/a``, ``checkpoint/b``) written in turn,
    the record naming the complete one (``attrs[key]``) written last, so that a crash,
    a full disk or a store turned read-only mid-write leaves the previous checkpoint
    whole.  A checkpoint's history is a table in its slot."""

    def __init__(self, url, key):
        self.url = str(url)
        self.key = key

    def latest(self):
        """The last complete checkpoint's record with its ``prefix`` and ``history``, or None;
        a StoreError where the record, an array it lists or its history is damaged."""
        record = read_json(self.url, self.key)
        if record is None:
            return None
        part = f"the checkpoint record {self.key!r}"
        checked_record(self.url, part, record, CHECKPOINT_FIELDS)
        prefix = f"checkpoint/{record['slot']}"
        _check_listed_arrays(self.url, part, record, prefix, "the checkpoint's")
        held = record.get("held", [])
        if not (_is_names(held) and set(held) <= set(record.get("arrays", []))):
            raise damaged(self.url, part, f"has held = {_short(held)}, not a list of the arrays it lists")
        return dict(record, prefix=prefix, history=checked_table(self.url, f"{prefix}/history") or [])

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


    # ---- the one checkpoint protocol: every iterative solver that checkpoints takes
    # ``state=`` (a state it handed to ``checkpoint`` earlier, as saved, or None) and
    # ``checkpoint=`` (a callable it calls with its state every ``checkpoint_every``
    # iterations and at its last).  A state is a dict: "history" (a list of rows),
    # NumPy arrays, held rows (n x k states of row chunks, which write themselves:
    # ``RowChunks.held``; valid during the call only), "blocks" (names of n x n matrices in
    # the solver's BlockGroup, which stay there), and JSON-able scalars.  These two methods
    # are its one store format.
    def save(self, state, *, group=None):
        """Write ``state``: its arrays under the slot (row-chunked), its ``blocks`` from
        ``group``, its history as a table, the scalars as the record (written last).  A
        value with a ``save_to(url, path)`` method (a state held in row chunks,
        :meth:`dnomad.blocks.RowChunks.held`) writes itself, from where it is held: the
        record lists it under ``held`` too, and :meth:`load` gives it back unread, as
        :class:`StoredRows`."""
        arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
        held = {k: v for k, v in state.items() if hasattr(v, "save_to")}
        record = {k: v for k, v in state.items() if k != "history" and k not in arrays and k not in held}
        record["arrays"] = sorted([*arrays, *held])
        if held:
            record["held"] = sorted(held)
        record["shapes"] = {name: list(value.shape) for name, value in arrays.items()}
        record.setdefault("iteration", len(state["history"]))
        with self.write(record, state["history"]) as prefix:
            for name, value in arrays.items():
                write_rows(self.url, f"{prefix}/{name}", value)
            for name, value in held.items():
                record["shapes"][name] = list(value.save_to(self.url, f"{prefix}/{name}"))
            if state.get("blocks"):
                group.save(list(state["blocks"]), self.url, prefix)

    def load(self, *, group=None):
        """The state :meth:`save` wrote last (None if there is none); its ``blocks`` are
        loaded into ``group``."""
        ck = self.latest()
        if ck is None:
            return None
        prefix = ck.pop("prefix")
        ck.pop("slot", None)
        shapes = ck.pop("shapes", {})
        held = set(ck.pop("held", []))
        state = dict(ck)
        if "arrays" not in state:
            raise InputValueError(f"the checkpoint {self.key!r} in {redact(self.url)!r} is in an older "
                                  "format (its record lists no arrays) and cannot be resumed: fit again with "
                                  "overwrite=True")
        for name in state.pop("arrays"):
            path = f"{prefix}/{name}"
            state[name] = (StoredRows(self.url, path, shapes.get(name) or array_shape(self.url, path))
                           if name in held else read_vector(self.url, path))
        if state.get("blocks"):
            group.load(list(state["blocks"]), self.url, prefix)
        return state


def array_shape(url, path):
    """The shape of the array at ``path`` (a list), None where there is none; one whose
    metadata cannot be read is damage (StoreError), not absence."""
    try:
        node = _group(url, mode="r")[path]
    except (KeyError, FileNotFoundError):
        return None
    except (ValueError, TypeError) as exc:
        raise damaged(url, f"the array {path}", f"cannot be read ({type(exc).__name__}: {exc})") from None
    return list(node.shape) if hasattr(node, "shape") else None


def has_array(url, path):
    """Whether the store holds an array at ``path`` (see :func:`array_shape`)."""
    return array_shape(url, path) is not None


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# ------------------------------------------------------------------ claiming a store
class StoreLock:
    """An exclusive claim on a local store: ``<store>.lock`` beside it (not inside, where
    ``overwrite`` would wipe it; the path resolved through symlinks, so that one store
    has one lock), locked with ``flock`` for as long as the run holds the store and
    holding the holder's pid, host and start time.  The kernel drops the lock when its
    process dies, so a crash leaves no stale claim.  A store given by URL (``s3://...``)
    has no lock file: object stores offer no exclusive create here, so two runs on one
    URL are not kept apart (a run's marker still names the run).  Where no lock can be
    taken (a parent directory that is not writable, a file system without locks) the
    run goes on unlocked, with a warning."""

    def __init__(self, url):
        url = os.fspath(url)
        self.url = url
        self.path = None if "://" in url else os.path.realpath(url).rstrip(os.sep) + ".lock"
        self._fd = None

    def _open(self):
        """The lock file, opened read-only where the file system allows an exclusive flock
        on that (a file open for writing would keep its file system from being remounted
        read-only), else read-write (NFS, where flock is a byte-range lock)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno != errno.EBADF:
                os.close(fd)
                raise
        os.close(fd)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _holder(self, wait=1.0):
        """Who holds the lock, from its file (read again for up to ``wait`` seconds: the
        holder writes it just after it takes the lock)."""
        import time

        deadline = time.monotonic() + wait
        while True:
            try:
                with open(self.path) as f:
                    who = json.load(f)
                return f"process {who['pid']} on {who['host']} since {who['since']}"
            except (OSError, ValueError, KeyError, TypeError):
                if time.monotonic() > deadline:
                    return "another process"
                time.sleep(0.02)

    def acquire(self):
        if self.path is None:
            return self
        import platform
        import time
        import warnings

        while True:
            try:
                fd = self._open()
            except BlockingIOError:
                who = self._holder()
                raise StoreError(f"store {redact(self.url)!r} is in use by {who} (lock {self.path!r}); wait "
                                 f"for that run to end, or give another store") from None
            except OSError as exc:
                warnings.warn(f"store {redact(self.url)!r} runs without a lock: {self.path!r} cannot be locked "
                              f"({exc.strerror}); two runs started on this store would not be kept apart",
                              RuntimeWarning, stacklevel=3)
                return self
            # The holder before us unlinks the file as it releases: make sure the lock we
            # hold is on the file that is at the path now, else try again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        # Who holds it, for the next claimant's message (written through another open file:
        # closing it keeps the flock, which belongs to ``fd``'s open file description).
        with open(self.path, "w") as f:
            json.dump({"pid": os.getpid(), "host": platform.node(),
                       "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        import fcntl

        try:
            os.unlink(self.path)
        except OSError:          # gone, or its file system turned read-only: unlocked all the same
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _local_path(url):
    return None if "://" in os.fspath(url) else os.path.abspath(os.fspath(url))


def claim(url, run_id, *, overwrite=False, resume=False, record=None):
    """Claim ``url`` for a run: check that it can be written (parent directory, write
    access), take its :class:`StoreLock`, then :func:`check_store` under the lock.  Returns
    ``(lock, created)``, ``created`` true when the store did not exist before (so that a
    run refused before writing anything can leave no store behind: :func:`abandon`)."""
    path = _local_path(url)
    if path is not None:
        _check_local_store_path(str(url))
    created = path is not None and not os.path.exists(path)
    lock = StoreLock(url).acquire()
    try:
        check_store(url, run_id, overwrite=overwrite, resume=resume, record=record)
    except BaseException:
        lock.release()
        raise
    return lock, created


def abandon(url, created):
    """Undo the claim of a run refused before it wrote a checkpoint or a result: the
    store is removed if this run created it, else emptied (it was empty, or its old run
    had been overwritten).  Never touches a store holding a checkpoint or a result."""
    g = _group(url, mode="r")
    attrs = dict(g.attrs)
    if "result" in attrs or any(k.endswith("_checkpoint") or "_checkpoint_" in k for k in attrs):
        return
    path = _local_path(url)
    if created and path is not None:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    else:
        _group(url, mode="w")
