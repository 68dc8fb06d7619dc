"""The TransformerEngine and FP8 step: TransformerEngine beside XLA and cuDNN, FP8 attention against bf16 cuDNN, and the FP8 recipes."""
from __future__ import annotations

from .. import plots
from ..step_types import LabConfig, LabContext, Section, Step, Table, jax_side
from ..plan import perf_backends
from ..plots import time_ms
from ..render_common import cells, field_text, fmt, section_renderer, status_or, sweep_table, time_text

TITLE = "TransformerEngine and FP8"

#: The FP8 recipes the lab times (``attnlab bench`` times them all): per-tensor amax, the fused
#: Hadamard rotation and smoothed K: the baseline and the two fixes for outlier channels.
LAB_FP8_RECIPES = ("cudnn-fp8", "cudnn-fp8-hadamard-fused", "cudnn-fp8-smoothk")


def fp8_seqs(cfg: LabConfig) -> list[int]:
    """T = S of the FP8 comparison: one length long enough for FP8's speed to show (H = 128, causal)."""
    return [4096] if cfg.gpu and not cfg.quick else [256]


def te_seqs(cfg: LabConfig) -> list[int]:
    """T = S of TransformerEngine's cells: two of the sequence sweep's lengths, at its shape, so XLA's
    and cuDNN's cells beside it are the sweep's (measured once)."""
    return cfg.seq_lens[-2:] if not cfg.quick else cfg.seq_lens[-1:]


def _te_fp8_why() -> tuple[str | None, dict[str, str | None]]:
    """(why TransformerEngine cannot run, {FP8 path: why it cannot run}), None where it can."""
    backends = jax_side().backends
    known = backends.names()
    te = backends.get("te") if "te" in known else None
    te_why = "the 'te' backend is not registered" if te is None else te.available()
    fp8 = {}
    for name in ("te-fp8", "cudnn-fp8"):
        b = backends.get(name) if name in known else None
        fp8[name] = "not registered" if b is None else b.available()
    return te_why, fp8


def _recipes_why() -> dict[str, str | None]:
    """{FP8 recipe backend (cudnn-fp8*): why it cannot run here, None where it can}."""
    backends = jax_side().backends
    return {n: backends.get(n).available() for n in fp8_recipe_names(backends.variant_names())}


def sweeps(cfg: LabConfig) -> list:
    Sweep = jax_side().Sweep
    c = cfg
    te_why, fp8 = _te_fp8_why()
    out = []
    if not te_why:   # at the sequence sweep's shape: XLA's and cuDNN's cells are the sweep's
        out.append(Sweep(["te"] + perf_backends(c), batch=[c.batch], q_len=te_seqs(c), heads=[c.heads],
                         head_dim=[c.head_dim], dtype=["bfloat16"], name="te"))
    common = dict(batch=[c.batch], heads=[c.heads], dtype=["bfloat16"], causal=[True], head_dim=[128])
    for name, why in fp8.items():
        if not why:
            out.append(Sweep([name, "cudnn"], q_len=fp8_seqs(c), name="fp8", **common))
    recipes = [n for n, why in _recipes_why().items() if not why and n in LAB_FP8_RECIPES]
    if recipes and not c.quick:   # the recipes differ on outlier channels; on gaussian inputs amax is the fp8 sweep's
        T = [max(fp8_seqs(c))]
        out.append(Sweep(["cudnn-fp8", "cudnn"], q_len=T, inputs=["gaussian"], name="fp8-recipes", **common))
        out.append(Sweep(recipes + ["cudnn"], q_len=T, inputs=["channel-outliers"], name="fp8-recipes", **common))
    return out


def probe(ctx: LabContext) -> dict:
    te_why, fp8 = _te_fp8_why()
    return {"te_why": te_why, "fp8_why": fp8, "recipes_why": _recipes_why()}


def cells_note(cfg: LabConfig) -> str:
    c = cfg
    return (f"Cells: TransformerEngine at T = {', '.join(map(str, te_seqs(c)))} (beside the sequence sweep's "
            f"XLA and cuDNN cells), each FP8 path and bf16 cuDNN at T = {fp8_seqs(c)[0]}"
            + ("" if c.quick else f", and the recipes {', '.join(LAB_FP8_RECIPES)} on outlier-channel inputs "
                                  "(where recipes differ; `attnlab bench` times all of them)") + ".")


