"""Matching two dumps op by op from their index columns, without a record per op: the streaming comparison's plan.

For each step, each side's selected ops become a few numpy columns read a
window at a time (`precision_tool.dump.windows`): the op's row, a 64-bit key
of (direction, name) and whether it is fused. The k-th target op of a key
pairs with the k-th golden op of the same key, as `matching._Matcher` pairs
them; the names themselves are compared again when the records of a window are
built (a key collision then ends the streaming). What it keeps is about 24
bytes per op: the matched rows of both sides, for the whole comparison.

A fused target op whose name golden lacks is matched through the ops it
replaced: that is the record-based matcher's work (`StreamUnsupported`).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field

import numpy as np

from precision_tool.compare.judged import NEAR_ZERO_RATIO, SENTINEL
from precision_tool.dump.records import MODULE_TYPE_PREFIX
from precision_tool.dump.windows import StepTables, TablesUnsupported

COLUMN_WINDOW = 16384  # op_index / index rows read at a time for the plan
_FLOATS = (b"float16", b"bfloat16", b"float32", b"float64")
_NOT_DATA = (b"uint8", b"int8", b"bool")


class StreamUnsupported(TablesUnsupported):
    """These dumps (or options) need the record-based comparison."""


@dataclass
class SideColumns:
    """One step of one side: its selected ops' rows, keys and fusion flags."""

    rows: np.ndarray  # op_index rows, increasing
    keys: np.ndarray  # int64 key of (direction, name)
    fused: np.ndarray  # bool


@dataclass
class StepPlan:
    """One step's matching: the matched op rows of both sides, in target order, and the rows left over."""

    step: int
    target: StepTables
    golden: StepTables
    target_rows: np.ndarray  # matched target op rows, increasing
    golden_rows: np.ndarray  # their golden partners
    unmatched_target: np.ndarray  # target op rows without a golden op of their name
    unmatched_golden: np.ndarray  # golden op rows no target op matched
    selected: tuple[int, int] = (0, 0)  # selected ops (golden, target)
    candidates: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # target rows: near-zero writers?


def side_columns(tables: StepTables, pattern: str | None) -> SideColumns:
    """The selected ops of one step of one side (``pattern``: compare --ops)."""
    rows, keys, fused = [], [], []
    last = -1
    for start in range(0, tables.n_ops, COLUMN_WINDOW):
        stop = min(tables.n_ops, start + COLUMN_WINDOW)
        columns = tables.op_columns(start, stop, ["exec_index", "direction", "name", "fusion"])
        executions = columns["exec_index"].astype(np.int64)
        if len(executions) and (executions[0] <= last or (np.diff(executions) <= 0).any()):
            raise StreamUnsupported("execution indices out of order")  # the reader sorts, or names a repeat
        last = int(executions[-1]) if len(executions) else last
        names, directions, fusion = columns["name"].tolist(), columns["direction"].tolist(), columns["fusion"]
        chosen = np.arange(start, stop)
        if pattern:
            keep = [_selected(name, text, pattern) for name, text in zip(names, fusion.tolist())]
            chosen = chosen[np.array(keep, bool)]
            names = [n for n, k in zip(names, keep) if k]
            directions = [d for d, k in zip(directions, keep) if k]
            fusion = fusion[np.array(keep, bool)]
        rows.append(chosen)
        keys.append(np.fromiter(map(hash, zip(directions, names)), np.int64, count=len(names)))
        fused.append(fusion != b"")
    if not rows:
        return SideColumns(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
    return SideColumns(np.concatenate(rows), np.concatenate(keys), np.concatenate(fused))


def _selected(name: bytes, fusion: bytes, pattern: str) -> bool:
    """`selection.op_matches` on an op_index row: its name, or a name it was fused from."""
    names = [name.decode("utf-8")]
    if fusion:
        try:
            names += list(json.loads(fusion.decode("utf-8")).get("original_names", ()))
        except (UnicodeDecodeError, ValueError, AttributeError):
            raise StreamUnsupported("a fusion column the reader would refuse") from None
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def plan_step(step: int, golden: StepTables, target: StepTables, pattern: str | None) -> StepPlan:
    """Pair the k-th target op of each (direction, name) with the k-th golden one."""
    g, t = side_columns(golden, pattern), side_columns(target, pattern)
    order_g = np.argsort(g.keys, kind="stable")
    sorted_g = g.keys[order_g]
    order_t = np.argsort(t.keys, kind="stable")
    sorted_t = t.keys[order_t]
    rank = np.empty(len(t.keys), np.int64)  # the occurrence of each target op among ops of its key
    rank[order_t] = np.arange(len(sorted_t)) - np.searchsorted(sorted_t, sorted_t, "left")
    at = np.searchsorted(sorted_g, t.keys, "left") + rank
    found = at < np.searchsorted(sorted_g, t.keys, "right")
    if (t.fused & ~found).any():
        raise StreamUnsupported("a fused op matched through the ops it replaced")
    partners = order_g[at[found]]
    golden_matched = np.zeros(len(g.keys), bool)
    golden_matched[partners] = True
    return StepPlan(step, target, golden, t.rows[found], g.rows[partners], t.rows[~found], g.rows[~golden_matched],
                    (len(g.rows), len(t.rows)))


def near_zero_candidates(plan: StepPlan) -> np.ndarray:
    """Target rows whose golden partner has an output that `judged.near_zero` may find near zero.

    Only what the golden statistics decide (an op, not a module; a float output whose norm is below
    NEAR_ZERO_RATIO of its largest input norm); the error condition is the scoring's.
    """
    tables = plan.golden
    scale = np.zeros(tables.n_ops)
    outputs = []
    names = ["op", "kind", "dtype", "count", "min", "max", "norm"]
    for start in range(0, tables.n_tensors, COLUMN_WINDOW):
        c = tables.tensor_columns(start, min(tables.n_tensors, start + COLUMN_WINDOW), names)
        op = c["op"].astype(np.int64)
        if (op >= tables.n_ops).any():
            raise StreamUnsupported("an index row past the end of op_index")
        with np.errstate(invalid="ignore"):  # NaN counts as bounded: candidates may be too many, never too few
            bounded = ~(np.fmax(np.abs(c["min"]), np.abs(c["max"])) >= SENTINEL)
        usable = (c["kind"] == 0) & np.isin(c["dtype"], _FLOATS) & (c["count"] > 0) & np.isfinite(c["norm"]) & bounded
        np.maximum.at(scale, op[usable], c["norm"][usable])
        keep = (c["kind"] == 1) & (c["count"] > 0) & np.isfinite(c["norm"]) & ~np.isin(c["dtype"], _NOT_DATA)
        outputs.append((op[keep], c["norm"][keep]))
    if not outputs:
        return np.zeros(0, np.int64)
    op = np.concatenate([o for o, _ in outputs])
    norm = np.concatenate([n for _, n in outputs])
    ops = np.unique(op[(scale[op] > 0) & (norm < NEAR_ZERO_RATIO * scale[op])])
    if not len(ops):
        return np.zeros(0, np.int64)
    modules = np.zeros(len(ops), bool)
    for start in range(0, tables.n_ops, COLUMN_WINDOW):
        inside = (ops >= start) & (ops < start + COLUMN_WINDOW)
        if inside.any():
            types = tables.op_columns(start, min(tables.n_ops, start + COLUMN_WINDOW), ["type"])["type"]
            modules[inside] = np.char.startswith(types[ops[inside] - start], MODULE_TYPE_PREFIX.encode())
    ops = ops[~modules]
    return plan.target_rows[np.isin(plan.golden_rows, ops)]
