"""Which compared tensors a gate judges, and on what scale: what `diagnose` ignores, `check` and `vcs` skip.

A tensor pair is compared and shown, but not judged (``TensorRow.skip`` says
why, in the table and in the JSON) when:

* it is not floating point: a byte or boolean output (a kernel's workspace,
  as ``aten.mkldnn_rnn_layer`` returns) holds no data to compare;
* its golden values are near zero next to the inputs they were computed from
  (the terms cancel: the gradient of an attention key bias) and its error,
  measured against those inputs' scale, is small: relative to its own tiny
  norm, rounding noise would look like total loss.

Backward tensors of a loss-scaled run carry the loss scale: `gradient_scale`
tells whether a tensor's statistics show it, so that the comparator divides
it out before scoring (``TensorRow.loss_scale``).
"""

from __future__ import annotations

import math

from precision_tool.dump.records import OpRecord, TensorRecord

NEAR_ZERO_RATIO = 1e-3  # golden norm below this share of its op's largest input norm: the terms cancel
NEAR_ZERO_TOLERANCE = 1e-2  # ... and its error below this share of that scale: not judged
_NOT_DATA = ("uint8", "int8", "bool")
_FLOATS = ("float16", "bfloat16", "float32", "float64")


NOT_READ = "not read: the op overwrites it (fill_, bernoulli_), so neither dump recorded its values before"


def not_data(tensor: TensorRecord) -> str:
    """Why a tensor holds no data to compare, or ""."""
    if tensor.dtype in _NOT_DATA:
        return f"not data: a {tensor.dtype} output (a kernel's workspace or a mask), not compared"
    return ""


def not_read(target: TensorRecord, golden: TensorRecord) -> str:
    """`NOT_READ` when neither side recorded a value of a tensor that has some (the input an in-place op
    overwrites unread: the capture keeps its shape only), else ""."""
    if target.has_data or golden.has_data or target.stats.count or golden.stats.count or not math.prod(target.shape):
        return ""
    return NOT_READ


def statistics_only(row) -> bool:
    """Whether ``row`` (a `TensorRow`) compares statistics, values missing on a side (a tensor neither side
    read, `NOT_READ`, is no statistics side)."""
    return row.stats is not None and row.skip != NOT_READ


SENTINEL = 1e30  # inputs holding values this large are masks (finfo.min), not terms of a sum


def input_scale(op: OpRecord) -> float:
    """The largest L2 norm among an op's float inputs: the scale of the terms its outputs are made of.

    Inputs holding mask sentinels (|x| >= 1e30, finfo.min) do not count.
    """
    scale = 0.0
    for tensor in op.tensors:  # every output of a dump asks: no tuples built on the way
        stats = tensor.stats
        if (tensor.slot.startswith("input") and tensor.dtype in _FLOATS and stats.count and stats.norm > scale
                and math.isfinite(stats.norm) and max(abs(stats.min), abs(stats.max)) < SENTINEL):
            scale = stats.norm
    return scale


def near_zero(golden_op: OpRecord, golden: TensorRecord, error_norm: float) -> str:
    """Why an op output whose golden values cancel to near zero is judged against its inputs' scale, or "".

    Module boundaries are not ops: their outputs are judged as they are.
    """
    if golden.kind != "output" or not golden.stats.count or golden_op.is_module:
        return ""
    scale = input_scale(golden_op)
    norm = golden.stats.norm
    if scale <= 0.0 or not math.isfinite(norm) or norm >= NEAR_ZERO_RATIO * scale:
        return ""
    relative = error_norm / scale
    if not relative < NEAR_ZERO_TOLERANCE:
        return ""
    return (f"near zero: golden norm {norm:.3g} is {norm / scale:.2g} of its inputs' {scale:.3g} (the terms "
            f"cancel); its error is {relative:.2g} of that scale")


def gradient_scale(target: TensorRecord, golden: TensorRecord, ratio: float) -> float:
    """``ratio`` (target over golden loss scale) when the target tensor's norm shows it carries it, else 1."""
    if ratio == 1.0 or not (target.stats.count and golden.stats.count):
        return 1.0
    t, g = target.stats.norm, golden.stats.norm
    if not (math.isfinite(t) and math.isfinite(g)) or t <= 0.0 or g <= 0.0:
        return 1.0
    return ratio if abs(math.log(t / g) - math.log(ratio)) < abs(math.log(t / g)) else 1.0


def loss_scale_ratios(golden, target) -> dict[int, float]:
    """Step -> target loss scale over golden's, for steps where both dumps record a usable scale."""
    def scales(dump) -> dict[int, float]:
        steps = getattr(dump, "steps", None)
        if not callable(steps):
            return {}
        return {s.step: s.loss_scale for s in steps()
                if s.loss_scale and math.isfinite(s.loss_scale) and s.loss_scale > 0}

    g, t = scales(golden), scales(target)
    return {step: t[step] / g[step] for step in t if step in g and t[step] != g[step]}


def skip_consumed_near_zero(pairs: list, rows: list) -> list:
    """Input rows that hold a tensor some output row found near zero are not judged either (same reason).

    The tensor an op reads is the one an earlier op wrote: the golden statistics identify it.
    """
    return skip_consumed(pairs, rows, near_zero_writers(pairs, rows))


def near_zero_writers(pairs: list, rows: list, found: dict | None = None) -> dict:
    """(step, golden fingerprint) -> the skip reason of each output row found near zero (the last one wins)."""
    found = {} if found is None else found
    for pair, row in zip(pairs, rows):
        if row.skip.startswith("near zero") and row.kind == "output":
            found[(row.step, _fingerprint(pair.golden))] = f"{row.skip} (written by {row.op})"
    return found


def skip_consumed(pairs: list, rows: list, found: dict) -> list:
    """``rows`` with the input rows whose golden tensor is in ``found`` (`near_zero_writers`) skipped."""
    from dataclasses import replace

    if not found:
        return rows
    out = []
    for pair, row in zip(pairs, rows):
        reason = found.get((row.step, _fingerprint(pair.golden))) if row.kind == "input" and not row.skip else None
        out.append(replace(row, skip=reason) if reason else row)
    return out


def _fingerprint(tensor: TensorRecord) -> tuple:
    s = tensor.stats  # no shape: an op often reads a reshaped view of what another wrote
    return s.count, s.min, s.max, s.mean, s.norm
