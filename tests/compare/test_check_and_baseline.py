import json

import numpy as np
import pytest

from precision_tool.compare.baseline import (baseline_from_report, cosine_drop_tolerance, error_growth_limit,
                                             load_baseline, save_baseline)
from precision_tool.compare.check import CheckCriteria, RegressionFound, check_report
from precision_tool.compare.comparator import compare_sources
from precision_tool.compare.memory import MemoryDump
from precision_tool.errors import ExitStatus, InputError

RNG = np.random.default_rng(11)
X = RNG.standard_normal(256).astype(np.float32)


def pair(*outputs, mode="dump", stats_only=False):
    """Golden and target dumps with one op per (name, target values); the golden values are X."""
    golden, target = MemoryDump("g.h5"), MemoryDump("t.h5", mode=mode)
    for name, values, dtype in outputs:
        golden.add(name, "T", {"input_0": X, "output_0": X})
        target.add(name, "T", {"input_0": X, "output_0": values}, dtypes={"output_0": dtype}, stats_only=stats_only)
    return golden, target


def noisy(scale):
    return (X + np.float32(scale) * RNG.standard_normal(X.size).astype(np.float32)).astype(np.float32)


def test_passing_check_is_truthy():
    report = compare_sources(*pair(("a", X, "float32"), ("b", noisy(1e-4), "float16")))
    result = check_report(report)
    assert result and result.passed and result.checked == 2 and not result.failures  # outputs only
    result.raise_if_failed()  # nothing to raise
    assert check_report(report, CheckCriteria(judge_inputs=True)).checked == 4


def test_failures_come_first_first_with_dtypes():
    report = compare_sources(*pair(("a", X, "float32"), ("b", noisy(0.5), "float16"), ("c", noisy(1.0), "bfloat16")))
    result = check_report(report, CheckCriteria(min_cosine=0.99))
    assert not result
    assert [(f.op, f.tensor, f.metric) for f in result.failures] == [("b", "output_0", "cosine"),
                                                                     ("c", "output_0", "cosine")]
    assert (result.failures[0].target_dtype, result.failures[0].golden_dtype) == ("float16", "float32")
    assert [op for _, _, op, _ in result.failing_ops] == ["b", "c"]
    with pytest.raises(RegressionFound, match="first: step 0 #1 b") as caught:
        result.raise_if_failed()
    assert caught.value.exit_status == ExitStatus.REGRESSION


def test_max_abs_err_threshold():
    report = compare_sources(*pair(("a", X + np.float32(0.01), "float32")))
    assert check_report(report, CheckCriteria(max_abs_err=0.1))
    failed = check_report(report, CheckCriteria(max_abs_err=0.001))
    assert [f.metric for f in failed.failures] == ["max_abs_err"]


def test_one_side_zero_nonfinite_and_shape_fail():
    broken = X.copy()
    broken[3] = np.nan
    golden, target = pair(("zeros", np.zeros_like(X), "float32"), ("nan", broken, "float32"))
    golden.add("shape", "T", {"output_0": X})
    target.add("shape", "T", {"output_0": X[:100]})
    result = check_report(compare_sources(golden, target))
    assert [(f.op, f.metric) for f in result.failures] == [("zeros", "cosine"), ("nan", "nonfinite"),
                                                           ("shape", "problem")]
    assert "one side is all zeros" in result.failures[0].message


def test_stats_only_rules_use_what_statistics_prove():
    report = compare_sources(*pair(("a", X * np.float32(1.05), "float32"), stats_only=True))
    assert [f.metric for f in check_report(report, CheckCriteria(min_cosine=0.99)).failures] == ["rel_norm_diff"]
    assert check_report(report, CheckCriteria(min_cosine=0.9))
    bound = check_report(report, CheckCriteria(min_cosine=None, max_abs_err=1e-3))
    assert [f.metric for f in bound.failures] == ["max_abs_err"]


def test_tolerance_functions():
    assert cosine_drop_tolerance(1.0) == 1e-6
    assert cosine_drop_tolerance(0.99) == pytest.approx(1e-3)
    assert error_growth_limit(0.0) == 1e-12
    assert error_growth_limit(2.0) == pytest.approx(2.2 + 1e-12)


