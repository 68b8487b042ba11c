"""The terminal view of a comparison: a table of the listed ops, a chart, the leftovers, a summary.

Shared by ``precision-tool compare`` and the shell's ``vcs`` (`flagged_view`).
Colour comes from rich, which leaves it out when the output is not a terminal
or NO_COLOR is set; every judgement is also spelled out in plain text.
"""

from __future__ import annotations

import math

from rich.console import Group
from rich.text import Text

from precision_tool.analysis.randomness import is_random_draw
from precision_tool.compare.report import CompareReport, OpComparison, TensorRow, row_flags
from precision_tool.render.cells import hanging
from precision_tool.render.chart import ExecutionChart
from precision_tool.render.diagnosis_parts import plural
from precision_tool.render.fit_table import Column, FitTable

SHORT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}
SHORT_DIRECTIONS = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
LEFTOVERS_SHOWN = 10
NOTE_INDENT = 4  # the lines a note or a leftover wraps to start here, under its "step"


def dtype_pair(target: str, golden: str) -> str:
    """``fp16/fp32`` (target/golden), or one name when both agree."""
    t, g = SHORT_DTYPES.get(target, target), SHORT_DTYPES.get(golden, golden)
    return t if t == g else f"{t}/{g}"


def fmt_cosine(value: float | None) -> str:
    """Six decimals; more when they would round a cosine below 1 up to 1.000000."""
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "nan"
    text = f"{value:.6f}"
    if text == "1.000000" and value < 1.0:
        text = f"{value:.12f}".rstrip("0")
        if text.startswith("1"):
            text = f"1-{1.0 - value:.1e}"
    return text


