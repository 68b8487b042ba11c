"""One step's index tables turned into `OpRecord`s, without walking the op groups."""

from __future__ import annotations

import json

import numpy as np

from precision_tool.dump import layout
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats
from precision_tool.engine.hooks import DIRECTIONS


class StepIndex:
    """The ``op_index`` and ``index`` tables of one step, and the records built from them."""

    def __init__(self, step: int, op_rows: np.ndarray, tensor_rows: np.ndarray, long_shapes: dict):
        self.step = step
        self.op_rows = op_rows
        self.tensor_rows = tensor_rows
        self._long_shapes = long_shapes
        self._records: list[OpRecord] | None = None
        self._by_exec: dict[int, int] | None = None

    @classmethod
    def read(cls, step: int, group) -> "StepIndex":
        """Read the tables of a step group (an h5py Group)."""
        long_shapes = group.attrs.get("long_shapes")
        long_shapes = {int(k): tuple(v) for k, v in json.loads(long_shapes).items()} if long_shapes else {}
        if layout.OP_INDEX not in group:  # the step recorded no op
            return cls(step, np.zeros(0, layout.op_row_dtype((1, 1, 1, 1))), np.zeros(0, layout.tensor_row_dtype()), {})
        return cls(step, group[layout.OP_INDEX][()], group[layout.INDEX][()], long_shapes)

    @property
    def overflow_rows(self) -> np.ndarray:
        """Positions of the recorded ops that raised the float status."""
        return np.flatnonzero(self.op_rows["overflow"]) if self.op_rows.size else np.zeros(0, int)

    def records(self) -> list[OpRecord]:
        """Every recorded op of the step, in execution order."""
        if self._records is None:
            tensors = self._tensors()
            self._records = [self._record(row, tensors) for row in self.op_rows.tolist()]
        return self._records

    def record_at(self, position: int) -> OpRecord:
        """The op in row ``position`` of ``op_index``."""
        if self._records is not None:
            return self._records[position]
        row = self.op_rows[position].tolist()
        first, count = row[5], row[6]
        return self._record(row, {i: t for i, t in zip(range(first, first + count), self._tensors(first, count))})

    def tensor_location(self, exec_index: int, slot: str) -> tuple[str, str, bool]:
        """(op group name, dtype, has_data) of a tensor; KeyError when not recorded."""
        if self._by_exec is None:
            self._by_exec = {int(e): i for i, e in enumerate(self.op_rows["exec_index"])} if self.op_rows.size else {}
        position = self._by_exec.get(int(exec_index))
        if position is None:
            raise KeyError(f"step {self.step}: no op with execution index {exec_index} recorded")
        row = self.op_rows[position]
        kind, index = layout.parse_slot(slot)
        first, count = int(row["first_tensor"]), int(row["n_tensors"])
        for t in self.tensor_rows[first:first + count]:
            if t["kind"] == kind and t["slot"] == index:
                name = row["name"].decode("utf-8")
                return layout.op_group_name(int(exec_index), name), t["dtype"].decode(), bool(t["has_data"])
        raise KeyError(f"step {self.step}: op {exec_index} has no tensor {slot}")

    def _tensors(self, first: int = 0, count: int | None = None) -> list[TensorRecord]:
        rows = self.tensor_rows if count is None else self.tensor_rows[first:first + count]
        result = []
        for offset, t in enumerate(rows.tolist()):
            (_, kind, index, dtype, has_data, ndim, shape, n, lo, hi, mean, std, norm, nan, inf, sat) = t
            row = first + offset
            full_shape = self._long_shapes.get(row) or tuple(int(d) for d in shape[:ndim])
            result.append(TensorRecord(layout.slot_name(kind, index), dtype.decode(), full_shape,
                                       TensorStats(n, lo, hi, mean, std, norm, nan, inf, sat), bool(has_data)))
        return result

    def _record(self, row: tuple, tensors) -> OpRecord:
        (exec_index, direction, overflow, inherited, _, first, count, name, op_type, compute, fusion, attrs) = row
        fused = json.loads(fusion.decode("utf-8")) if fusion else {}
        return OpRecord(
            step=self.step, exec_index=exec_index, name=name.decode("utf-8"), type=op_type.decode("utf-8"),
            direction=DIRECTIONS[direction], compute_dtype=compute.decode(), overflow=bool(overflow),
            tensors=tuple(tensors[i] for i in range(first, first + count)),
            pass_name=fused.get("pass_name", ""),
            original_names=tuple(fused.get("original_names", ())),
            original_types=tuple(fused.get("original_types", ())),
            output_origins=tuple((n, int(i)) for n, i in fused.get("output_origins", ())),
            input_origins=tuple((n, int(i)) for n, i in fused.get("input_origins", ())),
            inherited_nonfinite=bool(inherited),
            attrs=json.loads(attrs.decode("utf-8")) if attrs else {},
        )
