"""The ``attnlab`` command line: ``run``, ``env``, ``backends``."""
from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table as RichTable

console = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attnlab")
def main():
    """attnlab: which attention path should I use, is it correct, how fast is it, what does it cost?"""


@main.command()
@click.option("--out", "out_dir", default="attnlab-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for report.html, results.jsonl, results.csv and plots/.")
@click.option("--label", default=None, help="A name for this run, shown in the report.")
@click.option("--quick", is_flag=True, help="Smallest sizes: a smoke test of every step.")
@click.option("--sections", default=None, help="Comma-separated step ids to run (default: all).")
def run(out_dir, label, quick, sections):
    """Run the codelab's steps and write a report."""
    from .lab import STEPS, run_lab

    chosen = [s.strip() for s in sections.split(",") if s.strip()] if sections else None
    if chosen:
        bad = [s for s in chosen if s not in STEPS]
        if bad:
            raise click.BadParameter(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(STEPS)}", param_hint="--sections")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        task = prog.add_task("attnlab run", total=len(chosen or STEPS))

        def progress(sid, i, n):
            prog.update(task, completed=i, description=f"step {sid}")

        done = run_lab(out_dir, label=label, quick=quick, sections=chosen, progress=progress)
        prog.update(task, completed=len(done), description="done")
    t = RichTable(title=f"attnlab run → {out_dir}/report.html")
    t.add_column("step")
    t.add_column("status")
    t.add_column("note", overflow="fold")
    colours = {"ok": "green", "skipped": "yellow", "failed": "red"}
    for s in done:
        t.add_row(s.title, f"[{colours.get(s.status, 'white')}]{s.status}[/]", s.reason or "")
    console.print(t)
    if any(s.status == "failed" for s in done):
        sys.exit(1)


@main.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def env_cmd(as_json):
    """Versions, devices, optional libraries and which backends can run here."""
    from . import env as envmod

    e = envmod.collect()
    if as_json:
        click.echo(json.dumps(e, indent=2))
        return
    t = RichTable(title="attnlab environment", show_header=False)
    for k in ("attnlab", "git_commit", "python", "jax", "jaxlib", "platform", "device_kind", "device_count",
              "compute_capability", "cudnn", "xla_flags"):
        t.add_row(k, str(e.get(k)))
    for lib, ver in e["optional"].items():
        t.add_row(f"optional: {lib}", ver or "not installed")
    console.print(t)
    _print_backends(e["backends"])
    if e.get("gpu_note"):
        console.print(f"[yellow]{e['gpu_note']}[/]")


def _print_backends(status: dict):
    t = RichTable(title="backends")
    for c in ("backend", "available", "why not", "version"):
        t.add_column(c, overflow="fold")
    from rich.markup import escape

    for name, s in status.items():
        t.add_row(name, "[green]yes[/]" if s["available"] else "[red]no[/]", escape(s["reason"] or ""), s["version"] or "")
    console.print(t)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def backends(as_json):
    """Every registered backend, available or not, why not, and its library's version."""
    from . import env as envmod

    status = envmod.collect()["backends"]
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        _print_backends(status)


def _fail(msg: str):
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(msg)}", highlight=False)
    sys.exit(2)


#: Flags that set the same axis two ways: refused together, and a flag replaces the config file's other way.
CONTRADICTIONS = (("seq", "q_len"), ("seq", "kv_len"), ("tokens", "batch"))
WINDOW_HELP = ("Windows, comma-separated: none, LEFT:RIGHT (128:0 = the 128 keys before each query and none after) "
               "or an int W, read as jax.nn.dot_product_attention reads local_window_size=W: (W, W), W keys before "
               "and W after (2W+1 keys), not a causal window of W.")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@main.command()
