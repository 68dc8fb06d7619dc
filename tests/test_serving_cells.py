"""Serving cells: request-length distributions, mixed batches, the sweep axis, one cell measured on the CPU
(serving_attention with the lengths traced) and its check of the longest and shortest requests."""
import hashlib

import numpy as np
import pytest

from attnlab import Problem
from attnlab.core import request_lengths as rl
from attnlab.measure import Options, ahead, check, serving_cell
from attnlab.measure.cell import Cell, measure_cell
from attnlab.measure.outcome import Skip
from attnlab.measure.recount import recount
from attnlab.reference.serving64 import sampled
from attnlab.sweep.spec import SweepError, build


def test_distributions_files_and_mixed_batches(tmp_path):
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    assert rl.draw("uniform", 4, 2, 64, rng()).tolist() == [64] * 4
    assert rl.draw("one-long", 4, 1, 64, rng()).tolist() == [64, 2, 2, 2]
    for dist in ("spread", "lognormal"):
        n = rl.draw(dist, 64, 4, 4096, rng())
        assert n.dtype == np.int32 and n.min() >= 4 and n.max() <= 4096 and len(set(n.tolist())) > 8
    f = tmp_path / "lens.txt"
    f.write_text("# kv lengths\n5 900\n30\n")
    assert rl.draw(f"file:{f}", 4, 8, 512, rng()).tolist() == [8, 512, 30, 8]       # clipped to [T, S], repeated
    q, kv = rl.mixed_batch(2, 16, 3, 64, rng(), decode_kv=[9, 64, 2], q_len=2)
    assert q.tolist() == [16, 16, 2, 2, 2] and kv[2:].tolist() == [9, 64, 2] and kv[:2].min() >= 16
    assert rl.parse_chunks("2x2048") == (2, 2048) and rl.parse_chunks("none") is None
    for bad in ("2y3", "0x4"):
        with pytest.raises(ValueError, match="NxSIZE"):
            rl.parse_chunks(bad)
    with pytest.raises(ValueError, match="lengths must be one of"):
        rl.draw("zipf", 4, 1, 64, rng())
    f.write_text("100\n1000000000000000000000000000\n")
    with pytest.raises(ValueError, match="all >= 1 and < 2\\*\\*31"):
        rl.read_lengths(str(f))


def test_sweep_axis_makes_serving_cells_and_refuses_bad_values():
    base = dict(backends="xla", batch="3", q_len="2", kv_len="64", heads="4", kv_heads="2", head_dim="16")
    cells = build({**base, "lengths": "spread,full,Spread:paged16", "prefill_chunks": "none,1x8", "causal": "both"}).cells()
    serving = [c for c in cells if c.prefill_chunks or c.lengths == "spread"]
    assert {(c.lengths, c.prefill_chunks, c.causal, c.page_size) for c in serving} == {
        ("spread", None, True, None), ("spread", "1x8", True, None), ("spread", None, True, 16), ("spread", "1x8", True, 16)}
    assert "prefill=1x8" in serving[1].config_label and "decode-spread:paged16" in serving[-1].config_label
    for values, match in ((dict(lengths="spread", causal="false"), "are causal"),
                          (dict(lengths="spread", prefill_chunks="2y3", causal="true"), "^prefill_chunks: .*NxSIZE"),
                          (dict(lengths="file:/no/such/file", causal="true"), "no/such/file")):
        with pytest.raises(SweepError, match=match):
            build({**base, **values})
    with pytest.raises(ValueError, match="prefill_chunks needs"):
        Cell("xla", 3, 2, 64, 4, 2, 16, causal=True, lengths="full", prefill_chunks="1x8")


def test_a_distribution_name_wins_over_a_file_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("spread", "Lognormal", "full"):
        (tmp_path / name).write_text("5\n")
    (tmp_path / "lens.txt").write_text("5\n")
    base = dict(backends="xla", batch="2", q_len="1", kv_len="64", heads="2", head_dim="16", causal="true")
    got = {c.lengths for c in build({**base, "lengths": "spread,Lognormal:paged16,full,lens.txt"}).cells()}
    assert got == {"spread", "lognormal", "full", "file:lens.txt@" + hashlib.sha256(b"5\n").hexdigest()[:12]}
    with pytest.raises(SweepError, match="'OK.TXT' is not none"):      # named as typed
        build({**base, "lengths": "OK.TXT"})


