"""The ``precision-tool`` command: a lazy click group and the one error boundary.

Subcommands live in their own modules and are imported only when run, so
``precision-tool --help`` starts fast and imports neither h5py nor numpy-heavy
code. `main` returns an exit status; only `entry_point` calls ``sys.exit``.

Exit statuses (`precision_tool.errors.ExitStatus`): 0 ok, 1 a check found a
precision regression, 2 a usage or input error, 3 an internal error (or
memory ran out: one line saying what could not be allocated), 130
interrupted.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import traceback
from pathlib import Path

import click

from precision_tool import __version__
from precision_tool.errors import (ExitStatus, PrecisionToolError, Terminated, memory_ran_out, out_of_memory,
                                   printable)

# name -> (module:attribute, one-line help shown by --help without importing). The commands that read dumps
# are generated from their specs (`precision_tool.commands.registry`, through `precision_tool.cli.batch`): their
# entries name the spec ("spec:compare"); the summary is the spec's (a test checks they agree).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("precision_tool.cli.demo:demo", "Run the whole flow on the embedded sample and diagnose its fault."),
    "collect": ("precision_tool.cli.collect:collect", "Train a model on a device and record per-op tensors to HDF5."),
    "inspect": ("spec:inspect", "Summarise a dump: metadata, steps, ops, overflow, loss."),
    "compare": ("spec:compare", "Score every op of a target dump against a golden dump."),
    "check": ("spec:check", "CI gate: exit 1 when a tensor fails its tolerance."),
    "baseline": ("spec:baseline", "Save per-op metrics for later `check --baseline`."),
    "diagnose": ("spec:diagnose", "Name the op where error is introduced, and why."),
    "precheck": ("spec:precheck", "Before tuning: do the two runs differ only where intended?"),
    "zoom": ("precision_tool.cli.zoom:zoom", "Stats first, then full tensors of the divergent region only, and the diagnosis."),
    "ranks": ("spec:ranks", "Check that the ranks of a data-parallel run stay identical."),
    "replay": ("precision_tool.cli.replay:replay", "Dump one step of a run from its checkpoint and diagnose it."),
    "shell": ("precision_tool.cli.shell:shell", "Interactive PrecisionTool shell over dumps."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported (or generated from their specs) on first use."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        module_name, attr = target.split(":")
        if module_name == "spec":
            from precision_tool.cli.batch import command

            return command(attr)
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, short) for name, (_, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    # click answers an EPIPE (``| head``) with exit status 1, which says a regression was found: the error
    # boundary in `_run` ends quietly with the command's own status instead
    def make_context(self, *args, **kwargs):
        with _reader_left():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _reader_left():
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt as exc:  # past click, which would print a blank line on any stderr first
                raise Stopped(exc) from exc


class ReaderLeft(Exception):
    """The reader of stdout left (``| head``): no OSError, so that click passes it on to the boundary."""


class Stopped(BaseException):
    """A command stopped by Ctrl-C or SIGTERM (the KeyboardInterrupt it carries), on its way to the boundary."""

    @property
    def interrupt(self) -> BaseException:
        return self.args[0]


@contextlib.contextmanager
def _reader_left():
    try:
        yield
    except BrokenPipeError as exc:
        raise ReaderLeft() from exc


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="precision-tool")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the full traceback of an error.")
@click.pass_context
def cli(ctx, show_traceback):
    """Find the op that broke a training run's precision, and say why.

    \b
    Exit statuses: 0 ok, 1 a check found a precision regression,
    2 usage or input error, 3 internal error, 130 interrupted.
    """
    ctx.obj = {"traceback": show_traceback}


def _error_log_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "precision-tool" / "last-error.log"


def _report_internal(exc: BaseException, show_traceback: bool) -> None:
    text = "".join(traceback.format_exception(exc))
    if show_traceback:
        sys.stderr.write(text)
        return
    if memory_ran_out(exc):  # exit 3 still: the machine's limit, or a read that should have streamed
        say(f"precision-tool: {out_of_memory(exc)} (rerun with --traceback to see where)")
        return
    where = ""
    try:
        from precision_tool.outputs import write_text

        path = _error_log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all (a full disk, a crash, two failing runs at once): the outputs' atomic replace
        write_text(path, text.encode("utf-8", "backslashreplace").decode("utf-8"))  # a name that was not UTF-8
        where = f"; traceback saved to {printable(path)}"
    except (OSError, ValueError, PrecisionToolError):
        pass
    say(f"precision-tool: internal error: {type(exc).__name__}: {printable(exc)}{where} "
        "(rerun with --traceback to see it)")


def click_message(exc: click.ClickException) -> str:
    """A click error as one line: what is wrong, and where a usage error's help is."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv``; return the exit status instead of exiting."""
    from precision_tool.outputs import standard_output

    _drop_unusable_terminal_size()
    with standard_output():  # a write to stdout that fails names it; none is lost without saying so
        return _run(argv)


