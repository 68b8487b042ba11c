"""A step's index tables read a window at a time: columns, gathered rows, and a dump seen through a window.

`precision_tool.dump.reader` reads a step's ``op_index`` and ``index`` whole
and builds a record per op (about 1 KB a one-tensor op). A streaming
comparison (`precision_tool.compare.stream`) reads them here instead: a few
columns at a time for its name index, then the rows of a few thousand ops,
which `window_dump` turns into a `StepIndex` of their own and a `Dump` that
reads tensors through it (packs and mappings shared with the opened dump).

Anything this module does not expect (an unusual table, a reference outside
the tables, execution indices out of order) raises `TablesUnsupported`: the
caller falls back to the reader, which names what is wrong, or reads it.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from precision_tool.dump import layout
from precision_tool.dump.links import member
from precision_tool.dump.reader import Dump
from precision_tool.dump.steps import (_OP_FIELDS, _TENSOR_FIELDS, _TENSOR_FIELDS_V1, DamagedDump, StepIndex,
                                      check_contents)
from precision_tool.engine.hooks import DIRECTIONS

GAP = 1024  # gathered rows further apart than this are read as separate slices


class TablesUnsupported(Exception):
    """A step's tables are not what a windowed read handles: read them whole instead."""


class StepTables:
    """The two index tables of one complete step of an opened dump, as h5py datasets (nothing read yet)."""

    def __init__(self, dump: Dump, step: int):
        self.dump, self.step = dump, step
        group = dump._step_group(step)
        if group.attrs.get("long_shapes") is not None and len(group.attrs["long_shapes"]):
            raise TablesUnsupported("shapes of rank above the index's")  # rare: the reader handles them
        has_ops, has_index = layout.OP_INDEX in group, layout.INDEX in group
        if has_ops != has_index:
            raise TablesUnsupported("one index table without the other")
        self.ops = self.tensors = None
        self.n_ops = self.n_tensors = 0
        if has_ops:
            fields = _TENSOR_FIELDS if dump.schema_version >= 2 else _TENSOR_FIELDS_V1
            tables = (member(group, name, dump._refused) for name in (layout.OP_INDEX, layout.INDEX))
            self.ops, self.tensors = (_dataset(table, f) for table, f in zip(tables, (_OP_FIELDS, fields)))
            self.n_ops, self.n_tensors = self.ops.shape[0], self.tensors.shape[0]
        elif layout.OPS in group and len(member(group, layout.OPS, dump._refused)):
            raise TablesUnsupported("tensor data without index tables")

    @classmethod
    def empty(cls, dump: Dump, step: int) -> "StepTables":
        """A step the dump did not record: no ops."""
        tables = cls.__new__(cls)
        tables.dump, tables.step, tables.ops, tables.tensors, tables.n_ops, tables.n_tensors = dump, step, None, None, 0, 0
        return tables

    def op_columns(self, start: int, stop: int, names: list[str]) -> np.ndarray:
        """Columns ``names`` of op rows ``start`` to ``stop``."""
        return self.ops.fields(names)[start:stop]

    def tensor_columns(self, start: int, stop: int, names: list[str]) -> np.ndarray:
        return self.tensors.fields(names)[start:stop]


def _dataset(dataset, fields: dict):
    """``dataset`` when it is a 1-D, non-empty table with the writer's columns (those the reader checks)."""
    import h5py

    names = getattr(dataset.dtype, "names", None) if isinstance(dataset, h5py.Dataset) else None
    if (names != tuple(fields) or any(dataset.dtype[f].base.kind != kind for f, kind in fields.items())
            or len(dataset.shape) != 1 or dataset.shape[0] == 0
            or ("shape" in fields and dataset.dtype["shape"].shape != (layout.MAX_RANK,))):
        raise TablesUnsupported(f"{dataset.name}: not the writer's table")
    return dataset