@click.option("--backends", help="Comma-separated backends, e.g. naive,xla,cudnn.")
@click.option("--batch", help="Batch sizes, e.g. 1,2,4 (not with --tokens).")
@click.option("--seq", help="Sequence lengths with q_len = kv_len, e.g. 64,128 (not with --q-len/--kv-len).")
@click.option("--q-len", help="Query lengths (with --kv-len; not with --seq).")
@click.option("--kv-len", help="Key/value lengths (with --q-len; not with --seq).")
@click.option("--heads", help="Query heads N.")
@click.option("--kv-heads", help="Key/value heads K (default: = heads).")
@click.option("--head-dim", help="Head dims H.")
@click.option("--dtype", help="float32, bfloat16, float16, float64 (comma-separated).")
@click.option("--causal", help="true, false or both.")
@click.option("--window", help=WINDOW_HELP)
@click.option("--mode", help="fwd, fwd+bwd, bwd (comma-separated).")
@click.option("--tokens", help="Fix batch x q_len: batch = tokens // q_len (not with --batch).")
@click.option("--devices", help="Mesh sizes for sharded cells, e.g. 1,2,4,8 (with --strategy).")
@click.option("--strategy", help="none, batch, heads, ring (comma-separated): sharded_attention strategies.")
@click.option("--lengths", help="none, full, ragged (comma-separated): full/ragged make decode cells, "
              "decode_attention of the q_len newest tokens against a kv_len cache.")
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
def bench(config, out_dir, resume, overwrite, repeats, min_time, compile_budget, no_check, name, **flags):
    """Sweep attention cells: check each against the reference, time it, record it."""
    from .measure import Options
    from .sweep import SweepError, build, load_toml, run_sweep
    from .sweep.engine import SweepInterrupted, existing_records

    given = {k: v for k, v in flags.items() if v is not None}
    for a, b in CONTRADICTIONS:
        if a in given and b in given:
            _fail(f"{_flag(a)} and {_flag(b)} contradict each other: {_flag(a)} sets "
                  f"{'q_len = kv_len' if a == 'seq' else 'batch = tokens // q_len'}; give one of them")
    if resume and overwrite:
        _fail("--resume and --overwrite contradict each other: give one of them")
    values, run_opts = {}, {}
    notes = []
    try:
        if config:
            values, run_opts = load_toml(config)
        for k, v in given.items():
            for a, b in CONTRADICTIONS:
                other = b if k == a else a if k == b else None
                if other and values.pop(other, None) is not None:
                    notes.append(f"{_flag(k)} replaces {other} from {config}")
            values[k] = v
        if name:
            values["name"] = name
        sweep = build(values)
    except SweepError as e:
        _fail(str(e))
    reps = repeats if repeats is not None else run_opts.get("repeats")
    if reps is not None and (not isinstance(reps, int) or reps < 1):
        _fail(f"repeats: {reps!r} is not a positive integer")
    budget = compile_budget if compile_budget is not None else run_opts.get("compile_budget", 300.0)
    if budget is not None and budget <= 0:
        _fail(f"compile budget: {budget!r} must be > 0 seconds")
    mt = min_time if min_time is not None else run_opts.get("min_time", 0.1)
    if isinstance(mt, bool) or not isinstance(mt, (int, float)) or mt < 0:
        _fail(f"min time: {mt!r} must be >= 0 seconds")
    n_old = existing_records(out_dir)
    if n_old and not (resume or overwrite):
        _fail(f"{out_dir} already holds {n_old} result(s) in results.jsonl; give --resume to skip the cells "
              f"recorded there, or --overwrite to erase them and start afresh")
    for n in notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    opts = Options(repeats=reps, compile_budget_s=budget, check=not no_check and run_opts.get("check", True),
                   min_time_s=float(mt))
    cells = sweep.cells()
    skipped = []
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False) as prog:
            task = prog.add_task("bench", total=len(cells))

            def on_cell(cell, rec, i, n):
                if rec is None:
                    skipped.append(cell)
                status = "resumed" if rec is None else rec["status"]
                prog.update(task, advance=1, description=f"{cell.backend} {cell.config_label} [{status}]"[:70])

            records = run_sweep(sweep, out_dir, resume=resume, overwrite=overwrite, options=opts, on_cell=on_cell)
    except SweepInterrupted as e:
        console.print(f"[yellow]interrupted:[/] {e.finished} of {e.total} cells finished, written to "
                      f"{out_dir}/results.jsonl and {out_dir}/results.csv", highlight=False)
        console.print("resume with:  " + _resume_command(config, out_dir, repeats, min_time, compile_budget, no_check,
                                                         name, given), highlight=False, soft_wrap=True)
        sys.exit(130)
    except SweepError as e:
        _fail(str(e))
    if resume:
        console.print(f"resumed: skipped {len(skipped)} of {len(cells)} cells already in {out_dir}/results.jsonl, "
                      f"measured {len(cells) - len(skipped)}", highlight=False)
    _print_bench_table(records, out_dir)


