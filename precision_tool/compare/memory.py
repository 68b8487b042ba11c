"""An in-memory dump with the reader's interface: compare arrays captured without a file."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from precision_tool.dump.records import OpRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats


class MemoryDump:
    """Op records and their arrays, held in memory; ``add`` appends one op execution."""

    def __init__(self, path: str = "<memory>", mode: str = "dump", role: str = ""):
        self.path, self.mode, self.role = path, mode, role
        self.metadata: dict = {"mode": mode, "role": role}
        self._records: list[OpRecord] = []
        self._arrays: dict[tuple[int, int, str], np.ndarray] = {}
        self._next_index: dict[int, int] = {}

    def add(self, name: str, op_type: str, arrays: dict[str, np.ndarray | None], *, step: int = 0,
            direction: str = "forward", dtypes: dict[str, str] | None = None, stats_only: bool = False,
            **fields) -> OpRecord:
        """Record one op run; ``arrays`` maps slots (``output_0``) to values, ``fields`` are OpRecord fields."""
        exec_index = self._next_index.get(step, 0)
        self._next_index[step] = exec_index + 1
        tensors = []
        for slot, values in arrays.items():
            values = np.asarray(values)
            dtype = (dtypes or {}).get(slot, "float32" if values.dtype.kind == "f" else str(values.dtype))
            stats = tensor_stats(values, dtype)
            tensors.append(TensorRecord(slot, dtype, tuple(values.shape), stats, has_data=not stats_only))
            if not stats_only:
                self._arrays[(step, exec_index, slot)] = values
        fields.setdefault("compute_dtype", "float32")
        fields.setdefault("overflow", False)
        record = OpRecord(step=step, exec_index=exec_index, name=name, type=op_type, direction=direction,
                          tensors=tuple(tensors), **fields)
        self._records.append(record)
        return record

    def ops(self, step: int | None = None, direction: str | None = None) -> list[OpRecord]:
        records = [r for r in self._records
                   if (step is None or r.step == step) and (direction is None or r.direction == direction)]
        return sorted(records, key=lambda r: (r.step, r.exec_index))

    def tensor(self, step: int, exec_index: int, slot: str) -> np.ndarray:
        return self._arrays[(step, exec_index, slot)]

    def tensor_chunks(self, step: int, exec_index: int, slot: str, max_elements: int) -> Iterator[np.ndarray]:
        flat = np.ravel(self.tensor(step, exec_index, slot))
        for start in range(0, flat.size, max_elements):
            yield flat[start:start + max_elements]

    def save(self, path, metadata: dict | None = None) -> str:
        """Write these records and arrays as a dump file with `DumpWriter`; return the path."""
        from precision_tool.dump.records import StepRecord
        from precision_tool.dump.writer import DumpWriter

        writer = DumpWriter(path, {"mode": self.mode, "role": self.role, **(metadata or {})})
        try:
            for step in sorted({r.step for r in self._records}):
                writer.begin_step(step)
                records = self.ops(step)
                for record in records:
                    arrays = {t.slot: self._arrays.get((step, record.exec_index, t.slot)) for t in record.tensors}
                    writer.write_op(record, arrays)
                writer.end_step(StepRecord(step, float("nan"), 1.0, False, ops_recorded=len(records)))
        finally:
            writer.close(complete=True)
        return str(path)
