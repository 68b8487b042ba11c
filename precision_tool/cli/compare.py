"""``precision-tool compare``: score every tensor of a target dump against a golden dump.

The option specs are shared: `selection_options` (--steps, --ops, --jobs)
with ``check`` and ``baseline``, and the ``-c``/``-l`` options with the
shell's ``vcs``, which reads them from this command so the two cannot drift.
Options default to None; the library's named defaults fill them in.
"""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from precision_tool.commands.options import COSINE_OPTION, LIMIT_OPTION
from precision_tool.defaults import COMPARE_JOBS, COSINE_THRESHOLD, LIST_LIMIT

DUMP = click.Path(path_type=str)  # a dump file, or an msprobe dump directory or dump.json
OUT_FILE = click.Path(dir_okay=False, writable=True, path_type=str)
FORMATS = ("table", "csv", "json")


def _steps_callback(ctx, param, value):
    from precision_tool.compare.selection import parse_steps
    from precision_tool.errors import ConfigError

    try:
        return parse_steps(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


def _plot_callback(ctx, param, value):
    if value is None:
        return None
    suffix = Path(value).suffix.lower()
    if suffix not in (".svg", ".png"):
        raise click.BadParameter(f"{value}: use a .svg or .png file name")
    if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
        raise click.BadParameter(f"{value}: PNG needs matplotlib; install precision-tool[plot] or use .svg")
    return value


def selection_options(func):
    """--steps, --ops and --jobs: which tensors to compare, and on how many threads."""
    func = click.option("--jobs", type=click.IntRange(min=1), default=None,
                        help=f"Threads scoring tensor pairs (default {COMPARE_JOBS}).")(func)
    func = click.option("--ops", "op_glob", metavar="GLOB", default=None,
                        help="Only ops whose name, or a name they were fused from, matches GLOB.")(func)
    func = click.option("--steps", metavar="LIST", default=None, callback=_steps_callback,
                        help="Only these steps, e.g. 0,5-7 (default: all).")(func)
    return func


def listing_options(func):
    """-c, -l and --all: which ops the listing shows (the rule of the shell's vcs)."""
    func = click.option("--all", "show_all", is_flag=True, help="List every compared op, not only flagged ones.")(func)
    for decls, attrs in (LIMIT_OPTION, COSINE_OPTION):  # shared with the shell's vcs
        func = click.option(*decls, **attrs)(func)
    return func


@contextmanager
def progress_callback():
    """A rich progress bar on stderr when it is a terminal; otherwise no callback."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    columns = ("comparing", BarColumn(), "{task.percentage:>3.0f}%", TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("compare", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or 1)

        yield update


def allow_incomplete_option(func):
    """--allow-incomplete: compare the committed steps of a run that was cut short, or is still written."""
    return click.option("--allow-incomplete", is_flag=True,
                        help="Accept a golden or target run that is incomplete (killed, or still being "
                             "written): only its committed steps are compared. Without it that is an "
                             "error (exit 2).")(func)


def preflight(golden, target, allow_incomplete: bool) -> None:
    """Refuse two opened dumps that cannot be compared meaningfully (exit 2); print the warnings on stderr."""
    from precision_tool.compare.preflight import raise_for_errors, run_problems

    for problem in raise_for_errors(run_problems(golden, target, allow_incomplete)):
        click.echo(f"precision-tool: warning: {problem.message}", err=True)


def run_compare(golden, target, steps, op_glob, jobs, allow_incomplete: bool | None = None):
    """The comparison compare, check and baseline share; with ``allow_incomplete`` given, `preflight` first."""
    from contextlib import ExitStack

    from precision_tool.compare.comparator import CompareOptions, compare_dumps
    from precision_tool.dump.reader import open_dump

    options = CompareOptions(steps=steps, ops=op_glob, jobs=jobs or COMPARE_JOBS)
    with ExitStack() as stack:
        sides = [stack.enter_context(open_dump(path)) for path in (golden, target)]
        if allow_incomplete is not None:
            preflight(*sides, allow_incomplete)
        with progress_callback() as progress:
            return compare_dumps(*sides, options, progress)


def write_text(text: str, output: str | None, inputs=()) -> None:
    """Print ``text``, or write it to ``output`` (never over one of ``inputs``) and say so."""
    if output is None:
        click.echo(text, nl=False)
    else:
        from precision_tool.outputs import write_text as write_file

        write_file(output, text, inputs)
        click.echo(f"wrote {output}", err=True)


def check_outputs(inputs, **outputs) -> None:
    """Refuse, before any work, outputs that are inputs or that two options share (``option=path``)."""
    from precision_tool.outputs import refuse_inputs, refuse_repeats

    refuse_repeats({f"--{name.replace('_', '-')}": path for name, path in outputs.items()})
    for path in outputs.values():
        refuse_inputs(path, inputs)


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("golden", type=DUMP)
@click.argument("target", type=DUMP)
@listing_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="A table with a chart, CSV, or JSON.")
@click.option("-o", "--output", type=OUT_FILE, default=None, help="Write the chosen format to FILE.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=str), default=None, callback=_plot_callback,
              help="Also draw cosine and max abs error along execution order to FILE (.svg, or .png with matplotlib).")
@selection_options
def compare(golden, target, cosine, limit, show_all, fmt, output, plot, steps, op_glob, jobs):
    """Compare every tensor of TARGET with its GOLDEN counterpart.

    Ops are matched by step, name, direction and tensor slot; a fused op
    through the ops it replaced. Lists the ops whose output cosine is at or
    below -c (first -l of them), or every op with --all, in execution order.
    Exit status 0 (use `check` for a CI gate), 2 on a bad input file.
    """
    from precision_tool.compare.report import select_flagged

    threshold = COSINE_THRESHOLD if cosine is None else cosine
    limit = LIST_LIMIT if limit is None else limit
    inputs = (golden, target)
    check_outputs(inputs, output=output, plot=plot)
    report = run_compare(golden, target, steps, op_glob, jobs)
    ops = list(report.ops) if show_all else select_flagged(report, threshold, limit)
    if plot is not None:
        from precision_tool.render.plot import write_plot

        write_plot(report, plot, threshold, inputs)
        click.echo(f"wrote {plot}", err=True)
    if fmt == "json":
        from precision_tool.render.compare_export import to_json

        write_text(to_json(report, ops, threshold, None if show_all else limit, "all" if show_all else "flagged"),
                   output, inputs)
    elif fmt == "csv":
        from precision_tool.render.compare_export import to_csv

        write_text(to_csv(report, ops, threshold), output, inputs)
    else:
        print_table(report, ops, threshold, limit, show_all, output, inputs)


def print_table(report, ops, threshold, limit, show_all, output, inputs=()) -> None:
    from rich.console import Console

    from precision_tool.outputs import replacing
    from precision_tool.render.compare_view import compare_view, summary_line

    view = compare_view(report, ops, threshold, limit, show_all)
    if output is None:
        Console(highlight=False).print(view)
        return
    with replacing(output, inputs) as temporary, open(temporary, "w", encoding="utf-8") as stream:
        Console(file=stream, highlight=False, no_color=True, width=160).print(view)
    Console(highlight=False).print(summary_line(report, threshold))
    click.echo(f"wrote {output}", err=True)
