"""A float16 model's attention mask is finfo(float16).min, -65504; golden's float32 model's is finfo(float32).min.
Cast up to float32 before a softmax, the target's mask value sits in a float32 tensor where golden's is 5e33
times larger: the same mask, in each run's own format, which no error measure should count."""

from __future__ import annotations

import numpy as np
import pytest

from precision_tool.analysis.errors import split_error

LOWEST32 = float(np.finfo(np.float32).min)


def test_a_float16_extreme_cast_up_where_golden_holds_a_larger_one_is_shared():
    golden = np.array([1.0, 2.0, LOWEST32, 4.0], dtype=np.float32)
    target = np.array([1.0, 2.0, -65504.0, 4.0 * (1 + 2 ** -10)], dtype=np.float32)
    split = split_error(target, golden, "float32")
    assert split.shared == 1 and split.overflowed == 0 and split.size == 4
    assert split.error == pytest.approx(4.0 * 2 ** -10 / np.sqrt(1 + 4 + 16), rel=1e-6)


@pytest.mark.parametrize("target_value", [65504.0, -60000.0, -3.0e38])
def test_anything_else_is_an_error(target_value):
    golden = np.array([1.0, LOWEST32], dtype=np.float32)
    target = np.array([1.0, target_value], dtype=np.float32)
    split = split_error(target, golden, "float32")
    assert split.shared == 0 and split.error == pytest.approx(abs(target_value - LOWEST32) / abs(LOWEST32), rel=1e-6)


def test_a_float16_target_at_its_limit_is_an_overflow_as_before():
    golden = np.array([1.0, -70000.0], dtype=np.float32)
    target = np.array([1.0, -65504.0], dtype=np.float16)
    split = split_error(target, golden, "float16")
    assert (split.overflowed, split.shared, split.error) == (1, 0, 0.0)
