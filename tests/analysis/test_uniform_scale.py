"""`errors.uniform_scale`: a target tensor that is golden's times one factor, from values or statistics alone.

Rounding moves each value by its own amount, both ways; a constant the code multiplies by moves all of them by one
factor. A module-level dump judges a call whose output is golden's times r from 1 % on, below a 16-bit dtype's
noise floor too (`modulejudge`), and calls it a kernel_bug whatever the dtype (`statsjudge.statistics_verdict`).
"""

import numpy as np
import pytest

from precision_tool.analysis.errors import uniform_scale
from precision_tool.dump.records import TensorStats


def stats(values, nan=0) -> TensorStats:
    x = np.asarray(values, dtype=np.float64)
    return TensorStats(x.size + nan, float(x.min()), float(x.max()), float(x.mean()), float(x.std()),
                       float(np.linalg.norm(x)), nan)


GOLDEN = np.random.default_rng(0).normal(size=4096)
BF16_UNIT = 2.0 ** -8  # bfloat16's largest relative rounding error


def _rounded(x, rng, unit=BF16_UNIT):
    return x * (1 + rng.uniform(-unit, unit, size=x.size))


@pytest.mark.parametrize("factor", [1.02, 0.97, 1 / np.sqrt(32)])
def test_golden_times_a_constant_is_that_constant(factor):
    assert uniform_scale(GOLDEN * factor, GOLDEN, "float32") == pytest.approx(factor, rel=1e-12)
    assert uniform_scale(stats(GOLDEN * factor), stats(GOLDEN), "float32") == pytest.approx(factor, rel=1e-12)


def test_a_scale_through_bfloat16_rounding_is_still_seen():
    # a 2 % scale under one bfloat16 rounding of every value (up to 0.39 % each): statistics leave 2e-4 of it
    target = _rounded(GOLDEN * 1.02, np.random.default_rng(1))
    assert uniform_scale(stats(target), stats(GOLDEN), "bfloat16") == pytest.approx(1.02, abs=2e-4)
    assert uniform_scale(target, GOLDEN, "bfloat16") == pytest.approx(1.02, abs=2e-4)


def test_rounding_alone_is_no_scale():
    for seed in range(20):
        target = _rounded(_rounded(GOLDEN, np.random.default_rng(seed)), np.random.default_rng(seed + 100))
        assert uniform_scale(target, GOLDEN, "bfloat16") is None
        assert uniform_scale(stats(target), stats(GOLDEN), "bfloat16") is None


def test_a_scale_under_one_percent_does_not_count():
    assert uniform_scale(GOLDEN * 1.009, GOLDEN, "float32") is None
    assert uniform_scale(stats(GOLDEN * 1.009), stats(GOLDEN), "float32") is None


def test_an_error_that_is_not_one_factor_is_no_scale():
    shifted = GOLDEN + 0.05  # a bias: the mean moves, the norm hardly
    assert uniform_scale(shifted, GOLDEN, "float32") is None
    assert uniform_scale(stats(shifted), stats(GOLDEN), "float32") is None
    rows = GOLDEN.reshape(64, 64) * np.linspace(1.0, 1.1, 64)[:, None]  # each row its own factor (a variance
    # computed wrongly row by row): the norm moves 5 %, what is left after dividing it out is 3 %
    assert uniform_scale(rows.ravel(), GOLDEN, "float32") is None
    assert uniform_scale(np.where(GOLDEN > 0, GOLDEN * 1.05, GOLDEN), GOLDEN, "float32") is None  # one side only


def test_a_scale_beyond_the_target_format_s_noise_left_over_is_none():
    # golden's times 6.8, plus 3 % of noise: coherent against the departure, but more noise than float16 leaves
    rng = np.random.default_rng(2)
    target = GOLDEN * 6.8 * (1 + rng.normal(scale=0.03, size=GOLDEN.size))
    assert uniform_scale(target, GOLDEN, "float32") is None
    assert uniform_scale(target, GOLDEN, "float16") is None


def test_few_equal_or_non_finite_values_are_never_a_scale():
    assert uniform_scale(GOLDEN[:15] * 1.05, GOLDEN[:15], "float32") is None  # a loss, a few logits
    assert uniform_scale(np.full(64, 1.05), np.ones(64), "float32") is None
    assert uniform_scale(stats(GOLDEN * 1.05, nan=1), stats(GOLDEN), "float32") is None
    broken = GOLDEN * 1.05
    broken[3] = np.inf
    assert uniform_scale(broken, GOLDEN, "float32") is None
    assert uniform_scale(stats(GOLDEN[:100] * 1.05), stats(GOLDEN), "float32") is None  # other counts
