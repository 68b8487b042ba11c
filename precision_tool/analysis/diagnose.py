"""The verdict: the first op where error is introduced beyond what its dtype explains, and why.

The same reasoning serves `ac` and `diagnose`. The scan (`analysis.scan`)
visits every op of the target in execution order, first step first, judges
each against golden (overflows the target's format alone could not hold,
error beyond its dtype's noise, replays on golden inputs and on its own
inputs, module calls whose op sequences differ) and returns the first
culprit: **overflow**, **invalid_operation**, **fusion**, **kernel_bug** or
**precision_loss**. An overflow or a precision loss that the ops reading it
absorb is a note, not a culprit.

With no culprit: an overflow that could not be judged against golden (no
data for it) is reported as **overflow**; gradient overflows that loss
scaling handled (updates skipped, scale lowered) are a note; otherwise the
class is **none**: nothing is flagged, or no single op introduces error
beyond what its dtype explains (accumulated rounding).

When golden and target differ in boost (mindspore.boost in the session), a
divergence that starts at a boost change (a BatchNorm LessBN removed, the FN
head, a frozen group, ...) is **boost** unless a culprit comes before it
(`analysis.boost`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from precision_tool.analysis.actions import INVALID_ACTION
from precision_tool.analysis.boost import boost_start, explain_boost
from precision_tool.analysis.errors import starts_nonfinite
from precision_tool.analysis.fusion import fusion_report, switch_off_action
from precision_tool.analysis.notes import precision_notes
from precision_tool.analysis.overflow import overflow_report
from precision_tool.analysis.results import Diagnosis, OverflowEntry, OverflowReport, Verdict
from precision_tool.analysis.scan import Scanner
from precision_tool.analysis.scaling import first_skipped_update, scaled_past_format, unexplained_skip
from precision_tool.analysis.structure import is_copy, module_path
from precision_tool.dump.records import OpRecord, StepRecord
from precision_tool.compare.report import SHAPE_MISMATCH
from precision_tool.defaults import COSINE_THRESHOLD


def _fusion_off_overflows(fusion_off, step: int, names: tuple[str, ...]) -> bool:
    records = fusion_off.ops(step=step, direction="forward")
    return any(r.overflow and r.name in names for r in records)


def _overflow_evidence(entry: OverflowEntry, report: OverflowReport) -> list[str]:
    """What the overflow report says of ``entry``, placed in its order (the overflow view's, execution order):
    the first to overflow, or the first whose overflow harms where earlier ones were absorbed or inherited."""
    order = next((i for i, e in enumerate(report.entries, 1) if (e.step, e.direction, e.exec_index, e.name) ==
                  (entry.step, entry.direction, entry.exec_index, entry.name)), None)
    total = report.total
    place = f"the first of {total} overflowing op execution(s)" if order == 1 else \
        f"overflowing op execution {order} of {total} in execution order" if order else \
        f"one of {total} overflowing op executions"
    evidence = [
        f"{entry.name} ({entry.type}, computing in {entry.compute_dtype}) raised the float status "
        f"at step {entry.step} in {entry.direction}, {place}",
        f"its outputs hold {entry.saturated} saturated, {entry.inf} inf and {entry.nan} NaN value(s)",
    ]
    if entry.input_ranges:
        lo = min(r.min for r in entry.input_ranges)
        hi = max(r.max for r in entry.input_ranges)
        evidence.append(f"its inputs range over [{lo:.4g}, {hi:.4g}]")
    return evidence


def _overflow_verdict(entry: OverflowEntry, report: OverflowReport, record: OpRecord | None,
                      fusion_off, extra: tuple[str, ...] = ()) -> Verdict:
    """Overflow at ``entry``; fusion when it is a fused op that the fusion-off run computes without overflow."""
    evidence = _overflow_evidence(entry, report) + list(extra)
    if record is not None and record.pass_name:
        evidence.append(f"it is a fused op ({record.pass_name}) replacing {', '.join(record.original_names)}")
        if fusion_off is not None and not _fusion_off_overflows(fusion_off, entry.step, record.original_names):
            evidence.append("the same ops do not overflow in the fusion-off run")
            return Verdict(entry.name, "fusion", entry.step, entry.direction, entry.type, tuple(evidence),
                           switch_off_action(record.pass_name))
        if fusion_off is None:
            evidence.append("collect a fusion-off run to tell a fusion fault from a plain overflow")
    return Verdict(entry.name, "overflow", entry.step, entry.direction, entry.type, tuple(evidence), entry.hint)


def _golden_overflows(golden, verdict: Verdict) -> Verdict:
    """``verdict`` (none, at no op), told that golden's own run overflows where it does: an inf or NaN of its own
    (not a constant the model asks for, `overflow.asked_constants`) that the target makes too, so that the
    comparison finds nothing to blame on the port, while neither run trains. Where golden's every recorded loss
    is finite, its inf or NaN are absorbed (T5's log of a zero relative position, replaced by `where`): not
    told."""
    if not any(s.overflow for s in golden.steps()) or all(math.isfinite(s.loss) for s in golden.steps()):
        return verdict
    first = overflow_report(golden).first
    if first is None:
        return verdict
    losses = [s for s in golden.steps() if not math.isfinite(s.loss) and s.ops_recorded]
    loss = f"; its loss is {losses[0].loss} at step {losses[0].step}" if losses and any(
        math.isfinite(s.loss) for s in golden.steps()) else ""
    evidence = (*verdict.evidence,
                f"golden's own run overflows: {first.name} ({first.type}, {first.compute_dtype}) at step "
                f"{first.step} {first.direction} holds {first.inf} inf and {first.nan} NaN value(s){loss}",
                "the target does the same there: the model overflows in golden's precision too, which no port "
                "fixes and no comparison with golden can tell apart")
    return replace(verdict, evidence=evidence, action=(
        "fix the model in golden's precision first (its data, initialisation, learning rate, or the op that "
        f"overflows): `precision-tool inspect {getattr(golden, 'path', 'GOLDEN')}` and the shell's `of` on the golden "
        "dump list its overflows"))


def _then_overflows(verdict: Verdict, report, target) -> Verdict:
    """``verdict`` (precision_loss at an op computing in a 16-bit format by hand) with what that format does next
    where the run's first overflow comes after it in its step (a softmax in float16 that underflows to 0, and
    the log after it writes -inf): the small error at the op is where the run's inf or NaN began."""
    first = report.first
    if verdict.cls != "precision_loss" or verdict.op is None or first is None or first.step != verdict.step:
        return verdict
    record = target.op(verdict.step, verdict.op, verdict.direction) if verdict.direction == "forward" else None
    if record is None or first.exec_index <= record.exec_index:
        return verdict
    lost = next((f"; the loss is {s.loss} from step {s.step}" for s in target.steps() if not math.isfinite(s.loss)),
                "")
    return replace(verdict, evidence=verdict.evidence + (
        f"later in that step {first.name} ({first.type}, in {first.compute_dtype}) writes {first.inf} inf and "
        f"{first.nan} NaN value(s), the run's first overflow{lost}",))


def _loss_gone_nonfinite(golden, target, verdict: Verdict) -> Verdict:
    """``verdict`` (none, at no op) for a target whose loss is not finite at a step where golden's is: not
    accumulated rounding, but an overflow this dump does not show (module-level records, a region, ops that
    write no recorded tensor); the first record holding inf or NaN where golden's holds none says from where
    to collect ops."""
    golden_losses = {s.step: s.loss for s in golden.steps()}
    gone = next((s for s in target.steps() if not math.isfinite(s.loss) and math.isfinite(
        golden_losses.get(s.step, math.nan))), None)
    if gone is None:
        return verdict
    first = None
    for step in sorted({s.step for s in target.steps()} & set(golden_losses)):
        theirs = {(r.direction, r.name): r for r in golden.ops(step=step)}
        first = next((r for r in target.ops(step=step) if _nonfinite(r) and (r.direction, r.name) in theirs
                      and not _nonfinite(theirs[(r.direction, r.name)])), None)
        if first is not None or step >= gone.step:
            break
    where = (f"; the first record holding inf or NaN where golden's holds none: {first.name} ({first.direction}, "
             f"step {first.step})" if first is not None else "")
    evidence = (f"the target's loss is {gone.loss} at step {gone.step}, where golden's is "
                f"{golden_losses[gone.step]:.6g}: not accumulated rounding, but an overflow this dump does not "
                f"show{where}",)
    steps = sorted({max(0, (first.step if first is not None else gone.step) - 1), gone.step})
    return replace(verdict, evidence=evidence, action=(
        f"collect steps {steps} again at op level with tensors (`precision-tool zoom`, or ptt.dump(path, "
        f"mode=\"dump\", steps={steps})): the op that overflows is among them (an optimizer updating in float16 "
        "writes inf or NaN into the parameters the next step reads)"))


def _nonfinite(record: OpRecord) -> bool:
    return any(t.stats.inf or t.stats.nan for t in record.outputs if t.stats.count)


def _invalid_verdict(entry: OverflowEntry, record: OpRecord) -> Verdict:
    """An op that made NaN from inputs holding neither NaN nor inf (from its statistics): invalid operation."""
    evidence = (f"{entry.name} ({entry.type}, computing in {entry.compute_dtype}) turns inputs without NaN or inf "
                f"into {entry.nan} NaN value(s) at step {entry.step}, the first op to raise the float status there",
                "no golden op pairs with it: judged from its own statistics")
    return Verdict(entry.name, "invalid_operation", entry.step, entry.direction, entry.type, evidence,
                   INVALID_ACTION.format(type=entry.type), module=module_path(entry.name))


def _has_data(dump, entry) -> bool:
    try:
        record = dump.op(entry.step, entry.name, entry.direction)
    except KeyError:
        return False
    return all(t.has_data for t in record.outputs)


def _has(dump, entry) -> bool:
    try:
        dump.op(entry.step, entry.name, entry.direction)
        return True
    except KeyError:
        return False


def loss_scale_handled(report: OverflowReport, steps: list[StepRecord]) -> set[str]:
    """Names of ops whose overflows went away as loss scaling reacted.

    An op's overflow steps were each skipped or followed by a lower loss
    scale, and the last step no longer overflows: gradients scaled too far,
    or an op that multiplies by the loss scale (GradScaler scales the loss in
    forward), which dynamic loss scaling exists to handle.
    """
    if len(steps) < 2:
        return set()
    by_name: dict[str, set[int]] = {}
    for entry in report.entries:
        by_name.setdefault(entry.name, set()).add(entry.step)
    last = steps[-1].step
    scale = {s.step: s.loss_scale for s in steps}
    scale_after = {s.step: later.loss_scale for s, later in zip(steps, steps[1:])}
    skipped = {s.step for s in steps if s.skipped}

    def cured(step: int) -> bool:
        return step in skipped or scale_after.get(step, scale.get(step, 0.0)) < scale.get(step, 0.0)

    return {name for name, overflow_steps in by_name.items()
            if last not in overflow_steps and all(cured(step) for step in overflow_steps)}


def handled_by_loss_scaling(name: str, report: OverflowReport, steps: list[StepRecord]) -> bool:
    """True when ``name``'s overflows went away as loss scaling reacted (see `loss_scale_handled`)."""
    return name in loss_scale_handled(report, steps)


def _steps_golden_alone(golden, target_steps: list[StepRecord]) -> list[str]:
    """A note when golden ran steps after the target's last one (a target stopped early, a crash): those steps
    have nothing to be compared with, and the verdict speaks only of the steps both ran."""
    if not target_steps:
        return []
    last = max(s.step for s in target_steps)
    later = [s.step for s in golden.steps() if s.step > last]
    if not later:
        return []
    which = f"step {later[0]}" if len(later) == 1 else f"{len(later)} steps ({later[0]} to {later[-1]})"
    return [f"the target stops after step {last}; golden's {which} after it have no target step and are not "
            "compared: the verdict covers the steps both runs took"]


def _names_apart(golden, target) -> tuple[str, ...] | None:
    """Evidence where most of the target's forward ops at its first step have no golden op of that name (the
    root module's class renamed, a model subclassed or wrapped in one run only): what does not pair is not
    judged, and a verdict of none says nothing then. None where at least half pair. Casts and copies are not
    counted: the target's own (autocast's, a saved-tensor hook's) have no golden partner by design; nor are ops
    outside every module (a training loop's own code: gradient clipping written by hand where golden calls
    clip_grad_norm_), which say nothing of the model's names."""
    steps = [s.step for s in target.steps()]
    if not steps:
        return None
    ops = [r for r in target.ops(step=steps[0], direction="forward")
           if not r.is_module and not is_copy(r.type) and module_path(r.name)]
    names = {r.name for r in golden.ops(step=steps[0], direction="forward")}
    paired = sum(1 for r in ops if r.name in names or any(n in names for n in r.original_names))  # (fused ops)
    if not ops or 2 * paired >= len(ops):
        return None
    roots = [sorted({r.name for r in d.ops(step=steps[0], direction="forward") if r.is_module and "/" not in r.name})
             for d in (golden, target)]
    return (f"only {paired} of the target's {len(ops)} forward ops at step {steps[0]} have a golden op of the same "
            f"name (golden's outermost modules {', '.join(roots[0]) or 'none'}; the target's "
            f"{', '.join(roots[1]) or 'none'}): ops are paired by name, and what does not pair is not judged",)


def diagnose(golden, target, overflow=None, fusion_off=None, comparison=None,
             cosine_threshold: float = COSINE_THRESHOLD) -> Diagnosis:
    """Diagnose ``target`` against ``golden``; see the module docstring for the reasoning."""
    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.compare.report import select_flagged

    from precision_tool.analysis.outcome import outcome
    from precision_tool.analysis.precheck import precheck
    from precision_tool.compare.preflight import run_problems

    notes = [f"{p.message} ({p.severity})" for p in run_problems(golden, target, allow_incomplete=True)]
    notes.extend(precision_notes(target))
    stats_sides = [role for role, dump in (("golden", golden), ("target", target))
                   if "stats" in (getattr(dump, "modes", None) or [getattr(dump, "mode", "")])]
    if stats_sides:
        notes.append(f"{' and '.join(stats_sides)} hold(s) statistics only: forward ops are judged from them "
                     "(shifts, scales, overflows, changed integers and arguments), backward and optimizer ops for "
                     "overflow, values changed between ops, backward groups that run other ops than golden's (in "
                     "float32 runs) and optimizer arguments only; rounding noise does not show in statistics. "
                     "Collect the step again with tensors (`precision-tool zoom`, or ptt.dump(..., mode=\"dump\", "
                     "steps=[N])) to judge the rest")
    overflow_rep = overflow_report(overflow if overflow is not None else target, golden=golden)
    fusion_rep = fusion_report(target, golden, fusion_off)
    report = comparison if comparison is not None else compare_dumps(golden, target)
    flagged = select_flagged(report, cosine_threshold, None)
    diagnosis = Diagnosis(Verdict(None, "none", None), overflow_rep, fusion_rep, [], notes, len(flagged),
                          flagged[0].name if flagged else None, precheck=precheck(golden, target),
                          outcome=outcome(golden, target))
    steps = target.steps()
    notes.extend(_steps_golden_alone(golden, steps))
    handled = sorted(loss_scale_handled(overflow_rep, steps))
    if handled:
        shown = ", ".join(handled[:5]) + (" ..." if len(handled) > 5 else "")
        notes.append(f"overflow in {shown} went away as loss scaling skipped steps or lowered the scale: "
                     "expected with dynamic loss scaling")
    searching = sorted(scaled_past_format(golden, target, overflow_rep.entries) - set(handled))
    if searching:
        shown = ", ".join(searching[:5]) + (" ..." if len(searching) > 5 else "")
        notes.append(f"overflow in {shown}: golden's gradients times the loss scale are beyond the target's format, "
                     "and every such step's update was skipped: dynamic loss scaling still searching for its scale "
                     "when the run ends, as expected with a high first scale")
        handled = sorted(set(handled) | set(searching))
    until, skipped = boost_start(golden, target), first_skipped_update(golden, target)
    unexplained = unexplained_skip(golden, target, skipped) if skipped is not None else None
    if skipped is not None and (until is None or skipped < until):
        until = skipped
        notes.append(f"the target skipped the optimizer update of step {skipped}"
                     f"{'' if unexplained else ' (loss scaling)'}: later steps train other weights than golden's and "
                     "are not scanned")
    scan = Scanner(golden, target, overflow_rep, fusion_off, set(handled),
                   lambda entry, record, extra: _overflow_verdict(entry, overflow_rep, record, fusion_off, extra),
                   until_step=until).run()
    verdict = scan.verdict if scan.verdict is not None or until != skipped else unexplained
    diagnosis.attributions = scan.attributions
    diagnosis.first_module = (verdict.module if verdict is not None else None) or scan.first_module
    notes.extend(scan.notes)
    if verdict is None:  # overflows the scan could not judge against golden (no data for them)
        # and, where the target's loss is lost, ops no golden op pairs with (a cast to float16 autocast adds)
        lost = {s.step for s in steps if not math.isfinite(s.loss)} - \
            {s.step for s in golden.steps() if not math.isfinite(s.loss)}
        unjudged = [e for e in overflow_rep.entries if not e.inherited and not e.models_own and e.name not in handled
                    and (not _has_data(target, e) or (lost and not _has(golden, e)))
                    and (e.step, e.name, e.direction) not in scan.judged
                    and (until is None or e.step <= until)]  # (steps not scanned: other weights than golden's)
        if unjudged:
            entry = unjudged[0]
            record = target.op(entry.step, entry.name, entry.direction) if _has(target, entry) else None
            verdict = _invalid_verdict(entry, record) if record is not None and starts_nonfinite(record) else \
                _overflow_verdict(entry, overflow_rep, record, fusion_off)
    if verdict is None and flagged:
        evidence = (f"{len(flagged)} op(s) at or below cosine {cosine_threshold} (first: {flagged[0].name})",
                    "no op introduces error beyond what its dtype explains, and no overflow reaches the ops "
                    "after it: the difference is accumulated rounding, as its dtypes allow")
        verdict = _unjudged_late_modules(target, evidence[0]) or _shapes_apart(report, evidence[0]) or Verdict(
            None, "none", None, evidence=evidence,
            action=_NOTHING_IN_ONE_OP)
    if verdict is None:
        verdict = Verdict(None, "none", None, evidence=(f"no op at or below cosine {cosine_threshold} and no "
                                                        "unhandled overflow",), action=_NOTHING)
    if verdict.action in (_NOTHING, _NOTHING_IN_ONE_OP) and getattr(target, "mode", "") == "stats":
        verdict = replace(verdict, action=verdict.action + _FROM_STATISTICS)
    apart = _names_apart(golden, target) if verdict.cls == "none" and verdict.op is None else None
    if apart is not None:
        verdict = replace(verdict, evidence=apart + verdict.evidence[:1], action=(
            "collect both runs from the same model code (the same module class and attribute names, no wrapper in "
            "one run only); then diagnose again"))
    if verdict.cls == "none" and verdict.op is None:
        generic, verdict = verdict, _golden_overflows(golden, verdict)
        verdict = _loss_gone_nonfinite(golden, target, verdict)
        if verdict is generic and scan.suspect is not None:  # where statistics leave a module unjudged: its tensors
            verdict = replace(scan.suspect, evidence=scan.suspect.evidence + generic.evidence[:1])  # judge it
    verdict = _then_overflows(verdict, overflow_rep, target)
    verdict, boost_notes = explain_boost(golden, target, verdict, flagged[0].name if flagged else None)
    notes.extend(boost_notes)
    diagnosis.verdict = verdict
    return diagnosis


_NOTHING = "nothing to do"
_NOTHING_IN_ONE_OP = "nothing to fix in one op; compare more steps or tighten the precision mode"
_FROM_STATISTICS = ("; the target holds statistics only, which do not show a fault within its rounding (a 2 % scale "
                    "under bfloat16): if its loss still departs from golden's, run precision-tool zoom, or collect "
                    "step 0 with tensors (mode=\"dump\"), and diagnose again")


def _unjudged_late_modules(target, flagged: str) -> Verdict | None:
    """A module-level dump recorded from a later step (``steps=``) is judged nowhere: a module call is judged at the
    run's first step only, where the parameters it reads are golden's. What departs there is no rounding said."""
    metadata = getattr(target, "metadata", None) or {}
    steps = metadata.get("steps_filter")
    if metadata.get("capture_level") != "module" or not (isinstance(steps, list) and steps and min(steps) > 0):
        return None
    return Verdict(None, "none", None, evidence=(
        flagged, f"these module-level dumps start at step {min(steps)} (steps={steps!r}): a module call is judged "
                 "at the run's first step only, where the parameters it reads are golden's, so nothing here was "
                 "judged"), action="collect both runs from step 0 (no steps=), or at op level, or run precision-tool "
                                   "zoom; then diagnose again")


def _shapes_apart(report, flagged: str) -> Verdict | None:
    """Where at least half of the compared ops hold a tensor whose shape differs from its golden partner's, the
    runs are not of one model and one batch: those pairs are not compared, and no rounding is said."""
    apart = [op for op in report.ops if any(row.problem == SHAPE_MISMATCH for row in op.rows)]
    if not apart or 2 * len(apart) < len(report.ops):
        return None
    row = next(row for row in apart[0].rows if row.problem == SHAPE_MISMATCH)
    shapes = "x".join(map(str, row.shape)), "x".join(map(str, row.golden_shape))
    return Verdict(None, "none", None, evidence=(
        flagged, f"{len(apart)} of the {len(report.ops)} compared ops hold tensors whose shapes differ from golden's "
                 f"(first: {row.op} {row.tensor}, {shapes[0]} where golden's is {shapes[1]}): other models, batch "
                 "sizes or sequence lengths, whose values are not compared"),
        action="collect both runs from the same model, batch and sequence length; then diagnose again")