def fmt_err(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def row_note(row: TensorRow, cosine_threshold: float) -> str:
    """What the numbers alone do not say: a problem, an undefined cosine, a flagged stats row, NaN/inf."""
    notes = []
    if row.skip:
        notes.append(f"not judged: {row.skip}")
    if row.loss_scale != 1.0:
        notes.append(f"loss scale {row.loss_scale:g} divided out")
    if row.problem:
        notes.append(f"{row.problem}: {_shape(row.shape)} vs {_shape(row.golden_shape)}")
    if row.metrics is not None and row.metrics.note:
        notes.append(row.metrics.note)
    if row.stats is not None and row.stats.rel_norm_diff > 1.0 - cosine_threshold:
        notes.append(f"stats only: |Δnorm|/norm {fmt_err(row.stats.rel_norm_diff)}")
    if row.extra_nonfinite:
        notes.append(f"target +{row.extra_nonfinite} NaN/inf")
    return "; ".join(notes)


def _row_cells(row: TensorRow, cosine_threshold: float) -> list:
    flagged = row.kind == "output" and bool(row_flags(row, cosine_threshold))
    metrics = row.metrics
    cosine = Text(fmt_cosine(row.cosine), style="bold red" if flagged else ("green" if metrics else ""))
    if metrics is not None:
        errors = [fmt_err(metrics.max_abs_err), fmt_err(metrics.max_rel_err), fmt_err(metrics.rmse)]
    elif row.stats is not None:
        errors = [f">={fmt_err(row.stats.max_abs_err_bound)}", "n/a", "n/a"]
    else:
        errors = ["n/a", "n/a", "n/a"]
    return [Text("!" if flagged else "", style="bold red"), str(row.step), str(row.exec_index), Text(row.op),
            row.type, SHORT_DIRECTIONS.get(row.direction, row.direction), row.tensor,
            dtype_pair(row.target_dtype, row.golden_dtype), cosine, *errors]


COLUMNS = (Column(""), Column("step", "right"), Column("#", "right", drop=2), Column("op"), Column("type", drop=1),
           Column("dir"), Column("tensor"), Column("dtype", drop=5), Column("cosine", "right"),
           Column("max abs", "right"), Column("max rel", "right", drop=3), Column("rmse", "right", drop=4))
_OP = 3


class RowsTable(FitTable):
    """One line per tensor pair of ``ops``; ``!`` marks the outputs that flag their op.

    Nothing folds: on a narrow terminal op names are shortened from their start
    and the type, #, max rel, rmse and dtype columns leave, in that order
    (`precision_tool.render.fit_table`).
    """

    def __init__(self, ops: list[OpComparison], cosine_threshold: float):
        super().__init__(COLUMNS, [_row_cells(row, cosine_threshold) for op in ops for row in op.rows], _OP)


def rows_table(ops: list[OpComparison], cosine_threshold: float) -> RowsTable:
    """The table of the listed ops' tensors (see `RowsTable`)."""
    return RowsTable(ops, cosine_threshold)


def row_notes(ops: list[OpComparison], cosine_threshold: float) -> list:
    """What the table's numbers do not explain: a line per op and note, naming its tensors (a loss scale divided
    out of four tensors is one line, not four); a line that wraps stays indented."""
    lines = []
    for op in ops:
        tensors: dict[str, list[str]] = {}
        for row in op.rows:
            note = row_note(row, cosine_threshold)
            if note:
                tensors.setdefault(note, []).append(row.tensor)
        for note, names in tensors.items():
            lines.append(hanging(Text(f"  step {op.step} #{op.exec_index} {op.name} {', '.join(names)}: {note}",
                                      style="yellow"), NOTE_INDENT))
    return lines


def _leftovers(report: CompareReport, show_all: bool) -> list[Text]:
    lines = []
    for side, items in (("golden", report.unmatched_golden), ("target", report.unmatched_target)):
        if not items:
            continue
        lines.append(Text(f"Unmatched {side} ({len(items)}):", style="bold yellow"))
        shown = items if show_all else items[:LEFTOVERS_SHOWN]
        for item in shown:
            what = f"{item.name}:{item.slot}" if item.slot else item.name
            lines.append(hanging(Text(f"  step {item.step} #{item.exec_index} {what} ({item.type}, "
                                      f"{item.direction}): {item.reason}"), NOTE_INDENT))
        if len(shown) < len(items):
            lines.append(Text(f"  ... and {len(items) - len(shown)} more (--all, or --format json, lists them)",
                              style="dim"))
    return lines


def summary_line(report: CompareReport, cosine_threshold: float) -> Text:
    """Counts, and the first flagged op."""
    s = report.summary(cosine_threshold)
    parts = [f"compared {plural(s.compared_tensors, 'tensor')} in {plural(s.compared_ops, 'op')}",
             f"flagged {plural(s.flagged_ops, 'op')} at cosine <= {cosine_threshold:g}"]
    leftovers = [f"unmatched: {s.unmatched_golden} golden, {s.unmatched_target} target"]
    if s.covered_by_fusion:
        leftovers.append(f"{s.covered_by_fusion} golden ops covered by fusion")
    if s.shape_mismatches:
        leftovers.append(f"{s.shape_mismatches} shape mismatches")
    text = Text(" | ".join(parts) + "\n" + " | ".join(leftovers))
    if s.first_flagged is not None:
        op = s.first_flagged
        text.append("\nfirst flagged: ", style="bold")
        text.append(f"step {op.step} #{op.exec_index} {op.name} ({op.type}, {op.direction}): "
                    + "; ".join(op.flag_reasons(cosine_threshold)), style="bold red")
        hint = random_draw_hint(op.type, op.direction)
        if hint:
            text.append(f"\n  {hint}", style="yellow")
        module = s.first_flagged_module
        if module is not None:
            text.append("\nfirst flagged module: ", style="bold")
            text.append(f"step {module.step} {module.name} ({module.direction})", style="bold red")
    else:
        text.append("\nno op flagged", style="bold green")
    return text


def random_draw_hint(op_type: str, direction: str) -> str:
    """What a first flagged op that draws random values means (`analysis.randomness`); "" for other ops."""
    if direction != "forward" or not is_random_draw(op_type):
        return ""
    return ("a random draw: the runs draw other random numbers from here on (dropout masks), and every op after "
            "it differs for that alone; compare runs that draw the same (dropout off, or one seed on one "
            "generator)")


def compare_view(report: CompareReport, ops: list[OpComparison], cosine_threshold: float,
                 limit: int | None, show_all: bool = False, chart: bool = True) -> Group:
    """The whole terminal view; ``ops`` are the listed ones (flagged, or all with --all)."""
    parts = [Text(f"golden {report.golden.path} ({report.golden.mode})  vs  "
                  f"target {report.target.path} ({report.target.mode})", style="dim")]
    if show_all:
        title = f"All {len(ops)} compared ops"
    else:
        flagged = report.summary(cosine_threshold).flagged_ops
        shown = f"first {len(ops)} of {flagged}" if len(ops) < flagged else f"{len(ops)}"
        title = f"Flagged ops ({shown}): an output's cosine <= {cosine_threshold:g}"
    parts.append(Text(title, style="bold"))
    if ops:
        parts.append(rows_table(ops, cosine_threshold))
        parts.extend(row_notes(ops, cosine_threshold))
    else:
        parts.append(Text("  (none)"))
    if chart and report.compared_ops:
        parts.append(ExecutionChart(report, cosine_threshold))
    parts.extend(_leftovers(report, show_all))
    parts.extend(Text(f"note: {note}", style="yellow") for note in report.notes)
    parts.append(summary_line(report, cosine_threshold))
    return Group(*parts)


def flagged_view(report: CompareReport, ops: list[OpComparison], cosine_threshold: float,
                 limit: int | None) -> Group:
    """The shell's ``vcs``: the same view, listing the flagged ops `select_flagged` chose."""
    return compare_view(report, ops, cosine_threshold, limit)
