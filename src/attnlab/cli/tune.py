"""``attnlab tune``: measure cells with the sweep engine and write auto's dispatch table (``attnlab.api.dispatch``).

Every cell is checked against the references before it is timed (CUPTI kernel time on a GPU); only
``ok`` records enter the table. The sweep's records stay in ``--records`` (``attnlab bench``'s format)."""
from __future__ import annotations

import os
import re

import click
from rich.markup import escape

from .. import backends
from ..api import dispatch
from ..api.dot_product import auto_ineligible, running_version
from ..core import device
from ..core.records import time_ms
from ..core.store import read_records
from ..measure import Options
from ..measure.cell import record_key
from .. import sweep as sweeps  # run_sweep through the package: tests replace it there
from ..sweep import SweepError, build
from ..sweep.engine import SweepInterrupted
from ..sweep.flags import check_contradictions, merge, run_options, warmup_of
from ..sweep.tune import existing_entries, finished_buckets, write_table
from ._app import _fail, console, main, writable_folder, writes_to
from ._sweep_ui import cell_budget, cell_budget_option, cost_line, exit_after_interrupt, phase_spinner, print_estimate
from .bench import WINDOW_HELP

AXES = (("batch", "Batch sizes, e.g. 1,4."), ("seq", "Sequence lengths, q_len = kv_len, e.g. 1024,4096."),
        ("q_len", "Query lengths (with --kv-len)."), ("kv_len", "Key/value lengths (with --q-len)."),
        ("heads", "Query heads N."), ("kv_heads", "Key/value heads K (default: = heads)."),
        ("head_dim", "Head dims H."), ("dtype", "Dtypes, e.g. bfloat16 (or bf16, fp16, f32)."), ("causal", "true, false or both."),
        ("window", WINDOW_HELP), ("mode", "fwd, fwd+bwd (comma-separated)."),
        ("tokens", "Fix batch x q_len: batch = tokens // q_len (not with --batch)."))


def tune_backends() -> list[str]:
    """The backends ``tune`` measures by default: every registered one available here that auto may
    pick (``api.auto_ineligible``: no PyTorch peer, no FP8)."""
    return [b.name for b in backends.all_backends() if b.available() is None and auto_ineligible(b) is None]


def _env_slug() -> str:
    """``NVIDIA_H200-jax0.11.2-jaxlib0.11.2-cudnn9.19.0``: the default records folder of this device and
    these versions, so a resumed tune never reuses cells measured on another device or before an upgrade."""

    parts = [device.current().kind] + [f"{n}{running_version(n) or '-'}" for n in ("jax", "jaxlib", "cudnn")]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))


def _axis_options(f):
    for name, help_ in reversed(AXES):
        f = click.option("--" + name.replace("_", "-"), name, help=help_)(f)
    return f


@main.command()
@click.option("--backends", help="Comma-separated backends (default: every one available here that auto may pick).")
@_axis_options
@click.option("--config", "config", type=click.Path(dir_okay=False), help="A sweep.toml ([sweep] and [run]); flags replace its axes.")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False),
              help="The dispatch table to write (default: ATTNLAB_DISPATCH's path, else $ATTNLAB_CACHE_DIR/dispatch.json, "
                   "else ~/.cache/attnlab/dispatch.json). Entries of other buckets, devices or versions are kept.")
@click.option("--records", "records_dir", default=None, type=click.Path(file_okay=False),
              help="Folder for the sweep's results.jsonl (default: OUT's folder/tune-records/DEVICE-VERSIONS); resumed if it holds results.")