#: Inputs the lab's FP8-recipe sweep draws (``attnlab.reference.inputs``): plain, and outlier channels.
FP8_RECIPE_INPUTS = ("gaussian", "channel-outliers")
#: The best recipe is the lowest-error one among those at most this much slower than the fastest FP8 recipe.
FP8_BEST_WITHIN = 0.05


def fp8_recipe_names(names) -> list[str]:
    """The cuDNN FP8 recipe backends (``cudnn-fp8``, ``cudnn-fp8-*``) among ``names``, in order."""
    return [n for n in names if n == "cudnn-fp8" or n.startswith("cudnn-fp8-")]


def best_fp8_recipe(recs: list[dict]) -> dict | None:
    """Of the timed FP8 recipe records of one shape and inputs: the lowest rel L2 vs float64 among those
    at most ``FP8_BEST_WITHIN`` slower than the fastest one (None when none was timed)."""
    ok = [r for r in recs if r["backend"] != "cudnn" and r["status"] == "ok" and time_ms(r)]
    if not ok:
        return None
    fastest = min(time_ms(r) for r in ok)
    near = [r for r in ok if time_ms(r) <= (1 + FP8_BEST_WITHIN) * fastest]
    return min(near, key=lambda r: r.get("rel_err_f64") if r.get("rel_err_f64") is not None else r["rel_err"])


def _err_pct(r) -> str:
    e = r.get("rel_err_f64") if r.get("rel_err_f64") is not None else r.get("rel_err")
    return "–" if e is None else f"{100 * e:.2f}%"


def _lowest_error_note(recs: list[dict]) -> str:
    """'; lowest error X e% against per-tensor amax's a% (g x lower)' over the FP8 recipes measured."""
    errs = {r["backend"]: r.get("rel_err_f64") or r.get("rel_err") for r in recs if r["backend"] != "cudnn"}
    errs = {n: e for n, e in errs.items() if e}
    if not errs:
        return ""
    n = min(errs, key=errs.get)
    amax = errs.get("cudnn-fp8")
    gain = f" against per-tensor amax's {100 * amax:.2f}% ({amax / errs[n]:.1f}x lower)" if amax else ""
    return f"; lowest error {n} {100 * errs[n]:.2f}%{gain}"


def fp8_recipes_part(records, p: dict, s: Section) -> None:
    """The recipe table (rows: recipes, columns: inputs) and, per inputs, the best recipe and its cost."""
    why = p.get("recipes_why") or {}
    if why and all(why.values()):
        first = next(iter(why.values()))
        s.paragraphs.append(f"FP8 recipes ({', '.join(why)}): skipped — {first}.")
        return
    recs = cells(records, "fp8-recipes")
    if not recs:
        return
    T = recs[0]["q_len"]
    dists = [d for d in FP8_RECIPE_INPUTS if any(r.get("inputs", "gaussian") == d for r in recs)]
    names = list(dict.fromkeys(r["backend"] for r in recs))
    by = {(r["backend"], r.get("inputs", "gaussian")): r for r in recs}
    rows = []
    for n in names:
        row = [n]
        for d in dists:
            r = by.get((n, d))
            row.append("" if r is None else f"{_err_pct(r)} · " + (f"{time_ms(r):.4g} ms" if r["status"] == "ok" else r["status"]))
        rows.append(row)
    s.tables.append(Table(f"FP8 recipes vs bf16 cuDNN (T=S={T}, causal, H=128): rel L2 vs float64 · time",
                          ["backend"] + [f"inputs = {d}" for d in dists], rows))
    for d in dists:
        best = best_fp8_recipe([r for r in recs if r.get("inputs", "gaussian") == d])
        anchor = by.get(("cudnn", d))
        if best is None:
            s.paragraphs.append(f"On {d} inputs no FP8 recipe was timed (each over the FP8 limit)"
                                + _lowest_error_note([r for r in recs if r.get("inputs", "gaussian") == d]) + ".")
            continue
        cost = ""
        if anchor is not None and anchor["status"] == "ok":
            e8 = best.get("rel_err_f64") or best["rel_err"]
            e16 = anchor.get("rel_err_f64") or anchor["rel_err"]
            cost = (f"; bf16 cuDNN: {_err_pct(anchor)} at {time_ms(anchor):.4g} ms, so FP8 is "
                    f"{time_ms(anchor) / time_ms(best):.2f}x as fast at {e8 / e16:.1f}x the error" if e16 else "")
        s.paragraphs.append(f"Best FP8 recipe on {d} inputs (lowest error among the recipes within "
                            f"{100 * FP8_BEST_WITHIN:.0f}% of the fastest): {best['backend']}, {_err_pct(best)} at "
                            f"{time_ms(best):.4g} ms{cost}.")


