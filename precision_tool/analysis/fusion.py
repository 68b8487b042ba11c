"""The fusion report: passes applied, and fused ops that compute clearly worse than unfused."""

from __future__ import annotations

import json

from precision_tool.analysis.attribution import attribute_record, golden_views, relative_error
from precision_tool.analysis.results import FusionReport, FusionSuspect
from precision_tool.defaults import FUSION_SUSPECT_RATIO, INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord


def switch_off_action(pass_name: str) -> str:
    """How to turn one pass off: a fusion switch file for ``collect --fusion-switch``."""
    spec = json.dumps({"GraphFusion": {pass_name: "off"}})
    return f"switch off {pass_name}: put {spec} in a fusion switch file (collect --fusion-switch FILE)"


def fusion_passes(target) -> dict[str, int]:
    """Fused ops per pass, counted once per fused op name (not per step)."""
    names: dict[str, set[str]] = {}
    for record in target.ops(direction="forward"):
        if record.pass_name:
            names.setdefault(record.pass_name, set()).add(record.name)
    return {name: len(ops) for name, ops in sorted(names.items())}


def _first_step_fused(target) -> list[OpRecord]:
    steps = [s.step for s in target.steps()]
    for step in steps:
        fused = [r for r in target.ops(step=step, direction="forward") if r.pass_name]
        if fused:
            return fused
    return []


def _unfused_error(golden, fusion_off, record: OpRecord) -> float | None:
    """Error of the original op's output in the fusion-off run, against golden."""
    origin, slot = record.output_origins[0] if record.output_origins else (None, 0)
    if origin is None:
        return None
    try:
        unfused = fusion_off.op(record.step, origin, "forward")
        golden_op = golden.op(record.step, origin, "forward")
    except KeyError:
        return None
    name = f"output_{slot}"
    try:
        if not (unfused.tensor(name).has_data and golden_op.tensor(name).has_data):
            return None
    except KeyError:
        return None
    return relative_error(fusion_off.tensor(record.step, unfused.exec_index, name),
                          golden.tensor(record.step, golden_op.exec_index, name))


def fusion_report(target, golden=None, fusion_off=None) -> FusionReport:
    """Passes and counts; with golden (and fusion-off) dumps, the suspects worst first.

    A fused op's error is the error it *introduces*: the op replayed on the
    golden inputs, so that a fused op fed by an earlier bad op is not blamed.
    It is a suspect when that error is at least SIGNIFICANT_ERROR and clearly
    larger than the unfused ops': FUSION_SUSPECT_RATIO times the same output's
    error in the fusion-off run when one is given, else INTRODUCED_EXCESS
    times what its compute dtype explains.
    """
    passes = fusion_passes(target)
    if golden is None:
        return FusionReport(passes, [], compared=False)
    fused = _first_step_fused(target)
    views = golden_views(golden, fused)
    suspects = []
    for record in fused:
        attribution = attribute_record(golden, target, record, view=views[id(record)])
        fused_error = attribution.introduced if attribution.introduced is not None else attribution.observed
        if fused_error < SIGNIFICANT_ERROR:
            continue
        unfused_error = _unfused_error(golden, fusion_off, record) if fusion_off is not None else None
        ratio = fused_error / max(unfused_error, 1e-12) if unfused_error is not None else None
        if ratio is not None and ratio < FUSION_SUSPECT_RATIO:
            continue
        if ratio is None and (attribution.excess or 0.0) < INTRODUCED_EXCESS:
            continue
        suspects.append(FusionSuspect(record.step, record.name, record.type, record.pass_name,
                                      record.original_names, fused_error, unfused_error, ratio,
                                      switch_off_action(record.pass_name)))
    suspects.sort(key=lambda s: (-(s.ratio or 0.0), -s.fused_error))
    return FusionReport(passes, suspects, compared=True)
