"""Rich renderables for the shell's results, shared by the REPL, `shell -c` and `diagnose`.

Each view takes the data a handler returned (`precision_tool.commands.results`,
`precision_tool.analysis.results`) and returns a
rich renderable; `render` picks the view by the result's type (`RENDERERS`).
"""

from __future__ import annotations

import json

from rich.console import Group
from rich.text import Text

from precision_tool.errors import printable
from precision_tool.render.diagnosis_parts import diagnosis_dict  # noqa: F401  (the JSON twin, for callers)
from precision_tool.render.diagnosis_parts import (attribution_path, fusion_summary, overflow_summary, plural,
                                                   section, verdict)
from precision_tool.render.compare_view import SHORT_DIRECTIONS, SHORT_DTYPES, fmt_cosine, row_notes, rows_table
from precision_tool.render.analysis_views import attribution, fusion_report, overflow_report
from precision_tool.render.cells import hanging as _hanging, num, panel as _panel, shape as _shape, table as _table
from precision_tool.render.cells import titled as _titled
from precision_tool.render.fit_table import Column, FitTable

VALUES_PER_ROW = 8
SLOT_INDENT = 12  # `ni`: "  output_0  " before the side's name


def render(result):
    """The renderable of ``result``, by its type (`RENDERERS`); TypeError for a type nobody draws."""
    for kind in type(result).__mro__:
        view = RENDERERS.get((kind.__module__, kind.__qualname__))
        if view is not None:
            return view(result)
    if hasattr(result, "__rich_console__") or hasattr(result, "__rich__"):  # already drawn (a summary line)
        return result
    raise TypeError(f"no renderer for {type(result).__name__}")


# -- ls, ni --------------------------------------------------------------------
def op_listing(listing):
    step = "no step" if listing.step is None else f"step {listing.step}"
    if not listing.filters:
        table = _table(f"Op types of {step} ({listing.source})", "Type", "Count")
        for row in listing.counts:
            table.add_row(row.type, str(row.count))
        table.add_row(Text("total", style="bold"), Text(str(sum(r.count for r in listing.counts)), style="bold"))
        return _titled(table)
    wanted = ", ".join(f"{k}~{v!r}" for k, v in listing.filters.items())
    rows = [[str(op.exec_index), SHORT_DIRECTIONS.get(op.direction, op.direction), Text(op.name), Text(op.type),
             Text(op.pass_name or "-")] for op in listing.ops]
    return Group(Text(f"{plural(len(listing.ops), 'op')} of {step} match {wanted} ({listing.source})", style="bold"),
                 FitTable(LISTING_COLUMNS, rows, name_column=2))


def candidates(found):
    more = f" (first {len(found.names)} of {found.total})" if found.total > len(found.names) else ""
    lines = [Text(f"{found.query!r} matches {found.total} ops{more}; give one of:")]
    lines += [Text(f"  {name}") for name in found.names]
    return Group(*lines)


def op_info(info):
    op = info.op
    head = _table(None, "Field", "Value", show_header=False)
    head.add_row("Op", f"{op.name} ({op.type})")
    head.add_row("Where", f"{info.role} side, step {op.step}, {op.direction}, execution index {op.exec_index}")
    head.add_row("Compute dtype", op.compute_dtype)
    if op.pass_name:
        head.add_row("Fusion pass", op.pass_name)
        head.add_row("Original ops", ", ".join(op.original_names) or "-")
    for role, records in _by_role(info.sides).items():
        overflowed = [name for name, record in records if record.overflow]
        inherited = all(record.inherited_nonfinite for _, record in records if record.overflow)
        status = "no overflow" if not overflowed else "overflow" + (" (inherited)" if inherited else "")
        if overflowed and len(records) > 1:
            status += f" in {', '.join(overflowed)}"
        head.add_row(f"Float status, {role}", Text(status, style="red" if overflowed else "green"))
    if info.arguments:
        head.add_row("Arguments", ", ".join(f"{path}={value!r}" for path, value in info.arguments.items()))
    if info.argument_changes:
        head.add_row("Arguments vs golden", Text("; ".join(info.argument_changes), style="red"))
    elif info.argument_changes is not None and info.arguments:
        head.add_row("Arguments vs golden", Text("the same", style="green"))
    lines = [Text(f"ni {op.name}", style="bold"), head, Text("Tensors", style="bold")]
    for view in info.slots:  # a line that wraps goes on under the side's name, not at the left edge
        lines.extend(_hanging(line, SLOT_INDENT) for line in _slot_lines(view))
    return Group(*lines)


