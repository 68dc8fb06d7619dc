"""attnlab.report.peers_table (the tables benchmarks/peers/table.py prints): one clock per table, failing cells shown
with their reason, what was checked; no JAX."""
import subprocess
import sys

from attnlab.report import peers_table


def _rec(backend, timer="cupti", status="ok", mode="fwd", **kw):
    r = {"backend": backend, "sweep": "fwd", "dtype": "bfloat16", "mode": mode, "head_dim": 128, "q_len": 1024,
         "batch": 1, "causal": False, "status": status, "reason": None if status == "ok" else "rel L2 0.3 > 0.005",
         "timer": timer, "tflops": 100.0 if status == "ok" else None, "checked_fraction": 1.0, "margin": 1.5,
         "grad_check": "ok" if mode != "fwd" else None, "grad_checked_fraction": 1.0 if mode != "fwd" else None}
    r.update(kw)
    return r


def _text(recs):
    return peers_table.table(recs, "fwd", lambda r: f"{r['tflops']:.0f}", lambda r: f"T{r['q_len']}", "t")


def test_a_table_mixing_clocks_marks_the_other_clock():
    text = _text([_rec("cudnn"), _rec("torch-flash", timer="cuda_events", timer_note="CUPTI unusable")])
    assert "| T1024 | 100 | 100†" in text and "† not CUPTI kernel time: timed by cuda_events (CUPTI unusable)" in text
    assert "†" not in _text([_rec("cudnn"), _rec("xla")])


def test_failing_cells_are_shown_with_their_reason():
    text = _text([_rec("cudnn"), _rec("bad", status="incorrect")])
    assert "**incorrect**" in text and "bad T1024: **incorrect**: rel L2 0.3 > 0.005" in text


def test_the_check_line_says_what_the_records_checked():
    text = _text([_rec("a"), _rec("b", checked_fraction=0.016, margin=1.1), _rec("c", mode="fwd+bwd")])
    assert "whole output on 2 of 3 ok cells" in text and "dq, dk, dv whole on 1 of 1" in text and "1.10x" in text


def test_the_tables_import_no_jax():
    code = "import sys, attnlab.report.peers_table; assert 'jax' not in sys.modules, 'jax imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_tables_skip_sweeps_the_records_lack():
    texts = peers_table.tables([_rec("cudnn", pct_peak=10.0)])
    assert len(texts) == 5 and texts[0].startswith("**Forward bf16") and "| 100 (10%) |" in texts[0]
    assert texts[1:] == ["", "", "", ""]


def test_cells_without_a_peak_or_kernel_time_show_a_dash():
    """CPU or wall-clock records: no pct_peak, no kernel_ms; the cell shows "–", not a TypeError."""
    assert peers_table.tflops_cell(_rec("xla", timer="wall", pct_peak=None)) == "100 (–)"
    assert peers_table.tflops_cell(_rec("xla", pct_peak=25.0)) == "100 (25%)"
    assert peers_table.gbps_cell({"gbps": 900.0, "kernel_ms": None}) == "900 GB/s (–)"
    assert peers_table.gbps_cell({"gbps": 900.0, "kernel_ms": 0.25}) == "900 GB/s (0.250 ms)"
    fp8 = {"kernel_ms": None, "tflops": 50.0, "pct_peak": None, "peak_dtype": "fp8", "rel_err": 0.01}
    assert peers_table.fp8_cell(fp8) == "–, 50 TF/s (– of fp8), err 1.00%"
    assert peers_table.fp8_cell({**fp8, "kernel_ms": 2.0, "pct_peak": 5.0}) == "2.000 ms, 50 TF/s (5% of fp8), err 1.00%"
    text = peers_table.tables([_rec("xla", timer="wall", pct_peak=None)])[0]
    assert "| 100 (–)† |" in text


#: The benchmark scripts that read their output folder (or input file) by position.
POSITIONAL_SCRIPTS = ("peers/cudnn_correctness_probe.py", "peers/table.py", "peers/sweep_gpu.py", "peers/te_probe.py",
                      "prefill/reference_times_gpu.py", "decode/peers.py", "decode/paged_vs_contiguous_gpu.py",
                      "fp8/lab_section_from_records.py", "fp8/kernels.py", "fp8/recipes.py", "decode/grid.py")


def test_a_benchmark_script_given_help_or_an_unknown_option_makes_no_folder(tmp_path):
    """--help prints the script's usage (exit 0), an option where the folder goes is refused (exit 2), and neither
    becomes a folder named after it (they made "--help/")."""
    import os

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    for script in POSITIONAL_SCRIPTS:
        run = lambda *a: subprocess.run([sys.executable, os.path.join(root, script), *a], cwd=tmp_path,  # noqa: E731
                                        capture_output=True, text=True, timeout=60)
        usage, bogus = run("--help"), run("--bogus")
        assert (usage.returncode, bogus.returncode) == (0, 2) and "benchmarks/" in usage.stdout, (script, usage, bogus)
        if script == "decode/grid.py":      # options alone, no folder: usage, not an IndexError
            assert run("--max-seconds", "5").returncode == 2
    assert not list(tmp_path.iterdir())
