"""Cross-rank consistency of a data-parallel run, no golden needed.

Data parallelism keeps some tensors bitwise identical on every rank: the result of a gradient all-reduce
(and of a broadcast or all-gather), and everything an optimizer update reads and writes (weights,
gradients after the all-reduce, optimizer slots). `check_consistency` compares those tensors across the
ranks of a run, step by step in execution order, and reports every op where a rank departs from the
others, the first first. Which rank departs: for an all-reduce, a rank whose output is neither the mean
nor the sum of the ranks' inputs; otherwise the ranks outside the largest group that agree (with two
ranks and no all-reduce to tell them apart, both are named).

Tensors with data are compared exactly (NaN equal to NaN); statistics-only tensors by their statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from precision_tool.engine.hooks import OPTIMIZER

_SAME_ON_EVERY_RANK = ("allreduce", "broadcast", "allgather")  # collectives whose output every rank shares
_REDUCING = ("allreduce",)


@dataclass(frozen=True)
class RankDeparture:
    """One op (and slot) where the ranks do not hold the same tensor."""

    step: int
    exec_index: int  # rank 0's (or the first rank's that ran it)
    op: str
    type: str
    direction: str
    slot: str
    departing: tuple[int, ...]  # the ranks that left the others
    agreeing: tuple[int, ...]
    max_abs_diff: float | None  # between a departing rank and the first agreeing one (None: stats only)
    reason: str = ""  # "missing on rank 1", "not the mean or sum of the ranks' inputs", ...


@dataclass
class ConsistencyReport:
    """`ranks RUN`: what was compared across the ranks of a run, and where they disagree."""

    path: str
    world_size: int
    steps: int = 0
    ops_checked: int = 0
    tensors_checked: int = 0
    departures: list[RankDeparture] = field(default_factory=list)  # in (step, exec_index) order
    total_departures: int = 0  # before ``departures`` was cut to the limit

    @property
    def consistent(self) -> bool:
        return self.total_departures == 0

    def __bool__(self) -> bool:
        return self.consistent

    @property
    def first(self) -> RankDeparture | None:
        return self.departures[0] if self.departures else None

    def summary(self) -> str:
        if self.consistent:
            return (f"{self.world_size} ranks consistent: {self.tensors_checked} tensors of {self.ops_checked} "
                    f"ops over {self.steps} steps identical on every rank")
        first = self.first
        ranks = ", ".join(str(r) for r in first.departing)
        several = len(first.departing) > 1
        return (f"ranks disagree: rank{'s' * several} {ranks} first depart{'s' * (not several)} "
                f"at step {first.step}, {first.op} {first.slot} ({first.reason or 'values differ'}); "
                f"{self.total_departures} inconsistent tensor{'s' * (self.total_departures != 1)}")


def kept_identical(op) -> bool:
    """Whether data parallelism keeps this op's tensors identical on every rank (see the module docstring)."""
    return op.direction == OPTIMIZER or _collective(op.type, _SAME_ON_EVERY_RANK)


def _collective(op_type: str, kinds) -> bool:
    word = op_type.lower().rsplit(".", 1)[-1].replace("_", "")
    return word.startswith(kinds)


def _slots(op) -> list[str]:
    """The slots compared: all of an optimizer update's, the outputs of a collective."""
    if op.direction == OPTIMIZER:
        return [t.slot for t in op.tensors]
    return [t.slot for t in op.tensors if t.kind == "output"]


def check_consistency(path: str, dumps: list, limit: int | None = None) -> ConsistencyReport:
    """Compare, across ``dumps`` (rank order), every tensor data parallelism keeps identical."""
    report = ConsistencyReport(path, len(dumps))
    steps = sorted(set.intersection(*(set(d.step_numbers()) for d in dumps))) if dumps else []
    report.steps = len(steps)
    for step in steps:
        for departure in _step_departures(step, dumps, report):
            report.total_departures += 1
            if limit is None or len(report.departures) < limit:
                report.departures.append(departure)
    return report


