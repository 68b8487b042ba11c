"""`DumpSummary` of an open dump: what `precision-tool inspect` shows."""

from __future__ import annotations

from precision_tool.dump import layout
from precision_tool.dump.records import DumpSummary
from precision_tool.errors import InputError


def summarize(dump, first_overflows: int = 5) -> DumpSummary:
    """Counts, overflow, loss history and size of ``dump`` (a `precision_tool.dump.reader.Dump`)."""
    steps = dump.steps()
    ops = tensors = recorded_overflows = 0
    counted_overflows = 0
    has_counts = True
    first = []
    for record in steps:
        index = dump.step_index(record.step)
        ops += len(index.op_rows)
        tensors += len(index.tensor_rows)
        rows = index.overflow_rows
        recorded_overflows += len(rows)
        count = dump.step_attrs(record.step).get("overflow_ops")
        if count is None:
            has_counts = False
        elif isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            counted_overflows += count
        else:
            raise InputError(dump.path, f"/{layout.STEPS}/{layout.step_name(record.step)}: its overflow_ops "
                                        f"attribute {count!r} is not a whole number >= 0")
        for position in rows[: max(0, first_overflows - len(first))]:
            first.append(index.record_at(int(position)))
    return DumpSummary(
        path=dump.path,
        schema_version=dump.schema_version,
        complete=dump.complete,
        steps_complete=dump.steps_complete,
        metadata=dict(dump.metadata),
        ops=ops,
        tensors=tensors,
        # the collector counts every op that raised the float status, recorded or not
        overflow_ops=counted_overflows if has_counts and steps else recorded_overflows,
        overflow_steps=[s.step for s in steps if s.overflow],
        loss=[s.loss for s in steps],
        loss_scale=[s.loss_scale for s in steps],
        accelerate_switch_step=accelerate_switch_step(dump.metadata, steps),
        size_bytes=dump.size_bytes,
        first_overflows=first,
        step_numbers=[s.step for s in steps],
        cut_short=[s.step for s in steps if s.cut_short],
    )


def accelerate_switch_step(metadata: dict, steps) -> int | None:
    """The step where accelerate_train_mode switched precision mode, or None.

    The run's end writes it to the root; a dump cut short by a crash lacks
    it, so it is then the first step whose precision mode differs from the
    first step's (only for runs with an accelerate_train_mode).
    """
    value = metadata.get("accelerate_switch_step")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if metadata.get("complete") or not metadata.get("accelerate_train_mode") or not steps:
        return None
    start = steps[0].precision_mode
    for step in steps[1:]:
        if step.precision_mode != start:
            return step.step
    return None
