"""One step's index tables turned into `OpRecord`s, without walking the op groups."""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import numpy as np

from precision_tool.bulk import bulk_objects
from precision_tool.dump import layout
from precision_tool.dump.links import member
from precision_tool.dump.records import SCHEMA_VERSION, OpRecord, TensorRecord, TensorStats
from precision_tool.engine.hooks import DIRECTIONS
from precision_tool.errors import NotFoundError



class TensorLocation(NamedTuple):
    """Where a recorded tensor's values are: its op group (schema 1, or a large tensor) or a pack."""

    op: int  # the op's row in ``op_index``
    dtype: str
    has_data: bool
    size: int  # number of values
    shape: tuple
    pack: int  # layout.NOT_PACKED, or the ``packs/`` dataset holding its bytes
    offset: int  # byte offset in that pack


class StepIndex:
    """The ``op_index`` and ``index`` tables of one step, and the records built from them."""

    def __init__(self, step: int, op_rows: np.ndarray, tensor_rows: np.ndarray, long_shapes: dict):
        self.step = step
        self.op_rows = op_rows
        self.tensor_rows = tensor_rows
        self._long_shapes = long_shapes
        self._records: list[OpRecord] | None = None
        self._texts: dict[bytes, str] = {}
        self._slots: dict[tuple[int, int, int], int] | None = None
        self.source_rows: np.ndarray | None = None  # a window's rows: their numbers in the step's whole index

    def source_row(self, row: int) -> int:
        """The number of index row ``row`` in the step's ``index`` table (a window's rows are its own)."""
        return int(self.source_rows[row]) if self.source_rows is not None else int(row)

    @classmethod
    def read(cls, step: int, group, schema: int = SCHEMA_VERSION) -> "StepIndex":
        """Read and check the tables of a step group (an h5py Group); `DamagedDump` names what is wrong."""
        where = f"/{layout.STEPS}/{layout.step_name(step)}"
        long_shapes = _long_shapes(group.attrs.get("long_shapes"), where)
        has_ops, has_index = layout.OP_INDEX in group, layout.INDEX in group
        if not has_ops and not has_index:  # the step recorded no op: then it has no tensor data either
            if layout.OPS in group and len(member(group, layout.OPS, DamagedDump)):
                raise DamagedDump(f"{where}/{layout.OP_INDEX}", "missing, though the step holds tensor data")
            return cls(step, np.zeros(0, layout.op_row_dtype((1, 1, 1, 1))), np.zeros(0, layout.tensor_row_dtype(schema)),
                       {})
        if not (has_ops and has_index):
            missing = layout.INDEX if has_ops else layout.OP_INDEX
            raise DamagedDump(f"{where}/{missing}", "missing (the step has "
                              f"{layout.OP_INDEX if has_ops else layout.INDEX} without it)")
        op_rows = _table(group, layout.OP_INDEX, where, _OP_FIELDS)
        tensor_rows = _table(group, layout.INDEX, where, _TENSOR_FIELDS if schema >= 2 else _TENSOR_FIELDS_V1)
        check_tables(op_rows, tensor_rows, where, long_shapes)
        return cls(step, op_rows, tensor_rows, long_shapes)

    @property
    def overflow_rows(self) -> np.ndarray:
        """Positions of the recorded ops that raised the float status."""
        return np.flatnonzero(self.op_rows["overflow"]) if self.op_rows.size else np.zeros(0, int)

    def records(self) -> list[OpRecord]:
        """Every recorded op of the step, in execution order."""
        if self._records is None:
            with bulk_objects():  # records by the ten thousand, no cycles among them
                tensors = self._tensors()
                self._records = [self._record(row, tensors, 0) for row in self.op_rows.tolist()]
        return self._records

    def record_at(self, position: int) -> OpRecord:
        """The op in row ``position`` of ``op_index``."""
        if self._records is not None:
            return self._records[position]
        row = self.op_rows[position].tolist()
        first, count = row[5], row[6]
        return self._record(row, self._tensors(first, count), first)

    def tensor_location(self, exec_index: int, slot: str) -> TensorLocation:
        """Where a tensor's values are; KeyError when it was not recorded."""
        if self._slots is None:
            self._slots = self._slot_rows()
        kind, index = layout.parse_slot(slot)
        row = self._slots.get((int(exec_index), kind, index))
        if row is None:
            if int(exec_index) not in self.op_rows["exec_index"]:
                raise NotFoundError(f"step {self.step}: no op with execution index {exec_index} recorded")
            raise NotFoundError(f"step {self.step}: op {exec_index} has no tensor {slot}")
        op, dtype, has_data, ndim, shape, pack, offset = (column[row] for column in self._columns)
        shape = tuple(self._long_shapes.get(row) or shape[:ndim])
        return TensorLocation(op, dtype.decode(), bool(has_data), math.prod(shape), shape, pack, offset)

    def slot_row(self, exec_index: int, slot: str) -> int:
        """The index row of a recorded tensor (as `tensor_location` finds it)."""
        if self._slots is None:
            self._slots = self._slot_rows()
        return self._slots[(int(exec_index), *layout.parse_slot(slot))]

    def group_name(self, location: TensorLocation) -> str:
        """The name of the ``ops/`` group holding a tensor that is not packed."""
        row = self.op_rows[location.op]
        return layout.op_group_name(int(row["exec_index"]), row["name"].decode("utf-8"))

    def _slot_rows(self) -> dict[tuple[int, int, int], int]:
        """(exec_index, kind, slot) -> index row for every tensor of the step; the columns a location needs
        become lists (one pass over the table, not a numpy scalar per field per lookup)."""
        rows = self.tensor_rows
        packed = "pack" in rows.dtype.names
        self._columns = [rows[name].tolist() for name in ("op", "dtype", "has_data", "ndim", "shape")] + (
            [rows["pack"].tolist(), rows["offset"].tolist()] if packed
            else [[layout.NOT_PACKED] * rows.size, [0] * rows.size])
        if not rows.size:
            return {}
        executions = self.op_rows["exec_index"][rows["op"]].tolist()
        keys = zip(executions, rows["kind"].tolist(), rows["slot"].tolist())
        return {key: row for row, key in enumerate(keys)}

    def _tensors(self, first: int = 0, count: int | None = None) -> list[TensorRecord]:
        """The tensor records of index rows ``first`` to ``first + count`` (all by default).

        This is the reader's inner loop (one iteration per tensor of a dump): names and dtypes are
        decoded once per distinct value, a row's statistics are one slice of its tuple.
        """
        rows = self.tensor_rows if count is None else self.tensor_rows[first:first + count]
        long_shapes, slots, dtypes = self._long_shapes, {}, {}
        result = []
        append = result.append
        # column by column: a structured row's tolist() is several times slower, and hands the shape as an array
        columns = [rows[name].tolist() for name in ("kind", "slot", "dtype", "has_data", "ndim", "shape")]
        stats = zip(*(rows[name].tolist() for name in layout.STATS_FIELDS))
        for row, kind, index, dtype, has_data, ndim, shape, values in zip(range(first, first + len(rows)), *columns,
                                                                          stats):
            slot = slots.get((kind, index))
            if slot is None:
                slot = slots[(kind, index)] = layout.slot_name(kind, index)
            name = dtypes.get(dtype)
            if name is None:
                name = dtypes[dtype] = self._dtype_name(dtype, row)
            full_shape = long_shapes.get(row) or tuple(shape[:ndim]) if long_shapes else tuple(shape[:ndim])
            append(TensorRecord(slot, name, full_shape, TensorStats(*values), has_data != 0, row))
        return result

    def _dtype_name(self, dtype: bytes, row: int) -> str:
        try:
            return dtype.decode("ascii")
        except UnicodeDecodeError:
            raise DamagedDump(self._where(layout.INDEX), f"row {row}: its dtype is not text") from None

    def _record(self, row: tuple, tensors: list[TensorRecord], base: int) -> OpRecord:
        """The op of ``op_index`` row ``row``; ``tensors`` holds index rows from ``base`` on."""
        try:
            return self._build_record(row, tensors, base)
        except DamagedDump:
            raise
        except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:  # undecodable text, bad fusion
            raise DamagedDump(self._where(layout.OP_INDEX), f"op {row[0]}: a malformed row ({exc})") from None

    def _where(self, table: str) -> str:
        return f"/{layout.STEPS}/{layout.step_name(self.step)}/{table}"

    def _build_record(self, row: tuple, tensors: list[TensorRecord], base: int) -> OpRecord:
        (exec_index, direction, overflow, inherited, _, first, count, name, op_type, compute, fusion, attrs) = row
        start = first - base
        own = tuple(tensors[start:start + count])
        if len(own) != count or start < 0:
            raise IndexError(f"tensors {first}-{first + count} are outside the rows read")
        if not fusion:  # most ops: no fusion fields to decode
            return OpRecord(self.step, exec_index, name.decode("utf-8"), self._text(op_type),
                            DIRECTIONS[direction], self._text(compute), overflow != 0, own,
                            inherited_nonfinite=inherited != 0,
                            attrs=self._json(attrs, exec_index, "attrs") if attrs else {})
        fused = self._json(fusion, exec_index, "fusion")
        return OpRecord(
            step=self.step, exec_index=exec_index, name=name.decode("utf-8"), type=op_type.decode("utf-8"),
            direction=DIRECTIONS[direction], compute_dtype=compute.decode(), overflow=overflow != 0,
            tensors=own,
            pass_name=fused.get("pass_name", ""),
            original_names=tuple(fused.get("original_names", ())),
            original_types=tuple(fused.get("original_types", ())),
            output_origins=tuple((n, int(i)) for n, i in fused.get("output_origins", ())),
            input_origins=tuple((n, int(i)) for n, i in fused.get("input_origins", ())),
            inherited_nonfinite=inherited != 0,
            attrs=self._json(attrs, exec_index, "attrs"),
        )

    def _text(self, value: bytes) -> str:
        """A column with few distinct values (op types, compute dtypes), decoded once per value."""
        text = self._texts.get(value)
        if text is None:
            text = self._texts[value] = value.decode("utf-8")
        return text

    def _json(self, text: bytes, exec_index: int, column: str) -> dict:
        """A JSON column of op_index (empty: {}); `DamagedDump` when it is not a JSON object."""
        if not text:
            return {}
        try:
            value = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            value = None
        if not isinstance(value, dict):
            raise DamagedDump(self._where(layout.OP_INDEX), f"op {exec_index}: its {column} column is not a JSON object")
        return value