@click.option("--replace", is_flag=True, help="Drop the file's other entries instead of merging.")
@click.option("--repeats", type=int, default=None, help="Timed calls per cell (default 20 GPU, 5 CPU).")
@click.option("--min-time", type=float, default=None, help="Wall clock (no GPU): seconds to keep timing a cell (default 0.1).")
@click.option("--compile-budget", type=float, default=None, help="Seconds a compile may take (default 300).")
@cell_budget_option
def tune(backends, config, out, records_dir, replace, repeats, min_time, compile_budget, cell_budget_s, **flags):
    """Measure cells (checked, then timed) and write auto's dispatch table: per shape bucket the fastest correct backend."""
    given = {k: v for k, v in flags.items() if v is not None}
    if backends:
        given["backends"] = backends
    try:
        check_contradictions(given)
        values, run_opts, notes = merge(config, given, "tune")
        values.setdefault("backends", ",".join(tune_backends()))
        sweep = build(values)
        notes += sweep.left_out_notes()
        if whys := sorted({w for c in sweep.cells() if (w := dispatch.not_dispatched(lambda f: getattr(c, f, None)))}):
            raise SweepError(f"tune: auto dispatches plain calls on gaussian inputs; cells of {', '.join(whys)} would "
                             f"be measured and key no entry (measure them with `attnlab bench`)")
        if "bwd" in sweep.mode:
            raise SweepError("mode: bwd is not a mode auto picks for: tune measures fwd (a forward call) and fwd+bwd "
                             "(a training step)")
        reps, budget, mt = run_options(run_opts, repeats=repeats, compile_budget=compile_budget, min_time=min_time)
        warmup = warmup_of(run_opts)
    except SweepError as e:
        _fail(str(e))
    for n in notes:
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False, soft_wrap=True)
    out = out or dispatch.default_path()
    try:
        existing_entries(out, replace)   # a corrupt table is refused now, not after every cell is measured
    except SweepError as e:
        _fail(str(e))
    records_dir = records_dir or os.path.join(os.path.dirname(os.path.abspath(out)), "tune-records", _env_slug())
    writable_folder(os.path.dirname(os.path.abspath(out)), "--out's folder")
    writable_folder(records_dir, "--records")
    opts = Options(repeats=reps, compile_budget_s=budget, check=True, min_time_s=float(mt), warmup=warmup,
                   cell_budget_s=cell_budget(cell_budget_s))
    n = len(sweep.cells())
    console.print(escape(f"tune: {n} cells ({', '.join(sweep.backends)}) -> {records_dir}/results.jsonl"), highlight=False,
                  soft_wrap=True)
    print_estimate(sweep.cells(), opts, records_dir)

    resumed: list = []

    def on_cell(cell, rec, i, total):
        if rec is None:
            resumed.append(cell)
        else:
            t = time_ms(rec)
            line = f"[{i + 1}/{total}] {cell.backend:<15} {cell.config_label:<52} {rec['status']:<12} " + (
                f"{t:.4g} ms" if t is not None else (rec.get("reason") or ""))
            console.print(escape(line), highlight=False, soft_wrap=True)   # "[torch]" in a reason is text

    interrupted = abandoned = False
    try:
        with writes_to(records_dir, "--records"), phase_spinner() as on_phase:
            records = sweeps.run_sweep(sweep, records_dir, resume=True, options=opts, on_cell=on_cell, on_phase=on_phase)
    except SweepError as e:
        _fail(str(e))
    except SweepInterrupted as e:   # Ctrl-C: the table of the buckets whose cells all finished
        interrupted, abandoned = True, e.abandoned
        console.print(f"[yellow]interrupted:[/] {e.finished} of {e.total} cells finished", highlight=False)
        keys = {c.key() for c in sweep.cells()}
        records = [r for r in read_records(os.path.join(records_dir, "results.jsonl")) if record_key(r) in keys]
        records = finished_buckets(records, sweep.cells())
    try:
        with writes_to(os.path.dirname(os.path.abspath(out)), "--out's folder"):
            path, entries = write_table(records, out, replace=replace)
    except SweepError as e:   # the file was spoilt while the cells were measured
        _fail(str(e))
    for e in entries:
        ru = ", ".join(f"{r['backend']} {r['ms']:.4g}" for r in e["runner_up"][:3])
        console.print(f"{e['bucket']}: [bold]{e['backend']}[/] {e['ms']:.4g} ms" + (f" (then {ru})" if ru else ""),
                      highlight=False, soft_wrap=True)
    console.print(escape(f"{len(entries)} dispatch entries -> {path}"), highlight=False, soft_wrap=True)
    if interrupted:
        exit_after_interrupt(abandoned)
    cost_line(records, resumed, records_dir)
