"""Scoring many small tensor pairs at once: the packed tensors of two dump files.

A real model has tens of thousands of small tensors; scored one by one, each
pair costs tens of microseconds of Python (find it in the index, slice its
pack, call the kernel, fold the sums) for a few microseconds of arithmetic.
Schema 2 dumps store a step's small tensors back to back in a few pack
datasets (`precision_tool.dump.packs`), so a window of pairs is a table of
(pack, offset, kind, count) rows over a few mapped buffers per side: one call
of the C kernel (``_native.pairs_sums``, GIL released) computes every pair's
float64 sums, exactly as `PairAccumulator` computes them for the same values,
and the rows are built from the sums.

What the batch does not take goes through `comparator.score_pair` as before:
pairs from other sources (msprobe dumps), shape mismatches, statistics only,
loss-scaled gradients, tensors larger than a chunk or stored in their own
dataset, dtypes other than float16/bfloat16/float32/float64, and any pair the
kernel hands back (a NaN or inf, an index row pointing outside its pack).
Without the C extension nothing is batched.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from precision_tool import native
from precision_tool.compare.cancel import raise_if_interrupted
from precision_tool.compare.matching import TensorPair
from precision_tool.compare.metrics import kl_shift, metrics_from_sums
from precision_tool.compare.report import TensorRow
from precision_tool.compare.rows import pair_row, relative_error_floor
from precision_tool.dump import integrity

WINDOW = 4096  # pairs per kernel call: their packs stay a few mapped segments, whatever the dump size
KINDS = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}  # _native.c's K_F32 ... K_BF16
# (relative, absolute per value) of `integrity.norm_agrees`, by kind code
_TOLERANCES = np.array([integrity.NORM_TOLERANCE.get(name, integrity.BASE_TOLERANCE) for name in KINDS])


def score_packed(pairs: list[TensorPair], golden, target, chunk_elements: int, scales: list[float],
                 rows: list[TensorRow | None], done: Callable[[TensorPair], None] | None = None) -> None:
    """Fill ``rows[i]`` for every pair the batch can score (``rows`` starts all None); the rest stay None.

    ``done(pair)`` is called for each pair scored, for progress.
    """
    from precision_tool.dump.reader import Dump

    kernel = native.extension
    if kernel is None or not (isinstance(golden, Dump) and isinstance(target, Dump)):
        return
    chosen = [i for i, pair in enumerate(pairs) if scales[i] == 1.0 and _batchable(pair, chunk_elements)]
    for start in range(0, len(chosen), WINDOW):
        raise_if_interrupted()  # Ctrl-C: within one window
        window = chosen[start:start + WINDOW]
        _score_window(kernel, [pairs[i] for i in window], window, golden, target, rows, done)


def _batchable(pair: TensorPair, chunk_elements: int) -> bool:
    t, g = pair.target, pair.golden
    return (t.has_data and g.has_data and t.dtype in KINDS and g.dtype in KINDS and tuple(t.shape) == tuple(g.shape)
            and math.prod(t.shape) <= chunk_elements)


def _score_window(kernel, pairs: list[TensorPair], positions: list[int], golden, target,
                  rows: list[TensorRow | None], done) -> None:
    x_packs, x_table, x_rows = _locate(target, [(p.target_op.step, p.target.index_row) for p in pairs])
    y_packs, y_table, y_rows = _locate(golden, [(p.golden_op.step, p.golden.index_row) for p in pairs])
    usable = (x_table[:, 2] >= 0) & (y_table[:, 2] >= 0)
    if not usable.any():
        return
    keep = np.flatnonzero(usable)
    pairs = [pairs[i] for i in keep.tolist()]
    positions = [positions[i] for i in keep.tolist()]
    n = len(pairs)
    table = np.empty((n, 7), np.int64)
    table[:, 0:3] = x_table[keep]
    table[:, 3:6] = y_table[keep]
    table[:, 6] = [math.prod(p.target.shape) for p in pairs]
    params = np.empty((n, 5))
    floors: dict[str, float] = {}
    for i, p in enumerate(pairs):
        ts, gs, dtype = p.target.stats, p.golden.stats, p.golden.dtype
        floor = floors.get(dtype)
        if floor is None:
            floor = floors[dtype] = relative_error_floor(dtype)
        params[i] = (*kl_shift(ts.min, ts.max), *kl_shift(gs.min, gs.max), floor)
    sums = np.empty((n, kernel.N_SUMS))
    status = np.empty(n, np.int8)
    kernel.pairs_sums(tuple(x_packs), tuple(y_packs), table, params, sums, status)
    _check_norms(pairs, status == 0, sums, table, ((target, x_rows, keep, 2, 2), (golden, y_rows, keep, 3, 5)))
    for pair, position, ok, s in zip(pairs, positions, status.tolist(), sums.tolist()):
        if ok:
            continue  # a NaN or inf, or a row outside its pack: score_pair deals with it
        count, sxy, sxx, syy, sdd, sum_abs, max_abs, sum_rel, max_rel, rel_count, kl_u, kl_v, kl_s = s[:13]
        metrics = metrics_from_sums(int(count), int(rel_count), sxy, sxx, syy, sdd, sum_abs, max(0.0, max_abs),
                                    sum_rel, max(0.0, max_rel), kl_s, kl_u, kl_v)
        rows[position] = pair_row(pair, 1.0, metrics)
        if done is not None:
            done(pair)


def _check_norms(pairs: list[TensorPair], scored: np.ndarray, sums: np.ndarray, table: np.ndarray, sides) -> None:
    """InputError (`integrity.check_norm`) for the first scored pair, target side first, whose sum of squares
    is not what its index row's norm says: a pack read at a wrong offset or in a wrong dtype. Vectorised over
    the window; ``sides`` holds (dump, its rows' statistics or None: not checked, the window's kept pairs,
    column of Σx² in ``sums``, column of the kind in ``table``) for target and golden."""
    flagged = np.zeros(len(pairs), bool)
    for _, stats, keep, column, kind in sides:
        if stats is None:
            continue
        stats = stats[keep]
        count, norm = stats["count"], stats["norm"]
        relative, absolute = _TOLERANCES[table[:, kind]].T
        with np.errstate(invalid="ignore", over="ignore"):  # the sums of pairs not scored are not set
            found = np.sqrt(sums[:, column])
            close = np.isfinite(found) & (np.abs(found - norm) <= relative * np.fmax(found, norm)
                                          + absolute * np.sqrt(count))
        flagged |= scored & (count > 0) & ((stats["nan"] > 0) | (stats["inf"] > 0) | ~close)
    for i in np.flatnonzero(flagged).tolist():  # the scalar check says the same, and names the tensor
        pair = pairs[i]
        for dump, stats, _, column, _ in sides:
            if stats is not None:
                op, tensor = (pair.target_op, pair.target) if column == 2 else (pair.golden_op, pair.golden)
                integrity.check_norm(dump, op, tensor, float(sums[i, column]))


def _locate(source, keys: list[tuple[int, int]]) -> tuple[list, np.ndarray, np.ndarray | None]:
    """Packs and (pack, offset, kind) rows of tensors given as (step, index row) in one dump, step by step, and
    the statistics of those rows where the dump's values are checked against them (`integrity.checked`)."""
    table = np.full((len(keys), 3), -1, np.int64)
    packs: list = []
    stats = np.zeros(len(keys), _STATS) if integrity.checked(source) else None
    by_step: dict[int, list[int]] = {}
    for i, (step, _) in enumerate(keys):
        by_step.setdefault(step, []).append(i)
    for step, members in by_step.items():
        rows = np.array([keys[i][1] for i in members], np.int64)
        step_packs, step_table = source.packed_table(step, rows, KINDS)
        found = step_table[:, 2] >= 0
        step_table[found, 0] += len(packs)
        table[members] = step_table
        packs.extend(step_packs)
        if stats is not None and found.any():
            index_rows = source.step_index(step).tensor_rows
            members = np.array(members)[found]
            for name in _STATS.names:
                stats[name][members] = index_rows[name][rows[found]]
    return packs, table, stats


_STATS = np.dtype([("count", "<u8"), ("norm", "<f8"), ("nan", "<u8"), ("inf", "<u8")])
