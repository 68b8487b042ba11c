"""`errors.stats_split`: a tensor pair's relative error bounded from below by their statistics alone."""

import math

import numpy as np
import pytest

from precision_tool.analysis.errors import stats_split
from precision_tool.dump.records import TensorStats


def stats(values, inf=0, nan=0, saturated=0) -> TensorStats:
    x = np.asarray(values, dtype=np.float64)
    return TensorStats(x.size + inf + nan, float(x.min()), float(x.max()), float(x.mean()), float(x.std()),
                       float(np.linalg.norm(x)), nan, inf, saturated)


GOLDEN = np.array([1.0, -2.0, 3.0, -4.0])  # norm sqrt(30), mean -0.5, std sqrt(7.25)


def test_a_scale_shows_at_its_full_size():
    split = stats_split(stats(GOLDEN * 1.02), stats(GOLDEN), "float32")
    assert split.error == pytest.approx(0.02, rel=1e-12)  # exactly ||t - g|| / ||g||
    assert (split.overflowed, split.new_nan, split.size) == (0, 0, 4)


def test_a_bias_shows_through_the_mean():
    split = stats_split(stats(GOLDEN + 0.1), stats(GOLDEN), "float32")
    # sqrt(4) * 0.1 / sqrt(30): the projection of the difference on the all-ones direction, its whole size here
    assert split.error == pytest.approx(0.2 / math.sqrt(30), rel=1e-12)
    assert split.error == pytest.approx(np.linalg.norm(0.1 * np.ones(4)) / np.linalg.norm(GOLDEN), rel=1e-12)


def test_the_bound_never_exceeds_the_true_error():
    rng = np.random.default_rng(0)
    for _ in range(200):
        g = rng.normal(size=64) * rng.uniform(0.1, 10)
        t = g * rng.uniform(0.9, 1.1) + rng.normal(size=64) * rng.uniform(0, 0.1) + rng.uniform(-0.1, 0.1)
        bound = stats_split(stats(t), stats(g), "float32").error
        assert bound <= np.linalg.norm(t - g) / np.linalg.norm(g) * (1 + 1e-12)


def test_reordered_values_have_the_same_statistics():
    assert stats_split(stats(GOLDEN[::-1]), stats(GOLDEN), "float32").error == 0.0


def test_counts_that_differ_are_a_mismatch():
    assert stats_split(stats(GOLDEN[:3]), stats(GOLDEN), "float32").error == math.inf


def test_a_loss_scale_is_divided_out():
    split = stats_split(stats(GOLDEN * 1024.0), stats(GOLDEN), "float16", scale=1024.0)
    assert split.error == 0.0


def test_an_inf_where_golden_is_finite_is_counted_not_scored():
    split = stats_split(stats(GOLDEN[:3], inf=1), stats(GOLDEN), "float16")
    assert (split.error, split.overflowed, split.new_nan) == (0.0, 1, 0)


def test_a_golden_value_beyond_the_target_format_is_an_overflow():
    golden = np.array([1.0, 70000.0])  # beyond float16's 65504
    split = stats_split(stats([1.0, 65504.0], saturated=1), stats(golden), "float16")
    assert split.overflowed == 1 and split.error == 0.0


def test_a_new_nan_is_counted_apart():
    split = stats_split(stats(GOLDEN[:3], nan=1), stats(GOLDEN), "float32")
    assert (split.overflowed, split.new_nan) == (0, 1)


def test_the_same_inf_on_both_sides_is_shared():
    split = stats_split(stats(GOLDEN[:3], inf=1), stats(GOLDEN[:3], inf=1), "bfloat16")
    assert (split.error, split.overflowed, split.new_nan) == (0.0, 0, 0)


def test_integers_are_compared_with_golden_s_integers_only():
    # a float16 cast in a module's first call renumbers the casts of its second: the target's cast of integer
    # positions to float met golden's cast of float buckets back to integers, paired by name, and its
    # "integers that differ from golden's" named a kernel_bug in a clean T5
    from precision_tool.analysis.statsjudge import _differing
    from precision_tool.dump.records import OpRecord, TensorRecord

    positions = TensorRecord("input_0", "int64", (10, 10), stats(np.arange(100) % 10 - 3.0))
    buckets = TensorRecord("input_0", "int64", (10, 10), stats(np.arange(100) % 7))
    floats = TensorRecord("input_0", "float32", (10, 10), stats(np.linspace(-5, 0, 100)))
    golden_cast = OpRecord(0, 5, "attn/aten._to_copy_5", "aten._to_copy", "forward", "float32", False, (floats,))
    assert _differing([positions], golden_cast) == []
    golden_lookup = OpRecord(0, 6, "attn/aten.embedding_0", "aten.embedding", "forward", "float32", False, (buckets,))
    assert _differing([positions], golden_lookup) == ["input_0"]
    assert _differing([buckets], golden_lookup) == []
