"""``attnlab env``, ``attnlab backends``, ``attnlab ceilings``: this machine, its backends, its measured ceilings."""
from __future__ import annotations

import json
import os

import click
from rich.markup import escape
from rich.table import Table as RichTable

from ..api.dot_product import group_reasons
from ..measure import env as envmod, peaks
from ._app import console, main, writable_folder, writes_to
from ._layout import packed, table_console, wide_option


@main.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@wide_option
def env_cmd(as_json, wide):
    """Versions, devices, optional libraries and which backends can run here."""
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
    _print_backends(e["backends"], wide)
    if e.get("gpu_note"):
        console.print(f"[yellow]{escape(e['gpu_note'])}[/]")


def _print_backends(status: dict, wide: bool = False):
    """The registered backends: those available here with their library's version, then the others
    grouped by the reason they are not (one reason, then its backends), or with ``wide`` a row each."""

    if wide:
        t = RichTable(title="backends")
        t.add_column("backend", no_wrap=True)          # a backend name is never split
        for c in ("available", "why not", "version"):
            t.add_column(c, overflow="fold")
        for name, s in status.items():
            t.add_row(name, "[green]yes[/]" if s["available"] else "[red]no[/]", escape(s["reason"] or ""),
                      s["version"] or "")
        table_console().print(t)
        return
    ok = [n for n, s in status.items() if s["available"]]
    console.print(f"backends available here: {len(ok)} of {len(status)}", highlight=False)
    t = RichTable()
    t.add_column("backend", no_wrap=True)
    t.add_column("version", overflow="fold")
    for n in ok:
        t.add_row(n, status[n]["version"] or "")
    console.print(t)
    groups = group_reasons({n: s["reason"] or "not available" for n, s in status.items() if not s["available"]})
    if groups:
        console.print(f"not available here ({len(status) - len(ok)}; --wide: a row each):", highlight=False)
    for why, names in groups.items():
        console.print(f"  [red]no[/]: {escape(why)}", highlight=False)
        for line in packed(names, console.width, sep=", ", indent="      "):
            console.print(line, highlight=False, soft_wrap=True)
@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@wide_option
def backends(as_json, wide):
    """Every registered backend, available or not, why not, and its library's version."""
    status = envmod.collect()["backends"]
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        _print_backends(status, wide)


@main.command()
@click.option("--force", is_flag=True, help="Measure again even if cached.")
def ceilings(force):
    """Measure this device's matmul TFLOP/s (bf16 on a GPU, float32 on a CPU) and copy GB/s; cache them for %-of-ceiling."""
    res = None if force else peaks.load_ceilings()
    if res is None:
        folder = writable_folder(os.path.dirname(peaks.cache_path()), "the ceilings cache ($ATTNLAB_CACHE_DIR)")
        with console.status("measuring matmul and copy"):
            res = peaks.measure_ceilings()
        with writes_to(folder, "the ceilings cache ($ATTNLAB_CACHE_DIR)"):
            path = peaks.save_ceilings(res)
    else:
        path = peaks.cache_path() + " (cached; --force to measure again)"
    console.print(ceilings_table(res, path))


def ceilings_table(res: dict, path: str) -> RichTable:
    """The measured ceilings beside the datasheet's, each in the unit that fits its size."""
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