class DamagedDump(ValueError):
    """A dump's table or attribute is not what the writer writes; ``where`` is its HDF5 path."""

    def __init__(self, where: str, problem: str):
        self.where, self.problem = where, problem
        super().__init__(f"{where}: {problem}")


# field name -> numpy kinds it may have ("u" unsigned, "i" signed int, "S" bytes), for op_index and index
_OP_FIELDS = {"exec_index": "u", "direction": "u", "overflow": "u", "inherited_nonfinite": "u", "has_group": "u",
              "first_tensor": "u", "n_tensors": "u", "name": "S", "type": "S", "compute_dtype": "S",
              "fusion": "S", "attrs": "S"}
_TENSOR_FIELDS_V1 = {"op": "u", "kind": "u", "slot": "u", "dtype": "S", "has_data": "u", "ndim": "u", "shape": "i",
                     **{name: layout.STATS_DTYPE[name].kind for name in layout.STATS_FIELDS}}
_TENSOR_FIELDS = {**_TENSOR_FIELDS_V1, "pack": "i", "offset": "u"}


def _table(group, name: str, where: str, fields: dict) -> np.ndarray:
    """A whole index table, after checking it is a 1-D table with the writer's columns in order."""
    import h5py

    dataset = member(group, name, DamagedDump)
    path = f"{where}/{name}"
    if not isinstance(dataset, h5py.Dataset):
        raise DamagedDump(path, "not a table (an HDF5 group)")
    names = dataset.dtype.names
    if names != tuple(fields) or any(dataset.dtype[f].base.kind != kind for f, kind in fields.items()):
        found = "columns " + ", ".join(names) if names else f"plain {dataset.dtype} values"
        raise DamagedDump(path, f"wrong type: {found} instead of the writer's {len(fields)} columns "
                                f"({', '.join(list(fields)[:3])}, ...)")
    if len(dataset.shape) != 1:
        raise DamagedDump(path, f"a table of shape {dataset.shape}; expected one row per entry (1-D)")
    if name == layout.INDEX and dataset.dtype["shape"].shape != (layout.MAX_RANK,):
        raise DamagedDump(path, f"its shape column holds {dataset.dtype['shape'].shape} values, "
                                f"not {layout.MAX_RANK}")
    if dataset.shape[0] == 0:
        raise DamagedDump(path, "empty (a step that recorded no op has no index tables)")
    return dataset[()]


