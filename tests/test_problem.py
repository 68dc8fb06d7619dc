"""One Problem type: its validation names the argument, one label format, identity and CSV columns
derived from the dataclasses, and measure reaching the mesh strategies through their registry."""
import ast
import dataclasses
import glob
import json
import os
import subprocess
import sys

import pytest

from attnlab import Problem, Workload
from attnlab.core.problem import FIELDS
from attnlab.measure import cell as cellmod
from attnlab.core.records import config_label
from attnlab.measure.cell import IDENTITY, IDENTITY_DEFAULTS, Cell, record_key
from attnlab.core.prepare import AttentionSpec, prepare
from attnlab.sweep import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = dict(batch=2, q_len=4, kv_len=4, heads=4, kv_heads=2, head_dim=8)

#: The hand lists these were before issue 14: the derived ones must not change a column.
OLD_IDENTITY = ("backend", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "window",
                "mode", "devices", "strategy", "lengths")
#: Issue 15 added the input distribution (old records read as gaussian).
NEW_IDENTITY = OLD_IDENTITY + ("inputs", "page_size", "soft_cap", "packing", "sinks", "kv_dtype", "kv_scale",
                               "prefill_chunks")
OLD_CSV_COLUMNS = list(NEW_IDENTITY) + [
    "status", "reason", "timer", "kernel_ms", "wall_ms", "pipelined_ms", "dispatch_ms", "compile_s", "tflops", "gbps",
    "pct_peak", "peak_dtype", "pct_ceiling", "pct_bandwidth", "roofline_ms", "pct_roofline", "checked_fraction", "rel_err",
    "row_err", "rel_err_f64", "max_abs_err", "margin", "tolerance", "grad_check", "grad_rel_err", "grad_margin",
    "grad_checked_fraction", "temp_bytes", "peak_bytes", "runtime_peak_bytes", "process_peak_bytes", "kernel_min_ms",
    "kernel_p25_ms", "kernel_p75_ms", "kernel_max_ms", "kernel_iqr_ms", "wall_min_ms", "wall_p25_ms", "wall_p75_ms",
    "wall_max_ms", "wall_iqr_ms", "flops", "bytes", "intensity", "input_sets", "repeats", "devices", "strategy", "mesh",
    "sweep", "schema", "timestamp", "env",
    # issue 22: where a cell's time went, and how it was drawn and compiled
    "inputs_s", "check_s", "timing_s", "cell_s", "lower_s", "compile_wait_s", "compiled_ahead", "estimate_s",
    "inputs_draw", "pipelined_calls",
]


@pytest.mark.parametrize("kw, names", [
    (dict(batch=0), ["batch"]), (dict(q_len=-1), ["q_len"]), (dict(kv_len=1.5), ["kv_len"]),
    (dict(head_dim=True), ["head_dim"]), (dict(heads=6, kv_heads=4), ["heads=6", "kv_heads=4"]),
    (dict(dtype="int9"), ["dtype", "int9"]), (dict(window=(-1, 0)), ["window"]), (dict(window=(1, 2, 3)), ["window"]),
    (dict(window=5), ["window"]),
])
def test_problem_validation_names_the_argument(kw, names):
    for make in (lambda **k: Problem(**k), lambda **k: Workload(**k), lambda **k: Cell("naive", **k)):
        with pytest.raises(ValueError) as e:
            make(**{**BASE, **kw})
        assert all(n in str(e.value) for n in names), str(e.value)


def test_problem_counts_and_names():
    p = Problem(2, 128, 256, 8, 2, 64, "bfloat16", True, [16, 0])
    assert p.window == (16, 0) and hash(p) == hash(Problem(2, 128, 256, 8, 2, 64, "bfloat16", True, (16, 0)))
    w = Workload(2, 128, 256, 8, 2, 64, "bfloat16", True, (16, 0))
    assert isinstance(w, Problem) and w.as_problem() == p
    assert (p.flops("fwd+bwd"), p.bytes("bwd"), p.intensity()) == (w.flops("fwd+bwd"), w.bytes("bwd"), w.intensity())
    assert p.label == w.label == "B2 T128 S256 N8/2 H64 bfloat16 causal w16:0"
    assert json.loads(p.key()) == {**{f: getattr(p, f) for f in FIELDS}, "window": [16, 0]}
    assert Problem.of(json.loads(p.key())) == p


