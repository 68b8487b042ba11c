"""Comparing two dump files a window of ops at a time, with memory that does not grow with the number of ops.

`comparator.compare_sources` builds a record per op of both dumps, a pair and
a row per tensor, and keeps them all (about 2.9 KB a one-tensor op). Here the
two dumps are matched from their index columns (`stream_index`), then read,
scored and handed on `WINDOW_OPS` target ops at a time: each window's records
are built from its own rows of the index tables (`precision_tool.dump.windows`),
scored by the comparator's own `_score_pairs` (the batch kernel first), its
rows grouped per op, and every `OpComparison` given to a sink with its rows in
both dumps. The sink keeps what its command needs (`digest.DigestSink`), and
the window is dropped. The rows are those `compare_sources` makes, to the bit.

Inputs rows whose tensor an earlier op's output found near zero are skipped
with it (`judged.skip_consumed_near_zero`); that needs the writers first, so
each step's possible writers (`stream_index.near_zero_candidates`, chosen from
the golden statistics) are scored before the step.

`StreamUnsupported` (or the dump's `TablesUnsupported`) says the dumps need the
record-based comparison: other sources (msprobe, in-memory dumps), a Dask
scheduler, fused ops matched through the ops they replaced, unusual tables.
Nothing has been handed on as output then: the caller compares again the old way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from precision_tool.bulk import bulk_objects
from precision_tool.compare.comparator import (CompareOptions, Progress, _group, _score_pairs, _size, compare_notes,
                                               dump_info)
from precision_tool.compare.judged import (loss_scale_ratios, near_zero_writers, skip_consumed, skip_misaligned,
                                          statistics_only)
from precision_tool.compare.matching import GOLDEN, TARGET, Unmatched, _Matcher
from precision_tool.compare.report import DumpInfo, OpComparison
from precision_tool.compare.stream_index import COLUMN_WINDOW, StepPlan, StreamUnsupported, near_zero_candidates, plan_step
from precision_tool.dump.reader import Dump
from precision_tool.dump.windows import StepTables, gather, window_dump, window_index
from precision_tool.engine.hooks import DIRECTIONS

WINDOW_OPS = 2048  # target ops read, scored and handed on at a time


class OpSink(Protocol):
    """What a streaming comparison hands each compared op to, in execution order."""

    def add(self, op: OpComparison, target_row: int, golden_row: int) -> None: ...


@dataclass
class StreamOutcome:
    """What a streaming comparison found besides the ops: the leftovers, the notes, and how to score again."""

    golden: DumpInfo
    target: DumpInfo
    unmatched_golden: list[Unmatched] = field(default_factory=list)
    unmatched_target: list[Unmatched] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    selected: tuple[int, int] = (0, 0)
    paired: bool = False
    stats_only: bool = False
    rescore: Callable | None = None  # rescore([(step, target_row, golden_row), ...]) -> list[OpComparison]


def streams(golden, target, options: CompareOptions) -> bool:
    """Whether these sources can be compared a window at a time: two dump files, scored here."""
    return type(golden) is Dump and type(target) is Dump and options.scheduler is None


def stream_compare(golden: Dump, target: Dump, options: CompareOptions, sink: OpSink,
                   progress: Progress | None = None) -> StreamOutcome:
    """Compare two opened dump files, handing each compared op to ``sink``; `StreamUnsupported` when they
    need `comparator.compare_sources`."""
    if not streams(golden, target, options):
        raise StreamUnsupported("not two dump files scored here")
    with bulk_objects():  # each window builds records and rows by the thousand, no cycles among them
        return _stream(golden, target, options, sink, progress)


def _stream(golden: Dump, target: Dump, options: CompareOptions, sink: OpSink, progress) -> StreamOutcome:
    plans = [plan_step(step, _tables(golden, step), _tables(target, step), options.ops) for step in _steps(
        golden, target, options)]
    ratios = loss_scale_ratios(golden, target)
    outcome = StreamOutcome(dump_info(golden), dump_info(target))
    found: dict = {}  # near-zero writers of every step, and what an optimizer made of them (`skip_consumed`)
    counter = _Progress(progress, sum(_data_elements(plan) for plan in plans) if progress else 0)
    stats_only = False
    while plans:
        plan = plans.pop(0)  # a step's matched rows are dropped once it is compared
        outcome.selected = (outcome.selected[0] + plan.selected[0], outcome.selected[1] + plan.selected[1])
        step_found: dict = {}
        candidates = near_zero_candidates(plan)
        if len(candidates):
            partners = plan.golden_rows[np.isin(plan.target_rows, candidates)]
            for start in range(0, len(candidates), WINDOW_OPS):
                window = _Window(plan, candidates[start:start + WINDOW_OPS], partners[start:start + WINDOW_OPS],
                                 golden, target)
                near_zero_writers(window.pairs, window.rows(options, ratios, None), step_found)
        found.update(step_found)
        written: dict = {}  # the step's backward outputs' errors, by target tensor (`skip_misaligned`)
        for start in range(0, len(plan.target_rows), WINDOW_OPS):
            window = _Window(plan, plan.target_rows[start:start + WINDOW_OPS],
                             plan.golden_rows[start:start + WINDOW_OPS], golden, target)
            ops = window.compared(options, ratios, found, counter, written)  # (adds the optimizer's noise on)
            outcome.paired = outcome.paired or bool(window.pairs)
            stats_only = stats_only or any(statistics_only(row) for op in ops for row in op.rows)
            for op in ops:
                sink.add(op, *window.rows_of[op.exec_index])
            outcome.unmatched_golden += window.matcher.result.unmatched_golden
            outcome.unmatched_target += window.matcher.result.unmatched_target
        outcome.unmatched_target += _whole_ops(plan.target, plan.unmatched_target, TARGET, "no golden op of this name")
        outcome.unmatched_golden += _whole_ops(plan.golden, plan.unmatched_golden, GOLDEN, "no target op of this name")
    for leftovers in (outcome.unmatched_golden, outcome.unmatched_target):
        leftovers.sort(key=lambda u: (u.step, u.exec_index, u.slot))
    outcome.notes = compare_notes(outcome.golden, outcome.target, stats_only, outcome.selected, outcome.paired)
    outcome.stats_only = stats_only
    outcome.rescore = lambda picks: rescore(golden, target, options, ratios, found, picks)
    return outcome


def rescore(golden: Dump, target: Dump, options: CompareOptions, ratios: dict, found: dict,
            picks: list[tuple[int, int, int]]) -> list[OpComparison]:
    """The `OpComparison` of each (step, target row, golden row) of a streamed comparison, scored again."""
    by_step: dict[int, list[tuple[int, int]]] = {}
    for step, target_row, golden_row in picks:
        by_step.setdefault(step, []).append((target_row, golden_row))
    done: dict[tuple[int, int], OpComparison] = {}
    with bulk_objects():
        for step, rows in by_step.items():
            rows.sort()
            plan = StepPlan(step, _tables(target, step), _tables(golden, step), np.zeros(0), np.zeros(0),
                            np.zeros(0), np.zeros(0))
            window = _Window(plan, np.array([t for t, _ in rows], np.int64), np.array([g for _, g in rows], np.int64),
                             golden, target)
            step_found = {key: reason for key, reason in found.items() if key[0] in (step, None)}
            for op in window.compared(options, ratios, step_found, _Progress(None, 0)):
                done[(step, window.rows_of[op.exec_index][0])] = op
    return [done[(step, target_row)] for step, target_row, _ in picks]


class _Window:
    """The records of a few thousand matched target ops and their golden partners, and their tensor pairs."""

    def __init__(self, plan: StepPlan, target_rows: np.ndarray, golden_rows: np.ndarray, golden: Dump, target: Dump):
        target_index = window_index(plan.target, target_rows)
        partners = np.unique(golden_rows)
        golden_index = window_index(plan.golden, partners)
        golden_records = golden_index.records()
        self.matcher = _Matcher([])
        self.rows_of: dict[int, tuple[int, int]] = {}  # exec index -> (target row, golden row)
        for record, where, target_row, golden_row in zip(target_index.records(), np.searchsorted(
                partners, golden_rows).tolist(), target_rows.tolist(), golden_rows.tolist()):
            partner = golden_records[where]
            if partner.name != record.name or partner.direction != record.direction:
                raise StreamUnsupported("two names with the same key")  # a hash collision: match by records
            self.matcher.pair_direct(record, partner)
            self.rows_of[record.exec_index] = (target_row, golden_row)
        self.pairs = self.matcher.result.pairs
        self.golden, self.target = window_dump(golden, golden_index), window_dump(target, target_index)

    def rows(self, options: CompareOptions, ratios: dict, progress) -> list:
        return _score_pairs(self.pairs, self.golden, self.target, options, progress, ratios)

    def compared(self, options: CompareOptions, ratios: dict, found: dict, counter: "_Progress",
                 written: dict | None = None) -> list[OpComparison]:
        rows = skip_consumed(self.pairs, self.rows(options, ratios, counter.window()), found)
        rows = skip_misaligned(self.pairs, rows, written)
        counter.advance(sum(_size(pair) for pair in self.pairs))
        return _group(self.pairs, rows)


class _Progress:
    """The comparator's (elements done, elements in all) over every window."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def window(self) -> Progress | None:
        if self.progress is None:
            return None
        return lambda done, _: self.progress(self.done + done, max(self.total, self.done + done))

    def advance(self, elements: int) -> None:
        self.done += elements