def test_a_lengths_file_is_pinned_to_its_contents(tmp_path, monkeypatch):
    """file:PATH cells carry the file's digest: the same file with other lengths makes other cells (compare and
    --resume tell them apart), and a cell whose file changed since it was made is refused, not run on new lengths."""
    monkeypatch.chdir(tmp_path)
    base = dict(backends="xla", batch="3", q_len="1", kv_len="256", heads="2", head_dim="16", causal="true",
                lengths="file:lens.txt:paged16")
    (tmp_path / "lens.txt").write_text("4 4 4\n")
    short, = build(base).cells()
    (tmp_path / "lens.txt").write_text("256 256 256\n")
    long, = build(base).cells()
    assert short.lengths != long.lengths and short.key() != long.key() and long.page_size == 16
    assert serving_cell.requests(long)[1].tolist() == [256] * 3
    with pytest.raises(ValueError, match="lengths file lens.txt changed since its cells were made"):
        serving_cell.requests(short)
    assert build({**base, "lengths": long.lengths + ":paged16"}).cells() == [long]   # a pinned value is kept


@pytest.mark.parametrize("backend,page_size", [("xla", None), ("attnlab-decode", 16)])
def test_a_serving_cell_runs_traced_checked_and_counts_the_valid_work(monkeypatch, backend, page_size):
    cell = Cell(backend, 3, 2, 64, 4, 2, 16, "float32", True, lengths="one-long", page_size=page_size,
                prefill_chunks="1x8")
    q, kv, _ = serving_cell.requests(cell)
    assert q.tolist() == [8, 2, 2, 2] and kv[1:].tolist() == [64, 2, 2] and cell.kv_lengths() == tuple(kv.tolist())
    compiled_on = []
    real = serving_cell.compile_within_budget
    monkeypatch.setattr(serving_cell, "compile_within_budget", lambda f, a, *b: compiled_on.append(a) or real(f, a, *b))
    monkeypatch.setattr(serving_cell, "_PROGRAMS", type(serving_cell._PROGRAMS)())
    opts = Options(repeats=1, warmup=0, min_time_s=0, pipelined_calls=2, compile_ahead=False)
    r = measure_cell(cell, opts)
    assert r["status"] == "ok", r["reason"]
    want = Problem.serving(q, kv, 4, 2, 16, "float32", kv_len_max=64)
    assert (r["flops"], r["bytes"]) == (want.flops(), want.bytes()) and r["lengths_traced"] is True
    assert recount(r)["flops"] == r["flops"]       # a stored serving record recounts to the same valid work
    assert "serving" in ahead.why_not(cell)       # never compiled ahead as a decode_attention program
    assert r["request_lengths"]["kv"] == kv.tolist() and r["tokens_per_s"] == pytest.approx(14 / (r["wall_ms"] * 1e-3))
    assert r["checks"]["float64_requests"]["requests"] == [0, 1, 2] and r["checked_rows"] == 8 + 2 + 2
    # the lengths are arguments of the jitted step (traced, as a server passes them), not constants in it
    assert [np.asarray(x).tolist() for x in compiled_on[0][3:5]] == [[0, 8, 10, 12, 14], kv.tolist()]
    assert compiled_on[0][1].shape == ((4 * 64 // 16, 16, 2, 16) if page_size else (4, 64, 2, 16))   # pages
    assert not r["compiled_ahead"] and not r["program_reused"]
    if page_size is None:      # compiled ahead from its shapes (the engine does so): those of its first timed set
        shape = lambda x: None if x is None else (x.shape, x.dtype)  # noqa: E731
        assert list(map(shape, serving_cell.step_shapes(cell))) == list(map(shape, compiled_on[0]))
    # another distribution of the same shape runs the same program (compiled once), checked on its own lengths
    again = measure_cell(Cell(backend, 3, 2, 64, 4, 2, 16, "float32", True, lengths="spread", page_size=page_size,
                              prefill_chunks="1x8"), opts)
    assert again["status"] == "ok", again["reason"]
    assert len(compiled_on) == 1 and again["program_reused"] is True and again["compile_s"] == r["compile_s"]
    assert again["request_lengths"]["kv"] != r["request_lengths"]["kv"] and again["compile_wait_s"] < 0.1


def test_a_sweep_compiles_the_next_serving_step_ahead_and_reuses_one_program(tmp_path, monkeypatch):
    """B = 2 then 3 (two programs: the second compiled ahead while the first is measured), then another
    distribution at B = 2 and 3 (their programs reused, so not compiled ahead), then two distributions in a row at
    B = 4 (one compile); each checked on its own lengths."""
    from attnlab.sweep.engine import run_sweep
    from attnlab.sweep.spec import Sweep

    serving_cell._PROGRAMS.clear()
    steps = []
    real = serving_cell.step
    monkeypatch.setattr(serving_cell, "step", lambda cell, kw: steps.append(cell.batch) or real(cell, kw))
    sweep = Sweep(["xla"], batch=[2, 3], q_len=[1], kv_len=[32], heads=[2], kv_heads=[1], head_dim=[8],
                  dtype=["float32"], causal=[True], lengths=["uniform", "spread"])
    recs = {(r["batch"], r["lengths"]): r for r in run_sweep(sweep, str(tmp_path), options=Options(repeats=1, warmup=0))}
    assert all(r["status"] == "ok" for r in recs.values()), [r["reason"] for r in recs.values()]
    got = {k: (r["compiled_ahead"], r["program_reused"]) for k, r in recs.items()}
    assert got == {(2, "uniform"): (False, False), (2, "spread"): (False, True),
                   (3, "uniform"): (True, False), (3, "spread"): (False, True)}, got
    assert sorted(steps) == [2, 3]      # one compile a program: none for the spread cells, ahead or not
    # two cells of one program in a row: the second is not compiled ahead while the first compiles it
    again = run_sweep(Sweep(["xla"], batch=[4], q_len=[1], kv_len=[32], heads=[2], kv_heads=[1], head_dim=[8],
                            dtype=["float32"], causal=[True], lengths=["uniform", "spread"]), str(tmp_path / "b"),
                      options=Options(repeats=1, warmup=0))
    assert [(r["status"], r["program_reused"]) for r in again] == [("ok", False), ("ok", True)]
    assert sorted(steps) == [2, 3, 4]
    assert "program_reused" in ahead.why_not(Cell("xla", 3, 1, 32, 2, 1, 8, "float32", True, lengths="one-long"))


def test_the_check_samples_the_longest_and_shortest_requests_and_catches_a_wrong_row():
    import jax.numpy as jnp

    q_lens, kv_lens = np.array([40, 1, 1, 3]), np.array([100, 7, 300, 3])
    pieces = sampled(q_lens, kv_lens)
    assert pieces == [(0, 0, 8, 68), (0, 32, 8, 100), (1, 40, 1, 7), (2, 41, 1, 300), (3, 42, 3, 3)]
    cell = Cell("xla", 4, 1, 300, 4, 2, 16, "float32", True, lengths="spread")
    starts = rl.starts_of(q_lens)
    qa, k, v = (np.random.default_rng(i).normal(size=s).astype(np.float32)
                for i, s in enumerate(((48, 4, 16), (4, 300, 2, 16), (4, 300, 2, 16))))
    from attnlab.reference.serving64 import reference_serving_attention

    good = reference_serving_attention(qa, k, v, starts, kv_lens).astype(np.float32)
    args = (jnp.asarray(qa), jnp.asarray(k), jnp.asarray(v), starts, kv_lens)
    backend = type("B", (), {"rel_l2_limit": None, "rel_l2_rule": None})
    sem = serving_cell.call_semantics(cell)
    rec = check.check_serving(jnp.asarray(good), args, q_lens, kv_lens, cell, backend, sem)
    assert rec["rel_err"] < 1e-6 and rec["checked_rows"] == 21
    bad = good.copy()
    bad[41] *= 1.01                     # the longest cache's one decode token, a 1% error
    with pytest.raises(Skip, match=r"requests \[0, 1, 2, 3\]"):
        check.check_serving(jnp.asarray(bad), args, q_lens, kv_lens, cell, backend, sem)


def test_the_check_judges_every_token_of_every_request():
    """A wrong token that no sample reads, or a padding row that is not 0, is caught: every token is judged (float32
    on the device, float64 rows). Row 12 is request 0's, between the float64 sample's first 8 tokens and its middle
    token 20; row 45 is request 4's only token, a request no sample picks."""
    import jax.numpy as jnp

    from attnlab.reference.serving64 import reference_serving_attention, sampled_requests

    q_lens, kv_lens = np.array([40, 1, 1, 3, 1]), np.array([100, 7, 300, 3, 50])
    assert 4 not in sampled_requests(q_lens, kv_lens)
    cell = Cell("xla", 5, 1, 300, 4, 2, 16, "float32", True, lengths="spread")
    starts = rl.starts_of(q_lens)
    qa, k, v = (np.random.default_rng(i).normal(size=s).astype(np.float32)
                for i, s in enumerate(((50, 4, 16), (5, 300, 2, 16), (5, 300, 2, 16))))
    good = reference_serving_attention(qa, k, v, starts, kv_lens).astype(np.float32)
    args = (jnp.asarray(qa), jnp.asarray(k), jnp.asarray(v), starts, kv_lens)
    backend = type("B", (), {"rel_l2_limit": None, "rel_l2_rule": None})
    sem = serving_cell.call_semantics(cell)
    rec = check.check_serving(jnp.asarray(good), args, q_lens, kv_lens, cell, backend, sem, seed=3)
    assert {"float64_requests", "every_token_float32_device", "every_token_float64_rows"} <= set(rec["checks"])
    assert rec["checked_fraction"] == 1.0
    for row, value, words in ((45, 1.05, "every token"), (48, 1.0, "padding rows from 46 are not 0"),
                              (12, 1.05, "every token"), (20, 1.05, "every token")):
        bad = good.copy()
        bad[row, 0, 0] = value if row == 48 or np.isnan(value) else bad[row, 0, 0] * value + 0.5
        with pytest.raises(Skip, match=words):
            check.check_serving(jnp.asarray(bad), args, q_lens, kv_lens, cell, backend, sem, seed=3)


@pytest.mark.parametrize("backend,page_size,kv", [("xla", None, ("int8", "head")),
                                                  ("attnlab-decode", 16, ("float8_e4m3fn", "page"))])
def test_a_serving_cell_with_a_window_sinks_and_a_quantized_cache(backend, page_size, kv):
    """The sweep makes the cell (no longer skipped); it runs the call with all three, is checked on the dequantized
    cache's float64 with the window and sinks, records the cache's own error, and counts the window's bytes at the
    cache's dtype."""
    flags = dict(backends=backend, batch="3", q_len="2", kv_len="64", heads="4", kv_heads="2", head_dim="16",
                 dtype="bfloat16", causal="true", window="12:0", sinks="true", kv_dtype=":".join(kv),
                 lengths="one-long" + (f":paged{page_size}" if page_size else ""), prefill_chunks="1x8")
    (cell,) = build(flags).cells()
    assert (cell.window, cell.sinks, cell.kv_dtype, cell.kv_scale, cell.page_size) == ((12, 0), True, *kv, page_size)
    r = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0, pipelined_calls=2, compile_ahead=False))
    assert r["status"] == "ok", r["reason"]
    assert r["rel_err"] < 1e-2 < r["kv_rel_err"] < 0.1 and "dequantized" in r["checks"]["float64_requests"]["reference"]
    plain = Cell(backend, 3, 2, 64, 4, 2, 16, "bfloat16", True, lengths="one-long", page_size=page_size,
                 prefill_chunks="1x8").workload
    assert r["bytes"] == cell.workload.bytes() < plain.bytes() and r["flops"] < plain.flops()
    assert recount(r)["bytes"] == r["bytes"]


