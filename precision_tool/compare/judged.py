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
from precision_tool.engine.formats import FORMATS
from precision_tool.engine.hooks import BACKWARD, OPTIMIZER

NEAR_ZERO_RATIO = 1e-3  # golden norm below this share of its op's largest input norm: the terms cancel
NEAR_ZERO_TOLERANCE = 1e-2  # ... and its error below this share of that scale (or of NEAR_ZERO_UNITS unit
NEAR_ZERO_UNITS = 8  # roundoffs of the target's format, where that is more: bfloat16's): not judged
NOISE = 1.0  # a gradient near zero whose error is this share of its golden norm or more is noise
# (`near_zero_writers`): statistics only, whose norm departs from golden's by that share
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


def near_zero(golden_op: OpRecord, golden: TensorRecord, error_norm: float, dtype: str = "") -> str:
    """Why an op output whose golden values cancel to near zero is judged against its inputs' scale, or "";
    ``dtype``: the target tensor's (its rounding sets the tolerance where it is coarse).

    Module boundaries are not ops: their outputs are judged as they are.
    """
    if golden.kind != "output" or not golden.stats.count or golden_op.is_module:
        return ""
    scale = input_scale(golden_op)
    norm = golden.stats.norm
    if scale <= 0.0 or not math.isfinite(norm) or norm >= NEAR_ZERO_RATIO * scale:
        return ""
    relative = error_norm / scale
    fmt = FORMATS.get(dtype)
    if not relative < max(NEAR_ZERO_TOLERANCE, NEAR_ZERO_UNITS * fmt.unit_roundoff if fmt else 0.0):
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
    """Input rows that hold a tensor some output row found near zero are not judged either (same reason), nor
    the outputs of ops that read only such tensors and golden's own values (`skip_consumed`).

    The tensor an op reads is the one an earlier op wrote: the golden statistics identify it.
    """
    return skip_consumed(pairs, rows, near_zero_writers(pairs, rows))


def near_zero_writers(pairs: list, rows: list, found: dict | None = None) -> dict:
    """`tensor_key` of the golden tensor of each output row found near zero -> (its skip reason, whether it is
    a gradient: what an optimizer makes of it is skipped too, `skip_consumed`) (the last one wins)."""
    found = {} if found is None else found
    for pair, row in zip(pairs, rows):
        if row.skip.startswith("near zero") and row.kind == "output":
            found[tensor_key(row.step, pair.golden)] = (f"{row.skip} (written by {row.op})",
                                                        row.direction == BACKWARD and _noise(row, pair))
    return found


def skip_consumed(pairs: list, rows: list, found: dict) -> list:
    """``rows`` with the input rows whose golden tensor is in ``found`` (`near_zero_writers`) skipped; and the
    output rows of each optimizer op that reads such a tensor and otherwise only values equal to golden's
    (added to ``found``, so that what reads them later is skipped in turn).

    Rounding noise around an exact zero in a gradient (an attention key bias's) travels on through an optimizer:
    Adam's moments are made of it, and its normalised update writes steps of the learning rate's size, in
    random directions, into a parameter the model's outputs do not depend on; the state and the parameter
    carry it to later steps. None of it is an error of the target's. Forward and backward ops that read such a
    parameter are judged as they are: there the noise stays small next to the other terms of their outputs.
    """
    from dataclasses import replace

    if not found:
        return rows
    out = list(rows)
    for positions in _by_op(pairs):
        noise, exact = "", True
        for position in positions:
            pair, row = pairs[position], out[position]
            if row.kind != "input" or row.skip:  # (skipped already: holds no values to compare)
                continue
            entry = found.get(tensor_key(row.step, pair.golden))
            if entry:
                out[position] = replace(row, skip=entry[0])
                if entry[1]:
                    noise = noise or f"{row.tensor}, {_origin(entry[0])}"
            elif not _equal(row):
                exact = False
        if not noise or not exact or out[positions[0]].direction != OPTIMIZER:
            continue
        for position in positions:
            pair, row = pairs[position], out[position]
            if row.kind != "output":
                continue
            if row.skip.startswith("near zero"):  # (small as well: the square of a gradient near zero)
                found[tensor_key(row.step, pair.golden)] = (f"{row.skip} (written by {row.op})", True)
            elif not row.skip and row.target_dtype in _FLOATS:
                out[position] = replace(row, skip=f"{DERIVED}: it reads {noise}, and otherwise golden's values")
                found[tensor_key(row.step, pair.golden)] = (f"{DERIVED} (written by {row.op})", True)
    return out


DERIVED = "derived from near-zero values"
MISREAD = 0.5  # a backward op's input whose cosine with its golden partner's is below this, its writer's above
AGREES = 0.99  # ... this with its own partner: the two ops paired by name read other tensors
MISALIGNED = "paired with a golden op that reads other gradients"