def _by_role(sides: dict) -> dict[str, list]:
    """``{"golden:a": r1, "golden:b": r2}`` -> ``{"golden": [("a", r1), ("b", r2)]}``."""
    grouped: dict[str, list] = {}
    for key, record in sides.items():
        role, _, name = key.partition(":")
        grouped.setdefault(role, []).append((name or record.name, record))
    return grouped


def _slot_lines(view) -> list[Text]:
    """One slot: a line per side (dtype, shape, statistics), then its metrics against golden."""
    lines = []
    for number, (role, record) in enumerate(view.records.items()):
        stats = record.stats
        dtype = SHORT_DTYPES.get(record.dtype, record.dtype)
        text = Text(f"  {view.slot if number == 0 else '':<9} {role:<10} {dtype:<5} {_shape(record.shape):<11}"
                    f" [{num(stats.min, 4)}, {num(stats.max, 4)}]  mean {num(stats.mean, 4)}"
                    f"  std {num(stats.std, 4)}")
        flags = [f"{n} {k}" for k, n in (("nan", stats.nan), ("inf", stats.inf), ("saturated", stats.saturated)) if n]
        if flags:
            text.append("  " + ", ".join(flags), style="red")
        if role in view.counterparts:
            text.append(f"  as {view.counterparts[role]}", style="dim")
        lines.append(text)
    metric = view.metric
    if metric is not None:
        if metric.cosine is None:
            lines.append(Text(f"  {'':<9} vs golden: {metric.note}", style="yellow"))
        else:
            text = Text(f"  {'':<9} vs golden: cosine {fmt_cosine(metric.cosine)}  rel. error {num(metric.relative_error, 4)}"
                        f"  max abs error {num(metric.max_abs_error, 4)}")
            if metric.note:
                text.append(f"  ({metric.note})", style="yellow")
            lines.append(text)
    return lines


# -- pt, cp --------------------------------------------------------------------
def tensor_view(view):
    stats = view.stats
    lines = [Text(f"{view.label}  {view.dtype} {_shape(view.shape)}  {view.total} elements"),
             Text(f"min {num(stats.min)}  max {num(stats.max)}  mean {num(stats.mean)}  std {num(stats.std)}  "
                  f"norm {num(stats.norm)}"),
             Text(f"nan {stats.nan}  inf {stats.inf}  saturated {stats.saturated}")]  # a count never wraps apart
    if view.values is None:
        lines.append(Text("values: not kept (stats-only dump)"))
        return _panel(Group(*lines), "pt")
    values = view.values.tolist()
    per_row = max(1, min(VALUES_PER_ROW, len(values)))  # `pt -p 3`: three value columns, not eight
    table = _table(f"first {view.shown} of {view.total} values (flattened)", "Index",
                   *[f"+{i}" for i in range(per_row)])
    for start in range(0, len(values), per_row):
        row = [num(v) for v in values[start:start + per_row]]
        table.add_row(str(start), *row, *([""] * (per_row - len(row))))
    return _panel(Group(*lines, _titled(table)), "pt")


def tensor_comparison(result):
    head = _table(None, "Field", "Value", show_header=False)
    head.add_row("Left", f"{result.left}  {_shape(result.left_shape)}")
    head.add_row("Right", f"{result.right}  {_shape(result.right_shape)}  (reference)")
    if result.comparable:
        verdict = Text(str(result.allclose), style="green" if result.allclose else "red")
        head.add_row("Elements", str(result.count))
        head.add_row("AllClose", verdict)
        head.add_row("Cosine", fmt_cosine(result.cosine))
        head.add_row("ErrorRatio", f"{num(result.error_ratio)} ({result.mismatched} of {result.count}; "
                                   f"rl={num(result.rtol)}, al={num(result.atol)})")
    for note in result.notes:
        head.add_row("Note", note)
    parts = [head]
    if result.mismatches:
        table = _table(f"first {len(result.mismatches)} of {result.mismatched} mismatching elements",
                       "Index", "Left", "Right", "Diff")
        for m in result.mismatches:
            table.add_row(_shape(m.index) if len(m.index) > 1 else str(m.index[0]),
                          num(m.left), num(m.right), num(m.diff))
        parts.append(_titled(table))
    return _panel(Group(*parts), "cp")


