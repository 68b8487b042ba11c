"""Rendering a `DumpSummary`: the JSON form and the rich table of `precision-tool inspect`."""

from __future__ import annotations

import math

from precision_tool.dump.records import DumpSummary, OpRecord
from precision_tool.errors import printable

LOSS_ROWS = 12  # loss history rows shown in the table before eliding the middle
_DIRECTIONS = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def format_size(size: int) -> str:
    """``12345678`` -> ``11.8 MiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _finite(value):
    """JSON has no NaN or Infinity: non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def op_json(record: OpRecord) -> dict:
    """The JSON form of one recorded op: where it ran, and its tensors' statistics."""
    return {
        "step": record.step, "exec_index": record.exec_index, "name": record.name, "type": record.type,
        "direction": record.direction, "compute_dtype": record.compute_dtype, "overflow": record.overflow,
        "inherited_nonfinite": record.inherited_nonfinite, "pass_name": record.pass_name,
        "original_names": list(record.original_names),
        "tensors": [{"slot": t.slot, "dtype": t.dtype, "shape": list(t.shape), "has_data": t.has_data,
                     "min": t.stats.min, "max": t.stats.max, "mean": t.stats.mean, "nan": t.stats.nan,
                     "inf": t.stats.inf, "saturated": t.stats.saturated} for t in record.tensors],
    }


def summary_json(summary: DumpSummary) -> dict:
    """The ``inspect --format json`` object; non-finite numbers are null."""
    meta = summary.metadata
    device = meta.get("device")
    return _finite({
        "path": summary.path,
        "schema_version": summary.schema_version,
        "complete": summary.complete,
        "steps_complete": summary.steps_complete,
        "steps_planned": meta.get("steps"),
        "cut_short": list(summary.cut_short),
        "ops": summary.ops,
        "tensors": summary.tensors,
        "overflow_ops": summary.overflow_ops,
        "overflow_steps": list(summary.overflow_steps),
        "loss": list(summary.loss),
        "loss_scale": list(summary.loss_scale),
        "accelerate_switch_step": summary.accelerate_switch_step,
        "size_bytes": summary.size_bytes,
        "model": meta.get("model"),
        "device": device.get("device") if isinstance(device, dict) else device,
        "precision_mode": meta.get("effective_precision_mode") or meta.get("precision_mode"),
        "overflow_mode": meta.get("overflow_mode"),
        "mode": meta.get("mode"),
        "modes": meta.get("modes"),
        "role": meta.get("role"),
        "seed": meta.get("seed"),
        "created": meta.get("created"),
        "tool_version": meta.get("tool_version"),
        "command": meta.get("command"),
        "first_overflows": [op_json(r) for r in summary.first_overflows],
        "metadata": meta,
    })


def render_summary(summary: DumpSummary, console) -> None:
    """Print ``summary`` to a rich console: run metadata, counts, first overflows, loss history."""
    console.print(summary_view(summary))


def evaluation_text(evaluation: dict) -> str:
    """``accuracy 0.539 after step 7`` from one of a run's evaluations."""
    try:
        return f"{evaluation['metric']} {float(evaluation['value']):.4g} after step {evaluation['step']}"
    except (KeyError, TypeError, ValueError):
        return str(evaluation)


