"""A sweep cell's identity fields beyond its problem and mode, each declared once: ``CELL_FIELDS``.

Everything else derives from this declaration:

- ``attnlab.measure.cell.Cell`` has them as fields (in this order, after ``backend``, the problem and ``mode``),
  and its identity and ``record_key`` with them (``default``: what a record written before the field existed
  reads as);
- the record's ``Problem`` part (``attnlab.core.record_model``) has them as fields of type ``type``;
- ``attnlab.sweep.spec.Sweep`` has one axis per field with an ``axis`` (a list of values, ``[default]`` by
  default), parsed from CLI text or TOML by the parser of that kind (``attnlab.sweep.parse.AXIS_PARSERS``),
  its cells take the axis's value as the field's, and its product leaves out the combinations the field's
  ``skip`` refuses (a field's rules with the others: packing on self-attention rows only, ...);
  ``attnlab bench`` has the flag ``--NAME`` (``help``);
- ``records.config_label`` shows ``label(record)`` where it is not None, in this order;
- ``model_plan.PlanEntry.matches`` and ``measure.recount`` read every field.

Adding an identity field: one entry here, the code that uses it (the measuring), a test.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

from .request_lengths import parse_chunks


@dataclasses.dataclass(frozen=True)
class CellField:
    """One identity field: its ``name``, ``default`` (and old records' value), the record's pydantic ``type``,
    the sweep parser's kind ``axis`` (None: set by another axis, e.g. ``page_size`` by ``lengths``), its part of
    the config label (``label(record) -> str | None``), its bench flag's ``help``, and ``skip(axes)``: true for a
    combination of a sweep's axis values the product leaves out (``axes``: q_len, kv_len, causal, window, mode and
    each field's axis value by name, with ``serving``, the lengths' request distribution or None, and ``page_size``)
    and ``rule``, that skip in words (a sweep with no cell left names it)."""

    name: str
    default: Any
    type: Any
    axis: str | None = None
    label: Callable[[dict], str | None] | None = None
    help: str = ""
    skip: Callable[[dict], bool] | None = None
    rule: str = ""


def _part(fmt: str, name: str, unless=None):
    """A label part ``fmt.format(value)`` shown when the record's ``name`` is neither None/false nor ``unless``."""
    return lambda rec: fmt.format(rec[name]) if rec.get(name) not in (None, False, "", unless) else None


def _lengths_skip(a: dict) -> bool:
    """Decode cells: q_len new tokens in a kv_len cache, no strategy, pages dividing it; serving cells: causal fwd
    cells on gaussian inputs."""
    if a["lengths"] is None:
        return False
    if a["q_len"] > a["kv_len"] or a["strategy"] is not None or (a["page_size"] and a["kv_len"] % a["page_size"]):
        return True
    return bool(a["serving"]) and not (a["causal"] and a["mode"] == "fwd" and a["inputs"] == "gaussian")


