"""Serving cells (``measure.serving_cell``) on an NVIDIA GPU: attnlab-decode's serving kernel and the masked xla
path on a skewed, a mixed and a paged batch, lengths traced, CUPTI time, checked on the longest and shortest requests.

    PYTHONPATH=src python -m pytest -q -m gpu tests/gpu/test_serving_cells_gpu.py      # well under a minute
"""
import pytest

from attnlab import backends
from attnlab.measure import Options
from attnlab.measure.cell import Cell, measure_cell

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["attnlab-decode", "xla"])
@pytest.mark.parametrize("lengths,chunks,page", [("one-long", None, None), ("lognormal", "2x512", None),
                                                 ("lognormal", None, 16)])
def test_serving_cell_on_the_gpu(backend, lengths, chunks, page):
    why = backends.get(backend).available()
    if why:
        pytest.skip(why)
    cell = Cell(backend, 32, 1, 8192, 32, 8, 128, "bfloat16", True, lengths=lengths, page_size=page,
                prefill_chunks=chunks)
    r = measure_cell(cell, Options(repeats=5))
    assert r["status"] == "ok", r["reason"]
    assert r["timer"] == "cupti" and r["kernel_ms"] > 0 and r["lengths_traced"] is True
    assert 0 < r["pct_roofline"] <= 100 and r["tokens_per_s"] > 0
    assert r["checks"]["float64_requests"]["ok"] and r["request_lengths"]["requests"] == 32 + (2 if chunks else 0)
