"""``attnlab bench`` (a sweep of cells), ``attnlab scaling`` and ``attnlab compare`` (its results).

The flags and a sweep.toml are merged by ``attnlab.sweep.flags``."""
from __future__ import annotations

import math
import shlex
import sys

import click
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table as RichTable

from ..core import cell_fields
from ..core.model_config import resolve
from ..core.model_plan import notes as plan_notes
from ..core.names import canonical_dtype
from ..measure import Options
from .. import sweep as sweeps  # run_sweep through the package: tests replace it there
from ..sweep import SweepError, build, compare, load
from ..sweep.compare import CompareError, counts, nothing_compared
from ..sweep.engine import SweepInterrupted, existing_records
from ..sweep.flags import check_contradictions, flag_name, merge, run_options, warmup_of
from ..sweep.model_cells import check_model_flags, model_sweep
from ..sweep.parse import _ints, _kv_dtypes, _strs
from ..sweep.scaling import scaling_rows
from ._app import _fail, console, main, writable_folder, writes_to
from ._layout import packed, wide_option
from ._sweep_ui import cell_budget, cell_budget_option, cost_line, exit_after_interrupt, print_estimate
from .tables import print_bench_table, print_compare

WINDOW_HELP = ("Windows, comma-separated: none, LEFT:RIGHT (128:0 = the 128 keys before each query and none after) "
               "or an int W, read as jax.nn.dot_product_attention reads local_window_size=W: (W, W), W keys before "
               "and W after (2W+1 keys), not a causal window of W. On decode cells (--lengths) it is decode_attention's "
               "window, around each new token's position in the cache.")


def cell_field_options(command):
    """The flag ``--NAME`` of each identity field that a sweep has an axis of (``core.cell_fields``: its help)."""
    for f in reversed([f for f in cell_fields.CELL_FIELDS if f.axis]):
        command = click.option("--" + f.name.replace("_", "-"), f.name, help=f.help)(command)
    return command


@main.command()
@click.option("--backends", help="Comma-separated backends, e.g. naive,xla,cudnn.")
@click.option("--batch", help="Batch sizes, e.g. 1,2,4 (not with --tokens).")
@click.option("--seq", help="Sequence lengths with q_len = kv_len, e.g. 64,128 (not with --q-len/--kv-len).")
@click.option("--q-len", help="Query lengths (with --kv-len; not with --seq).")
@click.option("--kv-len", help="Key/value lengths (with --q-len; not with --seq).")
@click.option("--heads", help="Query heads N.")
@click.option("--kv-heads", help="Key/value heads K (default: = heads).")
@click.option("--head-dim", help="Head dims H.")
@click.option("--dtype", help="float32, bfloat16, float16, float64 or bf16, fp16, f32, ... (comma-separated).")
@click.option("--causal", help="true, false or both.")
@click.option("--window", help=WINDOW_HELP)
@click.option("--mode", help="fwd, fwd+bwd, bwd (comma-separated).")
@click.option("--tokens", help="Fix batch x q_len: batch = tokens // q_len (not with --batch).")
@cell_field_options
@click.option("--model", help="A model: a preset (attnlab models), a Hugging Face id of one or of its "
              "variants (meta-llama/Llama-3.1-8B-Instruct, llama3.1-8b), or a config.json or a folder holding one; "
              "the cells come from its shape, "
              "--phase and --context.")
@click.option("--phase", help="With --model: prefill, decode, train (comma-separated; default all three).")
@click.option("--context", help="With --model: context lengths, e.g. 4k,32k,128k (k = 1024) or 256 (default 4k).")
@click.option("--fp8-recipe", help="With the cudnn-fp8 backend: FP8 recipes (comma-separated): amax, unit, pow2, s256, "
              "s1, hadamard, hadamard-f32, hadamard-fused, smoothk, hadamard-smoothk; each runs as cudnn-fp8-RECIPE.")
@click.option("--config", "config", type=click.Path(dir_okay=False),
              help="A sweep.toml ([sweep] and [run] tables); a flag replaces the file's value of its axis "
                   "(--seq its q_len/kv_len, --tokens its batch and the other way round).")
@click.option("--name", default=None, help="Sweep name stored with each record.")
@click.option("--out", "out_dir", default="attnlab-out/bench", show_default=True, type=click.Path(file_okay=False))
@click.option("--resume", is_flag=True, help="Skip cells already in OUT/results.jsonl.")
@click.option("--overwrite", is_flag=True, help="Erase OUT/results.jsonl and start afresh (without it, or --resume, "
                                                "a folder that holds results is refused).")