def _drop_unusable_terminal_size() -> None:
    """Forget a COLUMNS or LINES that is not a positive number: rich takes COLUMNS=0 (a pty of unknown size, some
    CI runners) as a width of 0 and prints nothing at all, exit 0; without it, it asks the terminal or uses 80."""
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) > 0):
            del os.environ[name]


def _run(argv: list[str] | None) -> int:
    from precision_tool.compare.cancel import clear_interrupt, interrupted

    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = "--traceback" in argv
    clear_interrupt()
    _TERMINATED.clear()
    try:
        # outside standalone mode click returns ctx.exit(code)'s code instead of exiting
        result = cli.main(args=argv, prog_name="precision-tool", standalone_mode=False)
        if interrupted() or _TERMINATED:  # a Ctrl-C (or SIGTERM) whose exception a finaliser swallowed
            raise KeyboardInterrupt
        _check_cut_short()
        _flush_stdout()  # here, where a full disk is reported, not at exit where Python would only warn
        return result if isinstance(result, int) and not isinstance(result, bool) else ExitStatus.OK
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort as exc:  # click's form of KeyboardInterrupt
        say(f"precision-tool: {_stopped_by()}{_kept(exc.__context__)}")
        return ExitStatus.INTERRUPTED
    except click.exceptions.NoArgsIsHelpError as exc:  # no command: the help as it reads, not folded into one line
        if sys.stderr is not None:
            sys.stderr.write(exc.ctx.get_help() + "\n")
        return ExitStatus.USAGE
    except click.ClickException as exc:
        say(f"precision-tool: error: {click_message(exc)}")
        return ExitStatus.USAGE if exc.exit_code == 2 else exc.exit_code
    except PrecisionToolError as exc:
        if show_traceback:
            traceback.print_exc()
        say(f"precision-tool: error: {printable(exc)}")  # one line, whatever a name holds
        return exc.exit_status
    except (KeyboardInterrupt, Stopped) as exc:
        interrupt = exc.interrupt if isinstance(exc, Stopped) else exc
        if _terminal(sys.stderr):  # end the line the terminal echoed ^C on
            say("")
        say(f"precision-tool: {_stopped_by(interrupt)}{_kept(interrupt)}")
        return ExitStatus.INTERRUPTED
    except (BrokenPipeError, ReaderLeft):  # the reader of stdout left (`| head`): the output ends quietly
        from precision_tool.outputs import abandon

        abandon(sys.stdout)  # what it still buffers goes nowhere at exit, instead of failing there (status 120)
        return ExitStatus.OK
    except Exception as exc:  # the boundary: anything else is our bug
        if interrupted():  # work called off by Ctrl-C (compare.cancel.Cancelled), not a bug
            say(f"precision-tool: {_stopped_by()}")
            return ExitStatus.INTERRUPTED
        from precision_tool.outputs import file_system_error

        refused = file_system_error(exc)
        if refused is not None:  # a folder that cannot be made, a full disk: the user's file, not our bug
            say(f"precision-tool: error: {refused}")
            return ExitStatus.USAGE
        _report_internal(exc, show_traceback)
        return ExitStatus.INTERNAL


LINE_LIMIT = 2000  # characters of one error line: a value quoted from a hostile file may be megabytes long


def say(line: str) -> None:
    """Write one line to stderr, its middle cut when it is longer than LINE_LIMIT; a closed or full stderr
    (``2>&-``) loses the line but never changes the exit status."""
    if len(line) > LINE_LIMIT:
        head, tail = LINE_LIMIT - 400, 300
        line = f"{line[:head]} [... {len(line) - head - tail} characters cut ...] {line[-tail:]}"
    if sys.stderr is None:  # closed when the process started: click would open a stream of its own on fd 2
        return
    try:
        click.echo(line, err=True)
    except (OSError, ValueError):  # ValueError: a closed file object
        from precision_tool.outputs import abandon

        abandon(sys.stderr)


