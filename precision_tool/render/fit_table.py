"""Tables that fit the terminal without folding a cell: a number split over two lines reads as another number.

One column holds names (op paths): it is shortened from its start, at a path
boundary where it can (``…/h.1/mlp/act/aten.mul_0``: the end names the op).
When even that is not enough, columns with a drop rank leave, lowest rank
first. JSON and CSV always keep every column and every name whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.table import Table
from rich.text import Text

NAME_MIN_WIDTH = 20  # a name column narrower than this says too little: drop other columns first


@dataclass(frozen=True)
class Column:
    """A column: its header, justification, and when it may be left out (None: never; else lower goes first)."""

    header: str
    justify: str = "left"
    drop: int | None = None


class FitTable:
    """Rows of cells (str or Text) under ``columns``; ``name_column`` is the one shortened to fit."""

    def __init__(self, columns: tuple[Column, ...], rows: list[list], name_column: int):
        self.columns, self.rows, self.name_column = columns, rows, name_column

    def layout(self, max_width: int) -> list[tuple[int, int]]:
        """(column, width) of the columns shown at ``max_width``."""
        natural = [max([len(c.header), 1] + [len(plain(cells[i])) for cells in self.rows])
                   for i, c in enumerate(self.columns)]
        name = self.name_column
        kept = list(range(len(self.columns)))
        droppable = sorted((c.drop, i) for i, c in enumerate(self.columns) if c.drop is not None)
        for dropped in (None, *(i for _, i in droppable)):
            if dropped is not None:
                kept.remove(dropped)
            room = max_width - sum(natural[i] for i in kept if i != name) - (len(kept) - 1)  # 1-space gaps
            if room >= min(natural[name], NAME_MIN_WIDTH):
                break
        return [(i, min(natural[name], max(room, 1)) if i == name else natural[i]) for i in kept]

    def __rich_console__(self, console, options):
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0, 0, 0),
                      collapse_padding=True)
        columns = self.layout(options.max_width)
        for i, width in columns:
            column = self.columns[i]
            table.add_column(column.header, justify=column.justify, no_wrap=True, overflow="ellipsis", width=width)
        for cells in self.rows:
            table.add_row(*(shorten_start(cells[i], width) if i == self.name_column else cells[i]
                            for i, width in columns))
        yield table


def shorten_start(cell, width: int):
    """``cell`` (str or Text) cut to ``width`` characters by dropping its start: ``…/h.1/mlp/act/aten.mul_0``."""
    text = plain(cell)
    if len(text) <= width:
        return cell
    tail = text[len(text) - (width - 1):]
    cut = tail.find("/")
    if 0 <= cut < len(tail) - 8:  # start at a path boundary when that keeps enough of the name
        tail = tail[cut:]
    return Text("…" + tail, style=cell.style if isinstance(cell, Text) else "")


def plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)