def test_the_serving_check_judges_the_window_and_the_sinks():
    """An output right but for the sinks, or for the window, is caught (the check is not the plain call's)."""
    import jax.numpy as jnp

    from attnlab.reference.serving64 import reference_serving_attention

    cell = Cell("xla", 2, 1, 64, 4, 2, 16, "float32", True, (6, 0), lengths="spread", sinks=True)
    q_lens, kv_lens, _ = serving_cell.requests(cell)
    starts = rl.starts_of(q_lens)
    qa, k, v = (np.random.default_rng(i).normal(size=s).astype(np.float32)
                for i, s in enumerate(((2, 4, 16), (2, 64, 2, 16), (2, 64, 2, 16))))
    args = (jnp.asarray(qa), jnp.asarray(k), jnp.asarray(v), starts, kv_lens)
    backend = type("B", (), {"rel_l2_limit": None, "rel_l2_rule": None})
    sem = serving_cell.call_semantics(cell)
    for drop in (None, "sinks", "local_window_size"):
        out = reference_serving_attention(qa, k, v, starts, kv_lens, **{**sem, **({drop: None} if drop else {})})
        if drop is None:
            check.check_serving(jnp.asarray(out, jnp.float32), args, q_lens, kv_lens, cell, backend, sem)
        else:
            with pytest.raises(Skip, match="output wrong on requests"):
                check.check_serving(jnp.asarray(out, jnp.float32), args, q_lens, kv_lens, cell, backend, sem)