def _steps(golden: Dump, target: Dump, options: CompareOptions) -> list[int]:
    steps = set(golden.step_numbers()) | set(target.step_numbers())
    return sorted(steps if options.steps is None else steps & set(options.steps))


def _tables(dump: Dump, step: int) -> StepTables:
    return StepTables(dump, step) if step in dump.step_numbers() else StepTables.empty(dump, step)


def _data_elements(plan: StepPlan) -> int:
    """Values of the matched target tensors with data: the progress bar's total (golden data not asked)."""
    tables, total = plan.target, 0
    for start in range(0, tables.n_tensors, COLUMN_WINDOW):
        c = tables.tensor_columns(start, min(tables.n_tensors, start + COLUMN_WINDOW), ["op", "has_data", "ndim", "shape"])
        used = np.arange(c["shape"].shape[1]) < c["ndim"][:, None]
        sizes = np.where(used, c["shape"], 1).prod(axis=1)
        total += int(sizes[(c["has_data"] != 0) & np.isin(c["op"], plan.target_rows)].sum())
    return total


def _whole_ops(tables: StepTables, rows: np.ndarray, side: str, reason: str) -> list[Unmatched]:
    """Unmatched entries of whole ops (op_index rows ``rows``)."""
    found = []
    for start in range(0, len(rows), COLUMN_WINDOW):
        part = gather(tables.ops, rows[start:start + COLUMN_WINDOW])
        for exec_index, direction, name, op_type in zip(part["exec_index"].tolist(), part["direction"].tolist(),
                                                        part["name"].tolist(), part["type"].tolist()):
            if direction >= len(DIRECTIONS):
                raise StreamUnsupported("a direction the reader would refuse")
            try:
                found.append(Unmatched(side, tables.step, exec_index, name.decode("utf-8"), op_type.decode("utf-8"),
                                       DIRECTIONS[direction], "", reason))
            except UnicodeDecodeError:
                raise StreamUnsupported("a name the reader would refuse") from None
    return found