# -- vcs, ac / diagnose ----------------------------------------------------------
def flagged(selection):
    """`vcs`: compare's own table for the selected ops, then a summary from counts already known.

    The full-run chart and `summary_line` walk every op of the run (tens of
    milliseconds at 10,000 ops); `precision-tool compare` shows them, the shell
    keeps `vcs` fast enough to retype.
    """
    rows, threshold, report = selection.rows, selection.threshold, selection.report
    shown = f"first {len(rows)} of {selection.total}" if len(rows) < selection.total else f"{len(rows)}"
    title = f"Flagged ops ({shown}): an output's cosine <= {threshold:g}"
    if getattr(selection, "show_all", False):  # vcs --all
        title = f"All {len(rows)} compared ops"
    parts = [Text(title, style="bold")]
    parts += [rows_table(rows, threshold), *row_notes(rows, threshold)] if rows else [Text("  (none)")]
    parts.append(Text(f"compared {plural(report.compared_tensors, 'tensor')} in {plural(report.compared_ops, 'op')} | "
                      f"flagged {plural(selection.total, 'op')} at "
                      f"cosine <= {threshold:g} | unmatched: {len(report.unmatched_golden)} golden, "
                      f"{len(report.unmatched_target)} target"))
    if rows:
        first = rows[0]
        parts.append(Text(f"first flagged: step {first.step} #{first.exec_index} {first.name} ({first.type}, "
                          f"{first.direction}): " + "; ".join(first.flag_reasons(threshold)), style="bold red"))
    else:
        parts.append(Text("no op flagged", style="bold green"))
    if getattr(selection, "zoom", None) is not None:  # a statistics comparison: where to dump tensors
        from precision_tool.render.zoom_view import zoom_view

        parts.append(zoom_view(selection.zoom))
    return Group(*parts)


def diagnosis(d, overflow_limit: int | None = None, flagged_rows=None, show_all: bool = False):
    """The verdict first; then the sections behind it, each headed by a one-line summary."""
    parts = [verdict(d.verdict)]
    if getattr(d, "outcome", None) is not None:  # the symptom the verdict explains
        parts.append(section("Outcome", d.outcome.summary()))
    check = getattr(d, "precheck", None)
    if check is not None:  # the pre-check first: a setting changed by mistake explains everything after it
        parts.append(section("Pre-check", check.summary()))
        parts += [Text(f"  - {item.name}: {item.describe()}", style="yellow") for item in check.unexpected]
    parts.append(section("Overflow", overflow_summary(d.overflow)))
    if d.overflow and d.overflow.total:
        parts.append(overflow_report(d.overflow, overflow_limit))
    parts.append(section("Fusion", fusion_summary(d.fusion)))
    if d.fusion and d.fusion.passes:
        parts.append(fusion_report(d.fusion))
    first = f"; first: {d.first_flagged}" if d.first_flagged else ""
    parts.append(section("Comparison", f"{plural(d.flagged, 'op')} at or below the cosine threshold{first}"))
    if getattr(d, "first_module", None):
        parts.append(Text(f"first module whose output diverges beyond its inputs: {d.first_module}"))
    if flagged_rows is not None:
        parts.append(flagged(flagged_rows))
    if d.attributions:
        shown = attribution_path(d, show_all)
        scored = plural(len(d.attributions), "op")
        what = (f"{scored} scored" if len(shown) == len(d.attributions) else
                f"{scored} scored; {_which(d, shown)} shown (--all: every one)")
        parts.append(section("Attribution", what))
        rows = [[a.name, str(a.step), SHORT_DIRECTIONS.get(a.direction, a.direction), num(a.observed, 4),
                 num(a.inherited, 4), num(a.introduced, 4), num(a.expected, 4)] for a in shown]
        parts.append(FitTable(ATTRIBUTION_COLUMNS, rows, name_column=0))  # never wider than the terminal
    if d.notes:
        parts.append(section("Notes", f"{len(d.notes)}"))
        parts += [Text(f"  - {note}") for note in d.notes]
    return Group(*parts)


LISTING_COLUMNS = (Column("#", "right"), Column("Dir"), Column("Name"), Column("Type", drop=2), Column("Pass", drop=1))
ATTRIBUTION_COLUMNS = (Column("Op"), Column("Step", "right"), Column("Dir"), Column("Observed", "right"),
                       Column("Inherited", "right"), Column("Introduced", "right"), Column("Expected", "right"))


def _which(d, shown) -> str:
    """Which attributions `attribution_path` kept: those up to the culprit, else the worst, else the first."""
    v = d.verdict
    if any(a.name == v.op and a.step == v.step for a in shown):
        return f"the {len(shown)} up to the culprit"
    if any(a.introduced is not None for a in shown):
        return f"the {len(shown)} introducing the most error"
    return f"the first {len(shown)}"


