"""The verdict: the first op where error is introduced beyond what its dtype explains, and why.

The same reasoning serves `ac` and `diagnose`. Forward ops are visited in
execution order, from the first step up to the first flagged op (output
cosine at or below the threshold) or the first overflow, whichever is later;
each is replayed on the golden inputs (`analysis.attribution`). The first op
that qualifies is the culprit:

* **overflow**: it raised the float status itself (its inputs held no
  inf/NaN) while its inputs were still close to golden. An overflow fed by
  inputs that are already wrong is a consequence, not a cause: the scan has
  passed the cause already or goes on to find it. A fused op that overflows
  where the fusion-off run does not is a **fusion** fault instead.
* it introduces at least SIGNIFICANT_ERROR relative error and more than
  INTRODUCED_EXCESS times what its compute dtype explains: the kernel
  computes worse than its dtype allows: **fusion** for a fused op, else
  **kernel_bug**;
* it introduces that much error, but its dtype explains it: the op is
  ill-conditioned in that dtype: **precision_loss**;
* its inputs match golden and a faithful replay is close, yet its recorded
  output is far off: the recorded kernel does not compute what it should:
  **kernel_bug** (or **fusion** when fused).

With no culprit: an overflow found without golden data to attribute it is
reported as **overflow**; gradient overflows that loss scaling handled
(updates skipped, scale lowered) are a note unless the scale fell to its
floor; otherwise the class is **none**: nothing is flagged, or no single op
introduces significant error (accumulated rounding that the dtypes allow).
"""

from __future__ import annotations

from precision_tool.analysis.attribution import attribute_record, golden_views
from precision_tool.analysis.fusion import fusion_report, switch_off_action
from precision_tool.analysis.notes import precision_notes
from precision_tool.analysis.overflow import overflow_entry, overflow_report
from precision_tool.analysis.results import Attribution, Diagnosis, OverflowEntry, OverflowReport, Verdict
from precision_tool.dump.records import OpRecord, StepRecord
from precision_tool.defaults import COSINE_THRESHOLD, INTRODUCED_EXCESS, SIGNIFICANT_ERROR

MAX_REPLAYS = 5000  # bound on ops replayed by one diagnosis


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _fusion_off_overflows(fusion_off, step: int, names: tuple[str, ...]) -> bool:
    records = fusion_off.ops(step=step, direction="forward")
    return any(r.overflow and r.name in names for r in records)


