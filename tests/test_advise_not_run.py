"""``attnlab advise`` says what its records back: a cell kept from running by the cell budget is
"not run: over budget" with the ``--cell-budget`` that runs it (never "none correct"), and its tables
follow bench's compact layout in a pipe or a terminal under 100 columns (a line per cell, nothing cut)."""
import pytest

from attnlab.cli import console
from attnlab.cli.advise import print_tables
from attnlab.core.model_plan import plan
from attnlab.core.models import preset
from attnlab.report.advice import advise, tables

BACKENDS = ("xla", "cudnn", "tokamax-mosaic", "unsupported-backend-with-a-long-name")


def _rec(e, backend, status, ms=None, estimate_s=None, reason="why"):
    return {"backend": backend, "batch": e.batch, "q_len": e.q_len, "kv_len": e.kv_len, "heads": e.heads,
            "kv_heads": e.kv_heads, "head_dim": e.head_dim, "dtype": e.dtype, "causal": True,
            "window": list(e.window) if e.window else None, "mode": e.mode, "lengths": e.lengths, "devices": 1,
            "strategy": None, "soft_cap": e.soft_cap, "status": status, "kernel_ms": ms, "wall_ms": None,
            "reason": None if status == "ok" else reason, "estimate_s": estimate_s}


@pytest.fixture
def adv():
    p = preset("llama-3.1-8b")
    es = plan(p, "prefill,decode", "4k")
    recs = []
    for e in es:
        if e.phase == "prefill":   # every backend kept from running by the budget, or refused here
            recs += [_rec(e, "xla", "over_budget", estimate_s=412.0), _rec(e, "cudnn", "unsupported")]
        else:                      # ran: one incorrect, one ok
            recs += [_rec(e, "xla", "ok", 0.25), _rec(e, "cudnn", "incorrect")]
        recs += [_rec(e, b, "unsupported") for b in BACKENDS[2:]]
    return advise(p, es, recs)


def test_a_phase_kept_from_running_by_the_budget_says_so_and_how_to_run_it(adv):
    summary, side, _ = tables(adv)
    pre = next(r for r in summary["rows"] if r[0] == "prefill")
    assert "not run: over budget" in pre[2] and "none correct" not in pre[2]
    assert next(r for r in side["rows"] if r[0] == "prefill")[-1].startswith("not run: over budget")
    assert next(p for p in adv["phases"] if p["phase"] == "prefill")["not_run"] == ["global"]
    note = next(n for n in adv["notes"] if "over_budget" in n)
    assert "1 cell(s) not run" in note and "--cell-budget 495" in note      # above the largest estimate, 412 s
    dec = next(r for r in summary["rows"] if r[0] == "decode T=1")
    assert dec[2] == "global: xla"


def test_none_correct_stays_for_cells_that_ran():
    p = preset("llama-3.1-8b")
    es = plan(p, "prefill", "4k")
    adv = advise(p, es, [_rec(es[0], "xla", "incorrect"), _rec(es[0], "cudnn", "over_budget", estimate_s=9.0)])
    assert tables(adv)[0]["rows"][0][2] == "global: none correct of those run; others not run: over budget (--cell-budget)"
    adv = advise(p, es, [_rec(es[0], "xla", "incorrect")])
    assert tables(adv)[0]["rows"][0][2] == "global: none correct"


def test_a_compile_past_its_budget_asks_for_the_compile_budget_not_the_cell_budget():
    p = preset("llama-3.1-8b")
    es = plan(p, "prefill", "4k")
    adv = advise(p, es, [_rec(es[0], "xla", "over_budget", estimate_s=3.0,
                              reason="compile ran past its 0.01 s budget (--compile-budget); abandoned and skipped")])
    assert tables(adv)[0]["rows"][0][2] == "global: not run: over budget (--compile-budget)"
    budget = [n for n in adv["notes"] if "over_budget" in n]
    assert len(budget) == 1 and "larger --compile-budget" in budget[0] and "--cell-budget" not in budget[0]


@pytest.mark.parametrize("width,terminal", [(80, False), (200, False), (90, True)])
def test_advise_tables_in_a_pipe_or_under_100_columns_are_a_line_per_cell(adv, capsys, monkeypatch, width, terminal):
    monkeypatch.setattr(console, "_width", width)
    monkeypatch.setattr(console, "_force_terminal", terminal)
    print_tables(tables(adv))
    out = capsys.readouterr().out
    assert "…" not in out and "┃" not in out and "│" not in out
    assert "unsupported-backend-with-a-long-name  unsupported" in out        # a line per cell, names whole
    assert "  fastest correct" in out and "prefill 4096 32 global T4096 S4096" in out
    print_tables(tables(adv), wide=True)
    assert "┃" in capsys.readouterr().out
