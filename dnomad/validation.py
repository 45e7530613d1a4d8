"""The input gate: every estimator's parameters and data are checked here, before a store
is touched or any pass runs (scikit-learn's ``_parameter_constraints`` pattern).

Each estimator declares ``_parameter_constraints``, a dict from parameter name to the
list of constraints it may satisfy (any one will do):

- ``None``: the value None;
- ``"boolean"``: True or False (a NumPy bool too; never "false" or 0);
- ``"callable"``, ``"callback"`` (a callable taking one argument), ``"random_state"`` (None, an int >= 0 or a ``np.random.Generator``),
  ``"path"`` (a str, an ``os.PathLike`` or an fsspec URL), ``"dtype"`` (float32 or
  float64 in any spelling NumPy accepts), ``"array-like"``, ``"dict"``;
- ``Interval(Integral | Real, lo, hi, closed=...)``: a number in a range (bools and NaN
  never qualify; Real accepts ints);
- ``Options(...)``: one of the listed values (strings, compared by ``==``);
- a class: an instance of it (``list``, a divergence object).

:func:`check_data` is the data's half of the gate: what the array is (its kind, its
dtype, its shape) and, for data in memory, what it holds (finiteness, magnitude, sign,
constant columns), with one message per failure that names the argument, says what was
found and what is allowed.  Lazy data (a Zarr array or path, a dask array) is checked by
its metadata here and by content where it is read.
"""
from __future__ import annotations

import math
import numbers
import os

import numpy as np

from .errors import InputTypeError, InputValueError, InvalidParameterError

# Entries whose magnitude exceeds this are refused: the methods square the data (Gram
# matrices, squared distances, row norms), and 1e150 squared is still finite in float64
# with room for sums over 10^8 terms.
MAX_ABS = 1e150


class Interval:
    """A number of ``kind`` (numbers.Integral or numbers.Real) with lo <= x <= hi;
    ``closed`` ("both", "left", "right", "neither") says which ends belong; None is
    unbounded."""

    def __init__(self, kind, lo, hi, *, closed="both"):
        self.kind, self.lo, self.hi, self.closed = kind, lo, hi, closed

    def holds(self, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, self.kind):
            return False
        try:
            if self.kind is numbers.Real and not math.isfinite(value):
                return False
        except OverflowError:               # an int beyond any float (10**400)
            return False
        lo_ok = self.lo is None or (value >= self.lo if self.closed in ("both", "left") else value > self.lo)
        hi_ok = self.hi is None or (value <= self.hi if self.closed in ("both", "right") else value < self.hi)
        return lo_ok and hi_ok

    def __str__(self):
        kind = "an int" if self.kind is numbers.Integral else "a finite number"
        left = "[" if self.closed in ("both", "left") and self.lo is not None else "("
        right = "]" if self.closed in ("both", "right") and self.hi is not None else ")"
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        return f"{kind} in {left}{lo}, {hi}{right}"


class Options:
    """One of the given values (compared with ``==``, by type first: 1 is not True)."""

    def __init__(self, *values):
        self.values = values

    def holds(self, value):
        return any(type(value) is type(v) and value == v for v in self.values) or \
            (isinstance(value, np.str_) and str(value) in self.values)

    def __str__(self):
        return "one of " + ", ".join(repr(v) for v in self.values)


def _is_path(value):
    return isinstance(value, (str, os.PathLike)) and len(os.fspath(value)) > 0


def _is_dtype(value):
    if isinstance(value, (bool, int, float)) or value is None:
        return False
    try:
        return np.dtype(value) in (np.dtype(np.float32), np.dtype(np.float64))
    except TypeError:
        return False


def _takes_one_argument(value):
    """A callable that can be called with one positional argument (a history row)."""
    if not callable(value):
        return False
    import inspect

    try:
        inspect.signature(value).bind(None)
    except TypeError:
        return False
    except ValueError:          # no signature to read (some builtins): let the call tell
        pass
    return True


_NAMED = {
    "boolean": (lambda v: isinstance(v, (bool, np.bool_)), "a bool (True or False)"),
    "callable": (callable, "a callable"),
    "callback": (_takes_one_argument, "a callable taking one argument (the history row, a dict)"),
    "random_state": (lambda v: v is None or isinstance(v, (np.random.Generator, np.random.BitGenerator,
                                                           np.random.SeedSequence)) or
                     (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= 0),
                     "None, an int >= 0, or a numpy Generator, BitGenerator or SeedSequence "
                     "(what numpy.random.default_rng takes)"),
    "path": (_is_path, "a path (str or os.PathLike) or an fsspec URL"),
    "dtype": (_is_dtype, "float32 or float64"),
    "array-like": (lambda v: hasattr(v, "__array__") or isinstance(v, (list, tuple)), "an array"),
    "dict": (lambda v: isinstance(v, dict), "a dict"),
}


