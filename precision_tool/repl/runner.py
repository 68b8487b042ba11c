"""Running one shell line: `;`-separated commands, help, exit/quit, unknown commands.

The runner only returns `Outcome`s (data or a one-line error); the front end
renders them. Nothing here prints, and nothing is ever handed to a system
shell: a word that is not in the command table is an error with a suggestion.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from precision_tool.errors import PrecisionToolError, printable
from precision_tool.repl.commands import QUIT_WORDS, Command, build_commands, command_help, help_index
from precision_tool.repl.parsing import parse_args, split_commands, split_words, wants_help

HELP = "help"


SUGGEST_CUTOFF = 0.6  # "did you mean" only for a name this close (difflib's ratio) to a command
ERROR_WIDTH = 400  # characters of an error line; a longer one loses its middle


def shorten(text: str, width: int) -> str:
    """``text`` with its middle replaced by a count of what was left out, when longer than ``width``."""
    if len(text) <= width:
        return text
    if width < 40:  # too narrow for a count: keep both ends around an ellipsis
        return text[:(width - 1) // 2] + "…" + text[len(text) - (width - 1 - (width - 1) // 2):]
    keep = width - 30
    head, tail = text[:keep * 2 // 3], text[len(text) - keep // 3:]
    return f"{head}…[{len(text) - len(head) - len(tail)} characters]…{tail}"


@dataclass
class Outcome:
    """What one command produced: a result to render, an error line, or a request to quit."""

    text: str  # the command as typed
    command: Command | None = None
    result: Any = None
    error: str | None = None  # one line, for the user
    internal: BaseException | None = None  # set when the error is a bug in precision-tool
    quit: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class Runner:
    """Executes lines against one session with one command table."""

    def __init__(self, session, commands: dict[str, Command] | None = None):
        self.session = session
        self.commands = commands if commands is not None else build_commands()

    @property
    def names(self) -> list[str]:
        """Every word that starts a command, for suggestions and completion."""
        return [*self.commands, HELP, *QUIT_WORDS]

    def run_line(self, line: str) -> list[Outcome]:
        """Run each command of ``line`` in turn; stop after exit/quit."""
        outcomes = []
        try:
            texts = split_commands(line)
        except PrecisionToolError as exc:
            return [Outcome(line, error=str(exc))]
        for text in texts:
            outcome = self.run_command(text)
            outcomes.append(outcome)
            if outcome.quit:
                break
        return outcomes

    def run_command(self, text: str) -> Outcome:
        """Run one command; every failure becomes an Outcome with a one-line error."""
        try:
            return self._dispatch(text)
        except PrecisionToolError as exc:
            return Outcome(text, error=shorten(printable(exc), ERROR_WIDTH))  # a pasted 100 KB name is not echoed whole
        except Exception as exc:  # the shell must survive its own bugs; the front end logs them
            from precision_tool.outputs import file_system_error

            refused = file_system_error(exc)  # a path the file system refuses is the user's, not a bug
            if refused is not None:
                return Outcome(text, error=shorten(refused, ERROR_WIDTH))
            return Outcome(text, error=f"internal error: {type(exc).__name__}: {exc}", internal=exc)

    def _dispatch(self, text: str) -> Outcome:
        words = split_words(text)
        if not words:
            return Outcome(text)
        name, args = words[0], words[1:]
        if name in QUIT_WORDS:
            return Outcome(text, quit=True)
        if name == HELP:
            return self._help(text, args)
        command = self.commands.get(name)
        if command is None:
            return Outcome(text, error=self.unknown(name))
        if wants_help(args):
            return Outcome(text, command, command_help(self.commands, name))
        params = parse_args(command.spec, name, args)
        result = command.handler(self.session, **params)
        return Outcome(text, command, result)

    def _help(self, text: str, args: list[str]) -> Outcome:
        if not args:
            return Outcome(text, result=help_index(self.commands))
        name = args[0]
        if name in self.commands:
            return Outcome(text, result=command_help(self.commands, name))
        if name in (HELP, *QUIT_WORDS):
            return Outcome(text, result=help_index(self.commands))
        return Outcome(text, error=self.unknown(name))

    def unknown(self, name: str) -> str:
        """"unknown command 'x'; did you mean 'y'?" with the closest command name."""
        closest = difflib.get_close_matches(name, self.names, n=1, cutoff=SUGGEST_CUTOFF)
        hint = f"; did you mean {closest[0]!r}?" if closest else ""
        return f"unknown command {shorten(name, 40)!r}{hint} (type 'help' for the list)"
