"""Delivering a command's result the same way in both front ends: ``--format json|csv``, ``-o FILE``, ``--plot``,
``--junit``.

`deliver` writes the files a command was asked for and says what is left to show: the JSON or CSV text (a
`TextDocument`, printed whole), the result itself (drawn by type: the batch command with its own view, the
shell with `precision_tool.render.shell_views.render`), or, when a table went to ``-o FILE``, its summary line.
The text of each format is keyed by result type (module, class name), as the renderers are.
"""

from __future__ import annotations

import json

from precision_tool.commands.results import Delivered, TextDocument
from precision_tool.render.compare_export import json_text

TABLE_FILE_WIDTH = 160  # columns of a table written to -o FILE


def deliver(result, inputs=(), fmt: str = "table", output: str | None = None, plot: str | None = None,
            junit: str | None = None) -> Delivered:
    """Write what was asked for (never over one of ``inputs``); return what is left to show."""
    exports = exports_of(result)
    wrote = []
    if junit is not None:
        exports["junit"](result, junit, inputs)
        wrote.append(junit)
    if plot is not None:
        exports["plot"](result, plot, inputs)
        wrote.append(plot)
    if fmt != "table" and fmt in exports:  # a result with no such form (an ambiguous op's candidates) is drawn
        text = exports[fmt](result)
        if output is None:
            return Delivered(TextDocument(text), tuple(wrote))
        from precision_tool.outputs import write_text

        write_text(output, text, inputs)
        return Delivered(None, (*wrote, output))
    if output is None:
        return Delivered(result, tuple(wrote))
    from rich.console import Console

    from precision_tool.outputs import replacing

    with replacing(output, inputs) as temporary, open(temporary, "w", encoding="utf-8") as stream:
        Console(file=stream, highlight=False, no_color=True, width=TABLE_FILE_WIDTH).print(exports["table"](result))
    return Delivered(exports["summary"](result), (*wrote, output))


def exports_of(result) -> dict:
    for kind in type(result).__mro__:
        found = EXPORTS.get((kind.__module__, kind.__qualname__))
        if found is not None:
            return found
    return {}


def document(result) -> dict:
    """The JSON document of ``result``, as its batch command prints it."""
    return json.loads(exports_of(result)["json"](result))


# -- compare / vcs -----------------------------------------------------------------------------------------------
def _comparison_json(c) -> str:
    from precision_tool.render.compare_export import report_dict
    from precision_tool.render.zoom_view import zoom_dict

    document = report_dict(c.report, c.rows, c.threshold, None if c.show_all else c.limit,
                           "all" if c.show_all else "flagged")
    document["zoom"] = zoom_dict(c.zoom)
    return json_text(document)


def _comparison_csv(c) -> str:
    from precision_tool.render.compare_export import to_csv

    return to_csv(c.report, c.rows, c.threshold)


def _comparison_plot(c, path, inputs) -> None:
    from precision_tool.render.plot import write_plot

    write_plot(c.report, path, c.threshold, inputs)


def comparison_table(c):
    """compare's whole terminal view: the listed ops, the full-run chart, leftovers, notes and summary."""
    from precision_tool.render.compare_view import compare_view

    return _with_zoom(compare_view(c.report, c.rows, c.threshold, c.limit, c.show_all), c.zoom)


def _comparison_summary(c):
    from precision_tool.render.compare_view import summary_line

    return _with_zoom(summary_line(c.report, c.threshold), c.zoom)


def _with_zoom(view, region):
    """``view``, then the zoom region's commands when there is one."""
    if region is None:
        return view
    from rich.console import Group

    from precision_tool.render.zoom_view import zoom_view

    return Group(view, zoom_view(region))


# -- the others --------------------------------------------------------------------------------------------------


def _auto_check_json(check) -> str:
    from precision_tool.render.diagnosis_parts import diagnosis_dict

    return json_text(diagnosis_dict(check.full if check.full is not None else check.diagnosis))


def _check_json(result) -> str:
    from precision_tool.render.check_view import check_json

    return check_json(result)


def _check_junit(result, path, inputs) -> None:
    from precision_tool.outputs import write_text
    from precision_tool.render.junit import to_junit_xml

    write_text(path, to_junit_xml(result), inputs)


def _inspect_json(result) -> str:
    from precision_tool.render.inspect_view import summary_json

    return json_text(summary_json(result.summary))


def _precheck_json(result) -> str:
    from precision_tool.render.precheck_view import precheck_json

    return precheck_json(result)


def _baseline_json(saved) -> str:
    return json_text({"tensors": saved.tensors, "ops": saved.ops, "output": saved.output})


def _analysis_json(result) -> str:
    """`of`, `fu`, `rerun`: the section of `diagnose --format json` the result is (NaN and inf as null); `ls`,
    `ni`, `pt`, `cp`: their result's fields."""
    from precision_tool.render.diagnosis_parts import jsonable

    return json_text(jsonable(result))


def _run(name: str):
    """A view of `precision_tool.render.run_views`, imported when first used."""
    def view(*args):
        from precision_tool.render import run_views

        return getattr(run_views, name)(*args)
    return view


_COMMANDS, _ANALYSIS = "precision_tool.commands.results", "precision_tool.analysis.results"
EXPORTS = {
    (_ANALYSIS, "OverflowReport"): {"json": _analysis_json},
    (_ANALYSIS, "FusionReport"): {"json": _analysis_json},
    (_ANALYSIS, "Attribution"): {"json": _analysis_json},
    **{(_COMMANDS, name): {"json": _analysis_json}
       for name in ("OpListing", "OpInfo", "TensorView", "TensorComparison", "Candidates")},
    (_COMMANDS, "Comparison"): {"json": _comparison_json, "csv": _comparison_csv, "plot": _comparison_plot,
                                "table": comparison_table, "summary": _comparison_summary},
    (_COMMANDS, "AutoCheck"): {"json": _auto_check_json},
    (_COMMANDS, "InspectResult"): {"json": _inspect_json},
    (_COMMANDS, "BaselineSaved"): {"json": _baseline_json},
    ("precision_tool.compare.check", "CheckResult"): {"json": _check_json, "junit": _check_junit},
    ("precision_tool.analysis.precheck", "PrecheckResult"): {"json": _precheck_json},
    (_COMMANDS, "RunComparison"): {"json": _run("run_comparison_json"), "csv": _run("run_comparison_csv"),
                                   "plot": _run("run_comparison_plot"), "table": _run("run_comparison"),
                                   "summary": _run("run_comparison_summary")},
    (_COMMANDS, "RunCheck"): {"json": _run("run_check_json"), "junit": _run("run_check_junit")},
    (_COMMANDS, "RunDiagnosis"): {"json": _run("run_diagnosis_json")},
    ("precision_tool.analysis.ranks", "ConsistencyReport"): {"json": _run("consistency_json")},
}
