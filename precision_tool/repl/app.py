"""The interactive front end: PromptSession factory, history, key bindings, toolbar, style, loop."""

from __future__ import annotations

import os
import shutil
import signal
import stat
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.styles import Style

from precision_tool.compare.cancel import clear_interrupt
from precision_tool.errors import Terminated
from precision_tool.repl.runner import shorten
from precision_tool.repl.completer import ShellCompleter

PROMPT = "PrecisionTool > "


def history_path(env=None) -> Path:
    """``$XDG_DATA_HOME/precision-tool/history``, else ``~/.local/share/precision-tool/history``."""
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "precision-tool" / "history"


def create_history(path: Path | None = None) -> History:
    """A history that persists across sessions; in memory only if its folder cannot be made, or its file is not
    a regular file (a device such as /dev/full would be read for ever, a FIFO would block the prompt)."""
    path = history_path() if path is None else path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.touch()
        if not stat.S_ISREG(os.stat(path).st_mode):
            return InMemoryHistory()
    except OSError:
        return InMemoryHistory()
    return SparingFileHistory(str(path))


class SparingFileHistory(FileHistory):
    """A FileHistory that a failing disk never stops: a line that cannot be saved (a full disk, a file made
    read-only meanwhile) stays in this session's memory only, and an unreadable file loads as empty."""

    def load_history_strings(self):
        try:
            yield from super().load_history_strings()
        except OSError:
            return

    def store_string(self, string: str) -> None:
        try:
            super().store_string(string)
        except OSError:
            pass


def shell_bindings() -> KeyBindings:
    """Ctrl-Space opens the completion menu; Ctrl-D on an empty line leaves (prompt_toolkit's default)."""
    bindings = KeyBindings()

    @bindings.add("c-space")
    def _(event):
        """Start completion, or move to the next candidate."""
        buffer = event.app.current_buffer
        if buffer.complete_state:
            buffer.complete_next()
        else:
            buffer.start_completion(select_first=False)

    return bindings


def toolbar(runner):
    """A callable for the bottom toolbar: the loaded dumps and whether a comparison is cached."""

    def tokens():
        session = runner.session
        compared = "comparison loaded" if session.comparison is not None else "not compared yet"
        width = _columns()
        return [("class:bottom-toolbar", toolbar_text(session.describe(), compared, width))]

    return tokens


def _columns() -> int:
    """The width of the terminal the shell draws on."""
    try:
        from prompt_toolkit.application import get_app

        return get_app().output.get_size().columns
    except Exception:  # no running application (tests, a pipe): the environment's idea of it
        return shutil.get_terminal_size((100, 24)).columns


def toolbar_text(dumps: list[tuple[str, str]], compared: str, width: int) -> str:
    """The toolbar's line within ``width``: file names lose their middle before anything else goes."""
    for name_width, tail in ((None, " | help · exit "), (None, ""), (24, ""), (14, "")):
        names = "  ".join(f"{role}: {name if name_width is None else shorten(name, name_width)}"
                          for role, name in dumps) or "no dumps loaded"
        text = f" {names} | {compared}{tail}"
        if len(text) <= width:
            return text
    return text[:max(width, 1)]


def shell_style() -> Style:
    return Style.from_dict({
        "prompt": "ansicyan bold",
        "bottom-toolbar": "noreverse bg:#303030 #d0d0d0",
        "completion-menu.completion": "bg:#303030 #d0d0d0",
        "completion-menu.completion.current": "bg:#5f87af #ffffff",
        "completion-menu.meta.completion": "bg:#444444 #aaaaaa",
    })


def create_prompt_session(runner, history: History | None = None, **overrides) -> PromptSession:
    """The PromptSession of one shell, assembled from the factories above."""
    options = dict(
        message=[("class:prompt", PROMPT)],
        history=create_history() if history is None else history,
        completer=ShellCompleter(runner),
        complete_while_typing=False,
        key_bindings=shell_bindings(),
        bottom_toolbar=toolbar(runner),
        style=shell_style(),
        enable_history_search=True,
    )
    options.update(overrides)
    return PromptSession(**options)


def run_interactive(runner, printer, prompt_session: PromptSession | None = None) -> None:
    """Read, run and show lines until exit, quit or Ctrl-D; Ctrl-C clears the line."""
    prompt_session = prompt_session or create_prompt_session(runner)
    while True:
        try:
            line = _prompt(prompt_session)
        except Terminated:  # SIGTERM ends the shell (exit 130); Ctrl-C only clears the line
            raise
        except KeyboardInterrupt:
            continue
        except EOFError:
            return
        clear_interrupt()  # a Ctrl-C belongs to the command it interrupted, not to the next one
        try:
            if printer.show_all(runner.run_line(line)):
                return
        except Terminated:
            raise
        except KeyboardInterrupt:  # a long command interrupted: back to the prompt
            printer.err.print("interrupted", style="red")
        finally:
            clear_interrupt()


def _prompt(prompt_session: PromptSession) -> str:
    """``prompt_session.prompt()``; a SIGTERM meanwhile makes the prompt's application exit with `Terminated`
    from inside its event loop, which then closes in order (an exception raised by the signal handler
    itself would cut through asyncio's tear-down, and print its tracebacks on the way out)."""
    app = prompt_session.app
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum, frame):
        loop = getattr(app, "loop", None)
        if not app.is_running or loop is None:  # between prompts: the usual handler
            if callable(previous):
                previous(signum, frame)
            raise Terminated()
        if callable(previous):  # it notes the termination for the exit line, then raises: the app raises instead
            try:
                previous(signum, frame)
            except KeyboardInterrupt:
                pass
        loop.call_soon_threadsafe(_exit_terminated, app)

    try:
        signal.signal(signal.SIGTERM, stop)
    except (ValueError, OSError):  # not the main thread: prompt as is
        return prompt_session.prompt()
    try:
        return prompt_session.prompt()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_terminated(app) -> None:
    if app.is_running and not app.future.done():
        app.exit(exception=Terminated())
