"""The batch commands that read dumps, generated from their specs (`precision_tool.commands.registry`).

Each click command takes the spec's parameters (the dumps it reads first, then the options it shares with its
shell twin, then its own), opens the dumps as `DumpFiles`, calls the spec's handler, hands the result to
`precision_tool.render.exports.deliver` and prints what is left: JSON or CSV text as is, a table through the
command's batch view (`compare`'s, with the full-run chart) or the shared renderer of its type.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import click

from precision_tool.commands.spec import CommandSpec

CONTEXT = {"help_option_names": ["-h", "--help"]}


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


def _warn(message: str) -> None:
    click.echo(f"precision-tool: warning: {message}", err=True)


def batch_command(spec: CommandSpec) -> click.Command:
    """The click command of ``spec``."""

    def callback(**values):
        from precision_tool.bulk import bulk_objects
        from precision_tool.commands.sources import DumpFiles
        from precision_tool.render.exports import deliver

        paths = {role: values.pop(param.name) for role, param in spec.inputs}
        allow_incomplete = values.pop("allow_incomplete", None)
        with DumpFiles(paths, allow_incomplete=allow_incomplete, progress=progress_callback, warn=_warn) as source:
            result, delivered, inputs = spec.run(source, values)
            shown = deliver(result, inputs, **delivered)
        after = AFTER.get(spec.name, _nothing)
        try:
            with bulk_objects():  # a view of a big comparison builds a point per op
                present(spec, shown)
        except BrokenPipeError:  # the reader left (`| head`): what was found still sets the exit status
            after(result)
            raise
        after(result)

    return click.Command(spec.name, params=spec.batch_parameters(), callback=callback, help=spec.help,
                         short_help=spec.summary, context_settings=CONTEXT)


def present(spec: CommandSpec, delivered) -> None:
    """Print what `deliver` left: text whole, a result through its batch view; then the files written."""
    from precision_tool.commands.results import TextDocument
    from precision_tool.errors import printable

    shown = delivered.shown
    if isinstance(shown, TextDocument):
        click.echo(shown.text, nl=False)
    elif shown is not None:
        from precision_tool.cli.consoles import console

        view = BATCH_VIEWS.get(spec.name)
        if view is None or type(shown).__name__ != "Comparison":
            from precision_tool.render.shell_views import render as view
        console().print(view(shown))
    for path in delivered.wrote:
        click.echo(f"wrote {printable(path)}", err=True)


def _compare_view(comparison):
    from precision_tool.render.exports import comparison_table

    return comparison_table(comparison)


def _nothing(result) -> None:
    pass


def _check_failed(result) -> None:
    # Through the error boundary, not click's Exit: `main` maps RegressionFound to exit status 1.
    result.raise_if_failed()


def _precheck_failed(result) -> None:
    if not result.passed:  # through the error boundary: RegressionFound is exit status 1, with one line
        from precision_tool.compare.check import RegressionFound

        raise RegressionFound(f"precheck failed: {result.summary()}")


def _ranks_disagree(result) -> None:
    if not result.consistent:
        from precision_tool.compare.check import RegressionFound

        raise RegressionFound(result.summary())


BATCH_VIEWS = {"compare": _compare_view}  # a batch view other than the shared renderer of the result's type
AFTER = {"check": _check_failed, "precheck": _precheck_failed, "ranks": _ranks_disagree}  # exit status 1 once the result is shown


def command(name: str) -> click.Command:
    """The batch command ``name`` of the registry."""
    from precision_tool.commands.registry import SPECS

    return batch_command(SPECS[name])
