"""``precision-tool inspect FILE``: summarise a dump (read-only)."""

from __future__ import annotations

import json

import click


def inspect_dump(path: str):
    """The handler: a `DumpSummary` of the dump at ``path`` (InputError if it is not a readable dump)."""
    from precision_tool.dump.reader import open_dump

    with open_dump(path) as dump:
        return dump.summary()


@click.command("inspect")
@click.argument("file", type=click.Path(dir_okay=True))
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Rich table, or one JSON object.")
def inspect_cmd(file, output_format):
    """Show a dump's run metadata, steps, op and tensor counts, overflowing ops,
    loss and loss-scale history, and size. Works on incomplete dumps (a killed
    run); never modifies the file.

    \b
    JSON keys include: schema_version, complete, steps_complete, ops, tensors,
    overflow_ops, overflow_steps, loss, loss_scale, accelerate_switch_step,
    size_bytes, model, device, precision_mode, mode, role, first_overflows.
    """
    from precision_tool.render.inspect_view import render_summary, summary_json

    summary = inspect_dump(file)
    if output_format == "json":
        click.echo(json.dumps(summary_json(summary), indent=2, allow_nan=False))
        return
    from rich.console import Console

    render_summary(summary, Console(highlight=False, soft_wrap=False))
