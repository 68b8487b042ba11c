"""The parts of a diagnosis view that stand alone: the root-cause box, the section summaries, which attribution
rows to show, and the JSON form. `precision_tool.render.shell_views.diagnosis` assembles them."""

from __future__ import annotations

import dataclasses
import math

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def verdict(v):
    """The root-cause box: labels on the left, their text wrapped beside them (never back to column 0)."""
    style = "green" if v.cls == "none" else "bold red"
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text("Verdict:", style="bold"), Text(v.cls, style=style))
    if v.op:
        where = ", ".join(x for x in (f"step {v.step}" if v.step is not None else "", v.direction or "",
                                      v.type or "") if x)
        grid.add_row("Op:", Text(v.op + (f" ({where})" if where else "")))
    if getattr(v, "module", None) and v.module != v.op:
        grid.add_row("Module:", Text(v.module))
    for line in v.evidence:
        grid.add_row("  -", Text(line))
    if v.action:
        grid.add_row("Action:", Text(v.action))
    return Panel(grid, title="root cause", title_align="left", box=box.HEAVY, expand=False)


ATTRIBUTION_SHOWN = 8  # without --all, the attribution table shows the ops up to the culprit, this many


def attribution_path(d, show_all: bool = False) -> list:
    """The attributions to show: all, or the last few up to and including the verdict's op."""
    rows = list(d.attributions)
    if show_all or len(rows) <= ATTRIBUTION_SHOWN:
        return rows
    v = d.verdict
    end = next((i + 1 for i, a in enumerate(rows) if a.name == v.op and a.step == v.step
                and (not v.direction or a.direction == v.direction)), None)
    if end is None:  # no culprit among them: the worst introduced errors, in execution order
        worst = sorted(range(len(rows)), key=lambda i: -((rows[i].introduced or 0.0) - (rows[i].expected or 0.0)))
        return [rows[i] for i in sorted(worst[:ATTRIBUTION_SHOWN])]
    return rows[max(0, end - ATTRIBUTION_SHOWN):end]


def plural(count: int, noun: str) -> str:
    """``1 op``, ``2 ops``: a count and its noun, which takes an s unless the count is one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def section(title: str, summary: str):
    return Text.assemble((title, "bold underline"), f"  {summary}" if summary else "")


def overflow_summary(report) -> str:
    if not report or not report.total:
        return "no op raised the float status" if report else "no overflow data"
    first, shared, asked = report.first, report.as_in_golden, getattr(report, "asked", 0)
    if first is None and shared == report.total:
        return f"{plural(report.total, 'op execution')} raised the float status, each as golden's op does"
    if first is None and shared + asked == report.total:
        return (f"{plural(report.total, 'op execution')} raised the float status, each with the model's own "
                "inf/NaN: " + "; ".join(x for x in (f"{shared} as golden's ops do" if shared else "",
                                                   f"{asked} infinite constants it asks for or carries (a mask's -inf)"
                                                   if asked else "") if x))
    return (f"{plural(report.total, 'op execution')} raised the float status"
            + (f", the first {first.name} (step {first.step} {first.direction})" if first is not None else "")
            + (f"; {shared} as golden's ops do" if shared else "")
            + (f"; {asked} infinite constants the model asks for" if asked else ""))


def fusion_summary(report) -> str:
    if not report:
        return "no fusion data"
    if not report.passes:
        return "no fusion pass was applied"
    suspects = len(report.suspects) if report.compared else 0
    return (f"{len(report.passes)} pass{'' if len(report.passes) == 1 else 'es'} applied; " +
            (f"{plural(suspects, 'fused op')} worse than {'its' if suspects == 1 else 'their'} unfused ops"
             if suspects else
             "no fused op worse than its unfused ops" if report.compared else "no fusion-off dump to rank them"))


def diagnosis_dict(d) -> dict:
    """The JSON form of a Diagnosis: the verdict object first; NaN and inf become null."""
    return {
        "verdict": _jsonable(d.verdict.to_dict()),
        "overflow": _jsonable(d.overflow),
        "fusion": _jsonable(d.fusion),
        "attributions": _jsonable(d.attributions),
        "notes": list(d.notes),
        "flagged": d.flagged,
        "first_flagged": d.first_flagged,
        "first_module": getattr(d, "first_module", None),
        "precheck": precheck_dict(getattr(d, "precheck", None)),
        "outcome": _jsonable(getattr(d, "outcome", None)),
    }


def precheck_dict(check):
    if check is None:
        return None
    return {"passed": check.passed, "summary": check.summary(), "unexpected": [item.name for item in check.unexpected],
            "items": [{"name": i.name, "status": i.status, "golden": _jsonable(i.golden), "target": _jsonable(i.target),
                       "expected": i.expected} for i in check.items]}


def jsonable(value):
    """``value`` (dataclasses, containers, numpy scalars) as JSON-ready data; NaN and inf become None."""
    return _jsonable(value)


def _jsonable(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if getattr(value, "ndim", 0) and hasattr(value, "tolist"):  # numpy arrays (pt's first values)
        return _jsonable(value.tolist())
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _jsonable(value.item())
    return value
