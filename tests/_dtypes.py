"""Helpers shared by the dtype-parametrised tests (test_dropin, test_finite_masking)."""
import contextlib

import jax
import pytest


@contextlib.contextmanager
def dtype_context(dtype):
    """x64 on for float64 cases only, restored afterwards (it does not leak into other tests)."""
    if dtype == "float64":
        with jax.enable_x64(True):
            yield
    else:
        yield


def skip_xla_float64(impl, dtype):
    if impl == "xla" and dtype == "float64":
        pytest.skip("xla refuses float64 (jax.nn's softmax is float32): tests/test_dtype_cells.py::test_xla_refuses_float64")
