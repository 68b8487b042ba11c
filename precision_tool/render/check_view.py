"""The views of `precision-tool check`: failing tensors first-first, a PASSED/FAILED footer, and JSON."""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Group
from rich.text import Text

from precision_tool.compare.check import CheckResult
from precision_tool.render.compare_export import json_number, json_text
from precision_tool.render.compare_view import SHORT_DIRECTIONS, dtype_pair, fmt_err, random_draw_hint
from precision_tool.render.fit_table import Column, FitTable

# "why" repeats value and limit in words: on a narrow terminal it goes first, then type, dtype, #, metric
FAILURE_COLUMNS = (Column("step", "right"), Column("#", "right", drop=4), Column("op"), Column("type", drop=2),
                   Column("dir"), Column("tensor"), Column("dtype", drop=3), Column("metric", drop=5),
                   Column("value", "right"), Column("limit", "right"), Column("why", drop=1))


def footer(result: CheckResult) -> Text:
    """``PASSED | ...`` or ``FAILED | ...``, with the first failing op."""
    report = result.report
    unmatched = f"{len(report.unmatched_golden)} golden and {len(report.unmatched_target)} target unmatched (not judged)"
    if result.passed:
        return Text.assemble(("PASSED", "bold green"), f" | {result.checked} tensors checked | {unmatched}")
    first = result.first_failure
    hint = random_draw_hint(first.type, first.direction)
    return Text.assemble(
        ("FAILED", "bold red"),
        f" | {len(result.failures)} failures in {len(result.failing_ops)} ops of {result.checked} tensors checked"
        f" | {unmatched}\nfirst failing op: step {first.step} #{first.exec_index} {first.op} ({first.type}, "
        f"{first.direction}) {first.tensor}: {first.message}", (f"\n  {hint}" if hint else "", "yellow"))


def check_view(result: CheckResult) -> Group:
    """The failures as a table in execution order, then the footer."""
    parts = []
    if result.failures:
        rows = [[str(f.step), str(f.exec_index), Text(f.op), f.type, SHORT_DIRECTIONS.get(f.direction, f.direction),
                 f.tensor, dtype_pair(f.target_dtype, f.golden_dtype), f.metric, fmt_err(f.value), fmt_err(f.limit),
                 Text(f.message)] for f in result.failures]
        table = FitTable(FAILURE_COLUMNS, rows, name_column=2)
        parts += [Text("Failing tensors, in execution order:", style="bold"), table]
    if result.baseline_missing:
        parts.append(Text(f"note: {result.baseline_missing} baseline tensors were not in this comparison",
                          style="yellow"))
    parts.extend(Text(f"note: {note}", style="yellow") for note in result.report.notes)
    parts.append(footer(result))
    return Group(*parts)


def check_json(result: CheckResult) -> str:
    """The check result as a JSON document."""
    criteria = result.criteria
    document = {
        "passed": result.passed,
        "checked": result.checked,
        "criteria": {"min_cosine": criteria.min_cosine, "max_abs_err": criteria.max_abs_err,
                     "baseline": criteria.baseline is not None},
        "failing_ops": [{"step": s, "exec_index": i, "op": op, "direction": d} for s, i, op, d in result.failing_ops],
        "failures": [{k: json_number(v) for k, v in asdict(f).items()} for f in result.failures],
        "unmatched_golden": len(result.report.unmatched_golden),
        "unmatched_target": len(result.report.unmatched_target),
        "baseline_missing": result.baseline_missing,
        "notes": list(result.report.notes),
    }
    return json_text(document)