def check_tables(op_rows: np.ndarray, tensor_rows: np.ndarray, where: str, long_shapes: dict) -> None:
    """Every reference the reader follows stays inside the tables: vectorised, a few microseconds."""
    ops, index = f"{where}/{layout.OP_INDEX}", f"{where}/{layout.INDEX}"
    end = op_rows["first_tensor"].astype(np.uint64) + op_rows["n_tensors"]
    _at_most(ops, "first_tensor + n_tensors", end, tensor_rows.shape[0], op_rows,
             f"past the end of {layout.INDEX} ({tensor_rows.shape[0]} rows)")
    _at_most(ops, "direction", op_rows["direction"], len(DIRECTIONS) - 1, op_rows, "not a direction")
    executions = op_rows["exec_index"]
    if np.unique(executions).size != executions.size:  # tensors are found by execution index
        seen, repeated = set(), None
        for value in executions.tolist():
            if value in seen:
                repeated = value
                break
            seen.add(value)
        raise DamagedDump(ops, f"execution index {repeated} appears twice")
    _at_most(index, "op", tensor_rows["op"], op_rows.shape[0] - 1, None,
             f"past the end of {layout.OP_INDEX} ({op_rows.shape[0]} rows)")
    _at_most(index, "kind", tensor_rows["kind"], len(layout.KINDS) - 1, None, "neither input (0) nor output (1)")
    if "pack" in tensor_rows.dtype.names:
        below = np.flatnonzero(tensor_rows["pack"] < layout.NOT_PACKED)
        if below.size:
            raise DamagedDump(index, f"row {int(below[0])}: pack is {int(tensor_rows['pack'][below[0]])}, "
                                     f"not a pack number or {layout.NOT_PACKED}")
    ndim = tensor_rows["ndim"].copy()
    ndim[[row for row in long_shapes if 0 <= row < ndim.size]] = 0  # shapes of higher rank are in long_shapes
    _at_most(index, "ndim", ndim, layout.MAX_RANK, None, f"more than {layout.MAX_RANK}, and no long_shapes entry")
    used = np.arange(layout.MAX_RANK) < ndim[:, None]  # the dims a row's shape has
    negative = np.flatnonzero((used & (tensor_rows["shape"] < 0)).any(axis=1))
    if negative.size:
        row = int(negative[0])
        raise DamagedDump(index, f"row {row}: a negative dimension in its shape "
                                 f"{tuple(tensor_rows['shape'][row][:ndim[row]].tolist())}")
    check_rows(op_rows, tensor_rows, ops, index)
    check_contents(tensor_rows, index, used, long_shapes)


