"""A module call's backward that scales the gradients it passes back, judged in a 16-bit run's module-level dump.

`modulejudge` leaves a 16-bit run's backward calls unjudged: their forward values carry rounding, and what a
backward computes from them moves far with it (a ReLU's mask flips where its input is near zero: 7 % on its input
gradient in a clean bfloat16 ResNet; a float16 attention's backward 6 % from inputs at 1e-4). Such moves are
value by value, each its own size and sign. One thing rounding never does is scale: when every gradient a call
passes back departs from golden's by SIGNIFICANT_ERROR or more, and is golden's times one factor r in its norm,
spread, extremes and mean alike (`errors.uniform_scale`, after the loss scale is divided out; r > 0, as a
gradient that underflowed to zero is not scaled, nor one whose values lie below its format's normal range), while the
gradients reaching it and those its inner calls passed back depart by under 1/INTRODUCED_EXCESS of that, and its
forward by under SIGNIFICANT_ERROR, the call's backward multiplies by another constant than golden's (a custom
backward written with a wrong factor). That is a kernel_bug at the call, direction backward, in any dtype.
"""

from __future__ import annotations

import math
from dataclasses import replace

from precision_tool.analysis.attribution import GoldenView, pair_errors
from precision_tool.analysis.errors import stats_only, uniform_scale
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.analysis.statsjudge import statistics_verdict
from precision_tool.compare.judged import gradient_scale
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FORMATS

SCALE_EXCESS = 4.0  # a scale departing this many times its inputs' (unscaled) departure is the call's own


def judge_gradient_scale(scan, record: OpRecord, forward_error: float, inner: list[OpRecord], harmful) -> \
        Verdict | None:
    """The verdict on backward module call ``record`` whose passed-back gradients are golden's times one factor,
    or None. ``forward_error``: the largest departure of its module's forward calls in the step; ``inner``: the
    backward calls made inside it (recorded before it, in backward's order); ``harmful(record, least)``: whether
    a reader departs.

    The gradients a call passes back scaled, or, where they are not (they flowed on through a 16-bit kernel's
    rounding, or into a float32 tensor whose noise floor leaves no room), those its own code hands to the first
    call made inside it (a pooler's wrapper scaling its output's gradient before its Linear and activation run
    backward). Its inputs' departure must be under 1/INTRODUCED_EXCESS of its own, as for any introduced error, or
    under 1/SCALE_EXCESS of the scale's departure where they are not golden's times that scale themselves: rounding
    on the way in (a ReLU's mask, 1 % on a bfloat16 ResNet's gradient) scales nothing either."""
    if record.direction != "backward" or forward_error >= SIGNIFICANT_ERROR:
        return None
    a = scan._attribute(record, replay=False)
    if a.overflowed or a.new_nan or a.observed < SIGNIFICANT_ERROR:
        return None
    introduced = [b.observed for b in (scan._attribute(c, replay=False) for c in inner)
                  if b.observed > INTRODUCED_EXCESS * b.inherited]  # (a call inside that departs on its own)
    inherited = max([a.inherited] + introduced)
    scale, handed = _scale(scan, record, "output"), None
    for call in inner if scale is None else ():
        scale = _scale(scan, call, "input")
        if scale is not None:
            handed = call
            break
    if scale is None or not (a.observed > INTRODUCED_EXCESS * inherited or (
            abs(scale - 1.0) >= SCALE_EXCESS * inherited and _scale(scan, record, "input", scale) is None)):
        return None
    if not harmful(record, SIGNIFICANT_ERROR):
        return None
    a = replace(a, inherited=inherited)
    scan.result.attributions.append(a)
    verdict = statistics_verdict(record, a, measured=not stats_only(record), scale=scale)
    if handed is not None:
        alike = "its norm, spread, extremes and mean alike" if stats_only(handed) else "value by value"
        verdict = replace(verdict, evidence=verdict.evidence[:2] + (
            f"the gradient its own code hands to {handed.name} is golden's times {scale:.4g} ({alike}): rounding "
            "moves values both ways and scales none; the code multiplies by another constant",))
    return verdict


def _subnormal(tensor) -> bool:
    """Whether ``tensor``'s values lie, as a rule (their root mean square), below its format's smallest normal
    value: rounded to a grid whose spacing is most of their size, a gradient of 1e-7 in float16 (a ConvNeXt's
    under its 1e-6 layer scale) holds a few levels, and one factor between it and golden's says nothing."""
    fmt = FORMATS.get(tensor.dtype)
    stats = tensor.stats
    return fmt is not None and stats.count > 0 and stats.norm / math.sqrt(stats.count) < fmt.tiny


def _scale(scan, record: OpRecord, kind: str, near: float | None = None) -> float | None:
    """r where every float gradient of ``kind`` (``output``: those ``record`` passes back; ``input``: those
    reaching it) that departs by SIGNIFICANT_ERROR is golden's times r, the target's loss scale over golden's
    divided out where the gradient carries it (`errors.uniform_scale`, from values where both hold them); None
    where one departs otherwise, or none departs. ``near``: only an r within a quarter of its departure from 1."""
    view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
    ratio = loss_scale_ratios(scan.golden, scan.target).get(record.step, 1.0)
    found = None
    for slot, e in pair_errors(scan.golden, scan.target, record, view, kind, ratio):
        if not e.error >= SIGNIFICANT_ERROR:
            continue
        tensor, partner = record.tensor(slot), view.statistics(slot) or view.record(slot)
        if partner is None or not math.isfinite(e.error) or tuple(tensor.shape) != tuple(partner.shape) \
                or not is_float(tensor.dtype) or _subnormal(tensor):
            return None
        carried = gradient_scale(tensor, partner, ratio)  # the loss scale the target's gradient carries
        golden = view.get(slot) if tensor.has_data else None
        if golden is not None:  # values: golden's times the scale carried, value by value
            target = scan.target.tensor(record.step, record.exec_index, slot)
            r = uniform_scale(target, golden * carried, tensor.dtype)
        else:
            golden = partner.stats
            r = uniform_scale(tensor.stats, replace(golden, min=golden.min * carried, max=golden.max * carried,
                                                    mean=golden.mean * carried, std=golden.std * carried,
                                                    norm=golden.norm * carried), tensor.dtype)
        if r is None or not r > 0.0 or (ratio != 1.0 and abs(math.log2(r) - round(math.log2(r))) < 1e-3) or \
                (found is not None and abs(r - found) > abs(found - 1.0) / 4):
            return None  # (a gradient gone to zero underflowed; a power of two where a loss scale is in play is
            # one the dumps record otherwise: a scaler that halved it within the step)
        found = r if found is None else found
    if near is not None and found is not None and abs(found - near) > abs(near - 1.0) / 4:
        return None
    return found
