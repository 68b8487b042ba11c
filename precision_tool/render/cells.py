"""The cells and small layouts every shell view draws with: numbers, plain tables, titled tables, panels, and
lines that keep their indent when they wrap."""

from __future__ import annotations

import math

from rich import box
from rich.console import Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def num(value, digits: int = 6) -> str:
    """A number in a table cell: ``-`` for missing, ``nan``/``inf`` spelled out."""
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}"


class PlainTable(Table):
    """A table whose string cells are plain text: op names like ``a[0]`` are never read as markup."""

    def add_row(self, *cells, **kwargs) -> None:
        super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **kwargs)


def table(title: str | None = None, *columns: str, **kwargs) -> Table:
    """A plain table of folding columns; ``title`` is drawn above it by `titled`."""
    made = PlainTable(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, **kwargs)  # no blank first and last lines
    made.title_text = title  # shown above the table by `titled`, so it never wraps to the table width
    for column in columns:
        made.add_column(column, overflow="fold")
    return made


def titled(made: Table):
    """The table under its title, when it has one."""
    title = getattr(made, "title_text", None)
    return Group(Text(title, style="bold"), made) if title else made


def panel(body, title: str):
    return Panel(body, title=Text(title), title_align="left", box=box.ROUNDED, expand=False)


def shape(dims) -> str:
    """``(3,)``, ``(2, 5)``: a shape as Python writes a tuple."""
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def indented(text: Text, indent: int):
    """``text`` with every line it wraps to ``indent`` columns in, so that a wrapped line never reads as the
    start of another entry."""
    return Padding(text, (0, 0, 0, indent), expand=False)


def hanging(text: Text, indent: int):
    """``text`` from column 0, the lines it wraps to ``indent`` columns in."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    head, rest = text[:indent], text[indent:]
    grid.add_row(head, rest)
    return grid