CELL_FIELDS: tuple[CellField, ...] = (
    CellField("devices", 1, Optional[int], "ints",
              help="Mesh sizes for sharded cells, e.g. 1,2,4,8 (with --strategy).",
              skip=lambda a: a["strategy"] is None and a["devices"] != 1, rule="devices > 1 need a strategy"),
    CellField("strategy", None, Optional[str], "names",
              help="none, batch, heads, ring (comma-separated): sharded_attention strategies."),
    CellField("lengths", None, Optional[str], "lengths",
              help="none, full, ragged, paged, pagedN (comma-separated): full/ragged/paged make decode "
              "cells, decode_attention of the q_len newest tokens against a kv_len cache; paged (page size 16) "
              "and pagedN: full lengths in a paged cache of N-token pages (vLLM layout). uniform, spread, "
              "lognormal, one-long, FILE (or file:FILE, whitespace-separated KV lengths) make serving cells: "
              "serving_attention on --batch requests with KV lengths of that distribution, traced as a server "
              "passes them (causal, fwd); DIST:pagedN: in a paged cache of N-token pages.",
              skip=_lengths_skip, rule="decode and serving cells need q_len <= kv_len, no strategy and a page size "
              "dividing kv_len; serving cells are causal fwd cells on gaussian inputs"),
    CellField("inputs", "gaussian", Optional[str], "lower", _part("inputs={}", "inputs", "gaussian"),
              help="Input distributions of q, k, v (comma-separated): gaussian, outliers, channel-outliers, "
              "shifted-keys (attnlab.reference.inputs; default gaussian)."),
    CellField("page_size", None, Optional[int]),           # set by lengths (paged, pagedN, DIST:pagedN)
    CellField("soft_cap", None, Optional[int | float], "caps",
              lambda rec: None if rec.get("soft_cap") is None else f"cap={rec['soft_cap']:g}",
              help="Logit soft caps, comma-separated: none or a positive number (Gemma-2: 50); "
              "logits -> cap * tanh(logits / cap) before masking.",
              skip=lambda a: a["soft_cap"] is not None and a["strategy"] is not None,
              rule="soft caps take no strategy"),
    CellField("packing", None, Optional[str], "lower_names", _part("packing={}", "packing"),
              help="none or docs:N (comma-separated): N documents of random lengths packed in each row "
              "(segment ids; seeded by the shape; self-attention cells, q_len == kv_len).",
              skip=lambda a: a["packing"] is not None and (a["q_len"] != a["kv_len"] or a["lengths"] is not None
                                                           or a["strategy"] is not None),
              rule="packing needs q_len == kv_len, no lengths and no strategy"),
    CellField("sinks", False, Optional[bool], "bools", lambda rec: "sinks" if rec.get("sinks") else None,
              help="false, true or both: attention sinks (gpt-oss), one logit per query head drawn "
              "standard normal (seeded by the head count), on attention and decode cells.",
              skip=lambda a: a["sinks"] and a["strategy"] is not None, rule="sinks take no strategy"),
    CellField("kv_dtype", None, Optional[str], "kv_dtypes",     # the axis's values: (dtype, layout) pairs
              lambda rec: f"kv={rec['kv_dtype']}:{rec.get('kv_scale')}" if rec.get("kv_dtype") else None,
              help="KV cache dtypes of decode cells (comma-separated): none, fp8 (e4m3), e5m2, int8, each "
              "with an optional scale layout :token (default), :head, :tensor or :page (paged cells); the cache is "
              "quantized before timing and checked against float64 of its dequantized values. Serving cells "
              "too; with --model one value, for the model's decode cells.",
              skip=lambda a: a["kv_dtype"] is not None and (a["lengths"] is None or a["mode"] != "fwd"
                                                            or (a["kv_dtype"][1] == "page" and not a["page_size"])),
              rule="a quantized cache needs lengths (decode or serving cells), mode fwd, and :page a paged cache"),
    CellField("kv_scale", None, Optional[str]),            # set by kv_dtype's layout
    CellField("prefill_chunks", None, Optional[str], "lower_names", _part("prefill={}", "prefill_chunks"),
              help="none or NxSIZE (comma-separated, e.g. 2x2048): N prefill chunks of SIZE "
              "tokens beside a serving cell's decodes (a mixed step).",
              skip=lambda a: bool(a["prefill_chunks"]) and (not a["serving"]    # each chunk fits in the cache
                                                            or parse_chunks(a["prefill_chunks"])[1] > a["kv_len"]),
              rule="prefill chunks need serving lengths and a chunk size <= kv_len"),
)

NAMES = tuple(f.name for f in CELL_FIELDS)
DEFAULTS = {f.name: f.default for f in CELL_FIELDS}
#: The fields a sweep has an axis of, in the order its product walks them (``strategy`` outermost, as it always was).
AXES = tuple(sorted((f for f in CELL_FIELDS if f.axis), key=lambda f: f.name != "strategy"))


def record_values(rec) -> dict:
    """The identity fields of a record (a dict or a ``Cell.identity()``): a missing or null one reads as its default."""
    return {f.name: f.default if rec.get(f.name) is None else rec[f.name] for f in CELL_FIELDS}


def label_parts(rec) -> list[str]:
    """The config label's parts of a record's identity fields, in declaration order."""
    return [p for f in CELL_FIELDS if f.label and (p := f.label(rec))]
