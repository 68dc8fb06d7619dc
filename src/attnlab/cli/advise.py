"""``attnlab advise --model NAME --context L``: a model's attention on this machine, in the model's terms.

Every phase's cells (``attnlab.core.model_plan``) run through the sweep engine into OUT (resumable: a
second run measures only what is missing), every available backend side by side; the answer
(``attnlab.report.advice``: fastest correct backend, ms per layer and per model, per token for decode, KV
bytes per sequence, the largest batch) is printed and written to OUT/advise.json and OUT/advise.html.
"""
from __future__ import annotations

import json
import math
import os
import types

import click
from rich.markup import escape
from rich.table import Table as RichTable

from .. import backends as registry
from ..core.model_config import resolve
from ..measure import Options
from ..measure.memory import device_bytes_limit
from ..report import advice
from .. import sweep as sweeps  # run_sweep through the package: tests replace it there
from ..sweep import SweepError
from ..sweep.engine import SweepInterrupted
from ..sweep.flags import seconds
from ..sweep.model_cells import model_sweep
from ._app import _fail, console, main, writable_folder, writes_to
from ._layout import compact, print_compact_table, table_console, wide_option
from ._sweep_ui import cell_budget, cell_budget_option, cost_line, exit_after_interrupt, phase_spinner, print_estimate
from .tables import print_footnotes


def _non_jax() -> set[str]:
    """The registered backends that are not JAX ops (PyTorch peers): advise names a JAX path beside them."""
    return {b.name for b in registry.all_backends() if b.native}


@main.command("advise")
@click.option("--model", required=True, help="A model: a preset (attnlab models, e.g. llama-3.1-70b), a Hugging Face "
              "id of one or of its variants (meta-llama/Llama-3.1-8B-Instruct, llama3.1-8b), or a config.json "
              "or a folder holding one.")
@click.option("--context", required=True, help="Context length(s) in tokens: 32k (k = 1024), 4096, or 4k,32k.")
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences per step.")
@click.option("--phase", default="prefill,decode,train", show_default=True, help="prefill, decode, train (comma-separated).")
@click.option("--backends", help="Comma-separated backends (default: every one available here, FP8 ones left out).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Folder for results.jsonl, advise.json, advise.html (default attnlab-out/advise-MODEL).")
@click.option("--device-memory", type=float, default=None,
              help="Device memory in GiB for the max batch (default: JAX's memory_stats bytes_limit).")
@click.option("--repeats", type=int, default=None, help="Timed calls per cell (default 20 GPU, 5 CPU).")
@click.option("--compile-budget", type=float, default=120.0, show_default=True,
              help="Seconds a compile may take before the cell is skipped.")
