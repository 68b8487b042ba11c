"""One spec per command, read by both front ends: the batch CLI builds its click commands from it and the shell
its command table, help and completion.

A `CommandSpec` says what a command is called in each front end, its help, its parameters (click `Parameter`
objects: the shell parses a line with the very same objects the batch command parses its argv with, so names,
types, defaults, ranges and messages cannot drift), and its handler. A handler takes a *source* of dumps and
the parsed values and returns a result dataclass; it never prints:

- the batch command's source is `precision_tool.commands.sources.DumpFiles`, the dumps named on its command
  line (``inputs``: parameters that only the batch command has, because the shell has its dumps loaded);
- the shell's source is its session (the dumps loaded by role, and the cached comparison).

A source offers ``dump(role)``, ``optional(role)`` (None when not given), ``path(role)``, ``primary_role``,
``inputs`` (the paths read, which no output may overwrite), ``compare(options)`` and ``flagged(threshold,
options)``.

What to do with the result (``--format``, ``-o``, ``--plot``, ``--junit``: the ``delivered`` parameters) is
the same in both front ends too: `precision_tool.render.exports.deliver`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import click

BATCH, SHELL = "batch", "shell"
BOTH = frozenset({BATCH, SHELL})
DELIVERED = ("fmt", "output", "plot", "junit")  # parameters the front ends hand to `deliver`, not to the handler


@dataclass(frozen=True)
class CommandSpec:
    """One command of either front end, or of both."""

    name: str  # the batch command's name, and the shell's unless shell_name says otherwise
    summary: str  # one line: the batch --help listing, the shell's help and completion menu
    help: str  # the full help text (click's conventions: \b keeps a paragraph's lines)
    handler: Callable[..., Any] | str  # handler(source, **values) -> result; "module:function" is imported when run
    params: tuple[click.Parameter, ...] = ()  # both front ends
    inputs: tuple[tuple[str, click.Parameter], ...] = ()  # (role, parameter): the dumps the batch command reads
    batch_params: tuple[click.Parameter, ...] = ()  # the batch command only
    shell_params: tuple[click.Parameter, ...] = ()  # the shell only (before the shared ones)
    shell_name: str | None = None
    aliases: tuple[str, ...] = ()  # more shell names
    front_ends: frozenset = BOTH
    delivered: tuple[str, ...] = ()  # parameter names `deliver` takes (a subset of DELIVERED)
    outputs: tuple[str, ...] = ()  # parameter names of files written: refused, before any work, if inputs
    reads: tuple[str, ...] = ()  # parameter names of other files read (never written over)
    shell_help: str | None = None  # the shell's help, where the batch help speaks of files the shell has loaded
    shell_summary: str | None = None  # the shell's one line, where it says it better for the shell

    @property
    def shell(self) -> str:
        return self.shell_name or self.name

    @property
    def in_batch(self) -> bool:
        return BATCH in self.front_ends

    @property
    def in_shell(self) -> bool:
        return SHELL in self.front_ends

    def batch_parameters(self) -> list[click.Parameter]:
        return [*(param for _, param in self.inputs), *self.params, *self.batch_params]

    def shell_parameters(self) -> list[click.Parameter]:
        return [*self.shell_params, *self.params]

    def shell_parser(self) -> click.Command:
        """The shell's parser for this command (also what its help and completion read)."""
        return click.Command(self.shell, params=self.shell_parameters(), help=self.shell_help or self.help,
                             short_help=self.shell_summary or self.summary,
                             add_help_option=False, context_settings={"show_default": True})

    def resolve(self) -> Callable[..., Any]:
        if callable(self.handler):
            return self.handler
        module, attr = self.handler.split(":")
        return getattr(importlib.import_module(module), attr)

    def split(self, values: dict) -> tuple[dict, dict]:
        """(the handler's values, the delivered ones)."""
        handler_values = {k: v for k, v in values.items() if k not in self.delivered}
        return handler_values, {k: v for k, v in values.items() if k in self.delivered}

    def run(self, source, values: dict):
        """Refuse outputs that are inputs (before any work), then call the handler: (result, delivered values)."""
        handler_values, delivered = self.split(values)
        inputs = (*source.inputs, *(values[name] for name in self.reads if values.get(name) is not None))
        outputs = {name: values[name] for name in self.outputs if values.get(name) is not None}
        if outputs:
            check_outputs(inputs, **outputs)
        if hasattr(source, "delivery"):  # a handler may choose how to work by what is delivered (--plot, --junit)
            source.delivery = delivered
        from precision_tool.dump.mapping import checked_reads

        with checked_reads():  # a dump cut short while it was read is the error, not what was made of it
            result = self.resolve()(source, **handler_values)
        return result, delivered, inputs


def check_outputs(inputs, **outputs) -> None:
    """Refuse, before any work, outputs that are inputs or that two options share (``option=path``)."""
    from precision_tool.outputs import refuse_inputs, refuse_repeats

    outputs = {name: path for name, path in outputs.items() if path is not None}
    refuse_repeats({f"--{name.replace('_', '-')}": path for name, path in outputs.items()})
    for path in outputs.values():
        refuse_inputs(path, inputs)


@dataclass
class Registry:
    """The specs of every command, by batch name; shell names resolved through ``shell_names``."""

    specs: dict[str, CommandSpec] = field(default_factory=dict)

    def add(self, *specs: CommandSpec) -> "Registry":
        for spec in specs:
            if spec.name in self.specs:
                raise ValueError(f"two specs named {spec.name!r}")
            self.specs[spec.name] = spec
        return self

    def batch(self) -> dict[str, CommandSpec]:
        return {name: spec for name, spec in self.specs.items() if spec.in_batch}

    def shell(self) -> dict[str, CommandSpec]:
        """Shell name (and alias) -> spec, in registration order."""
        table = {}
        for spec in self.specs.values():
            if spec.in_shell:
                for name in (spec.shell, *spec.aliases):
                    table[name] = spec
        return table
