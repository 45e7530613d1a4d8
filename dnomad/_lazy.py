"""Package attributes imported on first use (PEP 562).  A dask worker that unpickles one
of dnomad's kernels imports the packages above it; importing every estimator there
(scikit-learn with SciPy's stats and pandas) cost each worker ~100 MiB it never used."""
import importlib


def lazy_attributes(package, names):
    """A module ``__getattr__`` for ``package``: ``names`` maps an attribute to the
    submodule (relative) that defines it; any other name is tried as a submodule.  A
    value found is kept in the package's namespace."""
    module = importlib.import_module(package)

    def __getattr__(name):
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
        else:
            try:
                value = importlib.import_module(f".{name}", package)
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(module, name, value)
        return value

    return __getattr__
