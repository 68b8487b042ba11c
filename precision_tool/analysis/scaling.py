"""The target's loss scale over golden's, per step: as the steps record it, else as the gradients show it.

`compare.judged.loss_scale_ratios` reads the scales the steps record (``ptt.step(loss, loss_scale)``). A run
whose loop scales the loss without saying so (``torch.amp.GradScaler`` with ``ptt.step(loss)``, or no
``ptt.step`` at all) records 1.0, and every gradient of its backward then looks 65536 times golden's. The
gradient backward starts from shows the scale: the first backward op golden runs reads the loss's gradient
(1 in an unscaled run) as its input_0, and the target's op of the same name reads it multiplied by the
scale. A ratio of the two that is a power of two other than 1 (loss scales are: GradScaler's 65536, halved and
doubled, static scales of 128 or 1024) is taken as the step's loss scale ratio where the step records none,
and over a recorded one that differs: a loop that reads ``scaler.get_scale()`` after ``scaler.update()`` (the
order docs/torch.md gives) records the next step's scale, half the one a skipped step's gradients carry.
"""

from __future__ import annotations

import math

from precision_tool.compare.judged import loss_scale_ratios as recorded_ratios

_CACHE_ATTR = "_analysis_loss_scale_ratios"


def loss_scale_ratios(golden, target) -> dict[int, float]:
    """Step -> target loss scale over golden's: the recorded ratio, else the one the seed gradient shows."""
    cache = getattr(target, _CACHE_ATTR, None)
    if cache is not None and cache[0] is golden:
        return cache[1]
    ratios = dict(recorded_ratios(golden, target))
    steps = getattr(target, "steps", None)
    if callable(steps) and callable(getattr(golden, "ops", None)):
        golden_steps = {s.step for s in golden.steps()}
        for step in (s.step for s in steps()):
            if step in golden_steps:
                inferred = seed_gradient_ratio(golden, target, step)
                if inferred is not None:  # what the gradients carry, also over a recorded scale that differs
                    ratios[step] = inferred
    try:
        setattr(target, _CACHE_ATTR, (golden, ratios))
    except AttributeError:  # an object that takes no attributes: computed again next time
        pass
    return ratios


def seed_gradient_ratio(golden, target, step: int) -> float | None:
    """The power of two (not 1) that the target's first backward input carries over golden's, or None."""
    golden_backward = golden.ops(step=step, direction="backward")
    first = next((r for r in golden_backward if not r.is_module and r.inputs), None)
    if first is None:
        return None
    partner = next((r for r in target.ops(step=step, direction="backward") if r.name == first.name), None)
    if partner is None:
        return None
    try:
        g, t = first.tensor("input_0").stats.norm, partner.tensor("input_0").stats.norm
    except KeyError:
        return None
    if not (math.isfinite(g) and math.isfinite(t)) or g <= 0.0 or t <= 0.0:
        return None
    exponent = round(math.log2(t / g))
    if exponent == 0 or abs(t / g / 2.0 ** exponent - 1.0) > 1e-3:
        return None
    return 2.0 ** exponent


def first_skipped_update(golden, target) -> int | None:
    """The first step whose optimizer update the target skipped and golden ran, or None.

    A dynamic loss scaler (``torch.amp.GradScaler``) skips the update of a step whose gradients overflowed and
    lowers the scale; the step records it as skipped, or its optimizer ops are missing where golden's ran.
    From the next step on the target trains other weights than golden by design: its ops differ from golden's
    by a whole update, which no op introduces.
    """
    golden_steps = {s.step for s in golden.steps()}
    for record in target.steps():
        if record.step not in golden_steps:
            continue
        if record.skipped or (not target.ops(step=record.step, direction="optimizer")
                              and golden.ops(step=record.step, direction="optimizer")):
            return record.step
    return None


def skipped_updates(golden, target) -> set[int]:
    """The steps whose optimizer update the target skipped and golden ran (see `first_skipped_update`)."""
    golden_steps = {s.step for s in golden.steps()}
    return {record.step for record in target.steps() if record.step in golden_steps and (
        record.skipped or (not target.ops(step=record.step, direction="optimizer")
                           and golden.ops(step=record.step, direction="optimizer")))}


