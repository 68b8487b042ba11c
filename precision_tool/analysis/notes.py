"""Precision-mode, cast and loss-scale notes for `ac` and `diagnose`."""

from __future__ import annotations

from collections import Counter

from precision_tool.engine.ops import REGISTRY
from precision_tool.engine.ops.base import BLACK


def meta(dump, key: str, default=None):
    """A run-metadata value, also when it sits in the nested ``device`` description."""
    value = dump.metadata.get(key)
    if value in (None, ""):
        device = dump.metadata.get("device")
        if isinstance(device, dict):
            value = device.get(key)
    return default if value in (None, "") else value


def _first_step_forward(dump):
    for step in dump.steps():
        records = dump.ops(step=step.step, direction="forward")
        if records:
            return records
    return []


def precision_notes(target) -> list[str]:
    """What the target's precision mode did: formats used, sensitive ops lowered, casts, loss scale."""
    notes = []
    mode = meta(target, "effective_precision_mode") or meta(target, "precision_mode")
    if mode:
        notes.append(f"precision mode {mode}, overflow mode {meta(target, 'overflow_mode', 'inf_nan')}")
    records = _first_step_forward(target)
    if records:
        by_dtype = Counter(r.compute_dtype for r in records)
        shares = ", ".join(f"{n} in {dtype}" for dtype, n in by_dtype.most_common())
        notes.append(f"{len(records)} forward ops per step: {shares}")
        lowered = Counter(r.type for r in records if r.compute_dtype in ("float16", "bfloat16")
                          and r.type in REGISTRY and REGISTRY[r.type].amp == BLACK)
        if lowered:
            listed = ", ".join(f"{t} x{n}" for t, n in lowered.most_common())
            notes.append(f"ops that mixed precision keeps in float32 run in low precision here: {listed}")
        casts = Counter((r.inputs[0].dtype if r.inputs else "?", r.compute_dtype) for r in records if r.type == "Cast")
        for (source, target_dtype), n in casts.items():
            notes.append(f"Cast {source} -> {target_dtype}: {n} op(s)")
    steps = target.steps()
    skipped = [s.step for s in steps if s.skipped]
    if steps and any(s.loss_scale != 1.0 for s in steps):
        notes.append(f"loss scale {steps[0].loss_scale:g} -> {steps[-1].loss_scale:g} over {len(steps)} steps; "
                     f"{len(skipped)} step(s) skipped for overflow")
    return notes
