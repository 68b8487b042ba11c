"""``precision-tool precheck GOLDEN TARGET``: the pre-tuning checklist (调优前检查) on two dumps' settings.

Exit 0 when the runs differ only where intended (and a second golden run, if
given, repeats the first exactly); 1 when a setting differs that ``--expect``
did not declare, or the reference does not repeat; 2 on a bad input.
"""

from __future__ import annotations

import click

from precision_tool.analysis.precheck import SETTING_NAMES
from precision_tool.compare.check import RegressionFound

_DUMP = click.Path(path_type=str)  # a dump file, or an msprobe dump directory or dump.json


def _names(ctx, param, values):
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETTING_NAMES]
    if unknown:
        raise click.BadParameter(f"unknown setting {unknown[0]!r}; valid: {', '.join(SETTING_NAMES)}")
    return tuple(names)


@click.command("precheck", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("golden", type=_DUMP)
@click.argument("target", type=_DUMP)
@click.option("--golden2", type=_DUMP, default=None,
              help="A second golden run of the same settings: the reference must repeat it exactly.")
@click.option("--expect", multiple=True, callback=_names, metavar="NAME[,NAME]",
              help=f"Settings meant to differ (repeatable): {', '.join(SETTING_NAMES)}.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="A table with a PASSED/FAILED footer, or JSON.")
def precheck_cmd(golden, target, golden2, expect, fmt):
    """Check that GOLDEN and TARGET differ only where intended, before tuning.

    Holds the pre-tuning checklist against the two dumps' recorded settings:
    device, precision mode and mix list, overflow mode, fusion switch, loss
    scale, boost, accelerate_train_mode, seed, batch size, model, optimizer,
    learning rate and steps. Each is the same, differs (golden X, target Y)
    or was not recorded. Differences that follow from the device (golden
    against npu: device, overflow mode, fusion) are intended; declare any
    other with --expect. Exit 1 when an undeclared difference is found.
    """
    from contextlib import ExitStack

    from precision_tool.analysis.precheck import precheck
    from precision_tool.dump.reader import open_dump

    with ExitStack() as stack:
        g, t, g2 = (stack.enter_context(open_dump(p)) if p is not None else None for p in (golden, target, golden2))
        result = precheck(g, t, g2, expect)
    if fmt == "json":
        from precision_tool.render.precheck_view import precheck_json

        click.echo(precheck_json(result), nl=False)
    else:
        from rich.console import Console

        from precision_tool.render.precheck_view import precheck_view

        Console(highlight=False).print(precheck_view(result))
    if not result.passed:  # through the error boundary: RegressionFound is exit status 1, with one line
        raise RegressionFound(f"precheck failed: {result.summary()}")