def test_one_label_format_everywhere():
    for kw in (dict(), dict(causal=True, window=(64, 0)), dict(strategy="batch", devices=2), dict(lengths="ragged")):
        c = Cell("naive", 2, 4, 8, 4, 2, 8, "float32", kw.get("causal", False), kw.get("window"), "fwd+bwd",
                 kw.get("devices", 1), kw.get("strategy"), kw.get("lengths"))
        assert c.config_label == engine.config_label(c.identity()) == config_label(json.loads(c.key()))
        assert c.config_label.startswith(c.workload.label + " ") and c.config_label.startswith(c.problem.label)
    assert "w64:0" in Cell("naive", 1, 8, 8, 1, 1, 8, window=(64, 0)).config_label


def test_identity_and_csv_columns_derived_from_fields_equal_the_old_lists():
    # the identity fields so far keep their order and defaults; a field added later (core.cell_fields) comes after
    assert IDENTITY[:len(NEW_IDENTITY)] == NEW_IDENTITY
    assert IDENTITY_DEFAULTS.items() >= {"devices": 1, "strategy": None, "lengths": None, "inputs": "gaussian",
                                         "page_size": None, "soft_cap": None, "packing": None, "sinks": False,
                                         "kv_dtype": None, "kv_scale": None, "prefill_chunks": None}.items()
    # derived from the typed record (record_model.csv_columns): identity, status, reason, then each part's
    # fields in declaration order, then the top-level extras; every old column is still there
    assert engine.CSV_COLUMNS[:len(IDENTITY) + 2] == list(IDENTITY) + ["status", "reason"]
    assert set(OLD_CSV_COLUMNS) <= set(engine.CSV_COLUMNS) and len(set(engine.CSV_COLUMNS)) == len(engine.CSV_COLUMNS)
    assert FIELDS == OLD_IDENTITY[1:10]


def test_cell_constructors_properties_and_replace():
    pos = Cell("xla", 1, 16, 32, 4, 2, 8, "float32", True, (4, 0), "fwd+bwd", 1, None, None)
    kw = Cell(backend="xla", batch=1, q_len=16, kv_len=32, heads=4, kv_heads=2, head_dim=8, dtype="float32",
              causal=True, window=(4, 0), mode="fwd+bwd")
    held = Cell("xla", problem=Problem(1, 16, 32, 4, 2, 8, "float32", True, (4, 0)), mode="fwd+bwd")
    assert pos == kw == held and hash(pos) == hash(kw) and pos.key() == kw.key()
    assert (pos.batch, pos.q_len, pos.kv_len, pos.heads, pos.kv_heads, pos.head_dim) == (1, 16, 32, 4, 2, 8)
    assert (pos.dtype, pos.causal, pos.window) == ("float32", True, (4, 0))
    assert Cell("naive", 1, 8, 8, 1, 1, 8).dtype == "bfloat16"
    other = dataclasses.replace(pos, backend="naive")
    assert other.backend == "naive" and other.problem == pos.problem
    assert dataclasses.replace(pos, heads=8).heads == 8
    with pytest.raises(AttributeError):
        pos.batch = 3


def test_attention_spec_holds_a_problem():
    import numpy as np

    q = np.zeros((2, 8, 4, 16), np.float32)
    k = np.zeros((2, 12, 2, 16), np.float32)
    spec = prepare(q, k, k, is_causal=True, local_window_size=(3, 0)).spec
    assert spec.problem == Problem(2, 8, 12, 4, 2, 16, "float32", True, (3, 0))
    assert (spec.batch, spec.heads, spec.kv_heads, spec.is_causal, spec.window, spec.groups) == (2, 4, 2, True, (3, 0), 2)
    legacy = AttentionSpec(batch=2, q_len=8, kv_len=12, heads=4, kv_heads=2, head_dim=16, dtype="float32", scale=None,
                           is_causal=True, window=(3, 0))
    assert legacy == spec and dataclasses.replace(spec, scale=0.5).problem == spec.problem