@cell_budget_option
@wide_option
def advise_cmd(model, context, batch, phase, backends, out_dir, device_memory, repeats, compile_budget, cell_budget_s,
               wide):
    """Which attention path, how long per layer and per model, how much KV cache, how large a batch fits."""
    try:
        p = resolve(model)
        ms = model_sweep(p, phase, context, batch, [b.strip() for b in backends.split(",")] if backends else None)
    except (ValueError, SweepError) as e:
        _fail(str(e))
    if repeats is not None and repeats < 1:
        _fail(f"--repeats: {repeats} is not a positive integer")
    try:
        compile_budget = seconds("--compile-budget", compile_budget)
    except SweepError as e:
        _fail(str(e))
    if device_memory is not None and not (math.isfinite(device_memory) and device_memory > 0):
        _fail(f"--device-memory: {device_memory:g} GiB must be a finite number > 0")
    out_dir = writable_folder(out_dir or os.path.join("attnlab-out", f"advise-{p.name.replace('/', '--')}"))
    cells = ms.cells()
    console.print(f"{escape(p.name)}: {len(ms.entries)} cell shapes x {len(ms.sweeps[0].backends)} backends "
                  f"({', '.join(ms.sweeps[0].backends)}) = {len(cells)} cells → {out_dir}/results.jsonl (resumes)",
                  highlight=False, soft_wrap=True)
    opts = Options(repeats=repeats, compile_budget_s=compile_budget, cell_budget_s=cell_budget(cell_budget_s))
    print_estimate(cells, opts, out_dir)
    resumed: list = []
    try:
        def on_cell(cell, rec, i, n):
            if rec is None:
                resumed.append(cell)
            status = "resumed" if rec is None else rec["status"]
            console.print(f"  [{i + 1}/{n}] {cell.backend:<15} {escape(cell.config_label)}  {status}", highlight=False,
                          soft_wrap=True)

        with writes_to(out_dir), phase_spinner() as on_phase:
            records = sweeps.run_sweep(ms, out_dir, resume=True, options=opts, on_cell=on_cell, on_phase=on_phase)
    except SweepInterrupted as e:
        console.print(f"[yellow]interrupted:[/] {e.finished} of {e.total} cells in {escape(out_dir)}; run the same command "
                      f"again to go on", highlight=False)
        exit_after_interrupt(e.abandoned)
    except SweepError as e:
        _fail(str(e))
    dev_bytes, source = _device_memory(device_memory)
    env = next((r["env"] for r in records if isinstance(r.get("env"), dict)), {})
    adv = advice.advise(p, ms.entries, records, batch=batch, device_bytes=dev_bytes,
                        device_kind=env.get("device_kind"), device_bytes_source=source,
                        non_jax=_non_jax())
    adv["env"] = env
    with writes_to(out_dir), open(os.path.join(out_dir, "advise.json"), "w", encoding="utf-8") as f:
        json.dump(adv, f, indent=2)
    tabs = advice.tables(adv)
    print_tables(tabs, wide)
    for n in adv["notes"]:
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False, soft_wrap=True)
    with writes_to(out_dir):
        html = _write_html(os.path.join(out_dir, "advise.html"), adv, tabs, env)
    console.print(escape(f"→ {html}, {out_dir}/advise.json"), highlight=False)
    cost_line(records, resumed, out_dir)


def print_tables(tabs: list[dict], wide: bool = False) -> None:
    """The advice's tables (``report.advice.tables``): full tables on a terminal of 100 columns or more
    (or with ``--wide``), else the compact layout of bench and compare, a line per cell, nothing cut."""
    for t in tabs:
        if compact(wide):
            print_compact_table(t["title"], t["columns"], t["rows"], t["key"])
        else:
            rt = RichTable(title=escape(t["title"]))
            for c in t["columns"]:
                rt.add_column(escape(c))
            for r in t["rows"]:
                rt.add_row(*[escape(x) for x in r])
            table_console().print(rt)
        print_footnotes(table_console(), t.get("footnotes", []))


def _device_memory(gib: float | None) -> tuple[int | None, str | None]:
    """(bytes, where they come from): the flag, else JAX's allocator limit, else unknown."""
    if gib is not None:     # checked by advise_cmd
        return int(gib * 2**30), "--device-memory"

    n = device_bytes_limit()
    return (n, "JAX memory_stats bytes_limit (the allocator's share, XLA_PYTHON_CLIENT_MEM_FRACTION)") if n else \
        (None, None)


def _write_html(path: str, adv: dict, tabs: list[dict], env: dict) -> str:
    """OUT/advise.html through the report's Jinja2 template (autoescaped): one section per table."""
    from ..report.html import write_report  # heavy: the HTML report (jinja2), kept out of the CLI's start

    ns = types.SimpleNamespace
    sections = [ns(id=f"t{i}", title=t["title"], status="ok", reason=None,
                   paragraphs=adv["notes"] if i == 0 else [], plots=[],
                   tables=[ns(title=t["title"], columns=t["columns"], rows=t["rows"], footnotes=t.get("footnotes", []))])
                for i, t in enumerate(tabs)]
    return write_report(path, sections, env, label=f"advise {adv['model']} batch {adv['batch']} "
                                                   f"context {','.join(map(str, adv['contexts']))}")
