"""The import direction of DESIGN.md: solvers never import dask, zarr or cupy, and the
per-block kernels never import dask."""
import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "dnomad"


def imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("path", sorted((PKG / "solvers").rglob("*.py")) + sorted((PKG / "linalg").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PKG)))
def test_solvers_and_linalg_do_not_import_dask_zarr_cupy(path):
    bad = {"dask", "distributed", "zarr", "cupy"} & set(imported_modules(path))
    assert not bad, f"{path.name} imports {bad}"


def test_kernels_do_not_import_dask():
    bad = {"dask", "distributed", "zarr"} & set(imported_modules(PKG / "blocks" / "kernels.py"))
    assert not bad


def test_cupy_is_imported_in_one_place():
    """CuPy is imported lazily by dnomad.blocks.device alone."""
    importers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if "cupy" in set(imported_modules(p)))
    assert importers == ["blocks/device.py"]
