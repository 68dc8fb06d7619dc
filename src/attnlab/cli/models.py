"""``attnlab models``: the model presets (attention shapes of published models, with their source)."""
from __future__ import annotations

import dataclasses
import json

import click
from rich.table import Table as RichTable

from ..core.models import PRESETS
from ._app import console, main


@main.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def models_cmd(as_json):
    """Model presets: N, K, H, layers, context, window, soft-cap and sinks, each from the model's config.json."""
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(p) for p in PRESETS], indent=2))
        return
    t = RichTable(title="model presets (source: each model's config.json; attnlab.core.models)")
    for c in ("model", "layers", "N", "K", "H", "context", "window", "cap", "KV/token"):
        t.add_column(c, no_wrap=True, justify="left" if c == "model" else "right")
    notes = []
    for p in PRESETS:
        window = "–" if p.window is None else f"{p.window}" + ("" if p.window_layers == "all" else "*")
        t.add_row(p.name, str(p.layers), str(p.heads), str(p.kv_heads), str(p.head_dim), str(p.context), window,
                  "–" if p.softcap is None else f"{p.softcap:g}", f"{p.kv_cache_bytes(1) / 2**10:.0f} KiB")
        if p.note or p.sinks:
            notes.append(f"{p.name}: " + "; ".join(x for x in ("attention sinks" if p.sinks else "", p.note) if x))
    console.print(t)
    console.print("window*: on some layers only (every other layer: Gemma-2, gpt-oss; 5 of every 6: Gemma 3); cap: "
                  "attention logit soft-cap; KV/token: K+V cache of one token over all "
                  "layers in bf16")
    for n in notes:
        console.print(n, highlight=False)