@section_renderer("te_fp8", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    c = cfg
    te_why = p["te_why"]
    if te_why:
        s.paragraphs.append(f"TransformerEngine: skipped — {te_why}.")
    else:
        recs = cells(records, "te")
        shape = f"B={c.batch}, N={c.heads}, H={c.head_dim}, bf16, no mask"
        s.tables.append(sweep_table(recs, "q_len", f"TransformerEngine DotProductAttention vs XLA vs cuDNN ({shape})"))
        made = plots_dir and plots.line_plot(recs, "q_len", "time", plots.path_in(plots_dir, "te_latency.png"),
                                             title=f"TransformerEngine vs XLA vs cuDNN ({shape})", xlabel="T = S", ylabel="ms")
        if made:
            s.plots.append(made)
    fp8 = cells(records, "fp8")
    fp8_rows, fp8_sources, te8_facts = [], [], []
    for name, why in p["fp8_why"].items():
        if why:
            fp8_rows.append([name, "", f"skipped: {why}", "", "", "", "", ""])
            fp8_sources.append(None)
            continue
        for T in fp8_seqs(c):
            r8 = next((r for r in fp8 if r["backend"] == name and r["q_len"] == T), None)
            r16 = next((r for r in fp8 if r["backend"] == "cudnn" and r["q_len"] == T), None)
            if r8 is None or r16 is None:
                continue
            sp = time_ms(r16) / time_ms(r8) if r8["status"] == "ok" and r16["status"] == "ok" else None
            facts = r8.get("facts") or {}
            if name == "te-fp8" and "fp8_in_program" in facts:
                te8_facts.append((T, facts))
            engaged = {True: "yes", False: "no"}.get(facts.get("fp8_in_program"), "yes" if name == "cudnn-fp8" else "")
            fp8_rows.append([name, f"T=S={T}", "ok" if r8["status"] == "ok" else status_or(r8, ""),
                             time_text(r8) if r8["status"] == "ok" else "", field_text(r8, "FP8 rel L2 vs float64"), engaged,
                             status_or(r16, f"{time_ms(r16):.4g} ms")
                             + f" (rel L2 vs float64 {field_text(r16, 'rel L2 vs float64')})", fmt(sp, ".2f")])
            fp8_sources.append(r8)
    s.tables.append(Table("FP8 attention (bf16 in and out, causal, H=128)",
                          ["path", "shape", "status", "FP8 time", "FP8 rel L2 vs float64", "FP8 in the program",
                           "cuDNN bf16", "speed-up"], fp8_rows,
                          empty_why={col: "nothing ran: no FP8 path is available here" for col in
                                     ("shape", "FP8 time", "FP8 rel L2 vs float64", "FP8 in the program", "cuDNN bf16", "speed-up")},
                          sources=fp8_sources))
    if te8_facts:
        yn = {True: "yes", False: "no", None: "not compared"}
        s.paragraphs.append("Measured in this run: under te.autocast (DelayedScaling) TransformerEngine's DotProductAttention "
                            + "; ".join(f"at T={T} has FP8 in its compiled program: {yn[f['fp8_in_program']]}, output "
                                        f"bit-identical to plain 'te': {yn[f.get('bit_identical_to_te')]}" for T, f in te8_facts)
                            + ". The FP8 attention that exists in JAX is cuDNN's (cudnn-fp8: e4m3 inputs, per-tensor amax scaling).")
    else:
        s.paragraphs.append("'te-fp8' runs TransformerEngine's DotProductAttention under te.autocast and records whether FP8 "
                            "engaged (fp8_in_program) and whether its output equals plain 'te' bit for bit; cudnn-fp8 is "
                            "cuDNN's FP8 attention through JAX.")
    fp8_recipes_part(records, p, s)
    if not (te_why and all(r[2].startswith("skipped: ") for r in fp8_rows)):
        s.paragraphs.append(cells_note(c))
    if te_why and all(r[2].startswith("skipped: ") for r in fp8_rows):
        s.status, s.reason = "skipped", (f"TransformerEngine: {te_why}; FP8: "
                                         + "; ".join(f"{r[0]}: {r[2].removeprefix('skipped: ')}" for r in fp8_rows))


STEP = Step("te_fp8", TITLE, render, sweeps=sweeps, probe=probe, cells_note=cells_note)
