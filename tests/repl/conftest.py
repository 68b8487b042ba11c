"""Shell test fixtures: a session over in-memory dumps, and a runner that renders to text."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from precision_tool.repl.output import Printer
from precision_tool.repl.runner import Runner
from precision_tool.repl.session import ShellSession

from .shell_fakes import sample_dumps


@pytest.fixture
def session():
    return ShellSession(sample_dumps())


@pytest.fixture
def runner(session):
    return Runner(session)


class TextShell:
    """Feeds lines to a Runner and returns what the user would see (stdout, stderr)."""

    def __init__(self, runner: Runner):
        self.runner = runner

    def __call__(self, line: str) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        printer = Printer(Console(file=out, width=120, no_color=True), Console(file=err, width=120, no_color=True))
        printer.show_all(self.runner.run_line(line))
        return out.getvalue(), err.getvalue()


@pytest.fixture
def shell(runner):
    return TextShell(runner)