def _overflow_evidence(entry: OverflowEntry, total: int) -> list[str]:
    evidence = [
        f"{entry.name} ({entry.type}, computing in {entry.compute_dtype}) raised the float status "
        f"at step {entry.step}, the first of {total} overflowing op execution(s) in {entry.direction}",
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
    evidence = _overflow_evidence(entry, report.total) + list(extra)
    if record is not None and record.pass_name:
        evidence.append(f"it is a fused op ({record.pass_name}) replacing {', '.join(record.original_names)}")
        if fusion_off is not None and not _fusion_off_overflows(fusion_off, entry.step, record.original_names):
            evidence.append("the same ops do not overflow in the fusion-off run")
            return Verdict(entry.name, "fusion", entry.step, entry.direction, entry.type, tuple(evidence),
                           switch_off_action(record.pass_name))
        if fusion_off is None:
            evidence.append("collect a fusion-off run to tell a fusion fault from a plain overflow")
    return Verdict(entry.name, "overflow", entry.step, entry.direction, entry.type, tuple(evidence), entry.hint)


def _has(dump, entry) -> bool:
    try:
        dump.op(entry.step, entry.name, entry.direction)
        return True
    except KeyError:
        return False


def _classify(a: Attribution, fused: bool, pass_name: str) -> Verdict | None:
    evidence = [f"observed error {_fmt(a.observed)}, inherited from its inputs {_fmt(a.inherited)}",
                f"replayed on golden inputs in {a.compute_dtype}: introduces {_fmt(a.introduced)}; "
                f"its dtype explains {_fmt(a.expected)}"]
    if a.introduced is not None and a.introduced >= SIGNIFICANT_ERROR:
        excess = a.introduced > INTRODUCED_EXCESS * max(a.expected or 0.0, 1e-12)
        if excess and fused:
            evidence.append(f"a fused kernel ({pass_name}) computes {a.excess:.3g}x worse than {a.compute_dtype} allows")
            return Verdict(a.name, "fusion", a.step, a.direction, a.type, tuple(evidence), switch_off_action(pass_name))
        if excess:
            evidence.append(f"the kernel computes {a.excess:.3g}x worse than {a.compute_dtype} allows")
            return Verdict(a.name, "kernel_bug", a.step, a.direction, a.type, tuple(evidence),
                           f"check the {a.type} kernel; replay it with `rerun {a.name}` against golden inputs")
        evidence.append(f"{a.type} is ill-conditioned on these values in {a.compute_dtype}")
        return Verdict(a.name, "precision_loss", a.step, a.direction, a.type, tuple(evidence),
                       f'keep {a.type} in float32 through the mix list ({{"black-list": {{"to-add": ["{a.type}"]}}}}) '
                       "or use a precision mode that keeps it in float32 (allow_mix_precision, must_keep_origin_dtype)")
    replay_close = a.introduced is not None and a.introduced * INTRODUCED_EXCESS < a.observed
    if a.observed >= SIGNIFICANT_ERROR and a.inherited * INTRODUCED_EXCESS < a.observed and replay_close:
        evidence.append("its inputs match golden and a faithful replay is close, yet the recorded output is far off")
        action = f"the recorded {a.type} kernel does not compute what its inputs imply: check that kernel"
        if fused:
            action += f" (a fused op: {switch_off_action(pass_name)})"
        return Verdict(a.name, "kernel_bug", a.step, a.direction, a.type, tuple(evidence), action)
    return None


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


def _scan_records(target, stop: tuple[int, int]) -> list[OpRecord]:
    """Ops of every direction with data, in execution order, up to (step, exec_index) ``stop``."""
    records = []
    for step in [s.step for s in target.steps() if s.step <= stop[0]]:
        for record in target.ops(step=step):
            if (record.step, record.exec_index) > stop:
                break
            if record.outputs and all(t.has_data for t in record.outputs):
                records.append(record)
    return records[:MAX_REPLAYS]


def _attribution_scan(golden, target, stop: tuple[int, int], report: OverflowReport, fusion_off,
                      handled: set[str]) -> tuple[Verdict | None, list[Attribution]]:
    """Visit ops in execution order up to ``stop``; return the first culprit.

    Forward ops (and torch ops of any direction) are replayed; every op is
    checked for an overflow it started with inputs still close to golden.
    """
    attributions: list[Attribution] = []
    records = _scan_records(target, stop)
    entries = {(e.step, e.exec_index): e for e in report.entries}
    views = golden_views(golden, records)
    scales = {s.step: s.loss_scale for s in target.steps()}
    for record in records:
        if record.name in handled:
            continue
        attribution = attribute_record(golden, target, record, view=views[id(record)])
        attributions.append(attribution)
        if record.overflow and not record.inherited_nonfinite and attribution.inherited < SIGNIFICANT_ERROR:
            entry = entries.get((record.step, record.exec_index)) or overflow_entry(record, scales.get(record.step))
            extra = (f"its inputs are within {attribution.inherited:.3g} of golden: the overflow starts here",)
            return _overflow_verdict(entry, report, record, fusion_off, extra), attributions
        verdict = _classify(attribution, record.fused, record.pass_name)
        if verdict is not None:
            return verdict, attributions
    return None, attributions


def diagnose(golden, target, overflow=None, fusion_off=None, comparison=None,
             cosine_threshold: float = COSINE_THRESHOLD) -> Diagnosis:
    """Diagnose ``target`` against ``golden``; see the module docstring for the reasoning."""
    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.compare.report import select_flagged

    notes = precision_notes(target)
    overflow_rep = overflow_report(overflow if overflow is not None else target)
    fusion_rep = fusion_report(target, golden, fusion_off)
    report = comparison if comparison is not None else compare_dumps(golden, target)
    flagged = select_flagged(report, cosine_threshold, None)
    diagnosis = Diagnosis(Verdict(None, "none", None), overflow_rep, fusion_rep, [], notes, len(flagged),
                          flagged[0].name if flagged else None)
    steps = target.steps()
    handled = sorted(loss_scale_handled(overflow_rep, steps))
    if handled:
        shown = ", ".join(handled[:5]) + (" ..." if len(handled) > 5 else "")
        notes.append(f"overflow in {shown} went away as loss scaling skipped steps or lowered the scale: "
                     "expected with dynamic loss scaling")
    overflows = [e for e in overflow_rep.entries if not e.inherited and e.name not in handled]
    stops = [(op.step, op.exec_index) for op in flagged[:1]] + [(e.step, e.exec_index) for e in overflows[:1]]
    verdict = None
    if stops:
        verdict, diagnosis.attributions = _attribution_scan(golden, target, max(stops), overflow_rep, fusion_off,
                                                            set(handled))
    if verdict is None and overflows:  # an overflow the scan could not attribute (no golden data for it)
        entry = overflows[0]
        record = target.op(entry.step, entry.name, entry.direction) if _has(target, entry) else None
        verdict = _overflow_verdict(entry, overflow_rep, record, fusion_off)
    if verdict is None and flagged:
        evidence = (f"{len(flagged)} op(s) at or below cosine {cosine_threshold} (first: {flagged[0].name})",
                    f"no op introduces {SIGNIFICANT_ERROR:g} relative error or more on golden inputs: "
                    "the difference is accumulated rounding, as its dtypes allow")
        verdict = Verdict(None, "none", None, evidence=evidence,
                          action="nothing to fix in one op; compare more steps or tighten the precision mode")
    if verdict is None:
        verdict = Verdict(None, "none", None, evidence=(f"no op at or below cosine {cosine_threshold} and no "
                                                        "unhandled overflow",), action="nothing to do")
    diagnosis.verdict = verdict
    return diagnosis
