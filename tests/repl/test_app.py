"""The prompt_toolkit front end, driven in process through a pipe input."""

import io

import pytest
from prompt_toolkit.document import Document
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from precision_tool.repl import app
from precision_tool.repl.completer import ShellCompleter
from precision_tool.repl.output import Printer


@pytest.fixture
def drive(runner):
    """Type ``keys`` into a real PromptSession and return (stdout, stderr, history)."""

    def run(keys: str):
        out, err = io.StringIO(), io.StringIO()
        printer = Printer(Console(file=out, width=120), Console(file=err, width=120))
        history = InMemoryHistory()
        with create_pipe_input() as pipe:
            pipe.send_text(keys)
            prompt = app.create_prompt_session(runner, history=history, input=pipe, output=DummyOutput())
            app.run_interactive(runner, printer, prompt)
        return out.getvalue(), err.getvalue(), list(history.get_strings())

    return run


def test_lines_run_until_exit(drive):
    out, err, history = drive("ls -t Fused\nvsc\nexit\nls\n")
    assert "fused/MatMulRelu" in out
    assert "unknown command 'vsc'; did you mean 'vcs'?" in err
    assert history == ["ls -t Fused", "vsc", "exit"]


def test_ctrl_d_leaves(drive):
    out, err, history = drive("help\n\x04ls\n")
    assert "Commands" in out and "Op types" not in out and history == ["help"]


def test_ctrl_c_clears_the_line_and_keeps_going(drive):
    out, _, history = drive("ls -t Fu\x03ls -t Fused\nquit\n")
    assert "fused/MatMulRelu" in out and history == ["ls -t Fused", "quit"]


def test_toolbar_shows_dumps_and_comparison_state(runner):
    [(_, text)] = app.toolbar(runner)()
    assert text == " golden: golden.h5  target: target.h5 | not compared yet | help · exit "
    runner.session._comparisons[None] = object()
    assert "comparison loaded" in app.toolbar(runner)()[0][1]


def test_completer_adapter_yields_engine_candidates(runner):
    completer = ShellCompleter(runner)
    found = list(completer.get_completions(Document("pt fused/MatMulRelu:o"), None))
    assert [(c.text, c.start_position) for c in found] == [("fused/MatMulRelu:output_0", -len("fused/MatMulRelu:o"))]
    assert [c.text for c in completer.get_completions(Document("ni fc"), None)] == ["fc2/MatMul"]


def test_prompt_is_precision_tool(runner):
    session = app.create_prompt_session(runner, history=InMemoryHistory(), output=DummyOutput())
    assert session.message == [("class:prompt", "PrecisionTool > ")]


def test_a_ctrl_c_that_interrupted_a_command_does_not_stop_the_next_one(runner, monkeypatch):
    from precision_tool.compare import cancel

    run_line = runner.run_line
    calls = []

    def interrupted_once(line):
        calls.append(line)
        if len(calls) == 1:  # as the console script's SIGINT handler does: remember, then raise
            cancel._INTERRUPTED.set()
            raise KeyboardInterrupt
        assert not cancel.interrupted()
        return run_line(line)

    monkeypatch.setattr(runner, "run_line", interrupted_once)
    out, err = io.StringIO(), io.StringIO()
    printer = Printer(Console(file=out, width=120), Console(file=err, width=120))
    with create_pipe_input() as pipe:
        pipe.send_text("vcs\nls -t Fused\nquit\n")
        prompt = app.create_prompt_session(runner, history=InMemoryHistory(), input=pipe, output=DummyOutput())
        app.run_interactive(runner, printer, prompt)
    assert "interrupted" in err.getvalue() and "fused/MatMulRelu" in out.getvalue()
    assert not cancel.interrupted()
