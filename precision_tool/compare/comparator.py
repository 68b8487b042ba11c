"""Comparing a target dump with a golden dump: match, then one streaming pass per tensor pair.

Each pair is read chunk by chunk (``tensor_chunks``) into a `PairAccumulator`,
so peak memory is a few chunks, whatever the dump size; from a dump file,
float32 and float64 chunks are views of the file mapped into memory, read
straight from the page cache by the metric kernel. With ``jobs > 1`` pairs
are scored on a thread pool: the metric kernel (C or numpy) releases the GIL
while it computes; h5py calls are serialised by one lock (h5py has a global
lock anyway). Ctrl-C cancels the queued pairs at once and stops the running
ones at their next chunk (`precision_tool.compare.cancel`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np

from precision_tool.bulk import bulk_objects
from precision_tool.compare.batch import score_packed
from precision_tool.compare.cancel import StopFlag, pool_map, raise_if_interrupted
from precision_tool.compare.judged import (gradient_scale, loss_scale_ratios, skip_consumed_near_zero, skip_misaligned,
                                          statistics_only)
from precision_tool.compare.matching import TensorPair, match_ops
from precision_tool.compare.metrics import PairAccumulator
from precision_tool.compare.report import SHAPE_MISMATCH, CompareReport, DumpInfo, OpComparison, TensorRow
from precision_tool.compare.rows import pair_row, relative_error_floor
from precision_tool.compare.selection import select_ops
from precision_tool.compare.stats import compare_stats
from precision_tool.defaults import COMPARE_CHUNK_ELEMENTS, COMPARE_JOBS, COMPARE_POOL_MIN_ELEMENTS
from precision_tool.dump import integrity
from precision_tool.dump.records import OpRecord
from precision_tool.errors import ConfigError

Progress = Callable[[int, int], None]  # (elements done, elements in all)


class DumpSource(Protocol):
    """What the comparator needs of a dump (`precision_tool.dump.reader` provides it)."""

    path: str
    mode: str

    def ops(self, step: int | None = None, direction: str | None = None) -> list[OpRecord]: ...
    def tensor_chunks(self, step: int, exec_index: int, slot: str, max_elements: int) -> Iterator[np.ndarray]: ...


@dataclass(frozen=True)
class CompareOptions:
    """What to compare and how; every field has a library default."""

    steps: frozenset[int] | None = None  # None: every step
    ops: str | None = None  # glob on op names (or the names a fused op replaced)
    chunk_elements: int = COMPARE_CHUNK_ELEMENTS
    jobs: int = COMPARE_JOBS
    scheduler: object = None  # a Dask scheduler address (or distributed.Client): score the pairs on its workers

    def __post_init__(self):
        if self.jobs < 1:
            raise ConfigError(f"jobs must be at least 1, not {self.jobs}")
        if self.chunk_elements < 1:
            raise ConfigError(f"chunk size must be at least 1 element, not {self.chunk_elements}")


def compare_dumps(golden, target, options: CompareOptions | None = None,
                  progress: Progress | None = None) -> CompareReport:
    """Compare two dumps, given as paths (opened read-only here) or as opened dumps.

    A missing or broken file raises the reader's InputError.
    """
    from contextlib import ExitStack

    from precision_tool.dump.reader import open_dump

    with ExitStack() as stack:
        sides = [side if hasattr(side, "tensor_chunks") else stack.enter_context(open_dump(side))
                 for side in (golden, target)]
        return compare_sources(sides[0], sides[1], options, progress)


def compare_sources(golden: DumpSource, target: DumpSource, options: CompareOptions | None = None,
                    progress: Progress | None = None) -> CompareReport:
    """Compare two opened dumps (anything with the reader's ``ops`` and ``tensor_chunks``)."""
    with bulk_objects():  # records and rows by the ten thousand, no cycles among them
        return _compare_sources(golden, target, options or CompareOptions(), progress)


def _compare_sources(golden: DumpSource, target: DumpSource, options: CompareOptions,
                     progress: Progress | None) -> CompareReport:
    golden_ops = select_ops(golden.ops(), options.steps, options.ops)
    target_ops = select_ops(target.ops(), options.steps, options.ops)
    match = match_ops(golden_ops, target_ops)
    rows = _score_pairs(match.pairs, golden, target, options, progress, loss_scale_ratios(golden, target))
    rows = skip_misaligned(match.pairs, skip_consumed_near_zero(match.pairs, rows))
    report = CompareReport(
        golden=dump_info(golden), target=dump_info(target), ops=_group(match.pairs, rows),
        unmatched_golden=match.unmatched_golden, unmatched_target=match.unmatched_target,
        covered_by_fusion=match.covered_by_fusion,
        stats_only=any(statistics_only(row) for row in rows),
    )
    report.notes.extend(compare_notes(report.golden, report.target, report.stats_only,
                                      (len(golden_ops), len(target_ops)), bool(match.pairs)))
    return report


def dump_info(source: DumpSource) -> DumpInfo:
    mode = str(getattr(source, "mode", "dump"))
    modes = tuple(str(m) for m in (getattr(source, "modes", None) or [mode]))
    return DumpInfo(str(source.path), mode, str(getattr(source, "role", "")), modes)


def _size(pair: TensorPair) -> int:
    return math.prod(pair.target.shape) if pair.target.has_data and pair.golden.has_data else 0


def _score_pairs(pairs: list[TensorPair], golden: DumpSource, target: DumpSource, options: CompareOptions,
                 progress: Progress | None, ratios: dict[int, float] | None = None) -> list[TensorRow]:
    total = sum(_size(pair) for pair in pairs)
    lock = threading.Lock()
    done = 0

    def pair_scale(pair: TensorPair) -> float:
        if ratios and pair.target_op.direction == "backward":
            return gradient_scale(pair.target, pair.golden, ratios.get(pair.target_op.step, 1.0))
        return 1.0

    def score(pair: TensorPair, stop: StopFlag | None = None) -> TensorRow:
        return score_pair(pair, golden, target, options.chunk_elements, lock, stop, pair_scale(pair))

    def report(row_pair):
        nonlocal done
        done += _size(row_pair)
        if progress is not None:
            progress(done, total)

    if options.scheduler is not None:
        from precision_tool.compare.cluster import score_on_cluster

        scales = [1.0] * len(pairs)
        if ratios:
            scales = [gradient_scale(p.target, p.golden, ratios.get(p.target_op.step, 1.0))
                      if p.target_op.direction == "backward" else 1.0 for p in pairs]
        return score_on_cluster(options.scheduler, score_pair, pairs, scales, golden, target, options.chunk_elements,
                                [_size(p) for p in pairs], report)
    scales = [pair_scale(pair) for pair in pairs]
    rows: list[TensorRow | None] = [None] * len(pairs)
    raise_if_interrupted()
    score_packed(pairs, golden, target, options.chunk_elements, scales, rows, report)  # most small tensors
    rest = [i for i, row in enumerate(rows) if row is None]
    rest_total = sum(_size(pairs[i]) for i in rest)
    if options.jobs == 1 or len(rest) < 2 or rest_total < COMPARE_POOL_MIN_ELEMENTS * len(rest):
        for i in rest:
            rows[i] = score(pairs[i])
            report(pairs[i])
        return rows
    with pool_map(lambda i, stop=None: score(pairs[i], stop), rest, options.jobs, "compare") as results:
        for i, row in zip(rest, results):  # Ctrl-C cancels the queued pairs
            rows[i] = row
            report(pairs[i])
    return rows


def score_pair(pair: TensorPair, golden: DumpSource, target: DumpSource, chunk_elements: int,
               read_lock: threading.Lock | None = None, stop: StopFlag | None = None,
               loss_scale: float = 1.0) -> TensorRow:
    """One tensor pair's row: metrics from one pass over its chunks, or stats deltas, or a problem.

    ``loss_scale`` is divided out of the target's values first (a loss-scaled gradient); rows that are
    compared but not judged carry the reason in ``skip`` (`precision_tool.compare.judged`).
    """
    t, g = pair.target, pair.golden
    if tuple(t.shape) != tuple(g.shape):
        return pair_row(pair, loss_scale, problem=SHAPE_MISMATCH)
    if not (t.has_data and g.has_data):
        return pair_row(pair, loss_scale, stats=compare_stats(t.stats, g.stats, loss_scale))
    target_range = (t.stats.min / loss_scale, t.stats.max / loss_scale)
    accumulator = PairAccumulator(target_range, (g.stats.min, g.stats.max),
                                  relative_error_floor(g.dtype), check_finite=not (t.stats.finite and g.stats.finite))
    target_chunks = _chunks(target, pair.target_op, t.slot, chunk_elements)
    if loss_scale != 1.0:
        target_chunks = (chunk / loss_scale for chunk in target_chunks)
    golden_chunks = _chunks(golden, pair.golden_op, g.slot, chunk_elements)
    if math.prod(t.shape) <= chunk_elements:  # one chunk each (most tensors): no streaming machinery
        _check_stop(stop)
        with read_lock or _NO_LOCK:
            x, y = _whole(target_chunks), _whole(golden_chunks)
        if x.size != y.size:
            raise ValueError("the two tensors hold different numbers of elements")
        if x.size:
            accumulator.update(x, y)
    else:
        for x, y in aligned_chunks(_locked(target_chunks, read_lock), _locked(golden_chunks, read_lock)):
            _check_stop(stop)  # Ctrl-C: a running pair ends within one chunk, not at its last
            accumulator.update(x, y)
    metrics = accumulator.result()
    _check_values(pair, golden, target, accumulator, loss_scale, chunk_elements, read_lock)
    return pair_row(pair, loss_scale, metrics)


def _check_values(pair: TensorPair, golden: DumpSource, target: DumpSource, accumulator: PairAccumulator,
                  loss_scale: float, chunk_elements: int, read_lock) -> None:
    """InputError when a side of a dump marked so (`integrity.checked`) holds values its index row does not
    describe: Σx² (times the loss scale divided out) against the row's norm, or, where the sums leave out
    pairs holding a NaN or inf, that side's values read again against its NaN and inf counts and norm."""
    for source, op, tensor, squares in ((target, pair.target_op, pair.target, accumulator.sxx * loss_scale ** 2),
                                        (golden, pair.golden_op, pair.golden, accumulator.syy)):
        if not (integrity.checked(source) and tensor.stats.count):
            continue
        if tensor.stats.finite and not accumulator.nonfinite_pairs:
            integrity.check_norm(source, op, tensor, squares)
        else:
            with read_lock or _NO_LOCK:
                integrity.check_values(source, op, tensor, _chunks(source, op, tensor.slot, chunk_elements))


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


def _check_stop(stop: StopFlag | None) -> None:
    if stop is not None:
        stop.check()
    else:
        raise_if_interrupted()


def _whole(chunks: Iterator[np.ndarray]) -> np.ndarray:
    """The flat values of a tensor that comes in at most one chunk."""
    first = next(chunks, None)
    return np.empty(0) if first is None else np.ravel(first)


def _chunks(source: DumpSource, op: OpRecord, slot: str, chunk_elements: int) -> Iterator[np.ndarray]:
    """A tensor's chunks; a dump file maps float32/float64 ones into memory rather than copying them."""
    from precision_tool.dump.reader import Dump

    if isinstance(source, Dump):
        return source.tensor_chunks(op.step, op.exec_index, slot, chunk_elements, mapped=True)
    return source.tensor_chunks(op.step, op.exec_index, slot, chunk_elements)


def _locked(chunks: Iterator[np.ndarray], lock: threading.Lock | None) -> Iterator[np.ndarray]:
    """Pull each chunk while holding ``lock``, so only one thread reads at a time."""
    if lock is None:
        yield from chunks
        return
    while True:
        with lock:
            chunk = next(chunks, None)
        if chunk is None:
            return
        yield chunk


def aligned_chunks(first: Iterator[np.ndarray], second: Iterator[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Equal-length flat pieces of two chunk streams over the same number of elements."""
    a = b = np.empty(0)
    while True:
        if a.size == 0:
            a = np.ravel(next(first, np.empty(0)))
        if b.size == 0:
            b = np.ravel(next(second, np.empty(0)))
        if a.size == 0 or b.size == 0:
            if a.size or b.size:
                raise ValueError("the two tensors hold different numbers of elements")
            return
        n = min(a.size, b.size)
        yield a[:n], b[:n]
        a, b = a[n:], b[n:]


def _group(pairs: list[TensorPair], rows: list[TensorRow]) -> list[OpComparison]:
    """Rows grouped by target op execution, in execution order."""
    groups: dict[int, tuple[OpRecord, list[TensorRow]]] = {}
    last, last_rows = None, None
    for pair, row in zip(pairs, rows):
        if pair.target_op is not last:  # an op's pairs are usually next to each other: one lookup per op
            last = pair.target_op
            last_rows = groups.setdefault(id(last), (last, []))[1]
        last_rows.append(row)
    ops = [OpComparison(op.step, op.exec_index, op.name, op.type, op.direction, tuple(op_rows),
                        op.pass_name, op.original_names)
           for op, op_rows in groups.values()]
    if not _in_order(ops):
        ops.sort(key=lambda op: (op.step, op.exec_index))
    return ops


def _in_order(ops: list[OpComparison]) -> bool:
    previous = (-1, -1)
    for op in ops:
        key = (op.step, op.exec_index)
        if key < previous:
            return False
        previous = key
    return True


def compare_notes(golden: DumpInfo, target: DumpInfo, stats_only: bool, selected: tuple[int, int],
                  paired: bool) -> list[str]:
    """The notes of a comparison: overflow-mode sides, statistics only, nothing selected or nothing matched.

    ``selected``: how many ops of golden and of target the steps and names chose; ``paired``: any tensor pair.
    """
    notes = []
    for side, info in (("golden", golden), ("target", target)):
        if "overflow" in info.modes:
            notes.append(f"the {side} dump is an overflow-mode dump: it holds only the ops that overflowed, "
                         f"so the other side's remaining ops are unmatched by design")
    if stats_only:
        notes.append("statistics only on at least one side: cosine is unavailable (n/a) there; such tensors "
                     "are flagged when |norm difference| / golden norm > 1 - c")
    if not selected[0] or not selected[1]:
        empty = "golden" if not selected[0] else "target"
        notes.append(f"the {empty} dump has no op in the selected steps and names")
    elif not paired:
        notes.append("no target op matched a golden op: are these dumps of the same model and steps?")
    return notes
