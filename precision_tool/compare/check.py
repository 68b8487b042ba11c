"""The CI gate: judge every compared tensor against thresholds or a baseline.

Without a baseline a tensor fails when its cosine is below ``min_cosine``
(or undefined because one side is all zeros), its max_abs_err exceeds
``max_abs_err``, the target holds NaN/inf the golden tensor lacks, or the
shapes differ. Statistics-only tensors use what the statistics prove
(`precision_tool.compare.stats`): the relative norm difference against
1 − min_cosine, and the lower bound of max_abs_err.

With a baseline, tensors the baseline holds are judged against it
(`precision_tool.compare.baseline`), and against the absolute thresholds only
when ``absolute_on_baselined`` is set (the CLI sets it when --min-cosine or
--max-abs-err is given); tensors new since the baseline use the thresholds.
Unmatched ops are reported, not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from precision_tool.compare.baseline import Baseline, RowKeys, baseline_violations
from precision_tool.compare.metrics import ONE_SIDE_ZERO
from precision_tool.compare.report import CompareReport, TensorRow
from precision_tool.defaults import CHECK_MIN_COSINE
from precision_tool.errors import ExitStatus, PrecisionToolError


class RegressionFound(PrecisionToolError):
    """A check found failing tensors: the front ends exit with status 1."""

    exit_status = ExitStatus.REGRESSION


@dataclass(frozen=True)
class CheckCriteria:
    """What a tensor must meet; None switches a threshold off."""

    min_cosine: float | None = CHECK_MIN_COSINE
    max_abs_err: float | None = None
    baseline: Baseline | None = None
    absolute_on_baselined: bool = False
    judge_inputs: bool = False  # inputs too: each tensor twice, as one op's output and the next op's input


@dataclass(frozen=True)
class CheckFailure:
    """One tensor that failed one rule; carries both dtypes so fp16 losses read as such."""

    step: int
    exec_index: int
    op: str
    type: str
    direction: str
    tensor: str
    metric: str
    value: float | None
    limit: float | None
    target_dtype: str
    golden_dtype: str
    message: str


@dataclass
class CheckResult:
    """Falsy when a tensor failed; ``failures`` are in execution order, the first failure first."""

    report: CompareReport
    criteria: CheckCriteria
    checked: int
    failures: list[CheckFailure] = field(default_factory=list)
    baseline_missing: int = 0  # baseline tensors this comparison did not produce

    @property
    def passed(self) -> bool:
        return not self.failures

    def __bool__(self) -> bool:
        return self.passed

    @property
    def failing_ops(self) -> list[tuple[int, int, str, str]]:
        """(step, exec_index, op, direction) of each failing op once, first first."""
        seen: dict[tuple[int, int, str, str], None] = {}
        for failure in self.failures:
            seen.setdefault((failure.step, failure.exec_index, failure.op, failure.direction), None)
        return list(seen)

    @property
    def first_failure(self) -> CheckFailure | None:
        return self.failures[0] if self.failures else None

    def raise_if_failed(self) -> None:
        """RegressionFound (exit status 1) naming the first failure, when a tensor failed."""
        first = self.first_failure
        if first is not None:
            raise RegressionFound(
                f"check failed: {len(self.failures)} failures in {len(self.failing_ops)} ops; first: step "
                f"{first.step} #{first.exec_index} {first.op} ({first.direction}) {first.tensor}: {first.message}")


def absolute_violations(row: TensorRow, criteria: CheckCriteria) -> list[tuple[str, float | None, float | None, str]]:
    """(metric, value, limit, message) for every absolute rule ``row`` breaks."""
    found = []
    if row.problem:
        found.append(("problem", None, None, f"{row.problem}: {row.shape} vs golden {row.golden_shape}"))
    metrics, min_cosine = row.metrics, criteria.min_cosine
    if metrics is not None:
        if math.isnan(metrics.cosine) and metrics.note == ONE_SIDE_ZERO:
            found.append(("cosine", metrics.cosine, min_cosine, f"cosine undefined: {ONE_SIDE_ZERO}"))
        elif min_cosine is not None and metrics.cosine < min_cosine:
            found.append(("cosine", metrics.cosine, min_cosine, f"cosine {metrics.cosine:.6f} < {min_cosine:g}"))
        if criteria.max_abs_err is not None and metrics.max_abs_err > criteria.max_abs_err:
            found.append(("max_abs_err", metrics.max_abs_err, criteria.max_abs_err,
                          f"max_abs_err {metrics.max_abs_err:.4g} > {criteria.max_abs_err:g}"))
    if row.stats is not None:
        if min_cosine is not None and row.stats.rel_norm_diff > 1.0 - min_cosine:
            found.append(("rel_norm_diff", row.stats.rel_norm_diff, 1.0 - min_cosine,
                          f"relative norm difference {row.stats.rel_norm_diff:.4g} > {1.0 - min_cosine:.4g} "
                          f"(statistics only)"))
        bound = row.stats.max_abs_err_bound
        if criteria.max_abs_err is not None and bound > criteria.max_abs_err:
            found.append(("max_abs_err", bound, criteria.max_abs_err,
                          f"max_abs_err is at least {bound:.4g} > {criteria.max_abs_err:g} (statistics only)"))
    if row.extra_nonfinite:
        found.append(("nonfinite", float(row.extra_nonfinite), 0.0,
                      f"target has {row.extra_nonfinite} NaN/inf the golden tensor lacks"))
    return found


def _failure(row: TensorRow, metric: str, value, limit, message: str) -> CheckFailure:
    return CheckFailure(row.step, row.exec_index, row.op, row.type, row.direction, row.tensor, metric,
                        value, limit, row.target_dtype, row.golden_dtype, message)


def check_report(report: CompareReport, criteria: CheckCriteria | None = None) -> CheckResult:
    """Judge every compared tensor of ``report``; failures come in execution order."""
    judge = CheckJudge(criteria or CheckCriteria())
    for row in report.rows:
        judge.add(row)
    return judge.result(report)


class CheckJudge:
    """`check_report` one row at a time, in execution order: what a streaming comparison feeds."""

    def __init__(self, criteria: CheckCriteria):
        self.criteria = criteria
        self.checked = 0
        self.failures: list[CheckFailure] = []
        self.seen: set = set()  # baseline keys met
        self._keys = RowKeys()

    def add(self, row: TensorRow) -> None:
        criteria, baseline = self.criteria, self.criteria.baseline
        entry = baseline.entries.get(self._keys(row)) if baseline is not None else None
        if entry is not None:
            self.seen.add(entry.key)  # in this comparison, judged or not
        if row.skip or (row.kind == "input" and not criteria.judge_inputs):
            return  # shown, not judged: an input is judged as the output of the op that wrote it
        self.checked += 1
        found = []
        if entry is not None:
            found.extend(baseline_violations(row, entry))
        if entry is None or criteria.absolute_on_baselined:
            found.extend(v for v in absolute_violations(row, criteria) if v[0] not in {f[0] for f in found})
        self.failures.extend(_failure(row, *violation) for violation in found)

    def result(self, report) -> CheckResult:
        """The result; ``report`` is the comparison judged (a `CompareReport`, or a streamed one)."""
        result = CheckResult(report, self.criteria, self.checked, self.failures)
        if self.criteria.baseline is not None:
            result.baseline_missing = len(set(self.criteria.baseline.entries) - self.seen)
        return result
