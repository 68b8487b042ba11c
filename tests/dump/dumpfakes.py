"""Synthetic dumps written through DumpWriter, with no session involved (shared by tests/dump and tests/cli)."""

from __future__ import annotations

import numpy as np
from precision_tool.dump.layout import PACK_LIMIT
from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.dump.writer import DumpWriter


def exact(values, dtype: str) -> np.ndarray:
    """float32 values exactly representable in ``dtype``."""
    import ml_dtypes

    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return values.astype(ml_dtypes.bfloat16).astype(np.float32)
    if dtype == "float64":
        return values.astype(np.float64)
    return values


def op(step, exec_index, name, arrays: dict, dtypes: dict, direction="forward", overflow=False, **fields):
    """An OpRecord whose tensors are ``arrays`` (slot -> array) with stats computed."""
    tensors = tuple(TensorRecord(slot, dtypes[slot], np.shape(a), tensor_stats(a, dtypes[slot]))
                    for slot, a in arrays.items())
    return OpRecord(step, exec_index, name, fields.pop("type", name.rsplit("/", 1)[-1]), direction,
                    fields.pop("compute_dtype", "float16"), overflow, tensors, **fields)


def write_synthetic(path, steps: int = 3, complete: bool = True, metadata=None, pack_limit: int = PACK_LIMIT,
                    stats_match_data: bool = True):
    """A small dump: per step a float16 MatMul, a fused bfloat16 op and a stats-only backward op
    (``stats_match_data=False``: without the mark, as written before it)."""
    rng = np.random.default_rng(0)
    arrays_by_step = {}
    writer = DumpWriter(path, {"model": "synthetic", "role": "target", "mode": "dump", "seed": 7,
                               "device": {"device": "npu", "origin_dtype": "float32"},
                               "overflow_mode": "saturation", **(metadata or {})}, pack_limit=pack_limit,
                        stats_match_data=stats_match_data)
    for step in range(steps):
        writer.begin_step(step)
        x = exact(rng.standard_normal((4, 8)), "float16")
        w = exact(rng.standard_normal((8, 3)), "float32")
        y = exact(x @ w, "float16")
        z = exact(rng.standard_normal((2, 3, 5)) * 100, "bfloat16")
        labels = np.arange(4, dtype=np.int64)
        arrays = {"input_0": x, "input_1": w, "output_0": y}
        writer.write_op(op(step, 0, "block/MatMul", arrays,
                           {"input_0": "float16", "input_1": "float32", "output_0": "float16"},
                           attrs={"transpose_b": False, "axes": (0, 1)}), arrays)
        fused = {"input_0": z, "input_1": labels, "output_0": z}
        writer.write_op(op(step, 1, "block/FusedThing", fused,
                           {"input_0": "bfloat16", "input_1": "int64", "output_0": "bfloat16"},
                           type="FusedThing", compute_dtype="bfloat16", overflow=step == 1,
                           pass_name="ThingFusionPass", original_names=("block/A", "block/B"),
                           original_types=("A", "B"), output_origins=(("block/B", 0),),
                           input_origins=(("block/A", 0), ("block/A", 1))), fused)
        writer.write_op(op(step, 2, "block/MatMul", {"input_0": y, "output_0": x},
                           {"input_0": "float16", "output_0": "float16"}, direction="backward"), None)
        writer.end_step(StepRecord(step, 2.0 - step / 10, 1024.0 * 2 ** step, step == 1, step == 1,
                                   "allow_fp32_to_fp16"), {"overflow_ops": int(step == 1)})
        arrays_by_step[step] = {"x": x, "w": w, "y": y, "z": z, "labels": labels}
    writer.close(complete=complete)
    return arrays_by_step
