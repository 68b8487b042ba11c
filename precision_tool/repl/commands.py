"""The shell's command table: name -> option spec and a handler returning data.

Each command's option spec is a `click.Command` used only as a parser (and
for its generated help); `vcs` takes its options from the batch `compare`
command itself. Handlers take the session and the parsed parameters and
return data (`precision_tool.commands.results` and the core's result types),
which `precision_tool.render.shell_views.render` draws by its type. The table
is built per session (`build_commands`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import click

from precision_tool import defaults
from precision_tool.commands.options import (COSINE, OP_NAME, PASS_NAME, TENSOR_NAME, TOLERANCE, TYPE_NAME,
                                             listing_params)
from precision_tool.commands.results import CommandHelp, HelpIndex, HelpText, InspectResult, JsonDocument
from precision_tool.repl import checks, ops, tensor_commands
from precision_tool.repl.session import ROLES, MissingDumpError
from precision_tool.repl.tensors import GRAMMAR

QUIT_WORDS = ("exit", "quit")
_DIRECTION = click.Choice(["forward", "backward", "optimizer"])


@dataclass(frozen=True)
class Command:
    """One shell command."""

    name: str
    summary: str
    spec: click.Command
    handler: Callable[..., Any]  # handler(session, **params) -> a result, drawn by its type (render.shell_views)


def _spec(name: str, help_text: str, *params: click.Parameter) -> click.Command:
    return click.Command(name, params=list(params), help=help_text, add_help_option=False,
                         context_settings={"show_default": True})


def _opt(*decls, **attrs) -> click.Option:
    return click.Option(list(decls), **attrs)


def _step(default: str = "the first step that recorded the op") -> click.Option:
    return _opt("-s", "--step", type=click.IntRange(min=0), default=None, help=f"Step to look at (default: {default}).")


def _direction(*decls) -> click.Option:
    return _opt(*(decls or ("-d", "--direction")), type=_DIRECTION, default=None,
                help="Forward, backward or optimizer op (default: forward, else the one the op has).")


def _format_option(json_is: str) -> click.Option:
    return _opt("--format", "output_format", type=click.Choice(["table", "json"]), default="table",
                help=f"A table, or {json_is}.")


def _render(name: str):
    """A renderer module, imported when a command first needs it (the shell starts without them)."""
    import importlib

    return importlib.import_module(f"precision_tool.render.{name}")


def _as(output_format: str, result, to_document):
    """``result``, or its batch twin's JSON document when ``--format json``."""
    return JsonDocument(to_document(result)) if output_format == "json" else result


