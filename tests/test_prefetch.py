"""The check's reference programs compiled ahead (``attnlab.measure.prefetch``) are the ones it runs."""
import pytest

from attnlab.measure import prefetch
from attnlab.measure.cell import Cell, Options, measure_cell
from attnlab.reference import check_programs, compiled
from benchmarks.engine.cost import _overhead

CELLS = [
    Cell("xla", batch=2, q_len=4, kv_len=128, heads=8, kv_heads=2, head_dim=32, dtype="float32", causal=True,
         lengths="full"),                                   # decode: lengths and query positions
    Cell("xla", batch=2, q_len=64, kv_len=64, heads=4, kv_heads=2, head_dim=32, dtype="bfloat16", causal=True,
         mode="fwd+bwd"),                                   # gradients too
]


@pytest.mark.parametrize("cell", CELLS, ids=["decode", "fwd+bwd"])
def test_the_check_runs_the_programs_compiled_ahead(cell):
    compiled._PROGRAMS.clear()
    compiled.clear_results()
    q, k, v, grads, kw = prefetch.check_shapes(cell)
    check_programs.precompile_check(q, k, v, grads=grads, **kw)
    ahead = set(compiled._PROGRAMS)
    rec = measure_cell(cell, Options(repeats=2, warmup=1))
    assert rec["status"] == "ok", rec["reason"]
    assert set(compiled._PROGRAMS) == ahead          # the check compiled nothing of its own


def test_nothing_is_queued_on_a_cpu():
    assert prefetch.start(CELLS) == 0


def test_the_wait_for_the_next_compile_is_not_overhead():
    rec = {"cell_s": 2.0, "compile_wait_s": 0.1, "timing_s": 0.4, "next_compile_wait_s": 1.2}
    assert _overhead(rec) == pytest.approx(0.3)
