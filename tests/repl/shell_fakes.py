"""An in-memory stand-in for an open dump, with the reader's interface, for fast shell tests."""

from __future__ import annotations

import numpy as np

from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats


class FakeDump:
    """ops(), op(), tensor(), steps() over records and arrays held in memory."""

    def __init__(self, path: str, role: str, mode: str = "dump"):
        self.path, self.role, self.mode = path, role, mode
        self.metadata = {"role": role, "mode": mode}
        self._ops: list[OpRecord] = []
        self._arrays: dict[tuple[int, int, str], np.ndarray] = {}
        self.closed = False

    def add(self, step: int, name: str, type_: str, tensors: dict[str, np.ndarray], direction: str = "forward",
            dtype: str = "float32", overflow: bool = False, keep_data: bool = True, **extra) -> OpRecord:
        exec_index = sum(1 for op in self._ops if op.step == step)
        records = []
        for slot, array in tensors.items():
            array = np.asarray(array, dtype=np.float32)
            records.append(TensorRecord(slot, dtype, tuple(array.shape), tensor_stats(array, dtype), keep_data))
            if keep_data:
                self._arrays[(step, exec_index, slot)] = array
        record = OpRecord(step, exec_index, name, type_, direction, dtype, overflow, tuple(records), **extra)
        self._ops.append(record)
        return record

    def ops(self, step=None, direction=None):
        return [op for op in self._ops if (step is None or op.step == step)
                and (direction is None or op.direction == direction)]

    def op(self, step, name, direction="forward"):
        for op in self._ops:
            if (op.step, op.name, op.direction) == (step, name, direction):
                return op
        raise KeyError(f"{name} at step {step} ({direction})")

    def tensor(self, step, exec_index, slot):
        return self._arrays[(step, exec_index, slot)]

    def tensor_chunks(self, step, exec_index, slot, max_elements):
        flat = self.tensor(step, exec_index, slot).ravel()
        for start in range(0, flat.size, max_elements):
            yield flat[start:start + max_elements]

    def steps(self):
        return [StepRecord(s, 1.0, 1024.0, False) for s in sorted({op.step for op in self._ops})]

    def close(self):
        self.closed = True


def sample_dumps() -> dict[str, FakeDump]:
    """A golden and a target run of a tiny net: fc2 drifts, the target fuses fc1+act."""
    rng = np.random.default_rng(0)
    golden, target = FakeDump("/data/golden.h5", "golden"), FakeDump("/data/target.h5", "target")
    for step in (0, 1):
        x = rng.standard_normal((4, 8)).astype(np.float32)
        w1 = rng.standard_normal((8, 8)).astype(np.float32)
        h = x @ w1
        a = np.maximum(h, 0)
        w2 = rng.standard_normal((8, 3)).astype(np.float32)
        y = a @ w2
        golden.add(step, "fc1/MatMul", "MatMul", {"input_0": x, "input_1": w1, "output_0": h})
        golden.add(step, "act/Relu", "Relu", {"input_0": h, "output_0": a})
        golden.add(step, "fc2/MatMul", "MatMul", {"input_0": a, "input_1": w2, "output_0": y})
        golden.add(step, "fc2/MatMul", "MatMul", {"input_0": np.ones_like(y), "output_0": np.ones_like(a)},
                   direction="backward")
        target.add(step, "fused/MatMulRelu", "FusedMatMulRelu", {"input_0": x, "input_1": w1, "output_0": a},
                   dtype="float16", pass_name="MatMulReluFusionPass", original_names=("fc1/MatMul", "act/Relu"),
                   original_types=("MatMul", "Relu"), output_origins=(("act/Relu", 0),),
                   input_origins=(("fc1/MatMul", 0), ("fc1/MatMul", 1)))
        bad = y.copy()
        bad[0, 0] += 10.0
        target.add(step, "fc2/MatMul", "MatMul", {"input_0": a, "input_1": w2, "output_0": bad}, dtype="float16")
        target.add(step, "fc2/MatMul", "MatMul", {"input_0": np.ones_like(y), "output_0": np.ones_like(a)},
                   direction="backward", dtype="float16")
    return {"golden": golden, "target": target}
