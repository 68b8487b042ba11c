"""The shell's command table, generated from command specs: name -> parser, summary and handler.

The commands that read dumps and have a batch twin (vcs/compare, ac/diagnose, check, inspect, precheck) come
from `precision_tool.commands.registry`: the shell parses their lines with the batch command's own click
parameters and runs the same handler, over the session instead of files. The shell's own commands (ls, ni,
pt, cp, of, fu, rerun) are specs of the same kind (`SHELL_SPECS`), for the shell only. Handlers take a
source (here the session, seen through `SessionSource`) and the parsed values, and return data, which
`precision_tool.render.shell_views.render` draws by its type. The table is built per session
(`build_commands`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import click

from precision_tool import defaults
from precision_tool.commands.options import (OP_NAME, PASS_NAME, STEP, TENSOR_NAME, TOLERANCE, TYPE_NAME, format_param,
                                             option)
from precision_tool.commands.results import CommandHelp, HelpIndex, HelpText
from precision_tool.commands.spec import SHELL, CommandSpec, Registry
from precision_tool.repl import checks, ops, tensor_commands
from precision_tool.repl.tensors import GRAMMAR

QUIT_WORDS = ("exit", "quit")
_DIRECTION = click.Choice(["forward", "backward", "optimizer"])
_SHELL_ONLY = frozenset({SHELL})


@dataclass(frozen=True)
class Command:
    """One shell command: its parser (the spec's parameters as a click command) and handler."""

    name: str
    summary: str
    spec: click.Command
    handler: Callable[..., Any]  # handler(session, **params) -> a result, drawn by its type (render.shell_views)
    source: CommandSpec | None = None  # the spec it was generated from


class SessionSource:
    """The session as a spec handler's source of dumps: errors name the command that needed a role."""

    def __init__(self, session, command: str):
        self._session, self._command = session, command

    def __getattr__(self, name):  # the shell's own handlers use the session itself
        return getattr(self._session, name)

    def dump(self, role: str, command: str | None = None):
        return self._session.dump(role, command or self._command)


def _step(default: str = "the first step that recorded the op") -> click.Option:
    return option("-s", "--step", type=STEP, default=None, help=f"Step to look at (default: {default}).")


def _direction(*decls) -> click.Option:
    return option(*(decls or ("-d", "--direction")), type=_DIRECTION, default=None,
                  help="Forward, backward or optimizer op (default: forward, else the one the op has).")


_TENSOR_HELP = f"TENSOR: {GRAMMAR}; or a .npy file."


def _shell_spec(name, summary, help_text, handler, *params, delivered=()) -> CommandSpec:
    return CommandSpec(name, summary, help_text, handler, params=params, front_ends=_SHELL_ONLY, delivered=delivered)


def _json_option(section: str | None = None) -> click.Option:
    if section is None:
        return format_param(help_text="A table, or JSON.")
    return format_param(help_text=f"A table, or JSON (the {section!r} section of `precision-tool diagnose "
                                  "--format json`).")


SHELL_SPECS = Registry().add(
    _shell_spec("ls", "List the ops of one step by substring filters; with none, counts per type.",
                "List the ops of one step whose name, type and fusion pass hold the given substrings. With no "
                "filter: how many ops of each type.",
                lambda source, name, type_, pass_, step: ops.list_ops(source, name, type_, pass_, step),
                option("-n", "--name", type=OP_NAME, help="Substring of the op name."),
                option("-t", "--type", "type_", type=TYPE_NAME, help="Substring of the op type."),
                option("-f", "--pass", "pass_", type=PASS_NAME, help="Substring of the fusion pass name."),
                _step("the first recorded step"), _json_option(), delivered=("fmt",)),
    _shell_spec("ni", "Node info: one op on every side, its tensors, fusion, overflow, metrics.",
                "Node info: type, execution index, inputs and outputs with dtype, shape and statistics on each "
                "side, fusion pass and original ops, overflow flag, and metrics against golden. OP is an exact "
                "name, else a unique substring.",
                lambda source, op, step, direction: ops.node_info(source, op, step, direction),
                click.Argument(["op"], type=OP_NAME), _step(), _direction(), _json_option(), delivered=("fmt",)),
    _shell_spec("pt", "Print a tensor: its statistics and first values.",
                f"Print a tensor's statistics and first values. {_TENSOR_HELP} Nothing is written to disk.",
                lambda source, tensor, count: tensor_commands.print_tensor(source, tensor, count),
                click.Argument(["tensor"], type=TENSOR_NAME),
                option("-p", "--print", "count", type=click.IntRange(min=0), default=defaults.PT_PRINT,
                       help="Values to show."), _json_option(), delivered=("fmt",)),
    _shell_spec("cp", "Compare two tensors: allclose, cosine, error ratio, first mismatches.",
                f"Compare LEFT against the reference RIGHT: allclose, cosine, error ratio and the first "
                f"mismatching elements. {_TENSOR_HELP} LEFT defaults to the target side, RIGHT to the golden "
                "side; without RIGHT, LEFT's golden counterpart.",
                lambda source, left, right, count, atol, rtol:
                    tensor_commands.compare_tensors(source, left, right, count, atol, rtol),
                click.Argument(["left"], type=TENSOR_NAME),
                click.Argument(["right"], required=False, type=TENSOR_NAME),
                option("-p", "--print", "count", type=click.IntRange(min=0), default=defaults.CP_PRINT,
                       help="Mismatching elements to show."),
                option("-al", "--atol", type=TOLERANCE, default=defaults.CP_ATOL, help="Absolute tolerance."),
                option("-rl", "--rtol", type=TOLERANCE, default=defaults.CP_RTOL, help="Relative tolerance."),
                _json_option(), delivered=("fmt",)),
    _shell_spec("of", "Overflow report: each overflowing op, its counts, ranges and a hint.",
                "Overflow report of the overflow dump (else the target dump): each overflowing op with its "
                "status, saturated and inf counts, input and output ranges, and a hint.",
                lambda source, limit: checks.overflow(source, limit),
                option("-l", "--limit", type=click.IntRange(min=0), default=defaults.OVERFLOW_LIMIT,
                       help="Overflowing ops to show (0: all)."),
                _json_option("overflow"), delivered=("fmt",)),
    _shell_spec("fu", "Fusion passes applied, then the fused ops suspected of the error.",
                "Fusion passes applied (pass and count), then the fused ops whose error against golden is "
                "clearly larger than the fusion-off run shows, each with the pass to switch off.",
                lambda source: checks.fusion(source), _json_option("fusion"), delivered=("fmt",)),
    _shell_spec("rerun", "Replay one op on golden inputs: error introduced against error inherited.",
                "Replay one op on the golden run's inputs through the shared engine and report the error it "
                "introduces against the error it inherits.",
                lambda source, op, device, step, direction: checks.rerun(source, op, device, step, direction),
                click.Argument(["op"], type=OP_NAME),
                option("--device", type=click.Choice(["npu", "golden"]), default="npu",
                       help="Numerics to replay with."),
                _step(), _direction("--direction"), _json_option("attributions"), delivered=("fmt",)),
)

# The shell's commands in the order `help` lists them: the twins of the batch commands first, as before.
_ORDER = ("ac", "vcs", "ls", "ni", "pt", "cp", "of", "fu", "rerun", "check", "inspect", "precheck")


def shell_specs() -> dict[str, CommandSpec]:
    """Shell name -> spec: the registry's specs for the shell, then the shell's own."""
    from precision_tool.commands.registry import REGISTRY

    table = {**REGISTRY.shell(), **SHELL_SPECS.shell()}
    order = {name: i for i, name in enumerate(_ORDER)}
    return dict(sorted(table.items(), key=lambda item: order.get(item[0], len(order))))


def _handler(spec: CommandSpec, name: str) -> Callable[..., Any]:
    """The shell's call of ``spec``: the handler over the session, then `deliver` for --format, -o, --plot."""

    def handler(session, **values):
        result, delivered, inputs = spec.run(SessionSource(session, name), values)
        if not spec.delivered:
            return result
        from precision_tool.render.exports import deliver

        shown = deliver(result, inputs, **delivered)
        return shown.shown if not shown.wrote else shown

    return handler


def build_commands() -> dict[str, Command]:
    """A fresh command table (help and exit/quit are handled by the runner)."""
    return {name: Command(name, spec.shell_summary or spec.summary, spec.shell_parser(), _handler(spec, name), spec)
            for name, spec in shell_specs().items()}


def help_index(commands: dict[str, Command]) -> HelpIndex:
    """`help`: every command, then how lines are read."""
    rows = [CommandHelp(c.name, c.summary) for c in commands.values()]
    rows.append(CommandHelp("help [CMD]", "This list, or one command's options."))
    rows.append(CommandHelp("exit, quit", "Leave the shell (or Ctrl-D)."))
    notes = ["Separate commands with ';'. Quote names with spaces: ni \"a b\".",
             f"Tensors (pt, cp): {GRAMMAR}, or a .npy file.",
             "Nothing typed here is passed to a system shell."]
    return HelpIndex(rows, notes)


def command_help(commands: dict[str, Command], name: str) -> HelpText:
    """`help CMD`: the usage text click generates from the command's spec."""
    from precision_tool.repl.parsing import help_text

    return HelpText(name, help_text(commands[name].spec, name))