def gather(dataset, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (increasing) of a table, read as a few slices."""
    if not len(rows):
        return dataset[0:0]
    if rows[-1] >= dataset.shape[0] or rows[0] < 0:
        raise TablesUnsupported(f"{dataset.name}: a reference past the end of the table")
    breaks = np.flatnonzero(np.diff(rows) > GAP) + 1
    parts = []
    for run in np.split(rows, breaks):
        lo = int(run[0])
        parts.append(dataset[lo:int(run[-1]) + 1][run - lo])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def window_index(tables: StepTables, positions: np.ndarray) -> StepIndex:
    """A `StepIndex` of the ops in rows ``positions`` (increasing) of ``op_index`` and of their tensors only.

    Its rows are local: ``TensorRecord.index_row`` and `TensorLocation` refer to the window's own tables,
    which `window_dump` reads through.
    """
    op_rows = gather(tables.ops, positions)
    first, count = op_rows["first_tensor"].astype(np.int64), op_rows["n_tensors"].astype(np.int64)
    if (first + count > tables.n_tensors).any() or (op_rows["direction"] > len(DIRECTIONS) - 1).any():
        raise TablesUnsupported("an op row refers outside the tables")
    starts = np.repeat(first - np.concatenate(([0], np.cumsum(count)[:-1])), count)
    rows = starts + np.arange(int(count.sum()), dtype=np.int64)  # every tensor row of the window, op by op
    if len(rows) and (np.diff(rows) <= 0).any():
        raise TablesUnsupported("ops whose tensor rows overlap or run backwards")
    tensor_rows = gather(tables.tensors, rows)
    _check_tensors(tensor_rows, tables)
    _check_window(op_rows, tensor_rows, positions, first, count)
    op_rows["first_tensor"] = np.concatenate(([0], np.cumsum(count)[:-1])) if len(count) else count
    tensor_rows["op"] = np.repeat(np.arange(len(op_rows)), count)
    index = StepIndex(tables.step, op_rows, tensor_rows, {})
    index.source_rows = rows  # messages name the step's own rows
    return index


def _check_tensors(rows: np.ndarray, tables: StepTables) -> None:
    """The reader's checks of ``index`` rows (`steps.check_tables`), on the rows a window reads."""
    bad = (rows["op"] > tables.n_ops - 1) | (rows["kind"] > len(layout.KINDS) - 1)
    if "pack" in rows.dtype.names:
        bad |= rows["pack"] < layout.NOT_PACKED
    ndim = rows["ndim"]
    bad |= ndim > layout.MAX_RANK
    used = np.arange(layout.MAX_RANK) < np.minimum(ndim, layout.MAX_RANK)[:, None]
    bad |= (used & (rows["shape"] < 0)).any(axis=1)
    if bad.any():
        raise TablesUnsupported("an index row the reader would refuse or read specially")


def _check_window(op_rows: np.ndarray, tensor_rows: np.ndarray, positions: np.ndarray, first: np.ndarray,
                  count: np.ndarray) -> None:
    """The reader's checks of what rows claim (`steps.check_rows`, `steps.check_contents`), as far as a window's
    rows show them: execution order, each tensor row owned by its op, no slot twice, statistics that fit the
    shape, dtypes numpy reads. Damage raises `TablesUnsupported`: the reader, reading the step whole, then
    names the row."""
    executions = op_rows["exec_index"].astype(np.int64)
    adjacent = np.flatnonzero(np.diff(positions) == 1)  # ops next to each other in op_index
    owners = np.repeat(np.arange(len(op_rows)), count)
    keys = owners * (1 << 17) + tensor_rows["kind"].astype(np.int64) * (1 << 16) + tensor_rows["slot"]
    if ((np.diff(executions) <= 0).any() or (first[adjacent + 1] != first[adjacent] + count[adjacent]).any()
            or (tensor_rows["op"] != np.repeat(positions, count)).any() or np.unique(keys).size != keys.size):
        raise TablesUnsupported("index rows the reader would refuse")
    used = np.arange(layout.MAX_RANK) < np.minimum(tensor_rows["ndim"], layout.MAX_RANK)[:, None]
    try:
        check_contents(tensor_rows, layout.INDEX, used, {})
    except DamagedDump:
        raise TablesUnsupported("index rows the reader would refuse") from None


class WindowDump(Dump):
    """An opened dump whose one step is seen through a window's `StepIndex` (no other step is readable)."""

    def step_index(self, step: int) -> StepIndex:
        if step != self._window_step:
            raise TablesUnsupported(f"step {step} is outside the window")
        return self._window

    def close(self) -> None:  # the file belongs to the dump it was made from
        pass


def window_dump(dump: Dump, index: StepIndex) -> WindowDump:
    """``dump`` reading step ``index.step`` through ``index``: its file is shared, its packs are its own, so their
    mappings (resident pages of the file) are released with the window."""
    view = WindowDump.__new__(WindowDump)
    view.__dict__.update(dump.__dict__)
    view._window, view._window_step, view._indexes = index, index.step, {index.step: index}
    view._packs = OrderedDict()
    return view
