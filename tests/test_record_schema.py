"""The typed cell record (attnlab.core.record_model): flat <-> typed round trip, derived field lists, status rules."""
from __future__ import annotations

import glob
import json
import os

import pytest
from pydantic import Field

from attnlab.core import record_model
from attnlab.measure.cell import IDENTITY, Cell, Options, measure_cell
from attnlab.core.record_model import PARTS, CellRecord, Cost, csv_columns, fields_where
from attnlab.core.records import RecordError, Status, time_ms, upgrade
from attnlab.core.store import ResultStore, read_records
from attnlab.measure.outcome import Skip, classify
from attnlab.sweep import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = Options(repeats=2, warmup=1, pipelined_calls=2, max_input_sets=1)


@pytest.fixture(scope="module")
def fresh():
    return measure_cell(Cell("naive", 1, 32, 32, 2, 2, 8, "float32", mode="fwd+bwd"), FAST)


def test_round_trip_of_a_fresh_cpu_record(fresh):
    assert isinstance(fresh, CellRecord) and fresh["status"] is fresh.status is Status.OK   # typed, the enum in memory
    typed = CellRecord.from_flat(json.loads(json.dumps(fresh.flat())))
    assert typed.status is Status.OK and typed.problem.head_dim == 8 and typed.cost.cell_s == fresh["cell_s"]
    assert typed.timing.wall_ms == time_ms(fresh) > 0 and typed.correctness.grad_check == "ok"
    assert typed.flat() == fresh.flat() and fresh.flat()["status"] == "ok" and type(fresh.flat()["status"]) is str


