"""The device parameter of the tests: "cpu" runs everywhere; "cuda" is marked gpu_test
and skips cleanly where CuPy or a CUDA device is missing (CI has neither)."""
import pytest

from dnomad.blocks import device as dev

needs_gpu = pytest.mark.skipif(not dev.cuda_available(), reason=dev.cuda_status()[1])
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu_test, needs_gpu])
DEVICES = ["cpu", CUDA]