def build_commands() -> dict[str, Command]:
    """A fresh command table (help and exit/quit are handled by the runner)."""
    tensor_help = f"TENSOR: {GRAMMAR}; or a .npy file."
    table = [
        Command("ac", "Auto check: overflow, fusion, comparison, notes, then the root-cause verdict.",
                _spec("ac", "Auto check: overflow summary, fusion suspects, comparison summary, "
                            "precision-mode and cast notes, then the root-cause verdict.",
                      _opt("-c", "--compare", "compare_first", is_flag=True,
                           help="Compare first if no comparison is loaded, and list the flagged ops as vcs does "
                                "(without it the comparison the verdict needs is still made once and cached)."),
                      _opt("-l", "--limit", type=click.IntRange(min=0), default=defaults.OVERFLOW_LIMIT,
                           help="Overflow entries to show (0: all)."),
                      _opt("-a", "--all", "show_all", is_flag=True,
                           help="Every scored op in the attribution table, not only those up to the culprit."),
                      _format_option("the JSON of `precision-tool diagnose --format json`")),
                lambda session, compare_first, limit, show_all, output_format: _as(
                    output_format, checks.auto_check(session, compare_first, limit, show_all),
                    lambda check: _render("diagnosis_parts").diagnosis_dict(check.diagnosis))),
        Command("vcs", "Ops whose output cosine is at or below -c, in execution order, at most -l.",
                _spec("vcs", "Compare summary: ops whose output cosine against golden is at or below "
                             "-c, in execution order, at most -l (the options of `precision-tool compare`).",
                      *listing_params(), _format_option("the JSON of `precision-tool compare --format json`")),
                lambda session, cosine, limit, output_format: _as(
                    output_format, checks.flagged(session, cosine, limit),
                    lambda f: _render("compare_export").report_dict(f.report, f.rows, f.threshold, f.limit,
                                                                    "flagged"))),
        Command("ls", "List the ops of one step by substring filters; with none, counts per type.",
                _spec("ls", "List the ops of one step whose name, type and fusion pass hold the given "
                            "substrings. With no filter: how many ops of each type.",
                      _opt("-n", "--name", type=OP_NAME, help="Substring of the op name."),
                      _opt("-t", "--type", "type_", type=TYPE_NAME, help="Substring of the op type."),
                      _opt("-f", "--pass", "pass_", type=PASS_NAME, help="Substring of the fusion pass name."),
                      _step("the first recorded step")),
                lambda session, name, type_, pass_, step: ops.list_ops(session, name, type_, pass_, step)),
        Command("ni", "Node info: one op on every side, its tensors, fusion, overflow, metrics.",
                _spec("ni", "Node info: type, execution index, inputs and outputs with dtype, shape and "
                            "statistics on each side, fusion pass and original ops, overflow flag, and "
                            "metrics against golden. OP is an exact name, else a unique substring.",
                      click.Argument(["op"], type=OP_NAME), _step(), _direction()),
                lambda session, op, step, direction: ops.node_info(session, op, step, direction)),
        Command("pt", "Print a tensor: its statistics and first values.",
                _spec("pt", f"Print a tensor's statistics and first values. {tensor_help} "
                            "Nothing is written to disk.",
                      click.Argument(["tensor"], type=TENSOR_NAME),
                      _opt("-p", "--print", "count", type=click.IntRange(min=0), default=defaults.PT_PRINT,
                           help="Values to show.")),
                lambda session, tensor, count: tensor_commands.print_tensor(session, tensor, count)),
        Command("cp", "Compare two tensors: allclose, cosine, error ratio, first mismatches.",
                _spec("cp", f"Compare LEFT against the reference RIGHT: allclose, cosine, error ratio and "
                            f"the first mismatching elements. {tensor_help} LEFT defaults to the target "
                            "side, RIGHT to the golden side; without RIGHT, LEFT's golden counterpart.",
                      click.Argument(["left"], type=TENSOR_NAME),
                      click.Argument(["right"], required=False, type=TENSOR_NAME),
                      _opt("-p", "--print", "count", type=click.IntRange(min=0), default=defaults.CP_PRINT,
                           help="Mismatching elements to show."),
                      _opt("-al", "--atol", type=TOLERANCE, default=defaults.CP_ATOL,
                           help="Absolute tolerance."),
                      _opt("-rl", "--rtol", type=TOLERANCE, default=defaults.CP_RTOL,
                           help="Relative tolerance.")),
                lambda session, left, right, count, atol, rtol:
                    tensor_commands.compare_tensors(session, left, right, count, atol, rtol)),
        Command("of", "Overflow report: each overflowing op, its counts, ranges and a hint.",
                _spec("of", "Overflow report of the overflow dump (else the target dump): each overflowing "
                            "op with its status, saturated and inf counts, input and output ranges, and a hint.",
                      _opt("-l", "--limit", type=click.IntRange(min=0), default=defaults.OVERFLOW_LIMIT,
                           help="Overflowing ops to show (0: all).")),
                lambda session, limit: checks.overflow(session, limit)),
        Command("fu", "Fusion passes applied, then the fused ops suspected of the error.",
                _spec("fu", "Fusion passes applied (pass and count), then the fused ops whose error against "
                            "golden is clearly larger than the fusion-off run shows, each with the pass to "
                            "switch off."),
                lambda session: checks.fusion(session)),
        Command("rerun", "Replay one op on golden inputs: error introduced against error inherited.",
                _spec("rerun", "Replay one op on the golden run's inputs through the shared engine and "
                               "report the error it introduces against the error it inherits.",
                      click.Argument(["op"], type=OP_NAME),
                      _opt("--device", type=click.Choice(["npu", "golden"]), default="npu",
                           help="Numerics to replay with."),
                      _step(), _direction("--direction")),
                lambda session, op, device, step, direction: checks.rerun(session, op, device, step, direction)),
        Command("check", "The CI gate's judgement of the loaded comparison: failing tensors, PASSED/FAILED.",
                _spec("check", "Judge every matched op output of the loaded comparison as `precision-tool check` "
                               "does: cosine, max abs error, NaN/inf golden lacks, shape; failing tensors first "
                               "first, then PASSED or FAILED. (The shell goes on either way; the batch command "
                               "exits 1 on a failure.)",
                      _opt("--min-cosine", type=COSINE, default=None,
                           help=f"A tensor fails below this cosine (default {defaults.CHECK_MIN_COSINE})."),
                      _opt("--max-abs-err", type=TOLERANCE, default=None,
                           help="A tensor fails above this max absolute error (default: not checked)."),
                      _opt("--judge-inputs", is_flag=True, help="Judge op inputs too."),
                      _format_option("the JSON of `precision-tool check --format json`")),
                lambda session, min_cosine, max_abs_err, judge_inputs, output_format: _as(
                    output_format, checks.check(session, min_cosine, max_abs_err, judge_inputs),
                    lambda result: json.loads(_render("check_view").check_json(result)))),
        Command("inspect", "A loaded dump's run, counts, overflows and loss history.",
                _spec("inspect", "A loaded dump's run metadata, steps, op and tensor counts, overflowing ops, "
                                 "loss and loss-scale history and size, as `precision-tool inspect` shows them.",
                      click.Argument(["role"], required=False, type=click.Choice(list(ROLES))),
                      _opt("--format", "output_format", type=click.Choice(["table", "json"]), default="table",
                           help="A table, or the batch command's JSON.")),
                lambda session, role, output_format: inspect_loaded(session, role, output_format)),
    ]
    return {command.name: command for command in table}


def inspect_loaded(session, role: str | None, output_format: str) -> InspectResult:
    """`inspect [ROLE]`: the summary of the dump loaded for ``role`` (default: the target, else the first)."""
    role = role or session.primary_role
    if role is None:
        raise MissingDumpError("target", "inspect")
    summary = session.dump(role, "inspect").summary()
    if output_format == "json":
        return JsonDocument(_render("inspect_view").summary_json(summary))
    return InspectResult(role, summary)


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
