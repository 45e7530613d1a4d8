"""The import direction of DESIGN.md: cli/api -> method packages -> linalg -> engine.
The engine (dnomad/blocks) imports no method package; a method's math (everything in
its package but the estimator) imports no dask, distributed, zarr or cupy; the per-block
kernels import no dask; CuPy is imported in one place."""
import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "dnomad"
METHODS = ("nomad", "symnmf", "hottopixx", "kmeans_sdp", "bregman")


def imported_modules(path):
    """Top-level names of the modules ``path`` imports (absolute, or relative resolved
    against its package)."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(PKG.parent).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module
                continue
            base = package[:len(package) - node.level + 1]
            for a in node.names if node.module is None else [None]:
                parts = base + ((node.module,) if node.module else (a.name,))
                yield ".".join(parts)


def _first(name):
    return name.split(".")[0]


def test_the_layering_helper_resolves_relative_imports():
    names = set(imported_modules(PKG / "nomad" / "estimator.py"))
    assert {"dnomad.blocks", "dnomad.nomad.cgm", "dnomad.base"} <= names


MATH = sorted(p for m in METHODS for p in (PKG / m).rglob("*.py") if not p.name.startswith("estimator")) + \
    sorted((PKG / "linalg").rglob("*.py"))


@pytest.mark.parametrize("path", MATH, ids=lambda p: str(p.relative_to(PKG)))
def test_method_math_and_linalg_do_not_import_dask_zarr_cupy(path):
    bad = {"dask", "distributed", "zarr", "cupy"} & {_first(m) for m in imported_modules(path)}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted((PKG / "blocks").rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_the_engine_imports_no_method_package(path):
    bad = {m for m in imported_modules(path)
           if m.startswith("dnomad.") and m.split(".")[1] in METHODS + ("api", "base", "cli")}
    assert not bad, f"{path.name} imports {bad}"


def test_kernels_do_not_import_dask():
    bad = {"dask", "distributed", "zarr"} & {_first(m) for m in imported_modules(PKG / "blocks" / "kernels.py")}
    assert not bad


def test_cupy_is_imported_in_one_place():
    """CuPy is imported lazily by dnomad.blocks.device alone."""
    importers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                       if "cupy" in {_first(m) for m in imported_modules(p)})
    assert importers == ["blocks/device.py"]


ESTIMATORS = sorted(p for m in METHODS for p in (PKG / m).glob("estimator*.py")) + [PKG / "base.py", PKG / "api.py"]


@pytest.mark.parametrize("path", ESTIMATORS, ids=lambda p: str(p.relative_to(PKG)))
def test_estimators_do_not_import_dask_zarr_distributed(path):
    """Clusters, stores and inputs are the engine's: an estimator reaches them through it."""
    bad = {"dask", "distributed", "zarr", "cupy"} & {_first(m) for m in imported_modules(path)}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("method", METHODS)
def test_every_method_package_has_its_estimator(method):
    assert list((PKG / method).glob("estimator*.py"))