def test_a_baseline_passes_on_its_own_dumps_and_round_trips(tmp_path):
    zeros = np.zeros_like(X)
    report = compare_sources(*pair(("a", noisy(0.3), "float16"), ("z", zeros, "float32")))
    assert not check_report(report)  # below 0.99, and one side all zeros: fails without a baseline
    path = tmp_path / "baseline.json"
    save_baseline(baseline_from_report(report), path)
    loaded = load_baseline(path)
    assert len(loaded.entries) == 4
    document = json.loads(path.read_text())
    assert document["format"] == "precision-tool-baseline"
    assert any(t["cosine"] == "nan" for t in document["tensors"])
    result = check_report(report, CheckCriteria(baseline=loaded))
    assert result.passed, result.failures
    assert result.baseline_missing == 0  # its inputs were compared, though not judged: none is missing


def test_a_baseline_fails_when_a_tensor_gets_worse(tmp_path):
    before = compare_sources(*pair(("a", noisy(0.01), "float16"), ("b", noisy(0.01), "float16")))
    baseline = baseline_from_report(before)
    worse = compare_sources(*pair(("a", noisy(0.01), "float16"), ("b", noisy(0.2), "float16")))
    result = check_report(worse, CheckCriteria(baseline=baseline))
    assert {(f.op, f.metric) for f in result.failures} == {("b", "cosine"), ("b", "max_abs_err")}
    assert "dropped below baseline" in result.failures[0].message


def test_with_a_baseline_new_tensors_use_the_thresholds_and_missing_ones_are_counted():
    baseline = baseline_from_report(compare_sources(*pair(("gone", X, "float32"))))
    report = compare_sources(*pair(("new", noisy(1.0), "float32")))
    result = check_report(report, CheckCriteria(min_cosine=0.99, baseline=baseline))
    assert [(f.op, f.metric) for f in result.failures] == [("new", "cosine")]
    assert result.baseline_missing == 2


def test_absolute_thresholds_apply_to_baselined_tensors_only_when_asked():
    report = compare_sources(*pair(("a", noisy(0.5), "float32")))
    baseline = baseline_from_report(report)
    assert check_report(report, CheckCriteria(min_cosine=0.99, baseline=baseline))
    strict = CheckCriteria(min_cosine=0.99, baseline=baseline, absolute_on_baselined=True)
    assert [f.metric for f in check_report(report, strict).failures] == ["cosine"]


@pytest.mark.parametrize("text, problem", [
    (None, "no such baseline file"), ("{not json", "not a baseline file"),
    ('{"format": "other"}', "not a precision-tool baseline"),
    ('{"format": "precision-tool-baseline", "version": 99, "tensors": []}', "version 99"),
    ('{"format": "precision-tool-baseline", "version": 1, "tensors": [{"step": 0}]}', "malformed"),
])
def test_bad_baseline_files_are_input_errors(tmp_path, text, problem):
    path = tmp_path / "b.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InputError, match=problem):
        load_baseline(path)


@pytest.mark.parametrize("content, says", [
    (b"not json", "not a baseline file: not JSON (expecting value at line 1, column 1)"),
    (b"\x89HDF\r\n\x1a\n\xff\xfe", "not a baseline file: not UTF-8 text"),
])
def test_a_baseline_that_is_not_json_says_why(tmp_path, content, says):
    from precision_tool.compare.baseline import load_baseline

    path = tmp_path / "base.json"
    path.write_bytes(content)  # (before: "not a baseline file (JSONDecodeError)", an exception's class)
    with pytest.raises(InputError) as raised:
        load_baseline(path)
    assert str(raised.value) == f"{path}: {says}"


def test_a_name_run_twice_a_step_has_an_entry_a_run(tmp_path):
    """An activation module called twice a step: one entry held both runs, the second's, and the pair failed
    against its own baseline (the first run, further from golden, judged by the second's metrics)."""
    golden, target = MemoryDump("g.h5"), MemoryDump("t.h5")
    for values in (noisy(1e-2), noisy(1e-4)):
        golden.add("act", "T", {"input_0": X, "output_0": X})
        target.add("act", "T", {"input_0": X, "output_0": values})
    report = compare_sources(golden, target)
    save_baseline(baseline_from_report(report), tmp_path / "base.json")
    baseline = load_baseline(tmp_path / "base.json")
    assert sorted(baseline.entries) == [(0, "act", "forward", tensor, run) for tensor in ("input_0", "output_0")
                                        for run in (0, 1)]
    result = check_report(report, CheckCriteria(baseline=baseline))
    assert result.passed and result.checked == 2 and result.baseline_missing == 0
