"""The views of runs of several ranks: the per-rank table of compare, check and diagnose, and `ranks`.

Tables for the terminal (rich) and the JSON and CSV documents, registered by result type in
`precision_tool.render.shell_views.RENDERERS` and `precision_tool.render.exports.EXPORTS`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict

from rich.console import Group
from rich.text import Text

from precision_tool.errors import ConfigError
from precision_tool.render.compare_export import json_number, json_text
from precision_tool.render.compare_view import SHORT_DIRECTIONS, fmt_cosine
from precision_tool.render.fit_table import Column, FitTable

RANK_COLUMNS = (Column("rank", "right"), Column("ops", "right"), Column("flagged", "right"),
                Column("first step", "right"), Column("#", "right", drop=2), Column("first flagged op"),
                Column("dir", drop=1), Column("min cosine", "right"))
CHECK_RANK_COLUMNS = (Column("rank", "right"), Column("tensors", "right"), Column("failing", "right"),
                      Column("first step", "right"), Column("#", "right", drop=2), Column("first failing op"),
                      Column("dir", drop=1), Column("min cosine", "right"))
DEPARTURE_COLUMNS = (Column("step", "right"), Column("#", "right", drop=3), Column("op"), Column("type", drop=2),
                     Column("dir", drop=4), Column("tensor"), Column("departing"), Column("max abs diff", "right"),
                     Column("why", drop=1))


def _dash(value) -> str:
    return "-" if value is None or value == "" else str(value)


def rank_table(rows, columns=RANK_COLUMNS) -> FitTable:
    cells = [[str(r.rank), str(r.ops), str(r.flagged), _dash(r.first_step), _dash(r.first_exec_index),
              Text(r.first_op or "-"), SHORT_DIRECTIONS.get(r.first_direction, _dash(r.first_direction)),
              fmt_cosine(r.min_cosine)] for r in rows]
    return FitTable(columns, cells, name_column=5)


def first_rank_line(first_rank, rows, what: str = "diverges") -> Text:
    if first_rank is None:
        return Text(f"no rank {what}: every rank matches its golden rank", style="green")
    row = rows[first_rank]
    return Text.assemble((f"rank {row.rank} {what} first", "bold red"),
                         f": step {row.first_step} #{row.first_exec_index} {row.first_op} "
                         f"({row.first_direction})")


def run_comparison(result):
    from precision_tool.render.compare_view import compare_view

    flagged_ranks = sum(1 for r in result.ranks if r.flagged)
    parts = [Text(f"{result.world_size} ranks; {flagged_ranks} with ops flagged at cosine <= {result.threshold:g}",
                  style="bold"),
             rank_table(result.ranks), first_rank_line(result.first_rank, result.ranks),
             Text(f"rank {result.detail_rank} ({result.ranks[result.detail_rank].target}):", style="bold")]
    c = result.detail
    parts.append(compare_view(c.report, c.rows, c.threshold, c.limit, c.show_all))
    return Group(*parts)


def run_comparison_summary(result) -> Text:
    return first_rank_line(result.first_rank, result.ranks)


def run_comparison_json(result) -> str:
    from precision_tool.render.compare_export import to_json

    c = result.detail
    listed = json.loads(to_json(c.report, c.rows, c.threshold, None if c.show_all else c.limit,
                                "all" if c.show_all else "flagged"))
    return _lines({"golden": result.golden, "target": result.target, "world_size": result.world_size,
                   "threshold": result.threshold, "first_diverging_rank": result.first_rank,
                   "ranks": [_row_dict(r) for r in result.ranks], "listed_rank": result.detail_rank,
                   "listed": listed})


def run_comparison_csv(result) -> str:
    stream = io.StringIO()
    fields = ["rank", "target", "ops", "flagged", "first_step", "first_exec_index", "first_op", "first_direction",
              "min_cosine", "first_diverging"]
    writer = csv.DictWriter(stream, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in result.ranks:
        writer.writerow({**_row_dict(row), "first_diverging": row.rank == result.first_rank})
    return stream.getvalue()


def run_comparison_plot(result, path, inputs) -> None:
    raise ConfigError("--plot draws one dump pair: plot a rank's dumps (RUN/rank0.h5)")


def run_check(result):
    from precision_tool.render.check_view import check_view

    parts = [rank_table(result.ranks, CHECK_RANK_COLUMNS)]
    if result.first_rank is not None:
        parts += [Text(f"rank {result.first_rank} ({result.ranks[result.first_rank].target}):", style="bold"),
                  check_view(result.results[result.first_rank])]
    failing = [r.rank for r in result.ranks if r.flagged]
    if result.passed:
        parts.append(Text.assemble(("PASSED", "bold green"), f" | {result.world_size} ranks | "
                                   f"{sum(r.ops for r in result.ranks)} tensors checked"))
    else:
        parts.append(Text.assemble(("FAILED", "bold red"), f" | {len(failing)} of {result.world_size} ranks fail "
                                   f"({', '.join(map(str, failing))}) | ", first_rank_line(result.first_rank,
                                                                                          result.ranks, "fails")))
    return Group(*parts)


def run_check_json(result) -> str:
    return _lines({"passed": result.passed, "world_size": result.world_size, "first_failing_rank": result.first_rank,
                   "ranks": [_row_dict(r) for r in result.ranks],
                   "results": [json.loads(_check_json(r)) for r in result.results]})


def run_check_junit(result, path, inputs) -> None:
    import xml.etree.ElementTree as ET

    from precision_tool.outputs import write_text
    from precision_tool.render.junit import SUITE_NAME, to_junit_xml

    suites = ET.Element("testsuites", name=SUITE_NAME)
    for row, check in zip(result.ranks, result.results):
        suite = ET.fromstring(to_junit_xml(check).split("\n", 1)[1])
        suite.set("name", f"{SUITE_NAME} rank{row.rank}")
        suites.append(suite)
    ET.indent(suites)
    write_text(path, '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n",
               inputs)


def run_diagnosis_json(result) -> str:
    from precision_tool.render.diagnosis_parts import diagnosis_dict

    check = result.check
    return _lines({"golden": result.golden, "target": result.target, "world_size": result.world_size,
                   "first_diverging_rank": result.first_rank, "diagnosed_rank": result.diagnosed_rank,
                   "ranks": [_row_dict(r) for r in result.ranks],
                   "diagnosis": diagnosis_dict(check.full if check.full is not None else check.diagnosis)})


def consistency(report):
    parts = []
    if report.departures:
        rows = [[str(d.step), str(d.exec_index), Text(d.op), d.type, SHORT_DIRECTIONS.get(d.direction, d.direction),
                 d.slot or "-", ", ".join(map(str, d.departing)),
                 "-" if d.max_abs_diff is None else f"{d.max_abs_diff:.6g}", Text(d.reason)] for d in report.departures]
        more = report.total_departures - len(report.departures)
        parts += [Text("Tensors that differ across ranks, in execution order:", style="bold"),
                  FitTable(DEPARTURE_COLUMNS, rows, name_column=2)]
        if more:
            parts.append(Text(f"... and {more} more (-l 0: all)"))
    word = ("CONSISTENT", "bold green") if report.consistent else ("INCONSISTENT", "bold red")
    parts.append(Text.assemble(word, f" | {report.summary()}"))
    return Group(*parts)


def consistency_json(report) -> str:
    first = report.first
    return _lines({"path": report.path, "world_size": report.world_size, "consistent": report.consistent,
                   "steps": report.steps, "ops_checked": report.ops_checked,
                   "tensors_checked": report.tensors_checked, "inconsistent_tensors": report.total_departures,
                   "first": _departure_dict(first) if first is not None else None,
                   "departures": [_departure_dict(d) for d in report.departures]})


def _departure_dict(departure) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else json_number(v)) for k, v in asdict(departure).items()}


def _row_dict(row) -> dict:
    return {k: json_number(v) for k, v in asdict(row).items()}


def _check_json(result) -> str:
    from precision_tool.render.check_view import check_json

    return check_json(result)


def _lines(document: dict) -> str:
    return json_text(document)
