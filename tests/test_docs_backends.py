"""docs/backends.md's refusals are what ``attnlab.explain`` says on this machine.

The table under "The refusals, checked" holds one call per row: where it holds (``any``, ``CPU``: no
GPU, ``GPU``: an NVIDIA GPU), the backend (or ``auto``), the query and key/value shapes and dtype,
``explain``'s other arguments, and what it says: ``runs``, ``runs `NAME``` (auto) or ``refuses: `REASON```
(the start of the reason); ``sinks=(N,)`` stands for a float32 array of that shape. Each row is one test; GPU rows are marked ``gpu`` (run them on the H200:
``python -m pytest -q -m gpu tests/test_docs_backends.py``).
"""
import ast
import pathlib
import re

import jax
import pytest

import attnlab

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "backends.md"
_SHAPE = re.compile(r"^\(([\d, ]+)\)(?: (\w+))?$")


def _arguments(text: str) -> dict:
    """``a=1, b=(16, 0)`` -> {"a": 1, "b": (16, 0)}: literal keyword arguments only."""
    call = ast.parse(f"f({text.strip('`')})", mode="eval").body
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def doc_rows(text: str | None = None) -> list[dict]:
    """The rows of the checked-refusals table: {where, backend, query, kv, dtype, arguments, says}."""
    text = DOC.read_text() if text is None else text
    part = text[text.index("### The refusals, checked"):]
    rows = []
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] in ("where", "---"):
            continue
        where, backend, query, kv, args, says = cells
        (qs, dtype), (ks, _) = _SHAPE.match(query).groups(), _SHAPE.match(kv).groups()
        rows.append({"where": where, "backend": backend.strip("`"), "dtype": dtype, "arguments": _arguments(args),
                     "query": tuple(int(x) for x in qs.split(",")), "kv": tuple(int(x) for x in ks.split(",")),
                     "says": says})
    return rows


def explain_says(row: dict) -> str:
    """What ``attnlab.explain`` says of the row's backend, in the table's words."""
    q, kv = (jax.ShapeDtypeStruct(row[s], row["dtype"]) for s in ("query", "kv"))
    args = dict(row["arguments"])
    if "sinks" in args:
        args["sinks"] = jax.ShapeDtypeStruct(args["sinks"], "float32")
    with jax.enable_x64(row["dtype"] == "float64"):
        e = attnlab.explain(q, kv, kv, **args)
    if row["backend"] == "auto":
        return f"runs `{e.chosen}`"
    why = e.reasons[row["backend"]]
    return "runs" if why is None else f"refuses: {why}"


def agrees(said: str, says: str) -> bool:
    """``says`` (the doc) matches ``said`` (explain): equal, or a refusal whose reason starts with the doc's."""
    m = re.fullmatch(r"refuses: `(.+)`", says)
    return said.startswith(f"refuses: {m.group(1)}") if m else said == says


ROWS = doc_rows()
_MARKS = {"any": [], "CPU": [pytest.mark.skipif(jax.default_backend() == "gpu", reason="a statement about a machine without a GPU")],
          "GPU": [pytest.mark.gpu]}


def test_the_table_parses_and_has_both_kinds_of_rows():
    assert {r["where"] for r in ROWS} == {"any", "CPU", "GPU"} and len(ROWS) >= 15
    assert any(r["says"].startswith("refuses") for r in ROWS) and any(r["backend"] == "auto" for r in ROWS)
    # the checker sees a wrong statement: xla runs float16 on a CPU, it does not refuse it
    assert not agrees("runs", "refuses: `float16`") and not agrees("refuses: float64: x", "refuses: `float16`")


@pytest.mark.parametrize("row", [pytest.param(r, marks=_MARKS[r["where"]], id=f"{r['where']}-{r['backend']}-{i}")
                                 for i, r in enumerate(ROWS)])
def test_each_documented_refusal_is_what_explain_says(row):
    said = explain_says(row)
    assert agrees(said, row["says"]), (row, said)