def _committed_cells():
    for path in sorted(glob.glob(os.path.join(ROOT, "results", "*", "results.jsonl"))):
        cells = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if r.get("kind", "cell") == "cell" and "backend" in r:
                    cells.append(r)
        if cells:
            yield os.path.basename(os.path.dirname(path)), cells[:: max(1, len(cells) // 5)]


@pytest.mark.parametrize("name, sample", list(_committed_cells()))
def test_round_trip_of_committed_records(name, sample):
    for rec in sample:
        rec = upgrade(rec)
        assert CellRecord.from_flat(rec).flat() == rec


def test_parts_forbid_unknown_fields_and_top_level_keeps_them():
    with pytest.raises(Exception, match="extra"):
        Cost(inputs_s=1.0, bogus=2)
    rec = {"backend": "naive", "batch": 1, "q_len": 4, "kv_len": 4, "heads": 1, "kv_heads": 1, "head_dim": 8,
           "dtype": "float32", "causal": False, "mode": "fwd", "status": "unsupported", "reason": "why",
           "from_the_future": [1, 2]}
    assert CellRecord.from_flat(rec).flat() == rec


def test_field_lists_are_derived_from_the_parts(monkeypatch):
    assert set(fields_where("phase")) == {"inputs_s", "compile_s", "check_s", "timing_s", "cell_s"}
    assert "kernel_ms" in fields_where("timed") and "rel_err" not in fields_where("timed")
    # a new field added to a part shows up in the CSV, the measured list and the part's flat fields
    New = type("Cost", (Cost,), {"__annotations__": {"queue_s": float | None},
                                 "queue_s": Field(None, json_schema_extra={"measured": True})})
    monkeypatch.setitem(PARTS, "cost", New)
    assert "queue_s" in csv_columns(IDENTITY) and "queue_s" in fields_where("measured")
    assert csv_columns(IDENTITY).count("devices") == 1


def _ok():
    return {"backend": "naive", "batch": 1, "q_len": 4, "kv_len": 4, "heads": 1, "kv_heads": 1, "head_dim": 8,
            "dtype": "float32", "causal": False, "mode": "fwd+bwd", "status": "ok", "reason": None, "schema": 2,
            "timer": "wall", "wall_ms": 1.0, "kernel_ms": None, "rel_err": 0.0, "checked_fraction": 1.0,
            "tolerance": "f32", "checks": {"ref": "ok"}, "grad_check": "ok"}


@pytest.mark.parametrize("change, field", [
    ({"status": "fine"}, "status"),
    ({"batch": "1"}, "batch"),
    ({"causal": 1}, "causal"),
    ({"window": [1, 2, 3]}, "window"),
    ({"reason": "why"}, "reason"),
    ({"timer": "sundial"}, "timer"),
    ({"wall_ms": 0.0}, "wall_ms"),
    ({"rel_err": None}, "rel_err"),
    ({"checked_fraction": 0.0}, "checked_fraction"),
    ({"tolerance": None}, "checks"),
    ({"grad_check": "skipped"}, "grad_check"),
    ({"status": "oom", "reason": None, "wall_ms": None}, "reason"),
    ({"status": "oom", "reason": "big"}, "wall_ms"),
    ({"status": "oom", "reason": "big", "wall_ms": None, "tflops": 3.0}, "tflops"),
    ({"cell_s": "slow"}, "cell_s"),
    ({"kernel_ms": -1.0}, "kernel_ms"),                 # any clock's time is positive, not only the headline's
    ({"status": "incorrect", "reason": "x", "wall_ms": None, "wall_p25_ms": 1.0}, "wall_p25_ms"),   # spreads too
    ({"status": "incorrect", "reason": "x", "wall_ms": None, "repeats": 5}, "repeats"),
    ({"status": "incorrect", "reason": "x", "wall_ms": None, "dispatch_ms": 1.0}, "dispatch_ms"),
])
def test_each_status_rule_names_its_field(change, field):
    assert CellRecord.from_flat(_ok()).status is Status.OK
    with pytest.raises(RecordError) as e:
        CellRecord.from_flat({**_ok(), **change})
    assert e.value.field == field, str(e.value)


def test_unchecked_records_need_no_correctness_fields():
    rec = {k: v for k, v in _ok().items() if k not in ("rel_err", "checked_fraction", "tolerance", "checks", "grad_check")}
    assert CellRecord.from_flat({**rec, "status": "unchecked"}).status is Status.UNCHECKED
    assert record_model.Status is Status


def test_a_writer_cannot_store_a_record_that_breaks_a_status_rule(tmp_path, fresh):
    with pytest.raises(RecordError, match="never timed"):
        fresh.with_fields(status="incorrect", reason="wrong")          # the model's validator refuses it
    with pytest.raises(Exception, match="frozen"):
        fresh.reason = "changed in place"
    with pytest.raises(TypeError):
        fresh["reason"] = "changed in place"
    store = ResultStore(tmp_path / "r.jsonl")
    with pytest.raises(RecordError, match="never timed"):   # model_copy skips the validator: the store does not
        store.append(fresh.model_copy(update={"status": Status.OOM, "reason": "big"}))
    store.append(fresh)
    assert [r["status"] for r in read_records(store.path)] == ["ok"]


def test_the_store_writes_strict_json_and_the_csv_keeps_every_part(tmp_path, fresh):
    """An exact output's margin is inf: the store wrote Infinity, which JSON parsers refuse."""
    store = ResultStore(tmp_path / "r.jsonl")
    store.append(fresh.with_fields(margin=float("inf"), grad_margin=float("inf"), schema=None))
    line = open(store.path, encoding="utf-8").read()
    rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert rec["margin"] is None and rec["grad_margin"] is None
    assert read_records(store.path)[0]["status"] == "ok"      # a null schema reads as an old one, not a TypeError
    cols = csv_columns(IDENTITY)
    assert {"request_lengths", "lengths_traced", "grad_checks", "out_dtype", "facts"} <= set(cols)


def test_resume_compacts_the_results_file_through_the_store(tmp_path, fresh, monkeypatch):
    path = str(tmp_path / "results.jsonl")
    ResultStore(path).append(fresh)
    ResultStore(path).append(fresh.with_fields(sweep="again"))    # the same cell twice: the first wins
    rewritten, rewrite = [], ResultStore.rewrite
    monkeypatch.setattr(ResultStore, "rewrite", lambda self, recs: (rewritten.append(self.path), rewrite(self, recs)))
    kept = engine._compact(path, engine.Options())
    assert rewritten == [path] and [type(r) for r in kept] == [CellRecord] and kept[0].get("sweep") is None
    assert len(read_records(path)) == 1


def test_statuses_are_the_enum_in_memory():
    r = measure_cell(Cell("no-such-backend", 1, 32, 32, 2, 2, 8, "float32"), FAST)
    assert r.status is r["status"] is Status.UNSUPPORTED and r.flat()["status"] == "unsupported"
    assert classify(MemoryError("big"), "run")[0] is Status.OOM and Skip("oom", "big").status is Status.OOM
    with pytest.raises(ValueError):
        Skip("fine", "no such status")


def test_a_native_backends_cell_is_checked_timed_and_typed(monkeypatch):
    """The path of a backend outside JAX (PyTorch on a GPU), on the CPU: naive's output, a kernel that
    does nothing timed by device events (no CUPTI here); the record comes back typed and valid. The cell's
    call is made once (``measure.inputs``): the one the backend is asked about, runs and is timed on."""
    from attnlab import backends
    from attnlab.backends.base import NativeBackend, NativeCall
    from attnlab.core.prepare import prepare
    from attnlab.measure import inputs

    made, seen = [], []

    def counted(*args, **kw):
        made.append(prepare(*args, **kw))
        return made[-1]

    monkeypatch.setattr(inputs, "prepare", counted)

    class FakeNative(NativeBackend):
        name = "test-native"

        def native_fn(self, spec, scale, arg_sets, decode=None):
            seen.append(spec)
            out = backends.get("naive").run(spec)      # the kernel's output on the first set (what is checked)
            return NativeCall(lambda q, k, v: out, lambda: None, arg_sets,
                              {"event_ms": lambda call: (call(), 0.5)[1]})

    with backends.registered(FakeNative()):
        r = measure_cell(Cell("test-native", 1, 32, 32, 2, 2, 8, "float32"), Options(repeats=2, max_input_sets=1))
    assert isinstance(r, CellRecord) and r.status is Status.OK, r.reason
    assert len(made) == 1 and len(seen) == 1 and all(c is made[0] for c in seen)
    assert r["timer"] in ("cupti", "cuda_events") and r["checked_fraction"] == 1.0 and r["tflops"] > 0
    assert r["check_s"] is not None and r["timing_s"] is not None and r["repeats"] == 2