def summary_view(summary: DumpSummary):
    """``summary`` as one renderable (the batch command prints it, the shell's `inspect` returns it)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from precision_tool.render.diagnosis_parts import plural

    data = summary_json(summary)
    cut = summary.cut_short
    failed = f"; the run failed in step {cut[-1]}, kept up to the failure" if cut else ""
    state = "complete" if summary.complete else f"INCOMPLETE ({summary.steps_complete} steps readable{failed})"
    meta = summary.metadata
    form = f"schema {summary.schema_version}" if meta.get("format") != "msprobe" else \
        "msprobe dump (" + ", ".join(str(meta[k]) for k in ("msprobe_framework", "msprobe_task", "msprobe_level", "rank")
                                    if meta.get(k)) + ")"
    form, loss_scale = printable(form), meta.get("loss_scale")  # (a dump's strings may hold terminal escapes)
    parts = [Text.assemble((printable(summary.path), "bold"), f"  {form}, {state}, {format_size(summary.size_bytes)}")]
    run = Table.grid(padding=(0, 2))
    run.add_column(style="bold")
    run.add_column()
    for label, key in (("model", "model"), ("device", "device"), ("precision mode", "precision_mode"),
                       ("overflow mode", "overflow_mode"), ("mode", "modes"), ("role", "role"),
                       ("seed", "seed"), ("created", "created"), ("command", "command")):
        value = data.get(key)
        if key == "modes" and not value:  # a torch dump records "mode" alone
            value = data.get("mode")
        if value not in (None, "", []):
            run.add_row(label, printable(",".join(map(str, value)) if isinstance(value, list) else str(value)))
    if loss_scale:
        run.add_row("loss scale", printable(_brief(loss_scale)))
    if meta.get("accelerate_train_mode"):
        switch = summary.accelerate_switch_step
        run.add_row("accelerate", printable(f"{meta['accelerate_train_mode']} (switched at step {switch})"
                                            if switch is not None else str(meta["accelerate_train_mode"])))
    planned = data.get("steps_planned")
    resumed = meta.get("resumed_from")
    run.add_row("steps", f"{summary.steps_complete}" + (f" of {planned}" if planned else "")
                + (f", resumed from the checkpoint of step {resumed}" if resumed is not None else ""))
    run.add_row("recorded", f"{summary.ops:,} ops, {summary.tensors:,} tensors")
    steps = ", ".join(map(str, summary.overflow_steps[:20])) + (" ..." if len(summary.overflow_steps) > 20 else "")
    executions = f"{summary.overflow_ops:,} op execution" + ("" if summary.overflow_ops == 1 else "s")
    run.add_row("overflow", f"{executions} in {plural(len(summary.overflow_steps), 'step')}"
                + (f" ({steps})" if steps else ""))
    evaluations = meta.get("evaluations") or []
    if evaluations:
        run.add_row("evaluation", "; ".join(evaluation_text(e) for e in evaluations[-3:])
                    + (f" ({len(evaluations)} evaluations)" if len(evaluations) > 3 else ""))
    parts.append(run)
    if summary.first_overflows:
        parts.append(_overflow_table(summary.first_overflows))
    if summary.loss:
        parts.append(_loss_table(summary))
    return Group(*parts)


def _brief(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _overflow_table(records: list[OpRecord]):
    """The first overflowing ops, one line each: names shortened from the start, never folded."""
    from rich.console import Group
    from rich.text import Text

    from precision_tool.render.fit_table import Column, FitTable

    columns = (Column("step", "right"), Column("#", "right"), Column("op"), Column("type", drop=1), Column("dir"),
               Column("compute", drop=2), Column("cause"), Column("max |out|", "right"))
    rows = []
    for r in records:
        peak = max((max(abs(t.stats.min), abs(t.stats.max)) for t in r.outputs
                    if t.stats.count and not math.isnan(t.stats.min)), default=math.nan)
        if any(t.stats.inf for t in r.outputs):  # (min and max are those of the finite values)
            peak = math.inf
        cause = "inherited" if r.inherited_nonfinite else "here"
        rows.append([str(r.step), str(r.exec_index), r.name, r.type, _DIRECTIONS.get(r.direction, r.direction),
                     r.compute_dtype, cause, f"{peak:.6g}"])
    return Group(Text("first overflowing ops", style="bold"), FitTable(columns, rows, name_column=2))


def _loss_table(summary: DumpSummary):
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    # drawn as the overflow table above it is: a bold title, a rule under the header, no frame
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ("step", "loss", "loss scale", "overflow"):
        table.add_column(column, justify="right")
    overflow = set(summary.overflow_steps)
    rows = list(enumerate(zip(summary.loss, summary.loss_scale)))
    if len(rows) > LOSS_ROWS:
        half = LOSS_ROWS // 2
        rows = rows[:half] + [None] + rows[-half:]
    for row in rows:
        if row is None:
            table.add_row("...", "", "", "")
            continue
        position, (loss, scale) = row
        step = summary.step_numbers[position] if position < len(summary.step_numbers) else position
        table.add_row(str(step), f"{loss:.6g}", f"{scale:g}", "yes" if step in overflow else "")
    return Group(Text("loss and loss scale", style="bold"), table)