def _resume_command(config, out_dir, repeats, min_time, compile_budget, no_check, name, given) -> str:
    """The ``attnlab bench`` command line that goes on where an interrupted one stopped."""
    import shlex

    parts = ["attnlab", "bench"]
    for k, v in given.items():
        parts += [_flag(k), str(v)]
    for flag, v in (("--config", config), ("--name", name), ("--repeats", repeats), ("--min-time", min_time),
                    ("--compile-budget", compile_budget)):
        if v is not None:
            parts += [flag, str(v)]
    if no_check:
        parts.append("--no-check")
    parts += ["--out", out_dir, "--resume"]
    return shlex.join(parts)


def bench_cell_text(r: dict, ridge_intensity: float | None, bw_tbps: float | None) -> str:
    """One ok cell of the bench table: ms · TFLOP/s · % of peak, or for a memory-bound cell
    (``peaks.memory_bound``: decode-like, intensity below the ridge) ms · GB/s · % of bandwidth."""
    from .measure import peaks

    ms = r["kernel_ms"] if r.get("kernel_ms") is not None else r["wall_ms"]
    if peaks.memory_bound(r, ridge_intensity) and r.get("gbps") is not None:
        bw = f"{100 * r['gbps'] / (bw_tbps * 1000):.1f}% BW" if bw_tbps else "–"
        return f"{ms:.4g} · {r['gbps']:.4g} GB/s · {bw}"
    pk = f"{r['pct_peak']:.1f}%" if r.get("pct_peak") is not None else "–"
    return f"{ms:.4g} · {r['tflops']:.3g} · {pk}"


def _print_bench_table(records, out_dir):
    from .measure import peaks
    from .records import config_label

    backends_ = list(dict.fromkeys(r["backend"] for r in records))
    rows: dict[str, dict] = {}
    for r in records:
        rows.setdefault(config_label(r), {})[r["backend"]] = r
    timer = next((r.get("timer") for r in records if r.get("timer")), "wall")
    kind = next((r["env"].get("device_kind") for r in records if isinstance(r.get("env"), dict)), None) or ""
    bw_tbps, bw_source = peaks.bandwidth_tbps(kind)
    ridges = {d: peaks.ridge(kind, d) for d in {r.get("dtype", "bfloat16") for r in records}}
    timed = lambda r: r is not None and r["status"] in ("ok", "unchecked")  # noqa: E731
    mb_rows = {label for label, by in rows.items()
               if any(timed(r) and peaks.memory_bound(r, ridges[r.get("dtype", "bfloat16")]) for r in by.values())}
    any_mb = bool(mb_rows)
    t = RichTable(title=f"{len(records)} cells → {out_dir}/results.jsonl  (time: {'CUPTI kernel' if timer == 'cupti' else 'wall clock, no GPU'})")
    t.add_column("configuration")
    for b in backends_:
        t.add_column(f"{b}\nms · TFLOP/s · %peak" + ("\n(memory-bound: GB/s · %BW)" if any_mb else ""), justify="right")
    for label, by in rows.items():
        cells = []
        for b in backends_:
            r = by.get(b)
            if r is None:
                cells.append("")
            elif not timed(r):
                cells.append(f"[yellow]{r['status']}[/]")  # reasons are in results.jsonl
            else:
                cells.append(bench_cell_text(r, ridges[r.get("dtype", "bfloat16")], bw_tbps))
        t.add_row(label + (" [cyan](memory-bound)[/]" if label in mb_rows else ""), *cells)
    console.print(t)
    if any_mb:
        console.print("memory-bound rows (decode: few queries against a long KV cache, intensity below the ridge) show "
                      "GB/s and % of " + (f"the {bw_source} bandwidth ({bw_tbps * 1000:.4g} GB/s)" if bw_tbps else
                                          "bandwidth (unknown here: run `attnlab ceilings`)") + " instead of TFLOP/s",
                      highlight=False, soft_wrap=True)