def skip_misaligned(pairs: list, rows: list, written: dict | None = None) -> list:
    """``rows`` with the output rows of each backward op skipped whose float input has a cosine under MISREAD with
    its golden partner's while the target op that wrote that very tensor agrees with its own partner (cosine
    AGREES or more): the two ops paired by name read other tensors. Autograd sums a tensor's gradients in the
    buffers of the nodes that read it, and an extra cast (a float16 model's ``x.to(float32)`` before an RMSNorm,
    a no-op in golden's float32 model) moves that sum to another node, whose name the sum takes. Cosines, not
    errors: a loss scale the run does not record leaves them as they are. ``written``: the cosines of the step's
    backward outputs seen so far, by target tensor, added to (a streamed comparison's earlier windows)."""
    from dataclasses import replace

    written = {} if written is None else written
    written.update((tensor_key(row.step, pair.target), row.metrics.cosine) for pair, row in zip(pairs, rows)
                   if row.kind == "output" and row.direction == BACKWARD and row.metrics is not None)
    out = list(rows)
    for positions in _by_op(pairs):
        if pairs[positions[0]].target_op.direction != BACKWARD:
            continue
        misread = None
        for position in positions:
            pair, row = pairs[position], out[position]
            if row.kind != "input" or row.metrics is None or not row.metrics.cosine < MISREAD:
                continue
            writer = written.get(tensor_key(row.step, pair.target))
            if writer is not None and writer >= AGREES:
                misread = (row.tensor, row.metrics.cosine, writer)
                break
        if misread is None:
            continue
        reason = (f"{MISALIGNED}: its {misread[0]} has cosine {misread[1]:.2g} with golden's partner's, while the "
                  f"op that wrote it agrees with its own ({misread[2]:.4g}; autograd sums the gradients elsewhere)")
        for position in positions:
            if out[position].kind == "output" and not out[position].skip:
                out[position] = replace(out[position], skip=reason)
    return out


def _origin(reason: str) -> str:
    """``reason`` (a `found` entry) without its measurements: "near zero (written by X)"."""
    writer = reason.rpartition(" (written by ")[2].rstrip(")")
    kind = DERIVED if reason.startswith(DERIVED) else "near zero"
    return f"{kind} (written by {writer})"


def _noise(row, pair=None) -> bool:
    """Whether a tensor found near zero departs from golden's by as much as golden's values are large: noise
    on both sides (the target's format's larger than golden's), not a small gradient with an error, whose
    optimizer ops are judged (where an optimizer fault shows); or whether golden's values are themselves within
    a few units of its format's rounding of the terms they were summed from, in a target of golden's format (an
    attention key bias's gradient in two float32 runs of other kernels: 2 to 4 units, 0.6 to 0.9 of golden's
    norm apart)."""
    if row.metrics is not None and not row.metrics.rel_euclidean < NOISE:
        return True
    if row.metrics is None and row.stats is not None and not row.stats.rel_norm_diff < NOISE:
        return True
    fmt = FORMATS.get(pair.golden.dtype) if pair is not None and pair.target.dtype == pair.golden.dtype else None
    if fmt is None or (row.metrics is not None and row.metrics.rel_euclidean < NOISE / 4):
        return False  # (in one format only: a coarser target's noise is as large as golden's values, above)
    norm, scale = pair.golden.stats.norm, input_scale(pair.golden_op)
    return scale > 0.0 and norm <= ROUNDING_UNITS * fmt.unit_roundoff * scale


ROUNDING_UNITS = 16  # golden values within this many units of rounding of their inputs' scale, a quarter of their
# norm apart in a target of the same format, are noise


def _by_op(pairs: list) -> list[list[int]]:
    """Positions of each target op's pairs, ops in execution order."""
    groups: dict[int, list[int]] = {}
    for position, pair in enumerate(pairs):
        groups.setdefault(id(pair.target_op), []).append(position)
    ops = sorted(groups.values(), key=lambda p: (pairs[p[0]].target_op.step, pairs[p[0]].target_op.exec_index))
    return ops


def _equal(row) -> bool:
    """Whether a row's target values are golden's, to the bit as far as its metrics or statistics tell."""
    if row.problem or row.target_dtype != row.golden_dtype:
        return False
    if row.metrics is not None:
        return row.metrics.max_abs_err == 0.0 and not row.metrics.nonfinite_pairs
    if row.stats is not None:
        s = row.stats
        return s.abs_mean_diff == 0.0 and s.abs_std_diff == 0.0 and s.abs_max_diff == 0.0 and s.abs_min_diff == 0.0
    return row.target_dtype not in _FLOATS  # neither: a tensor with no values compared (a mask, a workspace)


def tensor_key(step: int, tensor: TensorRecord) -> tuple:
    """What identifies a golden tensor that one op writes and later ops read: its statistics; within its step
    where every value is one (zeros, a filled constant: such tensors recur), else across steps (state an
    optimizer carries on, a parameter it updated)."""
    s = tensor.stats
    fingerprint = _fingerprint(tensor)
    return (step, *fingerprint) if s.min == s.max else (None, *fingerprint)


def _fingerprint(tensor: TensorRecord) -> tuple:
    s = tensor.stats  # no shape: an op often reads a reshaped view of what another wrote
    return s.count, s.min, s.max, s.mean, s.norm