def _check_cut_short() -> None:
    """InputError when a dump was cut short while the command read it in place (`precision_tool.dump.mapping`):
    for the commands that do not run through a spec (zoom, demo); never imports the reader itself."""
    mapping = sys.modules.get("precision_tool.dump.mapping")
    if mapping is not None:
        mapping.check_cut_short()


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


_TERMINATED: set = set()  # holds True once SIGTERM arrived (a set: cleared in place, no global statement)


def _terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


def _kept(interrupt: BaseException | None) -> str:
    """What an interrupted command kept (collect: its dump's finished steps), as the end of the one line."""
    kept = getattr(interrupt, "kept", None)
    return f"; {kept}" if kept else ""


def _stopped_by(exc: BaseException | None = None) -> str:
    return "terminated" if isinstance(exc, Terminated) or _TERMINATED else "interrupted"


def stop_on_sigterm() -> None:
    """SIGTERM stops a command as Ctrl-C does (outputs cleaned up, a dump closed as incomplete; exit 130).

    The handler first runs the SIGINT handler in place (the console script's remembers the interrupt for the
    work that checks it; collect's defers it to the next step boundary and returns), then raises `Terminated`,
    a KeyboardInterrupt, unless that handler deferred it.
    """
    def handler(signum, frame):
        _TERMINATED.add(True)
        on_interrupt = signal.getsignal(signal.SIGINT)
        if callable(on_interrupt) and on_interrupt is not signal.default_int_handler:
            try:
                on_interrupt(signal.SIGINT, frame)
            except KeyboardInterrupt:
                raise Terminated() from None
            if getattr(on_interrupt, "defers", False):  # collect's StopOnInterrupt: it stops at a step boundary
                return
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # not the main thread, or no SIGTERM here
        pass


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse rather than hand it back to the system.

    A training step frees and allocates the same few megabytes of arrays
    every step. By default glibc returns them to the kernel (it trims the
    heap and unmaps large blocks) and the next step faults every page back
    in: about 460 page faults a step on the golden transformer, 16-19 % of
    the step in a fresh process (``python bench/bench_malloc.py``). Blocks
    below 32 MiB then come from the heap, and up to 128 MiB of freed heap is
    kept. Linux with glibc only; returns whether the settings took.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):  # no mallopt (musl): nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))


def reopen_closed_standard_streams() -> list[str]:
    """Give a standard stream that was closed when the process started (``<&-``, ``2>&-``, a daemon) /dev/null.

    Python sets such a stream to None, which code printing a progress line or reading commands would trip
    over, and the descriptor's number would go to the next file opened: a dump or an output, which a stray
    write to fd 1 or 2 (HDF5's error printer) would then damage. Returns the names of the streams reopened.
    """
    reopened = []
    for descriptor, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(descriptor)
            continue  # open after all: not ours to replace
        except OSError:
            pass
        try:
            null = os.open(os.devnull, os.O_RDWR)
            if null != descriptor:
                os.dup2(null, descriptor)
                os.close(null)
            setattr(sys, name, open(descriptor, mode, encoding="utf-8", errors="replace", closefd=False))
        except OSError:
            continue
        reopened.append(name)
    return reopened


def entry_point() -> None:
    """The console script: a process of its own, so its allocator is tuned for training steps."""
    try:
        from precision_tool.compare.cancel import install_interrupt_handler

        reopen_closed_standard_streams()
        keep_freed_memory()
        install_interrupt_handler()
        stop_on_sigterm()
        status = main()
    except KeyboardInterrupt:  # Ctrl-C before `main` catches it (the process just started): one line too
        if sys.stderr is not None:
            sys.stderr.write("precision-tool: interrupted\n")
        status = ExitStatus.INTERRUPTED
    try:  # the command is done and its status decided: a SIGTERM or Ctrl-C while the interpreter shuts down
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (which puts Python's handlers back to the default, but
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # keeps an ignored signal ignored) would end it as 143 or
    except (ValueError, OSError):  # 130 with no word, whatever the command's status
        pass
    sys.exit(status)