def test_decode_call_holds_a_problem():
    import numpy as np

    from attnlab.api.decode import DecodeSpec, prepare_decode

    q = np.zeros((2, 4, 4, 16), np.float32)
    k = np.zeros((2, 12, 2, 16), np.float32)
    spec = prepare_decode(q, k, k, [12, 5], scale=0.5)
    assert spec.problem == Problem(2, 4, 12, 4, 2, 16, "float32", True) and spec == DecodeSpec(spec.problem, 0.5)
    assert (spec.batch, spec.q_len, spec.max_len, spec.heads, spec.kv_heads, spec.head_dim, spec.dtype, spec.causal,
            spec.groups, spec.kind, spec.scale) == (2, 4, 12, 4, 2, 16, "float32", True, 2, "decode", 0.5)
    with pytest.raises(AttributeError):
        spec.max_len = 3
    att = spec.as_attention()       # decode's causal tail is a mask there, not attention's top-left is_causal
    assert att.problem == dataclasses.replace(spec.problem, causal=False) and att.mask_shape == (2, 1, 4, 12)
    # the quantized cache of the older constructor becomes the problem's (its bytes at one byte a value)
    fp8 = DecodeSpec(Problem(2, 1, 64, 8, 2, 64, "bfloat16", True, decode=True), kv_dtype="fp8", kv_scale="token")
    assert fp8.kv_dtype == "float8_e4m3fn" and fp8.problem.kv_bytes() == 2 * 2 * 64 * 2 * 64 + 2 * 4 * 2 * 64 * 2
    with pytest.raises(ValueError, match=r"kv_scale must be one of .* \(page: with page_size\), got 'page'"):
        Problem(1, 1, 64, 8, 8, 64, kv_dtype="fp8", kv_scale="page", decode=True)


def test_one_call_type_for_attention_decode_and_serving():
    """attention, decode and serving calls are one type: the static facts compare, the arrays ride along;
    a paged cache's page size is the problem's."""
    import numpy as np

    from attnlab.api.decode import prepare_decode
    from attnlab.api.serving import prepare_serving
    from attnlab.core.call import Call

    q = np.zeros((2, 1, 4, 16), np.float32)
    pages = np.zeros((6, 4, 2, 16), np.float32)
    table = np.arange(6, dtype=np.int32).reshape(2, 3)
    calls = [prepare(q, pages[:2], pages[:2]), prepare_decode(q, pages, pages, [5, 12], page_table=table),
             prepare_serving(q[:, 0], pages, pages, [0, 1, 2], [5, 12], page_table=table)]
    assert [type(c) for c in calls] == [Call] * 3 and [c.kind for c in calls] == ["attention", "decode", "serving"]
    assert [c.page_size for c in calls] == [None, 4, 4] and calls[2].q_starts.tolist() == [0, 1, 2]
    assert all(c.spec is c and c.query is not None for c in calls)
    assert calls[1] == dataclasses.replace(calls[1], query=None, key=None, kv_lengths=None) == Call(
        calls[1].problem, kind="decode", has_kv_lengths=True)
    with pytest.raises(ValueError, match="kind must be one of"):
        Call(calls[0].problem, kind="prefill")


def test_committed_records_rebuild_their_cells_keys():
    n = 0
    for path in glob.glob(os.path.join(ROOT, "results", "*", "results.jsonl")):
        for line in open(path, encoding="utf-8"):
            rec = json.loads(line)
            if "backend" not in rec or "mode" not in rec:
                continue
            ident = {k: rec.get(k, IDENTITY_DEFAULTS.get(k)) for k in IDENTITY}
            ident["window"] = tuple(ident["window"]) if ident["window"] else None
            assert Cell(**ident).key() == record_key(rec)
            n += 1
    assert n > 0


