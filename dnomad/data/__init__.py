"""Synthetic generators from the papers; loaders for real data shipped by packages."""
from .synthetic import DATASETS, gaussian_blobs, grid_2d, noisy_semicircles, trefoil_knot, two_rings

__all__ = ["DATASETS", "gaussian_blobs", "grid_2d", "noisy_semicircles", "trefoil_knot", "two_rings"]
