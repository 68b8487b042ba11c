"""The shell's views of the analysis results: `of` (overflow), `fu` (fusion) and `rerun` (attribution), which
`diagnose` and `ac` draw too."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.render.cells import hanging, indented, num, panel as _panel, table as _table, titled as _titled
from precision_tool.render.fit_table import Column, FitTable


def _range(r) -> str:
    if r.min != r.min and r.max != r.max:  # NaN: statistics over the finite values, and there is none
        return "[no finite value]"
    return f"[{num(r.min, 5)}, {num(r.max, 5)}]"


def overflow_report(report, limit: int | None = None):
    entries = report.cut(limit)
    if not report.total:
        return Text(f"No op raised the float status{_source(report)}.", style="green")
    first = report.first
    executions = "1 op execution" if report.total == 1 else f"{report.total} op executions"
    summary = Text(f"{executions} raised the float status in step{'s' if len(report.steps) > 1 else ''} "
                   f"{_list(report.steps)}{_source(report)}")
    if first is not None:
        summary.append(f"; the first: {first.name} ({first.type}), step {first.step} {first.direction}")
    shared, asked = report.as_in_golden, report.asked
    if shared:
        summary.append(f"; {'all as' if shared == report.total else f'{shared} of them as'} golden's ops do "
                       "(the model's own inf/NaN)")
    if asked:
        summary.append(f"; {'all' if asked == report.total else f'{asked} of them'} infinite constants the model "
                       "asks for (a mask's -inf), or carried from them")
    skipped = report.skipped_steps
    summary.append(f"; updates skipped at step{'s' if len(skipped) > 1 else ''} {_list(skipped)}" if skipped
                   else "; no update was skipped")
    if report.loss_scale:
        low, high = report.loss_scale[0], report.loss_scale[-1]
        summary.append(f"; loss scale {num(low)} -> {num(high)}" if low != high
                       else f"; loss scale stayed {num(low)}")
    own = report.models_own  # some of the model's own unshown:
    left_out = 0 < own < report.total and sum(e.models_own for e in entries) < own
    lines = [summary, Text(f"showing {len(entries)} of {report.total}, in execution order"
                           + (", the model's own inf/NaN where room is left" if left_out else ""), style="bold")]
    for number, entry in enumerate(entries, 1):
        lines.extend(_overflow_entry(number, entry, entry is first))
    return Group(*lines)


def _overflow_entry(number: int, entry, is_first: bool) -> list[Text]:
    """One overflowing op as a few short lines: readable at any terminal width."""
    status = ("as golden", "dim") if entry.in_golden else ("constant", "dim") if entry.asked else \
        ("inherited", "yellow") if entry.inherited else \
        (("FIRST", "bold red") if is_first else ("overflow", "red"))
    head = Text.assemble(f"[{number}] ", (status[0], status[1]),
                         f"  step {entry.step} {entry.direction} #{entry.exec_index}  {entry.name} ({entry.type})"
                         f"  {entry.compute_dtype}")
    if entry.saturated or entry.inf or entry.nan:
        counts = Text(f"outputs hold {entry.saturated} saturated, {entry.inf} inf, {entry.nan} nan values")
    elif entry.invalid:
        counts = Text("no output holds inf, nan or a saturated value: the NaN it makes was written as numbers")
    else:
        counts = Text("no output holds inf, nan or a saturated value: the overflow is inside the kernel")
    ranges = Text("inputs " + (" ".join(_range(r) for r in entry.input_ranges) or "-")
                  + "  outputs " + (" ".join(_range(r) for r in entry.output_ranges) or "-"))
    return [hanging(head, 4), *(indented(line, 4) for line in (counts, ranges, Text(f"hint: {entry.hint}",
                                                                                        style="cyan")))]


def fusion_report(report):
    if not report.passes:
        return Text("No fusion pass was applied in the target run.")
    passes = _table("Fusion passes applied", "Pass", "Count")
    for name, count in report.passes.items():
        passes.add_row(name, str(count))
    if not report.compared:
        return Group(_titled(passes), Text("Load golden and fusion-off dumps (--golden, --fusion-off) "
                                           "to rank the fused ops."))
    if not report.suspects:
        return Group(_titled(passes), Text("No fused op is clearly worse than its unfused ops.", style="green"))
    rows = [[str(rank), str(s.step), Text(s.name), Text(s.type), Text(s.pass_name), num(s.fused_error, 4),
             num(s.unfused_error, 4), num(s.ratio, 4)] for rank, s in enumerate(report.suspects, 1)]
    suspects = FitTable(SUSPECT_COLUMNS, rows, name_column=2)  # a name is never folded into the next lines
    details = []
    for rank, s in enumerate(report.suspects, 1):
        details.append(hanging(Text(f"  [{rank}] {s.name} replaces {', '.join(s.original_names)}"), 6))
        details.append(indented(Text(s.action, style="cyan"), 6))
    return Group(_titled(passes), Text("Fused-op suspects, worst first", style="bold"), suspects, *details)


def attribution(a):
    table = _table(None, "Field", "Value", show_header=False)
    table.add_row("Op", f"{a.name} ({a.type}), step {a.step}, {a.direction}, computes in {a.compute_dtype}")
    table.add_row("Observed error", num(a.observed, 4) + "  (recorded target output against golden)")
    table.add_row("Inherited", num(a.inherited, 4) + "  (largest error of its inputs)")
    table.add_row("Introduced", "not replayable" + (" (see the note)" if a.notes else "") if a.introduced is None else
                  num(a.introduced, 4) + f"  (replayed on golden inputs, {a.replay_device} numerics)")
    table.add_row("Expected", num(a.expected, 4) + f"  (what {a.compute_dtype} rounding alone explains)")
    if a.excess is not None:
        table.add_row("Excess", f"{num(a.excess, 3)}x expected")
    if a.overflowed:  # the errors above leave these out: they would only say how far the format's limit is
        table.add_row("Overflowed", f"{a.overflowed} output values golden holds are beyond the target format's "
                                    "range (left out of the errors above)")
    if a.new_nan:
        table.add_row("New NaN", f"{a.new_nan} output values are NaN where golden's are finite")
    if a.inputs_off:
        table.add_row("Inputs off", f"{', '.join(a.inputs_off)} already hold{'s' * (len(a.inputs_off) == 1)} "
                                    "overflowed or NaN values")
    for note in a.notes:
        table.add_row("Note", note)
    table.add_row("Reading", Text(_reading(a), style="bold"))
    return _panel(table, f"rerun {a.name}")


def _reading(a) -> str:
    """Where the error comes from, and whether the op's dtype explains what it adds."""
    if a.inputs_off:
        return "its inputs already hold overflowed or NaN values: look upstream"
    if a.overflowed or a.new_nan:
        made = " and ".join(x for x in ("values beyond its format's range" if a.overflowed else "",
                                        "NaN" if a.new_nan else "") if x)
        return f"it makes {made} here, from inputs that hold none (ac judges whether the ops reading it suffer)"
    if a.introduced is None:
        return "cannot replay this op; only the inherited error is known"
    where = ("most of its error is introduced here" if a.introduced >= a.inherited
             else "most of its error is inherited from its inputs: look upstream")
    dtype = a.compute_dtype
    if a.introduced >= SIGNIFICANT_ERROR and a.excess is not None and a.excess > INTRODUCED_EXCESS:
        why = f"it computes {a.excess:.3g}x worse than {dtype} allows"
    elif a.introduced >= SIGNIFICANT_ERROR:
        why = f"{dtype} rounding explains it: the op is ill-conditioned in {dtype}"
    else:
        why = f"what it adds is small and within what {dtype} explains"
    return f"{where}; {why}"


def _list(values) -> str:
    values = list(values)
    return ", ".join(str(v) for v in values[:10]) + (", ..." if len(values) > 10 else "")


def _source(report) -> str:
    return f" in {report.source}" if getattr(report, "source", "") else ""


SUSPECT_COLUMNS = (Column("#", "right"), Column("Step", "right"), Column("Fused op"), Column("Type", drop=1),
                   Column("Pass"), Column("Introduced err", "right"), Column("Unfused err", "right"),
                   Column("Ratio", "right"))
