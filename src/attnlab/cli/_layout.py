"""Which layout a table gets: the full table on a wide terminal (or with ``--wide``), else a compact
one, a line per cell, that fits a narrow terminal (< ``NARROW`` columns) or a pipe without cutting a
number (rich folds a table's cells to fit and cuts numbers with "…")."""
from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape

from ._app import console

#: Terminals narrower than this get the compact layout: the bench and compare tables need about 100.
NARROW = 100

wide_option = click.option("--wide", is_flag=True,
                           help=f"The full table even in a pipe or a terminal under {NARROW} columns (default there: "
                                "a line per cell).")


def compact(wide: bool, con: Console | None = None) -> bool:
    """True unless ``--wide`` was given or the output is a terminal of at least ``NARROW`` columns."""
    con = con or console
    return not wide and (not con.is_terminal or con.width < NARROW)


def table_console(con: Console | None = None) -> Console:
    """The console for a full table: a terminal's own, else (a pipe, a file) one wide enough that no
    cell is folded: a log is read whole, not at 80 columns."""
    con = con or console
    return con if con.is_terminal else Console(width=max(con.width, 240), emoji=False)


def packed(items: list[str], width: int, *, sep: str = "  ·  ", indent: str = "") -> list[str]:
    """``items`` joined by ``sep`` into lines of at most ``width`` characters, breaking only between
    items (a backend name or a "only in A: 3" is never split); an item longer than a line gets its own."""
    lines, cur = [], indent
    for it in items:
        add = it if cur == indent else sep + it
        if cur != indent and len(cur) + len(add) > width:
            lines.append(cur)
            cur, add = indent, it
        cur += add
    if cur != indent:
        lines.append(cur)
    return lines


def print_compact_table(title: str, columns: list[str], rows: list[list[str]], key: int = 1,
                        con: Console | None = None) -> None:
    """A table in the compact layout: its title, then per row its first ``key`` cells on one line and
    each other non-empty cell on a line of its own, ``column: value``, whole (nothing cut to fit)."""
    con = con or console
    con.print(escape(title), highlight=False, soft_wrap=True)
    width = max((len(c) for c in columns[key:]), default=0)
    for row in rows:
        con.print(escape(" ".join(x for x in row[:key] if x)), highlight=False, soft_wrap=True)
        for c, x in zip(columns[key:], row[key:]):
            if x:
                con.print(f"  {escape(c.ljust(width))}  {escape(x)}", highlight=False, soft_wrap=True)
