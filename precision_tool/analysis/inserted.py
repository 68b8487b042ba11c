"""A gradient scaled by an op the target's backward inserts into a group golden runs too, from statistics.

A rewritten backward group (`structure.Rewritten`) whose target runs golden's ops and, besides, an op that
writes its one float input times a constant (every statistic scaled alike: sum, norm, and the extremes), changes
the gradient by that factor where golden changes nothing: a custom autograd Function or a hook that scales what
flows back (5 % through a ResNet's activation under bfloat16). From statistics the group's results are judged
against golden's from GROUP_FLOOR_16 in a 16-bit run (its incoming gradient's noise can surface there), which a
5 % scale does not pass; the scaling op's own statistics show it exactly, whatever the noise: its output is
its input, scaled. A factor equal to the loss scale over golden's (or its inverse) is a loss scaler's.
"""

from __future__ import annotations

import math
from typing import Callable

from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.structure import fingerprint, is_copy
from precision_tool.defaults import SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import get_format

_SCALING = frozenset({"aten.mul", "aten.mul_", "aten.div", "aten.div_"})


def scaled_gradient(rewrite, members: list[OpRecord], scale_ratios: Callable[[], dict]) -> Verdict | None:
    """kernel_bug at the first op of a rewritten backward group, from statistics, that golden's sequence does
    not run and that writes its input times a constant other than 1 (module docstring); None where there is
    none. ``scale_ratios``: the target's loss scale over golden's by step, asked for where needed."""
    if rewrite.direction != "backward" or not members or any(t.has_data for r in members for t in r.tensors):
        return None
    extra = {t: rewrite.target_ops.count(t) - rewrite.golden_ops.count(t) for t in set(rewrite.target_ops)}
    if not rewrite.golden_ops or any(n > 0 and t not in _SCALING and not is_copy(t) for t, n in extra.items()):
        return None  # (another implementation of golden's ops, not golden's with a scaling inserted)
    written = {}  # fingerprint -> the group's op that wrote it
    for record in members:
        scaling = record.type in _SCALING and extra.get(record.type, 0) > 0 and \
            _from_outside(record, written)  # (the gradient handed in, not a value the group made: noise)
        for tensor in record.outputs:
            written.setdefault(fingerprint(tensor), record)
        if not scaling:
            continue
        factor = _constant_factor(record)
        ratio = scale_ratios().get(record.step, 1.0) if factor is not None else 1.0
        if factor is None or any(math.isclose(factor, r, rel_tol=1e-6) for r in (ratio, 1.0 / ratio)):
            continue
        tolerance = 4.0 * _roundoff(record)
        if abs(factor - 1.0) < SIGNIFICANT_ERROR + tolerance:
            continue
        evidence = (f"in backward of {rewrite.name}, {rewrite.describe()}",
                    f"{record.name} ({record.type}), which golden's backward does not run, writes the gradient "
                    f"it reads times {factor:.4g}: every statistic of its output is its input's, scaled")
        return Verdict(record.name, "kernel_bug", record.step, "backward", record.type, evidence,
                       f"the target scales the gradient through {rewrite.name} by {factor:.4g} where golden does "
                       "not: check its custom backward (an autograd.Function) or a gradient hook there",
                       module=rewrite.name)
    return None


def _from_outside(record: OpRecord, written: dict) -> bool:
    """Whether the op's full-size float input comes from outside the group (through the group's casts and
    copies), as the gradient the group reads does (golden's sequence with scalings inserted reads nothing else
    from outside but what forward saved, which a scaling inserted before golden's ops does not read)."""
    full = [t for t in record.inputs if is_float(t.dtype) and t.stats.count > 1]
    if len(full) != 1:
        return False
    writer = written.get(fingerprint(full[0]))
    for _ in range(8):
        if writer is None:
            return True
        if not is_copy(writer.type):
            return False
        source = [t for t in writer.inputs if is_float(t.dtype) and t.stats.count > 1]
        writer = written.get(fingerprint(source[0])) if len(source) == 1 else writer
        if len(source) != 1:
            return False
    return False


def _constant_factor(record: OpRecord) -> float | None:
    """The constant c where the op's one float output holds its one full-size float input times c, by their
    sums, norms and extremes (within the output's rounding); None otherwise."""
    out = [t for t in record.outputs if is_float(t.dtype) and t.stats.count]
    full = [t for t in record.inputs if is_float(t.dtype) and out and t.stats.count == out[0].stats.count]
    if len(out) != 1 or len(full) != 1 or any(t.stats.count > 1 and t not in full for t in record.inputs):
        return None  # (a mask or another tensor: no scaling by a constant)
    a, b = full[0].stats, out[0].stats
    if not (a.norm > 0 and math.isfinite(a.norm) and math.isfinite(b.norm)) or a.nan or b.nan or a.inf or b.inf:
        return None
    factor = b.norm / a.norm
    sign = 1.0 if b.mean * a.mean >= 0 and b.max * a.max >= 0 else -1.0
    factor *= sign
    low, high = (a.min, a.max) if sign > 0 else (a.max, a.min)
    tolerance = 4.0 * _roundoff(record) + 1e-6
    scale = max(abs(factor) * max(abs(a.min), abs(a.max)), 1e-30)
    extremes = all(abs(x - y) <= tolerance * max(abs(y), 1e-3 * scale)
                   for x, y in ((b.min, factor * low), (b.max, factor * high)))
    # the sums: each value rounded by at most the unit roundoff, so together by at most sqrt(n) times the norm
    summed = abs(b.mean * b.count - factor * a.mean * a.count) <= tolerance * math.sqrt(b.count) * b.norm
    return factor if extremes and summed else None


def _roundoff(record: OpRecord) -> float:
    dtypes = [t.dtype for t in record.tensors if is_float(t.dtype)] + [record.compute_dtype]
    try:
        return max(get_format(d).unit_roundoff for d in dtypes if d in ("float16", "bfloat16", "float32"))
    except ValueError:
        return 2.0 ** -24
