"""The engine's layouts the pass tests run over: in process, Zarr on disk, a real
2-worker cluster, CuPy blocks on a GPU (the ``backend`` and ``client_for`` fixtures are in
conftest.py)."""
import numpy as np

N = 50
# eps x size: float32 sums of ~n terms of O(1) values.
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def make_group(backend, block_size, dtype, tmp_path, client):
    """Keyword arguments of ``blocks.new_group`` / ``blocks.from_array`` for ``backend``."""
    if backend == "cuda":
        return dict(block_size=block_size, dtype=dtype, backend="local", device="cuda")
    kw = dict(block_size=block_size, dtype=dtype, backend=backend)
    if backend == "zarr":
        kw["store"] = str(tmp_path / "state.zarr")
    if backend == "distributed":
        kw["client"] = client
    return kw