def _holds(constraint, value):
    if constraint is None:
        return value is None
    if isinstance(constraint, type):
        return isinstance(value, constraint)
    if isinstance(constraint, str):
        return _NAMED[constraint][0](value)
    return constraint.holds(value)


def _describe(constraint):
    if constraint is None:
        return "None"
    if isinstance(constraint, type):
        return f"a {constraint.__name__}"
    if isinstance(constraint, str):
        return _NAMED[constraint][1]
    return str(constraint)


def validate_params(est):
    """Check every parameter of ``est`` against ``est._parameter_constraints``; raise
    :class:`InvalidParameterError` naming the first that satisfies none of its own."""
    owner = type(est).__name__
    for name, constraints in est._parameter_constraints.items():
        value = getattr(est, name)
        if not any(_holds(c, value) for c in constraints):
            allowed = " or ".join(_describe(c) for c in constraints)
            raise InvalidParameterError(f"{owner}: {name} must be {allowed}; got {value!r} "
                                        f"({type(value).__name__})")


# ----------------------------------------------------------------------- data
_DTYPE_KINDS = {"b": "boolean", "c": "complex", "O": "object", "U": "string", "S": "bytes",
                "M": "datetime", "m": "timedelta", "V": "structured"}


def check_dtype_kind(dtype, name, owner):
    """Refuse a dtype that is not an integer or floating one, saying which it is."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iuf":
        return
    what = _DTYPE_KINDS.get(dtype.kind, str(dtype))
    hint = {"complex": "; pass X.real or np.abs(X) if that is what you mean",
            "boolean": "; pass X.astype(float) if 0/1 values are meant",
            "string": "; convert it with X.astype(float) if the strings are numbers",
            "object": "; it must hold numbers only (X.astype(float))"}.get(what, "")
    raise InputTypeError(f"{owner}: {name} must hold real numbers (an integer or floating dtype); "
                         f"got {what} dtype {dtype}{hint}")


def _unwrapped(X, owner, name):
    """A masked array without masked entries as its data (with any: refused, dnomad does
    not impute), a pandas object as a float64 array (missing values as NaN, which the
    gate then names); anything else unchanged."""
    if isinstance(X, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(X)
        if mask.any():
            where = np.argwhere(mask)[0]
            count = int(mask.sum())
            raise InputValueError(f"{owner}: {name} is a masked array with {count} masked "
                                  f"{'entry' if count == 1 else 'entries'} (first at {tuple(int(i) for i in where)}); "
                                  f"dnomad does not impute them: fill them ({name}.filled(value)) or drop their rows")
        return np.ma.getdata(X)
    if isinstance(getattr(X, "_meta", None), np.ma.MaskedArray) and hasattr(X, "dask"):
        raise InputValueError(f"{owner}: {name} is a dask array of masked arrays; dnomad does not impute masked "
                              f"entries: fill them (dask.array.ma.filled({name}, value)) or drop their rows")
    if type(X).__module__.split(".")[0] == "pandas" and hasattr(X, "to_numpy"):
        try:
            return X.to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError) as exc:
            dtypes = getattr(X, "dtypes", None)
            columns = [] if dtypes is None or not hasattr(dtypes, "items") else \
                [str(c) for c, t in dtypes.items() if t.kind not in "biuf"]
            which = f" (columns {', '.join(columns[:5])})" if columns else ""
            raise InputTypeError(f"{owner}: {name} is a pandas {type(X).__name__} that does not convert to "
                                 f"numbers{which}: {exc}") from None
    return X


def check_data(X, *, owner, name="X", min_rows=2, min_cols=1, square=False, nonnegative=False,
               no_zero_rows=False, not_constant=False, sparse=False, lazy=True, dtype=None):
    """The data's half of the gate.  Returns X as a float64 ndarray when it is in memory
    (NumPy, a list, anything with ``__array__``), a scipy.sparse matrix as float64 CSR
    when ``sparse``, and lazy data (Zarr arrays, paths and URLs; dask arrays) unchanged
    after checking its metadata when ``lazy``.

    Checked: the kind and the dtype (complex, bool, object, strings refused, saying
    which); 2-D with at least ``min_rows`` x ``min_cols`` (``square``: n x n); for
    data in memory also finite entries, magnitude at most MAX_ABS, ``nonnegative``,
    ``no_zero_rows`` (rows that cannot be scaled to sum 1) and ``not_constant`` (every
    row equal: the method's objective is then the same for every clustering).  ``dtype``:
    the float type the entries are stored in (a precomputed matrix), whose row sums must
    not overflow: entries up to its largest value / n."""
    from . import blocks

    X = _unwrapped(X, owner, name)
    meta = blocks.input_metadata(X)
    kind = meta["kind"]
    if kind == "dask" and any(isinstance(s, float) and math.isnan(s) for s in meta["shape"]):
        # Unknown chunk sizes (after boolean indexing): one pass to count the rows, as
        # every later step needs n.
        X = blocks.with_known_chunks(X)
        meta = dict(meta, shape=X.shape)
    if kind == "unsupported":
        raise InputTypeError(f"{owner}: {name} must be an array (NumPy, dask, a Zarr array or its path or "
                             f"URL{', scipy.sparse' if sparse else ''}); got {type(X).__name__}")
    if kind == "sparse" and not sparse:
        raise InputTypeError(f"{owner}: {name} is a scipy.sparse matrix; this method needs it dense "
                             f"(X.toarray())")
    if kind in ("zarr", "dask") and not lazy:
        raise InputTypeError(f"{owner}: {name} is a {kind} array; this method needs it in memory "
                             f"(np.asarray(X))")
    if kind == "array-like":
        try:
            X = np.asarray(X)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(f"{owner}: {name} must be a numeric array; {type(X).__name__} could not "
                                 f"be read as one ({exc})") from None
        meta = dict(meta, dtype=X.dtype, shape=X.shape)
    check_dtype_kind(meta["dtype"], name, owner)
    shape = tuple(meta["shape"])
    rows, cols = ("n_features", "n_samples") if no_zero_rows else ("n_samples", "n_features")
    if len(shape) != 2:
        want = "n x n" if square else f"({rows}, {cols})"
        raise InputValueError(f"{owner}: {name} must be 2-D {want}; got {len(shape)}-D shape {shape}")
    if square and shape[0] != shape[1]:
        raise InputValueError(f"{owner}: {name} must be a square n x n matrix; got shape {shape}")
    # scikit-learn's wording, which its estimator checks look for
    if shape[1] < min_cols:
        raise InputValueError(f"{owner}: {name} has {shape[1]} {cols.split('_')[1][:-1]}(s) (shape={shape}) "
                              f"while a minimum of {min_cols} is required.")
    if shape[0] < min_rows:
        raise InputValueError(f"{owner}: {name} has {shape[0]} {rows.split('_')[1][:-1]}(s) (shape={shape}) "
                              f"while a minimum of {min_rows} is required.")
    if kind in ("zarr", "dask"):
        return X
    if kind == "sparse":
        X = X.tocsr().astype(np.float64)
        values = X.data
    else:
        X = np.asarray(X, dtype=np.float64)
        values = X
    finite = np.isfinite(values)
    if not finite.all():
        if kind == "sparse":
            raise InputValueError(f"{owner}: {name} contains NaN or Inf; remove or impute those entries")
        bad = np.argwhere(~finite)[0]
        raise InputValueError(f"{owner}: {name} contains NaN or Inf (first at row {bad[0]}, column {bad[1]}); "
                              f"remove or impute those entries")
    peak = float(np.abs(values).max(initial=0.0))
    bound = MAX_ABS if dtype is None else min(MAX_ABS, float(np.finfo(dtype).max) / shape[0])
    if peak > bound:
        where = "" if dtype is None else f" (in {np.dtype(dtype).name}, over {shape[0]} rows)"
        raise InputValueError(f"{owner}: {name} has entries of magnitude up to {peak:.3g}, beyond {bound:.3g}, "
                              f"where squares and sums overflow{where}; rescale it (e.g. X / np.abs(X).max())")
    if nonnegative and values.size and float(values.min()) < 0:
        raise InputValueError(f"{owner}: {name} must be nonnegative; its smallest entry is {values.min():.3g}")
    if no_zero_rows:
        sums = np.asarray(abs(X).sum(axis=1)).ravel()
        if (sums == 0).any():
            raise InputValueError(f"{owner}: row {int(np.flatnonzero(sums == 0)[0])} of {name} is all zero and "
                                  f"cannot be scaled to sum 1; drop the zero rows of {name}")
    if not_constant and np.ptp(X, axis=0).max(initial=0.0) == 0:
        raise InputValueError(f"{owner}: every row of {name} is the same point ({name} is constant after centering): there is nothing to cluster")
    return X
