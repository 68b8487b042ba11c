"""Schema 2's packs: a step's small tensors copied one after another into a few byte datasets.

Split from `precision_tool.dump.writer`, which decides what is packed (a
tensor of at most `layout.PACK_LIMIT` stored bytes) and records where; the
layout is in docs/dump-format.md.
"""

from __future__ import annotations

import numpy as np

from precision_tool.dump import layout
from precision_tool.dump.h5low import LowLevel


class StepPacks:
    """One step's small tensors, copied into a buffer and written as ``packs/NNNNNN`` byte datasets.

    Each tensor starts at a multiple of `layout.PACK_ALIGN` bytes; a pack is
    written once it would pass `layout.PACK_SEGMENT` bytes, so memory stays
    one segment however many tensors a step has. `fill_columns` puts each
    index row's (pack, offset) into the step's ``index`` table.
    """

    def __init__(self, h5: LowLevel):
        self._h5 = h5
        self._buffer = np.empty(0, np.uint8)
        self._group = self._packs_group = None
        self._fill = self._number = 0
        self._rows: list[int] = []
        self._where: list[tuple[int, int]] = []

    def begin(self, step_group) -> None:
        self._group, self._packs_group = step_group, None
        self._fill = self._number = 0
        self._rows, self._where = [], []

    def add(self, row: int, stored: np.ndarray) -> tuple[int, int]:
        """Copy ``stored`` (C-contiguous) into the current pack; return its (pack, offset)."""
        size = stored.nbytes
        if self._fill + size > layout.PACK_SEGMENT:
            self.flush()
        if self._buffer.size < layout.PACK_SEGMENT:
            self._buffer = np.empty(layout.PACK_SEGMENT, np.uint8)
        start = self._fill
        self._buffer[start:start + size] = stored.reshape(-1).view(np.uint8)
        self._fill = start + size + (-size) % layout.PACK_ALIGN
        self._buffer[start + size:self._fill] = 0  # padding: not whatever the buffer's memory held before
        where = (self._number, start)
        self.point(row, where)
        return where

    def point(self, row: int, where: tuple[int, int]) -> None:
        self._rows.append(row)
        self._where.append(where)

    def flush(self) -> None:
        """Write the current pack, if it holds anything."""
        if not self._fill:
            return
        if self._packs_group is None:
            self._packs_group = self._h5.group(self._group, layout.PACKS)
        self._h5.dataset(self._packs_group, layout.pack_name(self._number), self._buffer[:self._fill])
        self._number += 1
        self._fill = 0

    def fill_columns(self, table: np.ndarray) -> None:
        table["pack"] = layout.NOT_PACKED
        table["offset"] = 0
        if self._rows:
            where = np.array(self._where, dtype=np.int64)
            table["pack"][self._rows] = where[:, 0]
            table["offset"][self._rows] = where[:, 1]
