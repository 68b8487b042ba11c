"""``precision-tool shell``: the interactive PrecisionTool shell, and its batch form ``-c``.

Exit statuses: 0 when every command ran; 2 when an input file is bad, or when
a command given with ``-c`` (or read from a non-TTY stdin) failed, after the
remaining commands have run; 3 when one hit an internal error. The
interactive shell itself always exits 0.
"""

from __future__ import annotations

import sys

import click

from precision_tool.errors import ExitStatus, PrecisionToolError

_DUMP = click.Path(path_type=str)  # a dump file, or an msprobe dump directory or dump.json


@click.command("shell", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1, type=_DUMP)
@click.option("--golden", type=_DUMP, help="The golden (reference) dump.")
@click.option("--target", type=_DUMP, help="The target dump, the run being diagnosed.")
@click.option("--overflow", type=_DUMP, help="An overflow-mode dump of the target run.")
@click.option("--fusion-off", "fusion_off", type=_DUMP, help="The target run dumped with fusion switched off.")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="With runs of several ranks: the rank to load (default: the rank that diverges first).")
@click.option("-c", "--command", "commands", metavar='"CMD1; CMD2"',
              help="Run these shell commands, print their results and exit.")
@click.pass_context
def shell(ctx, files, golden, target, overflow, fusion_off, rank, commands):
    """Interactive PrecisionTool shell over dumps.

    FILES are dumps whose roles (golden, target, overflow, fusion-off) are read
    from their metadata; --golden, --target, --overflow and --fusion-off give a
    role explicitly. --golden and --target may be runs of several ranks
    (directories of rank dumps): the shell loads one rank of each, --rank
    or the rank that diverges first, and says which. Type `help` at the prompt for the commands; `exit`, `quit`
    or Ctrl-D leaves. When stdin is not a terminal, commands are read from it
    line by line and only their results are printed.

    \b
    Exit statuses: 0 ok; 2 a bad input file, or a failed command
    under -c / piped stdin; 3 an internal error in a command.
    """
    from precision_tool.repl.output import Printer
    from precision_tool.repl.runner import Runner
    from precision_tool.repl.session import ShellSession

    show_traceback = bool((ctx.obj or {}).get("traceback"))
    paths, run_note = pick_rank({"golden": golden, "target": target, "overflow": overflow,
                                 "fusion_off": fusion_off}, rank)
    session = ShellSession.open(files, **paths)
    if run_note is not None:  # every file of the runs given stays an input, not only the rank loaded
        session.runs = tuple(str(path) for path in (golden, target, overflow, fusion_off) if path is not None)
    if run_note is not None:  # once the rank's dumps opened: a bad one is the only line
        click.echo(f"precision-tool shell: {run_note}", err=True)
    with session:
        runner = Runner(session)
        printer = Printer(*_consoles(), report_internal=_internal_reporter(show_traceback))
        if commands is not None:
            printer.show_all(runner.run_line(commands))
        elif sys.stdin is None or not sys.stdin.isatty():  # None: stdin was closed, nothing to read
            _run_stream(runner, printer, sys.stdin or ())
        else:
            from precision_tool.cli.batch import progress_callback
            from precision_tool.repl.app import run_interactive

            session.progress = progress_callback  # vcs and ac show their comparison's progress, as compare does
            _greet(printer, session)
            run_interactive(runner, printer)
            return
    if printer.failures:
        # Through the error boundary, not click's Exit, which `main` does not turn into a status.
        raise CommandsFailed(printer.failures, printer.internal_failures)


class CommandsFailed(PrecisionToolError):
    """Some commands run under -c or from a piped stdin failed: exit 2 (3 for an internal error)."""

    def __init__(self, failures: int, internal: int):
        self.exit_status = ExitStatus.INTERNAL if internal else ExitStatus.USAGE
        super().__init__(f"{failures} shell command{'s' if failures > 1 else ''} failed")


def _run_stream(runner, printer, stream) -> None:
    """Run each line of a non-TTY stdin; blank lines and lines starting with # are skipped.

    A byte that is not text in stdin's encoding is kept as Python keeps one in a file name (surrogateescape),
    so that the command naming it fails alone, as `-c` with the same bytes does, not the whole shell.
    """
    try:
        stream.reconfigure(errors="surrogateescape")
    except (AttributeError, ValueError, OSError):  # not a text file (a list, a StringIO), or already read from
        pass
    for line in stream:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if printer.show_all(runner.run_line(line.rstrip("\n"))):
            return


def _consoles():
    from precision_tool.cli.consoles import console

    return console(), console(stderr=True)


def pick_rank(paths: dict, rank: int | None) -> tuple[dict, str | None]:
    """With runs of several ranks for golden and target: each role's dump of the chosen rank, and a line saying
    which rank and why; the paths as given (and None) otherwise."""
    from precision_tool.commands.sources import DumpFiles
    from precision_tool.errors import ConfigError

    roles = {role.replace("_", "-"): path for role, path in paths.items()}
    with DumpFiles(roles) as source:
        layouts = source.runs()
        if not layouts:
            if rank is not None:
                raise ConfigError("--rank picks a rank of runs of several ranks: give --golden RUN and --target RUN")
            return paths, None
        world_size = layouts["golden"].world_size
        if rank is not None and rank >= world_size:
            raise ConfigError(f"--rank {rank} is not a rank of the runs' {world_size}")
        why = "as asked"
        if rank is None:
            from precision_tool.commands.run_handlers import first_rank, rank_rows
            from precision_tool.defaults import COSINE_THRESHOLD

            rows = rank_rows(source, layouts, COSINE_THRESHOLD)
            first = first_rank(rows)
            rank = 0 if first is None else first
            why = ("no rank has an op flagged" if first is None else
                   f"it diverges first: step {rows[first].first_step} #{rows[first].first_exec_index} "
                   f"{rows[first].first_op}")
    chosen = {role: (layouts[role.replace("_", "-")].paths[rank] if role.replace("_", "-") in layouts else path)
              for role, path in paths.items()}
    return chosen, f"runs of {world_size} ranks: rank {rank} loaded ({why}); --rank R loads another"


def _greet(printer, session) -> None:
    loaded = ", ".join(f"{role}: {name}" for role, name in session.describe()) or "no dumps"
    printer.out.print(f"precision-tool shell ({loaded}). Type help, or exit to leave.", markup=False)


def _internal_reporter(show_traceback: bool):
    def report(exc: BaseException) -> None:
        from precision_tool.cli.main import _report_internal

        _report_internal(exc, show_traceback)

    return report