@click.option("--repeats", type=int, default=None, help="Timed calls per cell (default 20 GPU, 5 CPU).")
@click.option("--min-time", type=float, default=None,
              help="Wall clock (no GPU): keep timing a cell for at least this many seconds (default 0.1).")
@click.option("--compile-budget", type=float, default=None, help="Seconds a compile may take before the cell is skipped (default 300).")
@click.option("--no-check", is_flag=True, help="Skip the per-cell comparison with the reference (not recommended).")
@wide_option
@cell_budget_option
def bench(config, out_dir, resume, overwrite, repeats, min_time, compile_budget, no_check, name, wide, cell_budget_s=None,
          **flags):
    """Sweep attention cells: check each against the reference, time it, record it."""
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        check_contradictions(given)
    except SweepError as e:
        _fail(str(e))
    if resume and overwrite:
        _fail("--resume and --overwrite contradict each other: give one of them")
    try:
        if given.get("model") is not None:
            sweep, run_opts, notes = _model_sweep(config, given, name)
        elif "phase" in given or "context" in given:
            raise SweepError("--phase and --context need --model (a preset from `attnlab models`)")
        else:
            values, run_opts, notes = merge(config, given, name)
            sweep = build(values)
            notes += sweep.left_out_notes()
        reps, budget, mt = run_options(run_opts, repeats=repeats, compile_budget=compile_budget, min_time=min_time)
        warmup = warmup_of(run_opts)
        if not isinstance(run_opts.get("check", True), bool):
            raise SweepError(f"check: {run_opts['check']!r} must be true or false")
    except SweepError as e:
        _fail(str(e))
    writable_folder(out_dir)
    try:
        n_old = 0 if overwrite else existing_records(out_dir)   # --overwrite erases what it cannot read too
    except (OSError, ValueError) as e:   # RecordError is a ValueError
        _fail(f"cannot go on with {out_dir}/results.jsonl: {e}")
    if n_old and not (resume or overwrite):
        _fail(f"{out_dir} already holds {n_old} result(s) in results.jsonl; give --resume to skip the cells "
              f"recorded there, or --overwrite to erase them and start afresh")
    for n in notes:
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
    opts = Options(repeats=reps, compile_budget_s=budget, check=not no_check and run_opts.get("check", True),
                   min_time_s=float(mt), warmup=warmup, cell_budget_s=cell_budget(cell_budget_s))
    cells = sweep.cells()
    print_estimate(cells, opts, out_dir if resume else None)
    skipped = []

    try:
        with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                      transient=False, disable=not console.is_terminal) as prog:   # a pipe: no torn last frame
            task = prog.add_task("bench", total=len(cells))

            def on_cell(cell, rec, i, n):
                if rec is None:
                    skipped.append(cell)
                status = "resumed" if rec is None else rec["status"]
                prog.update(task, advance=1, description=f"{cell.backend} {cell.config_label} [{status}]"[:70])

            def on_phase(cell, phase):
                prog.update(task, description=f"{cell.backend} {cell.config_label}"[:60] + f" · {phase}")

            with writes_to(out_dir):
                records = sweeps.run_sweep(sweep, out_dir, resume=resume, overwrite=overwrite, options=opts, on_cell=on_cell,
                                    on_phase=on_phase)
    except SweepInterrupted as e:
        console.print(f"[yellow]interrupted:[/] {e.finished} of {e.total} cells finished, written to "
                      + escape(f"{out_dir}/results.jsonl and {out_dir}/results.csv"), highlight=False)
        console.print("resume with:  " + escape(_resume_command(config, out_dir, repeats, min_time, compile_budget, no_check,
                                                                name, given, cell_budget_s)), highlight=False, soft_wrap=True)
        exit_after_interrupt(e.abandoned)
    except SweepError as e:
        _fail(str(e))
    if resume:
        console.print(escape(f"resumed: skipped {len(skipped)} of {len(cells)} cells already in {out_dir}/results.jsonl, "
                             f"measured {len(cells) - len(skipped)}"), highlight=False)
    _print_bench_table(records, out_dir, wide)
    cost_line(records, skipped, out_dir)


