import math

import pytest

from precision_tool.compare.selection import op_matches, parse_steps, select_ops
from precision_tool.compare.stats import compare_stats, extra_nonfinite, relative_norm_difference
from precision_tool.dump.records import OpRecord, TensorStats
from precision_tool.errors import ConfigError


def stats(mean=0.0, std=1.0, norm=10.0, lo=-3.0, hi=3.0, nan=0, inf=0):
    return TensorStats(100, lo, hi, mean, std, norm, nan, inf)


def test_relative_norm_difference_edges():
    assert relative_norm_difference(11.0, 10.0) == pytest.approx(0.1)
    assert relative_norm_difference(9.0, 10.0) == pytest.approx(0.1)
    assert relative_norm_difference(0.0, 0.0) == 0.0
    assert relative_norm_difference(1.0, 0.0) == math.inf


def test_stats_deltas_and_the_max_abs_err_bound():
    delta = compare_stats(stats(mean=0.5, std=1.5, norm=12.0, lo=-3.0, hi=5.0), stats())
    assert (delta.abs_mean_diff, delta.abs_std_diff, delta.abs_max_diff, delta.abs_min_diff) == (0.5, 0.5, 2.0, 0.0)
    assert delta.rel_norm_diff == pytest.approx(0.2)
    assert delta.max_abs_err_bound == 2.0


def test_extra_nonfinite_counts_only_what_the_target_adds():
    assert extra_nonfinite(stats(nan=3, inf=1), stats(nan=1, inf=2)) == 2
    assert extra_nonfinite(stats(), stats(nan=5)) == 0


@pytest.mark.parametrize("text, expected", [
    ("0", {0}), ("0,5-7", {0, 5, 6, 7}), (" 3 , 1 ", {1, 3}), ("2-2", {2}),
])
def test_parse_steps(text, expected):
    assert parse_steps(text) == frozenset(expected)


@pytest.mark.parametrize("text", ["x", "1-", "-1", "5-3", "1,,2", "1.5"])
def test_parse_steps_rejects_nonsense(text):
    with pytest.raises(ConfigError, match="bad step selection"):
        parse_steps(text)


def test_parse_steps_none_means_every_step():
    assert parse_steps(None) is None and parse_steps("  ") is None and parse_steps("all") is None


def _op(name, step=0, original_names=()):
    return OpRecord(step, 0, name, "T", "forward", "float32", False, original_names=original_names,
                    pass_name="P" if original_names else "")


def test_op_glob_matches_names_and_fused_originals():
    fused = _op("fc/FusedMatMulAdd", original_names=("fc/MatMul", "fc/Add"))
    assert op_matches(fused, "fc/Add")
    assert op_matches(fused, "*Fused*")
    assert not op_matches(fused, "conv*")
    assert op_matches(fused, None)


def test_select_ops_by_step_and_glob():
    records = [_op("a", 0), _op("b", 1), _op("a", 2)]
    assert [(r.name, r.step) for r in select_ops(records, frozenset({1, 2}), "a")] == [("a", 2)]