def check_rows(op_rows: np.ndarray, tensor_rows: np.ndarray, ops: str, index: str) -> None:
    """Ops in execution order, each owning the next ``n_tensors`` rows of ``index`` and no slot twice."""
    executions = op_rows["exec_index"].astype(np.int64)
    unordered = np.flatnonzero(np.diff(executions) <= 0)
    if unordered.size:
        row = int(unordered[0]) + 1
        raise DamagedDump(ops, f"row {row}: execution index {int(executions[row])} after "
                               f"{int(executions[row - 1])}; rows must be in execution order")
    counts = op_rows["n_tensors"].astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    moved = np.flatnonzero(op_rows["first_tensor"] != starts)
    if moved.size:
        row = int(moved[0])
        raise DamagedDump(ops, f"op {int(executions[row])}: first_tensor is {int(op_rows['first_tensor'][row])}, "
                               f"but the ops before it own {int(starts[row])} rows of {layout.INDEX}")
    owners = np.repeat(np.arange(op_rows.shape[0]), counts)
    if owners.size != tensor_rows.shape[0]:
        raise DamagedDump(ops, f"its ops own {owners.size} rows of {layout.INDEX}, which has {tensor_rows.shape[0]}")
    strays = np.flatnonzero(tensor_rows["op"] != owners)
    if strays.size:
        row = int(strays[0])
        raise DamagedDump(index, f"row {row}: op is {int(tensor_rows['op'][row])}, but {layout.OP_INDEX} row "
                                 f"{int(owners[row])} owns it (first_tensor, n_tensors)")
    keys = owners * (1 << 17) + tensor_rows["kind"].astype(np.int64) * (1 << 16) + tensor_rows["slot"]
    if np.unique(keys).size != keys.size:
        _, first = np.unique(keys, return_index=True)
        row = int(np.setdiff1d(np.arange(keys.size), first)[0])
        raise DamagedDump(index, f"row {row}: op {int(executions[owners[row]])} has "
                                 f"{layout.slot_name(int(tensor_rows['kind'][row]), int(tensor_rows['slot'][row]))} "
                                 "twice")


