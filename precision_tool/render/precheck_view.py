"""The views of `precision-tool precheck`: the checklist as a table with a PASSED/FAILED footer, and JSON."""

from __future__ import annotations

import dataclasses
import json

from rich.console import Group
from rich.table import Table
from rich.text import Text

from precision_tool.analysis.precheck import DIFFERS, NOT_RECORDED, PrecheckResult
from precision_tool.render.diagnosis_parts import jsonable

_STYLES = {DIFFERS: "bold red", NOT_RECORDED: "yellow"}


def precheck_view(result: PrecheckResult):
    """One row per setting (intended differences dim), the reference's repeatability, and the footer."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for item in result.items:
        style = "dim" if item.expected else _STYLES.get(item.status, "green")
        table.add_row(item.name, Text(item.describe(), style=style))
    r = result.repeatability
    if r.checked:
        repeat = Text(f"two golden runs: identical over {r.compared_tensors} tensors", style="green") if r.identical \
            else Text(f"two golden runs differ first at {r.first_difference}", style="bold red")
    else:
        repeat = Text("reference repeatability not checked (give a second golden run with --golden2)", style="dim")
    verdict = ("PASSED", "bold green") if result.passed else ("FAILED", "bold red")
    footer = Text.assemble(verdict, f" | {result.summary()}")
    hint = []
    if result.unexpected:
        names = ",".join(item.name for item in result.unexpected)
        hint.append(Text(f"if these differences are intended: --expect {names}", style="cyan"))
    return Group(Text(f"golden {result.golden}  vs  target {result.target}", style="dim"), table, repeat, footer,
                 *hint)


def precheck_json(result: PrecheckResult) -> str:
    """The checklist as JSON: passed, the items, the unexpected ones and the repeatability check."""
    document = {
        "passed": result.passed,
        "golden": result.golden,
        "target": result.target,
        "summary": result.summary(),
        "items": [{**dataclasses.asdict(item), "unexpected": item.unexpected} for item in result.items],
        "unexpected": [item.name for item in result.unexpected],
        "repeatability": dataclasses.asdict(result.repeatability),
    }
    # as every command's JSON (`compare_export.json_text`): NaN and inf as null; other values a setting holds as text
    return json.dumps(jsonable(document), indent=2, allow_nan=False, default=str) + "\n"
