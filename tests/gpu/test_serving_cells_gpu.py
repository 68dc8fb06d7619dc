"""Serving cells (``measure.serving_cell``) on an NVIDIA GPU: attnlab-decode's serving kernel and the masked xla
path on a skewed, a mixed and a paged batch, lengths traced, CUPTI time, checked on the longest and shortest requests.

    PYTHONPATH=src python -m pytest -q -m gpu tests/gpu/test_serving_cells_gpu.py      # about a minute

With a window, sinks and an FP8 cache together (serving and paged decode cells): never run yet (written without a GPU).
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


@pytest.mark.parametrize("backend", ["attnlab-decode", "xla"])
@pytest.mark.parametrize("lengths,page,kv", [("lognormal", 16, ("float8_e4m3fn", "page")),
                                             ("one-long", None, ("float8_e4m3fn", "token")),
                                             ("paged", 16, ("float8_e4m3fn", "token"))])
def test_window_sinks_and_an_fp8_cache_compose_in_measured_cells(backend, lengths, page, kv):
    """gpt-oss's windowed layer on an FP8 cache: window 128, sinks, soft cap 30, G = 7 (28/4), in a serving cell
    (lengths traced; paged or contiguous) and a paged decode cell (T = 4), checked against float64 of the
    dequantized cache, the cache's own error recorded, the roofline that of the window's FP8 bytes."""
    why = backends.get(backend).available() or (
        "xla has no paged decode path of its own" if backend == "xla" and lengths == "paged" else None)
    if why:
        pytest.skip(why)
    T = 4 if lengths == "paged" else 1
    cell = Cell(backend, 16, T, 8192, 28, 4, 128, "bfloat16", True, (128, 0), lengths=lengths, page_size=page,
                soft_cap=30.0, sinks=True, kv_dtype=kv[0], kv_scale=kv[1])
    r = measure_cell(cell, Options(repeats=5))
    assert r["status"] == "ok", r["reason"]
    assert r["timer"] == "cupti" and 0 < r["pct_roofline"] <= 100 and r["rel_err"] < 1e-2 < r["kv_rel_err"] < 0.1
    plain = Cell(backend, 16, T, 8192, 28, 4, 128, "bfloat16", True, lengths=lengths, page_size=page).workload
    assert r["bytes"] < plain.bytes() / 4          # the window's keys alone (<= 132 of up to 8192), at 1 byte each