def _model_sweep(config, given: dict, name):
    """(ModelSweep, run options, notes) of ``bench --model``: flags that contradict the preset refused."""
    if config:
        raise SweepError("--config and --model contradict each other: the model's cells come from --phase/--context")
    try:
        p = resolve(given["model"])
    except ValueError as e:
        raise SweepError(str(e)) from None
    check_model_flags(p, given)
    batch = _ints("batch", given.get("batch", "1"))
    if len(batch) != 1:
        raise SweepError(f"--batch: one value with --model, got {given['batch']!r}")
    dtype = [canonical_dtype(d) for d in _strs(given.get("dtype", "bfloat16"))]
    if len(dtype) != 1:
        raise SweepError(f"--dtype: one value with --model, got {given['dtype']!r}")
    kv = _kv_dtypes(given.get("kv_dtype", "none"))
    if len(kv) != 1 or (kv[0] and kv[0][1] == "page"):
        raise SweepError(f"--kv-dtype: one value with --model, its scales per token, head or tensor (a model's "
                         f"decode cells are contiguous caches), got {given['kv_dtype']!r}")
    contexts = given.get("context", "4k")
    sweep = model_sweep(p, given.get("phase", "prefill,decode,train"), contexts, batch[0],
                        _strs(given["backends"]) if given.get("backends") else None, name, dtype[0], kv[0])
    notes = plan_notes(p, contexts)
    if kv[0]:
        notes.append(f"decode cells read a {kv[0][0]} KV cache, scales per {kv[0][1]} (quantize_kv_cache); "
                     f"prefill and train read no cache")
    if not given.get("backends"):
        notes.append("backends: every one available here (FP8 ones left out): " + ", ".join(sweep.sweeps[0].backends))
    return sweep, {}, notes


def _resume_command(config, out_dir, repeats, min_time, compile_budget, no_check, name, given,
                    cell_budget_s=None) -> str:
    """The ``attnlab bench`` command line that goes on where an interrupted one stopped."""
    parts = ["attnlab", "bench"]
    for k, v in given.items():
        parts += [flag_name(k), str(v)]
    for flag, v in (("--config", config), ("--name", name), ("--repeats", repeats), ("--min-time", min_time),
                    ("--compile-budget", compile_budget), ("--cell-budget", cell_budget_s)):
        if v is not None:
            parts += [flag, str(v)]
    if no_check:
        parts.append("--no-check")
    parts += ["--out", out_dir, "--resume"]
    return shlex.join(parts)


def _print_bench_table(records, out_dir, wide: bool = False):
    print_bench_table(records, out_dir, wide)


@main.command()
@click.argument("results", type=click.Path(exists=True))
def scaling(results):
    """Scaling efficiency of sharded cells: time on 1 device / (n x time on n devices).

    Exit 2 when there is nothing to show (no results, or no sharded cell timed), as ``compare``'s
    "nothing comparable"."""
    try:
        rows = scaling_rows(load(results))
    except (OSError, ValueError) as e:   # CompareError and RecordError are ValueErrors
        _fail(str(e))
    if not rows:
        _fail(f"{results}: no sharded cell timed, nothing to show (a sweep with --devices 1,2 --strategy batch "
              f"makes them)")
    t = RichTable(title="strong scaling (same global problem)")
    for c in ("configuration", "backend", "strategy", "devices", "ms", "1-device ms", "efficiency"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["label"], r["backend"], r["strategy"], str(r["devices"]), f"{r['ms']:.4g}", f"{r['ms_1']:.4g}" if r["ms_1"] else "–",
                  f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "–")
    console.print(t)


@main.command("compare")
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@click.option("--threshold", type=float, default=5.0, show_default=True,
              help="Percent slower that counts as a regression (a finite number >= 0).")
@wide_option
def compare_cmd(a, b, threshold, wide):
    """Per-cell time ratios B/A of two bench or run folders (or results.jsonl files).

    A cell is SLOWER only when B's median and B's fastest call are both more than the threshold
    above A's median and the two runs' [min, p75] spreads do not overlap; a cell ok in A and
    failing in B counts too; a cell timed in both (ok or unchecked) is judged by its times. Exit 0: no
    regression; 1: a regression; 2: nothing comparable (unreadable file, no cell records, no cell in
    common, or no common cell could be compared).
    """
    if not math.isfinite(threshold) or threshold < 0:
        _fail(f"--threshold: {threshold:g} must be a finite number >= 0 (percent)")
    try:
        rows, regressed = compare(load(a), load(b), threshold)
    except (OSError, ValueError) as e:   # CompareError and RecordError are ValueErrors
        _fail(str(e))

    print_compare(rows, threshold, wide)
    n = counts(rows)
    for line in packed([f"{k}: {v}" for k, v in n.items()], console.width):
        console.print(line, highlight=False, soft_wrap=True)
    if why := nothing_compared(rows):
        _fail(why)
    if regressed:
        console.print(f"[red]regression: {n['slower']} cell(s) slower beyond {threshold:g}% and their spreads, "
                      f"{n['failed']} failed in B[/]")
        sys.exit(1)
