"""The environment step: JAX, the device, cuDNN, and which backends run the lab's input here."""
from __future__ import annotations

from ...core.prepare import prepare
from ..render_common import section_renderer
from ..step_types import LabConfig, LabContext, Step, Table, jax_side

TITLE = "Environment and GPU check"


def probe(ctx: LabContext) -> dict:
    """{env: the versions and device, backends: [[name, available, why not, runs this input, why not, what]]}."""
    jx = jax_side()
    spec = prepare(*jx.qkv_inputs(ctx.cfg, "bfloat16")).spec
    rows = []
    for b in jx.backends.all_backends():
        avail = b.available()
        sup = None if avail else b.supports(spec)   # an unavailable backend's reason is said once, in its own column
        runs = "yes" if avail is None and sup is None else "no"
        rows.append([b.name, "yes" if avail is None else "no", avail or "", runs,
                     "(not available)" if avail else (sup or ""), b.description])
    keep = ("jax", "jaxlib", "device_count", "device_kind", "platform", "cudnn", "gpu_note", "optional")
    return {"env": {k: ctx.env_full.get(k) for k in keep}, "backends": rows}


@section_renderer("environment", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    e = p["env"]
    s.paragraphs.append(f"JAX {e['jax']} (jaxlib {e['jaxlib']}) on {e['device_count']} × {e['device_kind']} "
                        f"({e['platform']}); cuDNN {e['cudnn'] or 'not loaded'}.")
    if e.get("gpu_note"):
        s.paragraphs.append(e["gpu_note"] + ".")
    rows = p["backends"]
    here = [r for r in rows if r[1] == "yes"]
    s.tables.append(Table(f"Backends available here ({len(here)} of {len(rows)}; input {cfg.batch}×{cfg.q_len}×"
                          f"{cfg.heads}×{cfg.head_dim} bf16)", ["backend", "runs this input", "why not this input", "what"],
                          [[r[0], r[3], r[4], r[5]] for r in here]))
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        if r[1] != "yes":
            by_reason.setdefault(r[2] or "not available", []).append(r[0])
    if by_reason:
        s.folds.append((f"{len(rows) - len(here)} backends not available here, by reason",
                        [f"{why}: {', '.join(names)}" for why, names in by_reason.items()]))
    s.tables.append(Table("Optional libraries", ["library", "version"],
                          [[k, v or "not installed"] for k, v in e["optional"].items()]))
    s.facts = {"platform": e["platform"], "device_kind": e["device_kind"], "cudnn": e["cudnn"],
               "backends_available": [r[0] for r in rows if r[1] == "yes"]}


STEP = Step("environment", TITLE, render, probe=probe)
