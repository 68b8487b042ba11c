"""Whether a tensor's stored values are those its index row describes: the norm check of a marked dump.

A dump whose writer promises that every index row's statistics were taken
from the very values it stores carries the root attribute
``stats_match_data = true`` (`layout.STATS_MATCH_DATA`; `DumpWriter` sets it
unless told otherwise). For such a dump, values read at a wrong pack offset,
in a wrong dtype or from damaged bytes show as an L2 norm (or NaN/inf counts)
grossly unlike the row's, and the dump is refused (InputError) rather than
scored. Dumps without the mark are never checked: torch dumps written before
the capture copied the inputs an op writes undeclared (BatchNorm's running
statistics, an LSTM workspace) legitimately stored those values after the
kernel and their statistics before it; msprobe directories and in-memory
dumps have no mark either.

The comparator already sums the squares of both sides of every pair it scores
(`compare.batch`, `compare.comparator.score_pair`): `check_norm` costs a few
float operations there. `check_values` reads a tensor again, for the rare
pair whose sums do not give one side's norm (NaN or inf values), and
`check_dump` reads every tensor of a dump (tests, tools).

Tolerances (`NORM_TOLERANCE`): the writer takes statistics before storing,
so values not exact in their dtype are rounded (float16) or truncated
(bfloat16) after: a relative change up to the format's unit (doubled for
margin), and values below its smallest subnormal may become 0 (an absolute
term per value). Sums taken in another order, and statistics summed in
float32 blocks (`torch.tensors.array_stats` without the C extension, 1e-5
at worst), stay inside the base relative 1e-4. A misread is off by orders
of magnitude, or not finite.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from precision_tool import native
from precision_tool.dump.layout import STATS_FIELDS, slot_name
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats
from precision_tool.engine.hooks import DIRECTIONS
from precision_tool.errors import InputError

_native = native.extension
_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))  # what its stats_rows reads (native byte order)
BASE_TOLERANCE = (1e-4, 0.0)  # (relative, absolute per value): float32, float64, integers, bool
NORM_TOLERANCE = {"float16": (1e-3 + 1e-4, 6e-8), "bfloat16": (1.6e-2, 1e-38), "float32": (1e-4, 1.5e-45),
                  "float64": BASE_TOLERANCE}


def checked(source) -> bool:
    """Whether ``source``'s tensors are checked against their index rows: a dump file carrying the mark."""
    return getattr(source, "stats_match_data", False) is True


def norm_agrees(stats: TensorStats, dtype: str, squares: float) -> bool:
    """Whether ``squares`` (the sum of a tensor's squared values, all of them finite) fits its row's
    statistics: a row with statistics not taken (count 0) fits anything, one counting NaN or inf does not."""
    if not stats.count:
        return True
    if stats.nan or stats.inf:
        return False
    return _close(stats, dtype, squares)


def _close(stats: TensorStats, dtype: str, squares: float) -> bool:
    norm, found = stats.norm, math.sqrt(squares) if squares >= 0.0 else math.nan
    relative, absolute = NORM_TOLERANCE.get(dtype, BASE_TOLERANCE)
    slack = relative * max(found, norm) + absolute * math.sqrt(stats.count)
    return math.isfinite(found) and abs(found - norm) <= slack  # (NaN: False too)


def check_norm(dump, op: OpRecord, tensor: TensorRecord, squares: float) -> None:
    """InputError when ``squares`` (Σx² of the tensor's values, all finite) is not what its row says."""
    if not norm_agrees(tensor.stats, tensor.dtype, squares):
        found = math.sqrt(squares) if squares >= 0.0 else math.nan
        refuse(dump, op, tensor, f"have L2 norm {found:.6g}", _row_says(tensor.stats))


def check_values(dump, op: OpRecord, tensor: TensorRecord, chunks: Iterable[np.ndarray]) -> None:
    """InputError when the tensor's values (``chunks``, read again) are not what its row says: the NaN and
    inf counts, and the L2 norm of the finite values."""
    stats = tensor.stats
    if not stats.count:
        return
    nan = inf = 0
    squares = 0.0
    for chunk in chunks:
        values = np.ravel(chunk)
        if values.dtype.kind == "f":
            finite = np.isfinite(values)
            if not finite.all():
                nan += int(np.count_nonzero(np.isnan(values)))
                inf += int(np.count_nonzero(np.isinf(values)))
                values = values[finite]
        wide = values.astype(np.float64)
        squares += float(np.dot(wide, wide))
    norm_ok = _close(stats, tensor.dtype, squares) if math.isfinite(stats.norm) else squares == 0.0
    if (nan, inf) != (stats.nan, stats.inf) or not norm_ok:
        if not (nan or inf or stats.nan or stats.inf):  # as `check_norm` says it
            refuse(dump, op, tensor, f"have L2 norm {math.sqrt(squares):.6g}", f"{stats.norm:.6g}")
        found = f"have {nan} NaN, {inf} inf and an L2 norm of the rest of {math.sqrt(squares):.6g}"
        refuse(dump, op, tensor, found, f"{stats.nan} NaN, {stats.inf} inf and {stats.norm:.6g}")


def check_read(dump, step: int, row: int, dtype: str, index_row, values: np.ndarray) -> None:
    """`check_values` of one tensor `Dump.tensor` has just read from a marked dump, by its raw index row:
    what the shell, zoom and the analysis read is checked as what compare scores. Finite float32/float64
    values take the C extension's one pass (no float64 copy); the rest, and any disagreement, numpy's."""
    stats = TensorStats(*(index_row[name].item() for name in STATS_FIELDS))
    flat = values.reshape(-1)
    if _native is not None and flat.size and flat.dtype in _NATIVE and flat.flags.c_contiguous:
        sums = _native.stats_rows((flat,), 0.0)[0]  # None: a value is not finite (or a variance below 0)
        if sums is not None and norm_agrees(stats, dtype, sums[5] * sums[5]):
            return
    index = dump.step_index(step)
    op_row = index.op_rows[int(index_row["op"])]
    op = OpRecord(step, int(op_row["exec_index"]), op_row["name"].decode("utf-8", "replace"), "",
                  DIRECTIONS[int(op_row["direction"])], "", False)
    slot = slot_name(int(index_row["kind"]), int(index_row["slot"]))
    check_values(dump, op, TensorRecord(slot, dtype, tuple(values.shape), stats, True, row), (values,))


def refuse(dump, op: OpRecord, tensor: TensorRecord, found: str, says: str) -> None:
    where = dump.stored_where(op.step, tensor.index_row)
    raise InputError(dump.path, f"{where}: the values of step {op.step} op {op.name} ({op.direction}) "
                                f"{tensor.slot} {found} where the index row says {says}: a damaged "
                                f"{'pack' if '/packs/' in where else 'dataset'} or index row")


def _row_says(stats: TensorStats) -> str:
    if stats.nan or stats.inf:
        return f"{stats.nan} NaN and {stats.inf} inf"
    return f"{stats.norm:.6g}"


def check_dump(dump, chunk_elements: int = 1 << 22) -> int:
    """Read every tensor with data of an opened dump file and `check_values` it, marked or not; return how
    many were checked. InputError names the first that disagrees with its row."""
    checked_tensors = 0
    for op in dump.ops():
        for tensor in op.tensors:
            if tensor.has_data:
                check_values(dump, op, tensor, dump.tensor_chunks(op.step, op.exec_index, tensor.slot,
                                                                  chunk_elements))
                checked_tensors += 1
    return checked_tensors