@main.command()
@click.argument("results", type=click.Path(exists=True))
def scaling(results):
    """Scaling efficiency of sharded cells: time on 1 device / (n x time on n devices)."""
    from .sweep import load
    from .sweep.scaling import scaling_rows

    rows = scaling_rows(load(results))
    t = RichTable(title="strong scaling (same global problem)")
    for c in ("configuration", "strategy", "devices", "ms", "1-device ms", "efficiency"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["label"], r["strategy"], str(r["devices"]), f"{r['ms']:.4g}", f"{r['ms_1']:.4g}" if r["ms_1"] else "–",
                  f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "–")
    console.print(t)


@main.command("compare")
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@click.option("--threshold", type=float, default=5.0, show_default=True, help="Percent slower that counts as a regression.")
def compare_cmd(a, b, threshold):
    """Per-cell time ratios B/A of two bench or run folders (or results.jsonl files).

    A cell is SLOWER only when B's median and B's fastest call are both more than the threshold
    above A's median and the two runs' [min, p75] spreads do not overlap; a cell ok in A and
    failing in B counts too. Exit 0: no regression; 1: a regression; 2: nothing comparable
    (unreadable file, no cell records, no cell in common).
    """
    from .sweep import compare, load
    from .sweep.compare import CompareError, counts

    if threshold < 0:
        _fail(f"threshold: {threshold:g} must be >= 0 percent")
    try:
        rows, regressed = compare(load(a), load(b), threshold)
    except (OSError, ValueError) as e:   # CompareError and RecordError are ValueErrors
        _fail(str(e))
    from rich.markup import escape

    t = RichTable(title=escape(f"B / A  (threshold {threshold:g}%; spread = [min, p75] of the repeats)"))
    for c in ("configuration", "backend", "A ms", "A [min, p75]", "B ms", "B [min, p75]", "B/A", "note"):
        t.add_column(escape(c))
    fmt = lambda x: "" if x is None else f"{x:.4g}"  # noqa: E731
    span = lambda s: "" if s is None else escape(f"[{s[0]:.4g}, {s[1]:.4g}]")  # noqa: E731
    colour = {"slower": "red", "failed": "red", "faster": "green"}
    for r in rows:
        note = f"[{colour[r.verdict]}]{escape(r.note)}[/]" if r.verdict in colour else escape(r.note)
        t.add_row(escape(r.label), escape(r.backend), fmt(r.a_ms), span(r.a_spread), fmt(r.b_ms), span(r.b_spread),
                  fmt(r.ratio), note)
    console.print(t)
    n = counts(rows)
    console.print("  ·  ".join(f"{k}: {v}" for k, v in n.items()), highlight=False, soft_wrap=True)
    if regressed:
        console.print(f"[red]regression: {n['slower']} cell(s) slower beyond {threshold:g}% and their spreads, "
                      f"{n['failed']} failed in B[/]", soft_wrap=True)
        sys.exit(1)


@main.command()
@click.option("--force", is_flag=True, help="Measure again even if cached.")
def ceilings(force):
    """Measure this device's bf16 matmul TFLOP/s and copy GB/s, and cache them for %-of-ceiling."""
    from .measure import peaks

    res = None if force else peaks.load_ceilings()
    if res is None:
        with console.status("measuring matmul and copy"):
            res = peaks.measure_ceilings()
        path = peaks.save_ceilings(res)
    else:
        path = peaks.cache_path() + " (cached; --force to measure again)"
    console.print(ceilings_table(res, path))


def ceilings_table(res: dict, path: str) -> RichTable:
    """The measured ceilings beside the datasheet's, each in the unit that fits its size."""
    from .measure import peaks

    t = RichTable(title=f"ceilings of {res['device_kind']} → {path}")
    t.add_column("what")
    t.add_column("measured", justify="right")
    t.add_column("datasheet")
    p = peaks.peak_for_kind(res["device_kind"])
    peak_ = p.tflops.get(peaks.dtype_class(res["matmul_dtype"])) if p else None
    t.add_row(f"{res['matmul_dtype']} matmul {res['matmul_n']}³ ({res['timer']})", peaks.format_flops(res["matmul_tflops"] * 1e12),
              f"{peaks.format_flops(peak_ * 1e12)} ({p.source})" if peak_ else "– (no datasheet for this device)")
    t.add_row(f"copy {res['copy_bytes'] / 2**30:.3g} GiB read+write", peaks.format_bandwidth(res["copy_gbps"] * 1e9),
              peaks.format_bandwidth(p.hbm_tbps * 1e12) if p else "–")
    return t


if __name__ == "__main__":  # pragma: no cover
    main()