def _step_departures(step: int, dumps: list, report: ConsistencyReport):
    per_rank = [{(op.name, op.direction): op for op in d.ops(step) if kept_identical(op)} for d in dumps]
    keys = sorted(set().union(*per_rank), key=lambda k: _order(k, per_rank))
    for key in keys:
        ops = [ops.get(key) for ops in per_rank]
        present = [r for r, op in enumerate(ops) if op is not None]
        first = ops[present[0]]
        if len(present) < len(ops):
            missing = [r for r, op in enumerate(ops) if op is None]
            yield RankDeparture(step, first.exec_index, first.name, first.type, first.direction, "",
                                tuple(missing), tuple(present), None,
                                f"missing on rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}")
            continue
        report.ops_checked += 1
        for slot in _slots(first):
            report.tensors_checked += 1
            departure = _slot_departure(step, dumps, ops, slot)
            if departure is not None:
                yield departure


def _order(key, per_rank) -> tuple:
    op = next(ops[key] for ops in per_rank if key in ops)
    return (op.exec_index, op.name)


def _slot_departure(step: int, dumps: list, ops: list, slot: str) -> RankDeparture | None:
    first = ops[0]
    records = [next((t for t in op.tensors if t.slot == slot), None) for op in ops]
    if any(r is None for r in records):
        missing = tuple(i for i, r in enumerate(records) if r is None)
        return RankDeparture(step, first.exec_index, first.name, first.type, first.direction, slot, missing,
                             tuple(i for i, r in enumerate(records) if r is not None), None, f"{slot} not recorded")
    if all(r.has_data for r in records):
        values = [d.tensor(step, op.exec_index, slot) for d, op in zip(dumps, ops)]
        groups = _groups(values, _same_values)
    else:
        values = None
        groups = _groups([_stats_key(r) for r in records], lambda a, b: a == b)
    if len(groups) == 1:
        return None
    departing, reason = _departing(groups, dumps, ops, slot, values)
    agreeing = tuple(r for r in range(len(ops)) if r not in departing)
    diff = None
    if values is not None and agreeing:
        a, b = values[departing[0]], values[agreeing[0]]
        diff = _max_abs_diff(a, b)
    return RankDeparture(step, first.exec_index, first.name, first.type, first.direction, slot, departing,
                         agreeing, diff, reason)


def _departing(groups: list[list[int]], dumps, ops, slot, values) -> tuple[tuple[int, ...], str]:
    """The ranks that left the others, and why they are the ones."""
    first = ops[0]
    if values is not None and slot.startswith("output") and _collective(first.type, _REDUCING):
        inputs = [d.tensor(op.step, op.exec_index, "input_0") if any(t.slot == "input_0" for t in op.tensors)
                  else None for d, op in zip(dumps, ops)]
        if all(i is not None and i.shape == inputs[0].shape for i in inputs):
            wrong = tuple(r for r, value in enumerate(values) if not _is_reduction(value, inputs))
            if 0 < len(wrong) < len(values):
                return wrong, "not the mean or sum of the ranks' inputs"
    largest = max(len(g) for g in groups)
    majority = [g for g in groups if len(g) == largest]
    if len(majority) == 1:
        return tuple(sorted(r for g in groups if g is not majority[0] for r in g)), "differs from the other ranks"
    return tuple(range(len(ops))), "no majority: the ranks split into groups of equal size"


def _is_reduction(value: np.ndarray, inputs: list[np.ndarray]) -> bool:
    if value.shape != inputs[0].shape:
        return False
    total = np.sum(np.stack([np.asarray(i, dtype=np.float64) for i in inputs]), axis=0)
    scale = float(np.max(np.abs(total))) if total.size else 0.0
    tolerance = 1e-5 * max(scale, 1e-30) * len(inputs)
    for expected in (total / len(inputs), total):  # float32 summation order may differ from float64's
        with np.errstate(all="ignore"):
            if np.allclose(np.asarray(value, dtype=np.float64), expected, rtol=1e-5, atol=tolerance):
                return True
    return False


def _groups(items: list, same) -> list[list[int]]:
    groups: list[list[int]] = []
    for rank, item in enumerate(items):
        for group in groups:
            if same(items[group[0]], item):
                group.append(rank)
                break
        else:
            groups.append([rank])
    return groups


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _stats_key(record) -> tuple:
    stats = record.stats
    return (record.dtype, tuple(record.shape), *(repr(float(getattr(stats, name)))
                                                 for name in ("min", "max", "mean", "std", "norm")),
            int(stats.nan), int(stats.inf))


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.shape != b.shape:
        return None
    with np.errstate(all="ignore"):
        diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    finite = diff[np.isfinite(diff)]
    return float(finite.max()) if finite.size else None
