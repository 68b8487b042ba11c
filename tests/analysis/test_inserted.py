"""`inserted._constant_factor`: an op's output as its input times a constant, from statistics alone."""

from __future__ import annotations

import numpy as np

from precision_tool.analysis.inserted import _constant_factor
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats


def _stats(values: np.ndarray) -> TensorStats:
    v = values.astype(np.float64)
    return TensorStats(v.size, float(v.min()), float(v.max()), float(v.mean()), float(v.std()),
                       float(np.linalg.norm(v)))


def _mul(inputs: list[np.ndarray], output: np.ndarray, dtype: str = "float32") -> OpRecord:
    tensors = [TensorRecord(f"input_{i}", dtype, x.shape, _stats(x), has_data=False) for i, x in enumerate(inputs)]
    tensors.append(TensorRecord("output_0", dtype, output.shape, _stats(output), has_data=False))
    return OpRecord(0, 0, "act/aten.mul_0", "aten.mul", "backward", dtype, False, tuple(tensors))


def test_a_scale_by_a_constant_is_read_off_the_statistics():
    x = np.random.default_rng(0).standard_normal(512).astype(np.float32)
    assert abs(_constant_factor(_mul([x], x * np.float32(1.05))) - 1.05) < 1e-6
    assert abs(_constant_factor(_mul([x], x * np.float32(-0.5))) + 0.5) < 1e-6


def test_a_scale_rounded_to_bfloat16_is_one_too():
    import ml_dtypes

    x = np.random.default_rng(1).standard_normal(512).astype(ml_dtypes.bfloat16)
    y = (x.astype(np.float32) * 1.05).astype(ml_dtypes.bfloat16)
    assert abs(_constant_factor(_mul([x.astype(np.float32)], y.astype(np.float32), "bfloat16")) - 1.05) < 0.01


def test_a_mask_or_another_function_is_no_constant_scale():
    x = np.random.default_rng(2).standard_normal(512).astype(np.float32)
    mask = (x > 0).astype(np.float32)
    assert _constant_factor(_mul([x, mask], x * mask)) is None  # (a second full-size tensor: a mask)
    assert _constant_factor(_mul([x], np.maximum(x, 0) * 1.05)) is None  # (a ReLU's: not every statistic scales)
    assert _constant_factor(_mul([x], x * 1.05 + 0.01)) is None  # (an offset too)