def check_contents(tensor_rows: np.ndarray, index: str, used: np.ndarray, long_shapes: dict) -> None:
    """dtypes numpy reads, statistics counting as many values as the shape holds, finite where they must be."""
    for name in np.unique(tensor_rows["dtype"][tensor_rows["has_data"] != 0]).tolist():
        if not readable_dtype(name):
            row = int(np.flatnonzero(tensor_rows["dtype"] == name)[0])
            raise DamagedDump(index, f"row {row}: a tensor with data of dtype "
                                     f"{name.decode('ascii', 'replace')!r}, not a number format")
    dims = np.where(used, tensor_rows["shape"], 1).astype(np.float64)  # exact below 2**53 values
    sizes = dims.prod(axis=1)
    for row, shape in long_shapes.items():
        if 0 <= row < sizes.size:
            sizes[row] = float(math.prod(shape))
    counts = tensor_rows["count"]
    # a count of 0 with a non-empty shape: statistics not taken (complex or sparse tensors)
    wrong = np.flatnonzero((sizes != counts.astype(np.float64)) & (counts != 0) | (sizes > 2.0 ** 53))
    if wrong.size:
        row = int(wrong[0])
        raise DamagedDump(index, f"row {row}: its statistics count {int(counts[row])} values, but its shape "
                                 f"holds {sizes[row]:.0f}")
    nonfinite = tensor_rows["nan"].astype(np.float64) + tensor_rows["inf"]
    finite = (counts != 0) & (nonfinite == 0)
    summary = np.stack([tensor_rows[f] for f in ("min", "max", "mean", "std", "norm")], 1)
    bad = (nonfinite > counts) | finite & ~np.isfinite(summary).all(axis=1)
    bad |= finite & (tensor_rows["min"] > tensor_rows["max"])
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        values = ", ".join(f"{f} {tensor_rows[f][row]:g}" for f in layout.STATS_FIELDS)
        raise DamagedDump(index, f"row {row}: inconsistent statistics ({values})")


def readable_dtype(name: bytes) -> bool:
    """Whether index dtype ``name`` is one the reader turns into numbers (a float format, an integer, bool)."""
    try:
        text = name.decode("ascii")
        return text == "bfloat16" or np.dtype(text).kind in "biuf" and np.dtype(text).name == text
    except (UnicodeDecodeError, TypeError, ValueError):
        return False


def _at_most(path: str, column: str, values: np.ndarray, limit: int, op_rows, why: str) -> None:
    """`DamagedDump` naming the first row whose ``column`` is above ``limit``."""
    bad = np.flatnonzero(values > limit)
    if bad.size:
        row = int(bad[0])
        which = f"op {int(op_rows['exec_index'][row])}" if op_rows is not None else f"row {row}"
        raise DamagedDump(path, f"{which}: {column} is {int(values[row])}, {why}")


def _long_shapes(text, where: str) -> dict:
    """The step's ``long_shapes`` attribute (JSON: index row -> shape of more than MAX_RANK dims)."""
    if text is None or len(text) == 0:
        return {}
    try:
        value = json.loads(text)
        shapes = {int(k): tuple(_dimension(d) for d in v) for k, v in value.items()}
    except (TypeError, ValueError, AttributeError, OverflowError):
        raise DamagedDump(f"{where}", "its long_shapes attribute is not a JSON map of row to shape") from None
    return shapes


def _dimension(value) -> int:
    """One dimension of a long shape: a whole number >= 0 (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a dimension")
    return value