def test_a_backend_without_a_serving_path_is_unsupported_before_compiling():
    """The serving cell asks its own backend (the one measure_cell found) about its first call: naive refuses."""
    r = measure_cell(Cell("naive", 3, 2, 64, 4, 2, 16, causal=True, lengths="spread"), Options(max_input_sets=1))
    assert r["status"] == "unsupported" and r["reason"].startswith("naive: no serving path")
    assert r["compile_s"] is None and r["input_sets"] == 1 and r.get("lengths_traced") is None   # it never ran


def test_a_quantized_serving_step_is_judged_on_every_request():
    """A serving step on an int8 cache whose request 3 (no float64 sample reads it) comes back 0 fails the check of
    every token against float32 on the dequantized cache (it was not made for a quantized cache: the cell passed)."""
    import jax.numpy as jnp

    from attnlab import backends
    from attnlab.backends.masked_serving import request_of_tokens

    class ZeroRequest(type(backends.get("xla"))):
        name = "fake-zero-request"

        def run_serving(self, call):
            out = super().run_serving(call)
            req, _ = request_of_tokens(call.q_starts, out.shape[0])
            return jnp.where((req == 3)[:, None, None], 0, out).astype(out.dtype)

    flags = dict(backends="fake-zero-request", batch="8", q_len="1", kv_len="64", heads="4", kv_heads="2",
                 head_dim="16", dtype="bfloat16", causal="true", kv_dtype="int8", lengths="spread",
                 prefill_chunks="1x4")
    backends.register(ZeroRequest())
    try:
        (cell,) = build(flags).cells()
        r = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0, pipelined_calls=2, compile_ahead=False))
    finally:
        backends.unregister("fake-zero-request")
    assert 3 not in r["checks"]["float64_requests"]["requests"] and r["checks"]["float64_requests"]["ok"]
    assert r["status"] == "incorrect" and "output wrong (every token)" in r["reason"], r["reason"]


def test_the_every_token_check_pads_each_group_of_query_lengths_only():
    """Requests are judged in groups of query lengths up to a power of two: one prefill chunk among decodes pads
    nothing (one batch of every request padded 2176 rows to 128 x 2048, 120x the step's check)."""
    assert [g.tolist() for g in rl.length_groups([1, 9, 1, 16, 3, 1, 4])] == [[0, 2, 5], [4, 6], [1, 3]]
    q = np.array([2048] + [1] * 127)
    assert sum(len(g) * q[g].max() for g in rl.length_groups(q)) == 2048 + 127
    idx, keep = rl.padded_rows([3, 1], [5, 0])
    assert idx.tolist() == [[5, 6, 7], [0, 0, 0]] and keep.tolist() == [[True] * 3, [True, False, False]]
