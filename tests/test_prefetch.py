"""The check's reference programs compiled ahead (``attnlab.measure.prefetch``) are the ones it runs."""
import time

import pytest

from attnlab.measure import calibration, prefetch
from attnlab.measure.cell import Cell, Options, measure_cell
from attnlab.reference import check_programs, compiled
from attnlab.sweep.engine import run_sweep
from attnlab.sweep.spec import Sweep
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
    for program, args, options in check_programs.check_compiles(q, k, v, grads=grads, **kw):
        compiled.precompile(program, *args, **options)
    ahead = set(compiled._PROGRAMS)
    rec = measure_cell(cell, Options(repeats=2, warmup=1))
    assert rec["status"] == "ok", rec["reason"]
    assert set(compiled._PROGRAMS) == ahead          # the check compiled nothing of its own


def test_a_cpu_compiles_ahead_but_never_beside_a_timed_cell(tmp_path, monkeypatch):
    """On a CPU the references are queued too (not a backend that is not available: never checked), and a
    held thread (a cell being timed) starts no compile until released; the engine holds around each timing and
    around the calibration's probe (whose CPU time a background compile would inflate)."""
    assert prefetch.why_not(Cell("cudnn", 2, 4, 4, 2, 2, 16)).startswith("never checked: cudnn")
    cell = Cell("xla", batch=3, q_len=5, kv_len=7, heads=2, kv_heads=1, head_dim=16, dtype="float32")
    compiled._PROGRAMS.clear()
    assert prefetch.hold()
    try:
        assert prefetch.start([cell]) == 1
        time.sleep(0.5)
        assert not compiled._PROGRAMS            # held: nothing compiled beside the timer
    finally:
        prefetch.release()
    for _ in range(600):
        if not prefetch._THREAD:
            break
        time.sleep(0.05)
    assert compiled._PROGRAMS                    # released: compiled
    calls = []
    monkeypatch.setattr(prefetch, "hold", lambda: calls.append("hold") or True)
    monkeypatch.setattr(prefetch, "release", lambda: calls.append("release"))
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))   # nothing learnt: the sweep probes first
    calibration.forget()
    run_sweep(Sweep(["naive", "xla"], batch=[1], q_len=[8], kv_len=[8], heads=[2], kv_heads=[1], head_dim=[8],
                    dtype=["float32"]), str(tmp_path / "o"), options=Options(repeats=1, warmup=0, min_time_s=0))
    assert calls == ["hold", "release"] * 3      # the calibration's probe, then each cell's timing
    calibration.forget()


def test_the_wait_for_the_next_compile_is_not_overhead():
    rec = {"cell_s": 2.0, "compile_wait_s": 0.1, "timing_s": 0.4, "next_compile_wait_s": 1.2}
    assert _overhead(rec) == pytest.approx(0.3)