def scaled_past_format(golden, target, entries) -> set[str]:
    """Names of backward ops whose every overflow the loss scale explains and loss scaling discarded: each in a
    step whose update the target skipped, where golden's largest value there times the step's loss scale ratio
    is beyond the target's format, or inherited from such an op.

    Dynamic loss scaling (``torch.amp.GradScaler``) starts high and halves the scale at every step whose
    gradients overflow, skipping its update, until they fit: a run shorter than that search overflows in every
    step, by design, and no op is to blame. An overflow golden's values do not explain at that scale (a kernel
    that returns inf whatever the scale) is not one of these; nor one in forward, which the scale does not reach;
    nor one after which the scale did not fall (a scaler that skips and never backs off trains nothing). An op
    golden does not run (a cast autocast inserts) is explained when its inputs fit its format once divided by
    the scale ratio and do not as they are: a stats-mode dump has no values to judge it by otherwise.
    """
    from precision_tool.analysis.errors import format_limit

    skipped, ratios = skipped_updates(golden, target), loss_scale_ratios(golden, target)
    following = dict(zip(sorted(ratios), sorted(ratios)[1:]))
    explained: dict[str, bool] = {}
    for entry in entries:
        ratio = ratios.get(entry.step, 1.0)
        later = ratios.get(following.get(entry.step), 0.0)  # the next step's scale ratio must be lower: searching
        ok = entry.direction == "backward" and entry.step in skipped and ratio > 1.0 and later < ratio
        if ok and not entry.inherited:
            try:
                record = golden.op(entry.step, entry.name, entry.direction)
            except KeyError:
                record = None
            if record is not None:  # beyond the format once scaled, and within it as golden computes it: a value
                # past the format unscaled (a power of a forward activation, in a norm's backward) overflows at
                # any loss scale, and no search for one ends it
                limit, largest = format_limit(entry.compute_dtype), _largest(record.outputs)
                ok = largest * ratio > limit >= largest
            else:  # an op only the target runs (a cast autocast inserts): its inputs fit the format without the
                # scale and do not with it, as its overflow shows
                ok = _unscaled_fits(target, entry, ratio)
        explained[entry.name] = explained.get(entry.name, True) and ok
    return {name for name, ok in explained.items() if ok}


def _largest(tensors) -> float:
    """The largest magnitude among ``tensors``' statistics (0 without any)."""
    return max((max(abs(t.stats.min), abs(t.stats.max)) for t in tensors if t.stats.count), default=0.0)


def _unscaled_fits(target, entry, ratio: float) -> bool:
    """Whether the float inputs of the target's op of ``entry`` fit its output's format once divided by the loss
    scale ``ratio``, and do not as they are: the scale pushed them past it."""
    from precision_tool.analysis.errors import format_limit
    from precision_tool.analysis.replay import is_float

    try:
        record = target.op(entry.step, entry.name, entry.direction)
    except KeyError:
        return False
    limit = min((format_limit(t.dtype) for t in record.outputs if t.stats.count), default=math.inf)
    largest = _largest(t for t in record.inputs if is_float(t.dtype))
    return largest > limit and largest / ratio <= limit



def unexplained_skip(golden, target, step: int):
    """A `Verdict` where the target ran no op of the update golden ran at ``step`` and nothing says a loss scaler
    skipped it: the step records no skip and no overflow, and the loss scale does not fall after it. The
    target's optimizer then updates nothing: its gradients were gone when it stepped (a ``zero_grad()`` between
    ``backward()`` and ``step()``) or it holds none of the parameters that train (built before adapters or new
    modules were put in). None otherwise, and for dumps that record only some ops (overflow mode, a zoom
    region), where missing optimizer ops say nothing."""
    from precision_tool.analysis.results import Verdict
    from precision_tool.collect.selection import narrows_ops

    metadata = getattr(target, "metadata", None) or {}
    if getattr(target, "mode", "") not in ("dump", "stats") or narrows_ops(metadata):
        return None
    steps = target.steps()
    record = next((s for s in steps if s.step == step), None)
    later = [s.loss_scale for s in steps if s.step > step]
    if record is None or record.skipped or record.overflow or getattr(record, "cut_short", False) or \
            (later and later[0] < record.loss_scale):  # (a run that failed inside the step never reached it)
        return None
    update = golden.ops(step=step, direction="optimizer")
    if not update:
        return None
    name = update[0].name.rsplit("/", 1)[0]
    written = sum(1 for r in update for t in r.outputs if t.stats.count > 1)
    evidence = (f"golden's {name} writes {written} tensor(s) at step {step}; the target's update runs no op there: "
                "it updates no parameter",
                f"no loss scaler skipped it: step {step} records no skip and no overflow, and the loss scale does not "
                "fall after it")
    return Verdict(name, "kernel_bug", step, "optimizer", update[0].type, evidence,
                   "check the target's training loop: that its optimizer holds the parameters that train (built after "
                   "every adapter or new module was put in) and that their gradients are still there when it steps "
                   "(no zero_grad() between backward() and step())", module=name)