def _imports(path):
    """The modules a file imports (``from .. import sharded`` counts as ``sharded``)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node.module or ""
            yield from ((node.module or "") + "." + a.name for a in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_measure_and_sweep_spec_do_not_import_sharded():
    files = glob.glob(os.path.join(ROOT, "src", "attnlab", "measure", "*.py")) + \
        [os.path.join(ROOT, "src", "attnlab", "sweep", "spec.py")]
    for path in files:
        bad = [i for i in _imports(path) if "sharded" in i.split(".")]
        assert not bad, (path, bad)
    # and at run time: measure alone loads no sharded module, knows no strategy, and says who registers them
    code = ("import sys, attnlab.measure as m; assert 'attnlab.api.sharded' not in sys.modules\n"
            "from attnlab.core import strategies; assert strategies.names() == ()\n"
            "try:\n    m.Cell('naive', 2, 8, 8, 2, 2, 8, strategy='batch', devices=2)\n"
            "except ValueError as e:\n    assert 'attnlab.api.sharded' in str(e)\nelse:\n    raise SystemExit('no refusal')\n"
            "import attnlab.sweep; assert strategies.names() == ('batch', 'heads', 'ring')\n"
            "m.Cell('naive', 2, 8, 8, 2, 2, 8, strategy='batch', devices=2)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_strategy_registry_declares_placement_and_refusals():
    from attnlab.core import strategies

    from attnlab.measure import Cell

    ring, batch, heads = (strategies.get(s) for s in ("ring", "batch", "heads"))
    assert ring.why_not(Cell("naive", 2, 8, 8, 2, 2, 8, strategy="ring", devices=2)) is None
    assert "use backend naive" in ring.why_not(Cell("xla", 2, 8, 8, 2, 2, 8, strategy="ring", devices=2))
    assert batch.why_not(Cell("xla", 2, 8, 8, 2, 2, 8, window=(4, 0), strategy="batch", devices=2)) == \
        "sharded cells take no window"
    # sizes a mesh axis does not divide: refused before the inputs are placed (a JAX IndivisibleError before)
    assert "batch B=3 is not a multiple" in batch.why_not(Cell("xla", 3, 8, 8, 2, 2, 8, strategy="batch", devices=2))
    assert "heads K=1" in heads.why_not(Cell("xla", 2, 8, 8, 4, 1, 8, strategy="heads", devices=2))
    assert "T == S" in ring.why_not(Cell("naive", 2, 4, 8, 2, 2, 8, causal=True, strategy="ring", devices=2))
    with pytest.raises(ValueError, match="no soft cap and no sinks"):    # the soft cap was dropped: "incorrect"
        Cell("naive", 2, 8, 8, 2, 2, 8, soft_cap=3.0, strategy="batch", devices=1)
    with pytest.raises(ValueError, match="diagonal"):
        strategies.get("diagonal")


def test_problem_carries_per_request_lengths_and_counts_a_serving_step_exactly():
    from attnlab.core import serving_cost as sc

    q, kv = (512, 1, 1, 4), (2048, 77, 1, 300)
    p = Problem.serving(q, kv, 8, 2, 64, total_tokens=600, kv_len_max=4096)
    starts = [0, 512, 513, 514, 518]
    assert (p.batch, p.q_len, p.kv_len, p.causal, p.decode) == (4, 600, 4096, True, True)
    assert p.flops() == sc.serving_flops(starts, kv, 8, 64)
    assert p.bytes() == sc.serving_bytes(starts, kv, 8, 2, 64, 2) and p.new_tokens() == 518
    ragged = Problem(3, 2, 64, 8, 2, 64, causal=True, kv_lengths=(64, 9, 2), decode=True)    # a ragged decode batch
    assert ragged.flops() == sc.serving_flops([0, 2, 4, 6], (64, 9, 2), 8, 64)
    rec = p.lengths_record(seed=7)
    assert rec["q"] == list(q) and rec["kv"] == list(kv) and (rec["kv_total"], rec["seed"]) == (2426, 7)
    assert "kv" not in p.lengths_record(short=3) and Problem(1, 1, 8, 1, 1, 8).lengths_record() is None
    for kw, field in ((dict(kv_lengths=(5000,) * 4), "kv_lengths"), (dict(q_lengths=(1, 1, 1)), "q_lengths"),
                      (dict(kv_lengths=(2048, 77, 1, 3)), "kv_lengths"), (dict(q_lengths=(512, 77, 1, 100)), "q_lengths")):
        with pytest.raises(ValueError, match=field) as e:
            dataclasses.replace(p, **kw)
        assert e.value.fields == (field,)
