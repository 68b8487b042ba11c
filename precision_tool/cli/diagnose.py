"""``precision-tool diagnose``: the root-cause verdict of the shell's `ac`, as a batch command.

The table form is the same renderer `ac` uses; ``--format json`` prints
``{"verdict": {"op", "class", "step", ...}, "overflow", "fusion",
"attributions", "notes", "flagged", "first_flagged"}``. When nothing is
wrong the verdict's class is ``none``. Exit status 0 whatever the verdict
(use ``check`` for a CI gate); 2 on a bad input file, and on golden and target
runs that cannot be compared (different models, swapped, an incomplete run
without --allow-incomplete: `precision_tool.compare.preflight`).
"""

from __future__ import annotations

import dataclasses
import json

import click

from precision_tool.cli.compare import allow_incomplete_option, preflight

_DUMP = click.Path(path_type=str)  # a dump file, or an msprobe dump directory or dump.json


@click.command("diagnose", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("golden", type=_DUMP)
@click.argument("target", type=_DUMP)
@click.option("--overflow", type=_DUMP, help="An overflow-mode dump of the target run.")
@click.option("--fusion-off", "fusion_off", type=_DUMP, help="The target run dumped with fusion switched off.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="A rich table, or JSON for scripts.")
@click.option("-c", "--compare", "compare_first", is_flag=True,
              help="Also list the flagged ops, as compare and the shell's vcs do (the shell's ac -c).")
@click.option("-l", "--limit", type=click.IntRange(min=0), default=None,
              help="Overflow entries to show (0: all; default 10, as ac -l).")
@click.option("-a", "--all", "show_all", is_flag=True,
              help="Every scored op in the attribution table, not only those up to the culprit.")
@allow_incomplete_option
def diagnose(golden, target, overflow, fusion_off, fmt, compare_first, limit, show_all, allow_incomplete):
    """Name the op where error is introduced, and why.

    Reads the GOLDEN and TARGET dumps (and optionally an overflow-mode and a
    fusion-off dump of the target run), and prints the root-cause verdict
    first, then the overflow summary, fusion suspects, comparison summary,
    the attribution of the ops up to the culprit (--all: every scored op)
    and notes, as the shell's `ac` does.
    """
    from contextlib import ExitStack

    from precision_tool.analysis import diagnose as run_diagnosis
    from precision_tool.compare.comparator import compare_dumps
    from precision_tool.dump.reader import open_dump

    with ExitStack() as stack:
        g, t, o, f = (stack.enter_context(open_dump(path)) if path is not None else None
                      for path in (golden, target, overflow, fusion_off))
        preflight(g, t, allow_incomplete)
        comparison = compare_dumps(g, t)
        result = run_diagnosis(g, t, overflow=o, fusion_off=f, comparison=comparison)
    if fmt == "json":
        from precision_tool.render.shell_views import diagnosis_dict

        click.echo(json.dumps(diagnosis_dict(result), indent=2, allow_nan=False))
        return
    from rich.console import Console

    from precision_tool.defaults import OVERFLOW_LIMIT
    from precision_tool.render.shell_views import diagnosis as diagnosis_view

    limit = OVERFLOW_LIMIT if limit is None else limit
    if limit and result.overflow is not None:
        result = dataclasses.replace(result, overflow=dataclasses.replace(result.overflow,
                                                                          entries=result.overflow.entries[:limit]))
    flagged = None
    if compare_first:
        from precision_tool.compare.report import Flagged, select_flagged
        from precision_tool.defaults import COSINE_THRESHOLD, LIST_LIMIT

        report = comparison
        every = select_flagged(report, COSINE_THRESHOLD, None)
        flagged = Flagged(report, every[:LIST_LIMIT], COSINE_THRESHOLD, LIST_LIMIT, len(every))
    Console(highlight=False).print(diagnosis_view(result, overflow_limit=limit, flagged_rows=flagged,
                                                  show_all=show_all))
