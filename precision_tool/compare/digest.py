"""A streamed comparison's report: the counts, leftovers and notes of a `CompareReport`, a few columns per op.

`DigestSink` takes each compared op from `stream.stream_compare` and keeps:

* per op, 81 bytes: its step and rows in both dumps (to score it again), what flags it
  at any threshold (the lowest judged output and input cosine, the largest
  judged relative norm difference of each, whether a problem, an undefined
  cosine or extra NaN/inf flags it whatever the threshold), whether it is a
  module, and the four values the execution chart draws;
* the first ``limit`` ops flagged at the threshold asked, and the first
  flagged modules, whole;
* a `CheckJudge`'s failures, when a check is run.

`StreamedReport` answers what the views ask of a `CompareReport`
(``summary``, the leftovers, ``notes``) and what `compare`/`vcs` list
(``select_flagged``); an op it did not keep is scored again
(`stream.rescore`), a few ops at a time. It has no ``ops``: walking every
op is what it avoids.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from precision_tool.compare.check import CheckJudge
from precision_tool.compare.matching import FusionCover, Unmatched
from precision_tool.compare.metrics import ONE_SIDE_ZERO
from precision_tool.compare.report import SHAPE_MISMATCH, CompareSummary, DumpInfo, OpComparison
from precision_tool.defaults import COSINE_THRESHOLD
from precision_tool.dump.records import MODULE_TYPE_PREFIX

OUT_ALWAYS, IN_ALWAYS, MODULE, HAS_COSINE, HAS_ERROR, HAS_NORM_DIFF, HAS_ABS_BOUND = (1 << i for i in range(7))
_DOUBLES = ("out_cosine", "out_norm_diff", "in_cosine", "in_norm_diff", "cosine", "error", "norm_diff", "abs_bound")


def _digest(op: OpComparison) -> tuple:
    """One pass over an op's rows: its judged outputs' and inputs' (lowest finite cosine, largest relative norm
    difference, flagged at any threshold) (`report.row_flags` split into what depends on the threshold and what
    does not); the chart's worst judged output cosine, max abs error, relative norm difference and its bound
    (`OpComparison.worst_output_cosine`, `max_output_abs_err`, `report.worst_output_stat`); shape mismatches."""
    judged = {"output": [math.inf, -math.inf, False], "input": [math.inf, -math.inf, False]}
    cosines, errors, norm_diffs, bounds = [], [], [], []
    mismatches = 0
    for row in op.rows:
        kind, metrics, stats = row.kind, row.metrics, row.stats
        mismatches += row.problem == SHAPE_MISMATCH
        if kind == "output" and not row.skip:
            if metrics is not None:
                cosines.append(metrics.cosine)
                if not math.isnan(metrics.max_abs_err):
                    errors.append(metrics.max_abs_err)
            if stats is not None:
                if not math.isnan(stats.rel_norm_diff):
                    norm_diffs.append(stats.rel_norm_diff)
                if not math.isnan(stats.max_abs_err_bound):
                    bounds.append(stats.max_abs_err_bound)
        flags = judged.get(kind)
        if flags is None or row.skip:
            continue
        if row.problem or row.extra_nonfinite:
            flags[2] = True
        if metrics is not None:
            if math.isnan(metrics.cosine):
                flags[2] = flags[2] or metrics.note == ONE_SIDE_ZERO
            elif metrics.cosine < flags[0]:
                flags[0] = metrics.cosine
        if stats is not None and stats.rel_norm_diff > flags[1]:
            flags[1] = stats.rel_norm_diff
    cosine = None if not cosines else math.nan if any(math.isnan(c) for c in cosines) else min(cosines)
    return (*judged["output"], *judged["input"], cosine, max(errors) if errors else None,
            max(norm_diffs) if norm_diffs else None, max(bounds) if bounds else None, mismatches)


class DigestSink:
    """Keeps what `StreamedReport` needs of each compared op (see the module docstring)."""

    def __init__(self, threshold: float = COSINE_THRESHOLD, limit: int = 0, judge: CheckJudge | None = None):
        self.threshold, self.limit, self.judge = threshold, limit, judge
        self.steps, self.target_rows, self.golden_rows = array("q"), array("I"), array("I")  # op_index rows: uint32
        self.doubles = {name: array("d") for name in _DOUBLES}
        self._appends = [self.doubles[name].append for name in _DOUBLES]
        self.bits = array("B")
        self.kept: dict[int, OpComparison] = {}
        self.listed = 0
        self.first_module = self.first_clean_module = None  # positions of the first flagged module calls
        self.tensors = self.shape_mismatches = 0

    def add(self, op: OpComparison, target_row: int, golden_row: int) -> None:
        position = len(self.bits)
        self.steps.append(op.step)
        self.target_rows.append(target_row)
        self.golden_rows.append(golden_row)
        (out_cosine, out_norm_diff, out_always, in_cosine, in_norm_diff, in_always, cosine, error, norm_diff,
         abs_bound, mismatches) = _digest(op)
        for append, value in zip(self._appends, (out_cosine, out_norm_diff, in_cosine, in_norm_diff, cosine, error,
                                                 norm_diff, abs_bound)):
            append(0.0 if value is None else value)
        module = op.type.startswith(MODULE_TYPE_PREFIX)
        self.bits.append(OUT_ALWAYS * out_always | IN_ALWAYS * in_always | MODULE * module
                         | HAS_COSINE * (cosine is not None) | HAS_ERROR * (error is not None)
                         | HAS_NORM_DIFF * (norm_diff is not None) | HAS_ABS_BOUND * (abs_bound is not None))
        self.tensors += len(op.rows)
        self.shape_mismatches += mismatches
        if self.judge is not None:
            for row in op.rows:
                self.judge.add(row)
        if _flags(out_always, out_cosine, out_norm_diff, self.threshold):
            if self.listed < self.limit:
                self.listed += 1
                self.kept[position] = op
            if module and self.first_module is None:
                self.first_module = position
                self.kept[position] = op
            if module and self.first_clean_module is None and not _flags(in_always, in_cosine, in_norm_diff,
                                                                         self.threshold):
                self.first_clean_module = position
                self.kept[position] = op

    def report(self, outcome) -> "StreamedReport":
        """The report of the comparison ``outcome`` (`stream.StreamOutcome`) whose ops this sink took."""
        columns = {name: np.frombuffer(values, np.float64) if len(values) else np.zeros(0)
                   for name, values in self.doubles.items()}
        return StreamedReport(outcome.golden, outcome.target, outcome.unmatched_golden, outcome.unmatched_target,
                              [], outcome.stats_only, list(outcome.notes), len(self.bits), self.tensors,
                              self.shape_mismatches, _numbers(self.steps), _numbers(self.target_rows),
                              _numbers(self.golden_rows), columns, np.frombuffer(self.bits, np.uint8),
                              self.threshold, self.kept, self.first_module, self.first_clean_module, outcome.rescore)


def _numbers(values: array) -> np.ndarray:
    dtype = np.int64 if values.typecode == "q" else np.uint32
    return np.frombuffer(values, dtype) if len(values) else np.zeros(0, dtype)


def _flags(always: bool, cosine: float, norm_diff: float, threshold: float) -> bool:
    return always or cosine <= threshold or norm_diff > 1.0 - threshold


@dataclass
class ChartColumns:
    """What the execution chart draws of a streamed comparison: one value per op, NaN where ``missing``."""

    cosine: np.ndarray
    cosine_missing: np.ndarray
    error: np.ndarray
    error_missing: np.ndarray
    norm_diff: np.ndarray
    norm_diff_missing: np.ndarray
    abs_bound: np.ndarray
    abs_bound_missing: np.ndarray
    step_starts: list[tuple[int, int]]  # (index, step) of each step's first op, the first step left out
    first_step: int | None
    first_flagged: int | None  # its index
    first_flagged_op: OpComparison | None


@dataclass
class StreamedReport:
    """A streamed comparison (see the module docstring); ``summary`` at any threshold, as `CompareReport`'s."""

    golden: DumpInfo
    target: DumpInfo
    unmatched_golden: list[Unmatched]
    unmatched_target: list[Unmatched]
    covered_by_fusion: list[FusionCover]
    stats_only: bool
    notes: list[str]
    compared_ops: int
    compared_tensors: int
    shape_mismatch_count: int
    steps: np.ndarray
    target_rows: np.ndarray
    golden_rows: np.ndarray
    columns: dict[str, np.ndarray]
    bits: np.ndarray
    threshold: float  # the threshold ``kept`` was chosen at
    kept: dict[int, OpComparison] = field(repr=False)
    first_module: int | None = None
    first_clean_module: int | None = None
    rescore: Callable | None = field(default=None, repr=False)

    def flagged_mask(self, threshold: float) -> np.ndarray:
        """Which ops are flagged at ``threshold`` (`OpComparison.flagged`)."""
        c = self.columns
        return ((self.bits & OUT_ALWAYS) != 0) | (c["out_cosine"] <= threshold) | (c["out_norm_diff"] > 1.0 - threshold)

    def flagged_count(self, threshold: float) -> int:
        return int(self.flagged_mask(threshold).sum())

    def select_flagged(self, threshold: float = COSINE_THRESHOLD, limit: int | None = 10) -> list[OpComparison]:
        """The first ``limit`` ops flagged at ``threshold``, in execution order (`report.select_flagged`)."""
        positions = np.flatnonzero(self.flagged_mask(threshold))
        if limit is not None and limit > 0:
            positions = positions[:limit]
        return self.ops_at(positions.tolist())

    def ops_at(self, positions: list[int]) -> list[OpComparison]:
        """The compared ops at these positions in execution order: kept, or scored again."""
        missing = list(dict.fromkeys(p for p in positions if p not in self.kept))  # each op scored once
        if missing:
            picks = [(int(self.steps[p]), int(self.target_rows[p]), int(self.golden_rows[p])) for p in missing]
            again = dict(zip(missing, self.rescore(picks)))
        return [self.kept[p] if p in self.kept else again[p] for p in positions]

    def summary(self, cosine_threshold: float = COSINE_THRESHOLD) -> CompareSummary:
        flagged = self.flagged_mask(cosine_threshold)
        first = int(np.argmax(flagged)) if flagged.any() else None
        module = self._first_diverging_module(flagged, cosine_threshold)
        wanted = [p for p in (first, module) if p is not None]
        ops = dict(zip(wanted, self.ops_at(wanted)))
        return CompareSummary(cosine_threshold, self.compared_tensors, self.compared_ops, int(flagged.sum()),
                              len(self.unmatched_golden), len(self.unmatched_target), len(self.covered_by_fusion),
                              self.shape_mismatch_count, ops.get(first), ops.get(module))

    def _first_diverging_module(self, flagged: np.ndarray, threshold: float) -> int | None:
        """`report._first_diverging_module`: the first flagged module whose inputs are not flagged, else the
        first flagged module."""
        if threshold == self.threshold:
            return self.first_clean_module if self.first_clean_module is not None else self.first_module
        c = self.columns
        modules = flagged & ((self.bits & MODULE) != 0)
        inputs = ((self.bits & IN_ALWAYS) != 0) | (c["in_cosine"] <= threshold) | (c["in_norm_diff"] > 1.0 - threshold)
        for candidates in (modules & ~inputs, modules):
            if candidates.any():
                return int(np.argmax(candidates))
        return None

    def chart_columns(self, threshold: float) -> ChartColumns:
        """The execution chart's values (`render.chart`), the first flagged op scored again if need be."""
        c, bits = self.columns, self.bits
        flagged = self.flagged_mask(threshold)
        first = int(np.argmax(flagged)) if flagged.any() else None
        starts = np.flatnonzero(np.diff(self.steps)) + 1
        return ChartColumns(c["cosine"], (bits & HAS_COSINE) == 0, c["error"], (bits & HAS_ERROR) == 0,
                            c["norm_diff"], (bits & HAS_NORM_DIFF) == 0, c["abs_bound"], (bits & HAS_ABS_BOUND) == 0,
                            [(int(i), int(self.steps[i])) for i in starts],
                            int(self.steps[0]) if len(self.steps) else None, first,
                            self.ops_at([first])[0] if first is not None else None)