def auto_check(check):
    return diagnosis(check.diagnosis, check.overflow_limit, check.flagged, getattr(check, "show_all", False))


# -- help ------------------------------------------------------------------------
def help_index(index):
    table = _table("Commands", "Command", "Description")
    for row in index.commands:
        table.add_row(row.name, row.summary)
    return Group(_titled(table), *[Text(note) for note in index.notes], Text("help CMD shows a command's options."))


def help_text(entry):
    return Text(entry.text.rstrip(), no_wrap=True, overflow="ignore")


def dump_summary(result):
    """The shell's `inspect`: the batch command's view of a loaded dump."""
    from precision_tool.render.inspect_view import summary_view

    return summary_view(result.summary)


def _json_document(result):
    return Text(json.dumps(result.document, indent=2, allow_nan=False), no_wrap=True, overflow="ignore")


def text_document(result):
    """JSON or CSV as the batch command prints it: whole lines, never wrapped or styled."""
    return Text(result.text.rstrip("\n"), no_wrap=True, overflow="ignore")


def delivered(result):
    """What a command left to show after writing its files, then a line per file written."""
    parts = [render(result.shown)] if result.shown is not None else []
    return Group(*parts, *[Text(f"wrote {printable(path)}", no_wrap=True, overflow="ignore") for path in result.wrote])


def baseline_saved(saved):
    return Text(f"baseline of {plural(saved.tensors, 'tensor')} in {plural(saved.ops, 'op')} written to "
                f"{printable(saved.output)}", no_wrap=True,
                overflow="ignore")


def _precheck(result):
    from precision_tool.render.precheck_view import precheck_view

    return precheck_view(result)


# result type (module, class name) -> view. By name, so that drawing a result never imports the layer that made
# it (the shell starts without loading the comparator or the analysis): `render` walks the result's MRO.
_COMMANDS, _ANALYSIS = "precision_tool.commands.results", "precision_tool.analysis.results"
RENDERERS = {
    (_COMMANDS, "OpListing"): op_listing, (_COMMANDS, "Candidates"): candidates, (_COMMANDS, "OpInfo"): op_info,
    (_COMMANDS, "TensorView"): tensor_view, (_COMMANDS, "TensorComparison"): tensor_comparison,
    (_ANALYSIS, "OverflowReport"): overflow_report, (_ANALYSIS, "FusionReport"): fusion_report,
    (_ANALYSIS, "Attribution"): attribution,
    (_COMMANDS, "AutoCheck"): auto_check, (_ANALYSIS, "Diagnosis"): diagnosis, (_COMMANDS, "HelpIndex"): help_index,
    (_COMMANDS, "HelpText"): help_text, (_COMMANDS, "InspectResult"): dump_summary,
    ("precision_tool.compare.check", "CheckResult"): lambda result: _check_view(result),
    (_COMMANDS, "JsonDocument"): _json_document, (_COMMANDS, "TextDocument"): text_document,
    (_COMMANDS, "Delivered"): delivered, (_COMMANDS, "Comparison"): flagged,
    (_COMMANDS, "BaselineSaved"): baseline_saved, ("precision_tool.analysis.precheck", "PrecheckResult"): _precheck,
    **{(module, name): (lambda result, view=view: _run_view(view)(result))
       for module, name, view in ((_COMMANDS, "RunComparison", "run_comparison"), (_COMMANDS, "RunCheck", "run_check"),
                                  ("precision_tool.analysis.ranks", "ConsistencyReport", "consistency"))},
    (_COMMANDS, "RunDiagnosis"): lambda result: run_diagnosis(result),
}


def run_diagnosis(result):
    """`diagnose` of two runs: which rank is diagnosed and why, the per-rank table, then that rank's `ac`."""
    from precision_tool.render.run_views import first_rank_line, rank_table

    chosen = result.ranks[result.diagnosed_rank]
    why = "it diverges first" if result.first_rank is not None else "no rank has a flagged op"
    return Group(Text(f"{result.world_size} ranks: diagnosing rank {result.diagnosed_rank} ({why}; {chosen.target})",
                      style="bold"),
                 rank_table(result.ranks), first_rank_line(result.first_rank, result.ranks), auto_check(result.check))


def _run_view(name: str):
    from precision_tool.render import run_views  # imported when first drawn: not at start-up

    return getattr(run_views, name)


def _check_view(result):
    from precision_tool.render.check_view import check_view  # imported when first drawn: not at start-up

    return check_view(result)
