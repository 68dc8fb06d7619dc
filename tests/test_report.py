"""The report tells signal from noise (issue 12, items 9 and 10): spreads, distinguishable lines,
labelled roofline points and roofs, named columns, no empty columns, units that fit."""
import html.parser

import pytest

from attnlab.lab import plots
from attnlab.lab.step_types import Section, Table
from attnlab.measure import peaks
from attnlab.report.html import render

NO_CUPTI = "kernel time needs a GPU (CUPTI); wall clock shown"


class _Tables(html.parser.HTMLParser):
    """title (the <figcaption> above it) -> (header cells, body rows) of every <table> in a page."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell, self._row, self._cap, self._in = {}, None, None, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "figure":
            self._cap = ""
        elif tag == "table":
            self._cur = ([], [])
        elif tag == "figcaption":
            self._in = "caption"
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self._in = None
        elif tag in ("td", "th"):
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            (self._cur[0].extend(self._row) if not self._cur[0] else self._cur[1].append(self._row))
        elif tag == "table":
            self.tables[self._cap] = self._cur

    def handle_data(self, data):
        if self._in == "caption":
            self._cap += data
        elif self._cell is not None:
            self._cell += data


def tables_of(page: str) -> dict:
    p = _Tables()
    p.feed(page)
    return p.tables


def _env():
    return {"device_kind": "cpu", "platform": "cpu", "jax": "x", "cudnn": None, "attnlab": "0", "git_commit": None}


def test_empty_columns_are_dropped_and_their_reason_said_once():
    t1 = Table("timing", ["path", "kernel (CUPTI)", "wall"], [["xla", "–", "0.1"], ["naive", "", "0.2"]],
               empty_why={"kernel (CUPTI)": NO_CUPTI})
    t2 = Table("more", ["path", "kernel (CUPTI)", "x"], [["xla", None, ""]], empty_why={"kernel (CUPTI)": NO_CUPTI})
    page = render([Section("s", "S", tables=[t1, t2])], _env())
    tabs = tables_of(page)
    assert tabs["timing"][0] == ["path", "wall"] and tabs["more"][0] == ["path"]
    assert page.count(NO_CUPTI) == 1 and "no value on this machine" in page   # x: no reason given
    kept = Table("k", ["a", "b"], [["1", "–"], ["2", "3"]]).compact()
    assert kept[0].columns == ["a", "b"] and kept[1] == {}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    from attnlab.lab import run_lab

    out = tmp_path_factory.mktemp("lab")
    secs = run_lab(str(out), quick=True, sections=["environment", "timing", "sweeps", "te_fp8", "next"])
    return secs, (out / "report.html").read_text()


def test_report_on_cpu(quick_report):
    secs, page = quick_report
    tabs = tables_of(page)
    env = next(v for k, v in tabs.items() if k.startswith("Backends available here"))
    assert env[0][:2] == ["backend", "runs this input"] and {r[0] for r in env[1]} >= {"naive", "xla"}
    assert "cudnn" not in {r[0] for r in env[1]}    # unavailable: folded, one line per reason
    fold = page[page.index("<details>"):page.index("</details>")]
    assert "backends not available here" in fold and "cudnn" in fold and fold.count("<li>") < 8
    timing = next(v for k, v in tabs.items() if k.startswith("Wall time per call, no kernel time (it needs a GPU"))
    assert "wall p25–p75" in timing[0] and not any("kernel" in c for c in timing[0])
    assert all("–" in r[timing[0].index("wall p25–p75")] for r in timing[1] if r[-1] == "ok")
    assert "Kernel time and wall time" not in page and "Not shown: kernel" not in page
    for cap, (cols, rows) in tabs.items():          # no all-empty column anywhere
        for i, c in enumerate(cols):
            assert any(r[i].strip() not in ("", "–") for r in rows), (cap, c)
    seq = next(v for k, v in tabs.items() if k.startswith("Sequence sweep"))
    # spread, and units that fit a CPU (MFLOP/s when a loaded runner takes over 1 ms a call)
    assert all("[" in r[1] and "FLOP/s" in r[1] and "TFLOP/s" not in r[1] for r in seq[1]), seq[1]
    fp8 = next(v for k, v in tabs.items() if k.startswith("FP8 attention"))
    if "shape" in fp8[0]:
        assert not any("skip" in r[fp8[0].index("shape")] for r in fp8[1])
    assert any(r[fp8[0].index("status")].startswith("skipped: ") for r in fp8[1])
    head = next(v for k, v in tabs.items() if k.startswith("Head-dim sweep"))
    assert "cuDNN accepts" not in page and not any("accepts" in c for r in head[1] for c in r)
    assert "memory_analysis" in page
    roof = next(sec for sec in secs if sec.id == "sweeps")
    assert any("the ceilings measured in this run" in p for p in roof.paragraphs)   # a CPU's roofline has a roof
    for cap, (cols, _) in tabs.items():
        assert len(set(cols)) == len(cols), cap      # every column named apart


def _capture(monkeypatch):
    figs = []

    def keep(fig, path):
        figs.append(fig)
        return path

    monkeypatch.setattr(plots, "save", keep)
    return figs


def _rec(backend, T, ms, step="seq_sweep", **kw):
    return {"backend": backend, "q_len": T, "batch": 1, "status": "ok", "wall_ms": ms, "kernel_ms": None,
            "wall_p25_ms": ms * 0.9, "wall_p75_ms": ms * 1.2, "wall_min_ms": ms * 0.8, "tflops": 0.01 * T / ms,
            "intensity": T / 4, "step": step, **kw}


def test_plots_show_spread_and_are_distinguishable(monkeypatch):
    from matplotlib.container import ErrorbarContainer

    figs = _capture(monkeypatch)
    recs = [_rec(b, T, T / 64) for b in ("naive", "xla") for T in (64, 128)]
    plots.line_plot(recs, "q_len", "time", "x.png", title="t", xlabel="T", ylabel="ms")
    ax = figs[-1].axes[0]
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 2 and "25th–75th" in ax.get_title()
    plots.line_plot(recs, "q_len", "tflops", "x.png", title="t", xlabel="T", ylabel="TFLOP/s", hline=989)
    assert figs[-1].axes[0].get_ylabel() == "GFLOP/s"
    mem = [{"backend": b, "q_len": T, "temp_bytes": T * T} for b in ("naive", "xla") for T in (64, 128)]   # identical lines
    plots.memory_plot(mem, "m.png", title="compiled temp bytes (XLA memory_analysis)")
    lines = figs[-1].axes[0].get_lines()
    assert len({(ln.get_marker(), ln.get_linestyle(), ln.get_fillstyle()) for ln in lines}) == 2
    assert "memory_analysis" in figs[-1].axes[0].get_title()
    bat = [_rec(b, 64, 1.0 + B, step="batch_sweep", batch=B) for b in ("naive", "xla") for B in (1, 2)]
    plots.roofline(recs + bat, "r.png", datasheet=(989.4, 4.8), measured=(809.5, 3.364), title="roofline",
                   group=lambda r: {"seq_sweep": "sequence sweep", "batch_sweep": "batch sweep"}[r["step"]])
    labels = figs[-1].axes[0].get_legend_handles_labels()[1]
    assert {"naive · sequence sweep", "xla · batch sweep"} <= set(labels)
    assert any(x.startswith("datasheet roof: 989.4 TFLOP/s, 4800 GB/s") for x in labels)
    assert any(x.startswith("measured roof: 809.5 TFLOP/s, 3364 GB/s") for x in labels)
    plots.bars(["a", "b"], [1.0, 2.0], "b.png", title="t", ylabel="ms", spread=[(0.9, 1.2), (1.5, 2.5)])
    assert any(isinstance(c, ErrorbarContainer) for c in figs[-1].axes[0].containers)


@pytest.mark.parametrize("value,fmt,text", [
    (85.8e9, peaks.format_flops, "85.80 GFLOP/s"),
    (809.5e12, peaks.format_flops, "809.5 TFLOP/s"),
    (1.23e12, peaks.format_flops, "1.23 TFLOP/s"),
    (2.644e9, peaks.format_bandwidth, "2.64 GB/s"),
    (3364e9, peaks.format_bandwidth, "3364 GB/s"),
    (150.25e9, peaks.format_bandwidth, "150.2 GB/s"),
])
def test_units_fit_the_size(value, fmt, text):
    assert fmt(value) == text


def test_ceilings_table_units():
    from rich.console import Console

    from attnlab.cli import ceilings_table

    def text(res):
        c = Console(width=200, record=True)
        c.print(ceilings_table(res, "p"))
        return c.export_text()

    cpu = {"device_kind": "cpu", "timer": "wall", "matmul_dtype": "float32", "matmul_n": 1024, "matmul_tflops": 0.0858,
           "copy_bytes": 2**27, "copy_gbps": 2.644}
    out = text(cpu)
    assert "85.80 GFLOP/s" in out and "2.64 GB/s" in out and "0.1 TFLOP/s" not in out
    gpu = dict(cpu, device_kind="NVIDIA H200", timer="cupti", matmul_dtype="bfloat16", matmul_n=8192,
               matmul_tflops=809.5, copy_bytes=2**31, copy_gbps=3364.0)
    out = text(gpu)
    assert "809.5 TFLOP/s" in out and "3364 GB/s" in out and "989.4 TFLOP/s" in out and "4800 GB/s" in out


# --- memory-bound cells in the bench table (item 10) ---------------------------------------------

def _cell(T, S, **kw):
    r = {"backend": "xla", "batch": 8, "q_len": T, "kv_len": S, "heads": 32, "kv_heads": 8, "head_dim": 128,
         "dtype": "bfloat16", "causal": False, "window": None, "mode": "fwd", "status": "ok", "timer": "cupti",
         "kernel_ms": 0.25, "wall_ms": 0.3, "tflops": 3.0, "gbps": 4000.0, "pct_peak": 0.3,
         "env": {"device_kind": "NVIDIA H200"}}
    r.update(kw)
    from attnlab.core.workload import Workload

    w = Workload(r["batch"], T, S, r["heads"], r["kv_heads"], r["head_dim"], r["dtype"], decode=r.get("lengths") is not None)
    r["intensity"] = w.intensity()
    return r


def test_memory_bound_cells_show_bandwidth(capsys):
    from attnlab.cli import _print_bench_table, bench_cell_text, console

    rid = peaks.ridge("NVIDIA H200")
    assert rid == pytest.approx(989.4 / 4.8)
    decode, square = _cell(1, 32768), _cell(4096, 4096, tflops=600.0, pct_peak=60.6)
    assert peaks.memory_bound(decode, rid) and not peaks.memory_bound(square, rid)
    assert peaks.memory_bound(_cell(16, 16384, lengths="ragged"), rid)
    assert not peaks.memory_bound(_cell(64, 64), rid)             # T <= 64 but not against a longer S
    assert bench_cell_text(decode, rid, 4.8) == "0.25 · 4000 GB/s · 83.3% BW"
    assert bench_cell_text(dict(decode, tokens_per_s=1.28e5), rid, 4.8) == "0.25 · 4000 GB/s · 83.3% BW · 1.28e+05 tok/s"
    assert bench_cell_text(square, rid, 4.8) == "0.25 · 600.0 TFLOP/s · 60.6%"   # the report's unit (units.format_flops)
    console.width = 200
    _print_bench_table([decode, square], "out")
    out = capsys.readouterr().out
    assert "4000 GB/s · 83.3% BW" in out and "(memory-bound)" in out and "datasheet bandwidth (4800 GB/s)" in out
    assert "0.25 · 600.0 TFLOP/s · 60.6%" in out
