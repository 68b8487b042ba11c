"""A float16 model's attention mask is finfo(float16).min, -65504; golden's float32 model's is finfo(float32).min.
Cast up to float32 before a softmax, the target's mask value sits in a float32 tensor where golden's is 5e33
times larger: the same mask, in each run's own format, which no error measure should count."""

from __future__ import annotations

from dataclasses import replace

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


def test_a_tensor_that_broadcasts_to_golden_s_shape_is_compared_broadcast():
    """Position ids given as (batch, length) where golden's model made (1, length): the same rows, repeated."""
    from precision_tool.analysis.departures import _differing

    golden = np.arange(10, dtype=np.int64)[None, :]
    target = np.repeat(golden, 3, axis=0)
    assert _differing(target, golden) == (0, 30)
    target[1, 4] = 7
    assert _differing(target, golden) == (1, 30)
    rows = np.array([[1.0, 2.0, 2.0]], dtype=np.float32)
    assert split_error(np.repeat(rows, 2, axis=0), rows, "float32").error == 0.0
    assert split_error(np.array([[1.0, 2.0, 2.0], [1.0, 2.0, 5.0]], np.float32), rows, "float32").error == \
        pytest.approx(3.0 / np.sqrt(18.0), rel=1e-6)
    assert split_error(np.ones((2, 4), np.float32), rows, "float32").error == np.inf  # (no broadcast: a mismatch)


def test_only_leading_dimensions_broadcast():
    """Top-1 routing weights (tokens, 1) against golden's top-2 (tokens, 2) are other values, not repeated ones."""
    golden = np.array([[0.6, 0.4], [0.7, 0.3]], dtype=np.float32)
    assert split_error(np.array([[1.0], [1.0]], np.float32), golden, "float32").error == np.inf


def test_a_gradient_of_copies_is_compared_with_golden_s_summed_gradient():
    """Backward, golden's (1, 3) gradient is the sum of the target's (2, 3) copies' gradients."""
    copies = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], np.float32)
    summed = np.array([[4.0, 4.0, 4.0]], np.float32)
    assert split_error(copies, summed, "float32", summed=True).error == 0.0
    assert split_error(copies, summed, "float32").error == pytest.approx(np.sqrt(28.0 / 96.0))  # (as repeated)
    assert split_error(summed * 1.5, summed, "float32", summed=True).error == pytest.approx(0.5)  # (same shape)


def test_statistics_of_copies_scale_the_count_and_the_norm():
    from precision_tool.analysis.errors import repeated_stats, stats_split
    from precision_tool.dump.records import TensorStats

    row = TensorStats(3, 1.0, 3.0, 2.0, 0.816496580927726, 3.7416573867739413, nan=0, inf=1, saturated=1)
    rows = TensorStats(12, 1.0, 3.0, 2.0, 0.816496580927726, 7.483314773547883, nan=0, inf=4, saturated=4)
    ours, theirs = repeated_stats((4, 3), rows, (1, 3), row)
    assert ours is rows and (theirs.count, theirs.inf, theirs.saturated, theirs.norm) == (12, 4, 4, 7.483314773547883)
    assert repeated_stats((1, 3), row, (4, 3), rows)[0].count == 12
    assert repeated_stats((4, 3), rows, (3, 4), row) == (rows, row)  # (not copies along leading axes)
    finite = TensorStats(3, 1.0, 3.0, 2.0, 0.816496580927726, 3.7416573867739413)
    assert stats_split(*repeated_stats((2, 3), replace(finite, count=6, norm=finite.norm * 2 ** 0.5), (1, 3),
                                       finite), "float32").error < 1e-15
