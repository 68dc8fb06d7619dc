"""A self-contained HTML report (plots embedded as base64 PNG), rendered by Jinja2 with autoescaping."""
from __future__ import annotations

import base64
import datetime
import os

import jinja2


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("attnlab", "templates"),
                              autoescape=jinja2.select_autoescape(["html"], default=True))


def _images(paths):
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append({"alt": os.path.basename(p), "data": base64.b64encode(f.read()).decode("ascii")})
    return out


def _tables(tables):
    """Each table without its all-empty columns, with a note naming them and why -- each reason said
    once per section (e.g. "kernel time needs a GPU (CUPTI); wall clock shown") -- and its ``footnotes`` (the
    reasons of the cells it shows not timed, "(1) cudnn: needs a GPU"), under it."""
    out, said = [], set()
    for t in tables:
        compact = t.compact() if hasattr(t, "compact") else (t, {})
        table, dropped = compact
        by_reason: dict[str, list[str]] = {}
        for col, why in dropped.items():
            by_reason.setdefault(why, []).append(col)
        notes = [f"Not shown: {', '.join(cols)} ({why})." for why, cols in by_reason.items() if why not in said]
        said.update(by_reason)
        out.append({"title": table.title, "columns": table.columns, "rows": table.rows,
                    "notes": notes + list(getattr(t, "footnotes", []))})
    return out


def render(sections, env: dict, *, label: str | None = None) -> str:
    view = [{"id": s.id, "title": s.title, "status": s.status, "reason": s.reason, "paragraphs": s.paragraphs,
             "tables": _tables(s.tables), "images": _images(s.plots),
             "folds": [{"summary": a, "lines": b} for a, b in getattr(s, "folds", [])]} for s in sections]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return _environment().get_template("report.html").render(sections=view, env=env, label=label, generated=now)


def write_report(path, sections, env: dict, *, label: str | None = None) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(sections, env, label=label))
    return path
