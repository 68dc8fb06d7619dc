"""What the lab's renderers share: reading records, making a step's section, formatting times. Pure: no JAX."""
from __future__ import annotations

from ..core.records import config_label, timing
from ..core.units import format_flops
from .step_types import LabConfig, Section, Table
from .plots import time_ms

ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
SPREAD_NOTE = "Times are the median of the repeats, with the 25th–75th percentile in brackets (the spread)."

# --- reading records -----------------------------------------------------------------------------

def cells(records, *steps: str) -> list[dict]:
    """The cell records tagged with one of ``steps``, in file order."""
    return [r for r in records if r.get("kind", "cell") == "cell" and r.get("step") in steps]


#: Cell statuses that fail the step showing them: a wrong answer, or a path that broke (refusals, budgets and
#: out-of-memory are results a step reports; the FP8 recipes' step reports its incorrect recipes as its finding).
FAILED = ("incorrect", "runtime_error", "compile_error")


def fail_on_failed_cells(s: Section, recs: list[dict]) -> None:
    """Mark the section failed (unless it already is not ok) when one of its cells ``recs`` is ``FAILED``."""
    bad = [r for r in recs if r.get("status") in FAILED]
    if bad and s.status == "ok":
        r = bad[0]
        s.status = "failed"
        s.reason = (f"{len(bad)} of {len(recs)} cell(s) failed; first: {r['backend']} {config_label(r)}: {r['status']}"
                    f"{': ' + r['reason'][:120] if r.get('reason') else ''}")


def probe(records, step: str) -> dict | None:
    """The probe facts of ``step`` (its latest ``lab_step`` record holding ``probe``), or None."""
    for r in reversed(records):
        if r.get("kind") == "lab_step" and r.get("step") == step and isinstance(r.get("probe"), dict):
            return r["probe"]
    return None


def missing(sid: str, title: str) -> Section:
    return Section(sid, title, status="skipped", reason=f"no records of step {sid!r}")


def section_renderer(sid: str, title, needs: tuple[str, ...] = ()):
    """Decorate ``fill(s, p, records, cfg, plots_dir)`` into the step's renderer ``(records, cfg, plots_dir) -> Section``.

    ``fill`` adds to the section ``s`` (id ``sid``; ``title`` a string or ``title(cfg)``) what the
    records say; ``p`` is the step's probe facts (None when it stored none). The step is skipped
    ("no records of step ...") without its records: its probe facts when ``needs`` is empty, else a
    cell record tagged with one of ``needs``."""
    def wrap(fill):
        def render(records, cfg: LabConfig, plots_dir: str | None = None) -> Section:
            s = Section(sid, title(cfg) if callable(title) else title)
            p = probe(records, sid)
            if (not cells(records, *needs)) if needs else p is None:
                return missing(sid, s.title)
            fill(s, p, records, cfg, plots_dir)
            return s
        render.__name__ = render.__qualname__ = f"render_{sid}"
        render.__doc__ = fill.__doc__
        return render
    return wrap


# --- formatting ----------------------------------------------------------------------------------

def fmt(x, spec=".4g"):
    return "–" if x is None else format(x, spec)


#: Report column headers that show one field of a cell record, and how: {header: (field, format)}.
#: A table built from cell records takes these columns' values from here (``field_text``), so a
#: header says which field it shows ("rel L2 vs float64" is ``rel_err_f64``, the sampled float64
#: rows; ``rel_err`` is the whole output against the float32 device reference).
FIELD_COLUMNS = {
    "rel L2 vs float64": ("rel_err_f64", ".2e"),
    "FP8 rel L2 vs float64": ("rel_err_f64", ".2e"),
    "rel L2 vs float32 (device)": ("rel_err", ".2e"),
    "kernel (CUPTI)": ("kernel_ms", ".4g"),
    "wall per blocked call": ("wall_ms", ".4g"),
    "pipelined wall": ("pipelined_ms", ".4g"),
    "dispatch = wall − kernel": ("dispatch_ms", ".4g"),
    "compile s": ("compile_s", ".3g"),
}


def field_text(rec: dict, header: str) -> str:
    """The value a column headed ``header`` (a key of ``FIELD_COLUMNS``) shows for the cell record ``rec``."""
    field, spec = FIELD_COLUMNS[header]
    return fmt(rec.get(field), spec)


def status_or(rec, text):
    return text if rec["status"] == "ok" else f"{rec['status']}: {(rec['reason'] or '')[:80]}"


def spread(rec, prefix: str | None = None) -> str:
    """A timed record's spread over its repeats: "p25–p75" (ms), or "" when not timed."""
    if prefix is None:
        t = timing(rec) if rec.get("status") == "ok" else None
        return "" if t is None else f"{t['p25']:.3g}–{t['p75']:.3g}"
    lo, hi = rec.get(f"{prefix}_p25_ms"), rec.get(f"{prefix}_p75_ms")
    return "" if lo is None or hi is None else f"{lo:.3g}–{hi:.3g}"


def time_text(rec) -> str:
    """"0.354 ms [0.33–0.36]": the median and, in brackets, the 25th–75th percentile of the repeats."""
    return status_or(rec, f"{time_ms(rec):.4g} ms [{spread(rec)}]" if rec["status"] == "ok" else "")


def speedup_text(rec, ref) -> str:
    """``ref``'s time over ``rec``'s, called faster or slower only where the repeats' 25th–75th
    percentiles do not overlap: "1.42× faster", "0.71× (slower)", or "1.11×: no clear difference
    (spreads overlap)"; "–" unless both were timed."""
    if rec is None or ref is None or rec.get("status") != "ok" or ref.get("status") != "ok":
        return "–"
    a, b = timing(rec), timing(ref)
    if not (a and b and a["median"]):
        return "–"
    ratio = b["median"] / a["median"]
    if a["p75"] < b["p25"]:
        return f"{ratio:.2f}× faster"
    if a["p25"] > b["p75"]:
        return f"{ratio:.2f}× (slower)"
    return f"{ratio:.2f}×: no clear difference (spreads overlap)"


def timer_note(recs) -> str:
    if any(r.get("timer") == "cupti" for r in recs):
        return "Times are GPU kernel time measured with CUPTI, compile time apart. " + SPREAD_NOTE
    return "No GPU here: times are host wall clock around each blocked call (no CUPTI), compile time apart. " + SPREAD_NOTE


def sweep_table(recs, x: str, title: str):
    bes = list(dict.fromkeys(r["backend"] for r in recs))
    xs = sorted({r[x] for r in recs})
    rows = []
    for xv in xs:
        row = [xv]
        for b in bes:
            r = next((r for r in recs if r[x] == xv and r["backend"] == b), None)
            row.append("" if r is None else status_or(r, f"{time_text(r)} · {format_flops(r['tflops'] * 1e12)}"
                                                          if r["status"] == "ok" else ""))
        rows.append(row)
    return Table(title, [x] + bes, rows)
