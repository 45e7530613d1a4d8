"""Synthetic generators from the papers; loaders for real data shipped by packages."""
from .real import (FASHION_MNIST_CLASSES, REAL_DATASETS, YEAST_CLASSES, breast_wisconsin, fashion_mnist, heart,
                   into_unit_interval, letter, mnist, nonnegative_unit_variance, pendigits, pima, satimage, spambase,
                   yeast)
from .text import health_tweets, news_articles
from .synthetic import (DATASETS, gaussian_blobs, gmm_simplex, grid_2d, noisy_semicircles, separable_nmf, trefoil_knot,
                        two_rings)

__all__ = ["DATASETS", "FASHION_MNIST_CLASSES", "REAL_DATASETS", "breast_wisconsin", "fashion_mnist", "heart", "into_unit_interval", "letter", "nonnegative_unit_variance", "mnist", "pima", "spambase", "YEAST_CLASSES", "health_tweets", "news_articles", "pendigits", "satimage", "separable_nmf", "yeast", "gaussian_blobs", "gmm_simplex", "grid_2d", "noisy_semicircles", "trefoil_knot", "two_rings"]
