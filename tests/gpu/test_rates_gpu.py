"""Rates that describe the call on the H200: the packed cell of the report (cuDNN, docs:6, B=2 T=8192 causal)
is counted by the pairs inside its documents, and its record is below the datasheet peak."""
import jax
import pytest

from attnlab.core.records import validate
from attnlab.measure import Cell, Options, measure_cell

pytestmark = pytest.mark.gpu


def test_a_packed_cudnn_cell_is_below_the_datasheet_peak():
    packed = Cell("cudnn", 2, 8192, 8192, 16, 16, 128, "bfloat16", True, packing="docs:6")
    r = measure_cell(packed, Options(repeats=10))
    assert r["status"] == "ok", r["reason"]
    dense = Cell("cudnn", 2, 8192, 8192, 16, 16, 128, "bfloat16", True).workload
    assert r["flops"] == packed.workload.flops() < 0.4 * dense.flops()      # the 6 documents' pairs only
    assert 0 < r["pct_peak"] < 100 and r["pct_roofline"] < 100
    validate({**r, "env": {"device_kind": jax.devices()[0].device_kind}})   # the datasheet bound holds
