"""How a line is read: help, exit/quit, ';', quoting, unknown commands, and never a system shell."""

import subprocess

import pytest

from precision_tool.commands.results import HelpIndex, HelpText


def test_help_lists_every_command_and_exit(shell):
    out, err = shell("help")
    assert err == ""
    for name in ("ac", "vcs", "ls", "ni", "pt", "cp", "of", "fu", "rerun", "help [CMD]", "exit, quit"):
        assert any(line.startswith(f"{name} ") for line in out.splitlines())
    assert "Nothing typed here is passed to a system shell." in out


def test_help_cmd_and_dash_h_show_the_spec_help(runner):
    [by_help] = runner.run_line("help cp")
    [by_flag] = runner.run_line("cp -h")
    assert isinstance(by_help.result, HelpText) and by_help.result == by_flag.result
    assert by_help.result.text.startswith("Usage: cp [OPTIONS] LEFT [RIGHT]")
    assert "-al, --atol" in by_help.result.text and "[default: 0.001" in by_help.result.text
    [index] = runner.run_line("help help")
    assert isinstance(index.result, HelpIndex)


def test_help_for_unknown_command_suggests(shell):
    assert shell("help cpp")[1].strip() == "error: unknown command 'cpp'; did you mean 'cp'? (type 'help' for the list)"


@pytest.mark.parametrize("word", ["exit", "quit"])
def test_exit_and_quit_stop_the_line(runner, word):
    outcomes = runner.run_line(f"ls; {word}; ls")
    assert [o.quit for o in outcomes] == [False, True]


def test_semicolons_run_each_command_in_turn(shell):
    out, err = shell("ls -t Fused ; pt fc2/MatMul:output_0 -p 2")
    assert "fused/MatMulRelu" in out and "first 2 of 12 values" in out and err == ""


def test_unknown_command_suggests_the_closest(shell):
    assert shell("vsc -c 0.9")[1].strip() == (
        "error: unknown command 'vsc'; did you mean 'vcs'? (type 'help' for the list)")


def test_nothing_reaches_a_system_shell(shell, monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError(f"the shell tried to run {args!r}")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, refuse)
    monkeypatch.setattr("os.system", refuse)
    victim = tmp_path / "x"
    victim.write_text("keep me")
    monkeypatch.chdir(tmp_path)
    out, err = shell("ls /; rm -rf x; run rm -rf x; !rm x; $(rm x); `rm x`")
    assert victim.read_text() == "keep me"
    lines = err.strip().splitlines()
    assert lines[0] == "error: ls: Got unexpected extra argument (/)"
    assert lines[1].startswith("error: unknown command 'rm'")
    assert lines[2].startswith("error: unknown command 'run'; did you mean 'rerun'?")
    assert len(lines) == 6


def test_quoting_passes_names_with_spaces(runner):
    runner.session.dump("target").add(0, "odd name/Add", "Add", {"output_0": [1.0, 2.0]})
    runner.session.index  # the index is rebuilt lazily below
    runner.session._indexes.clear()
    [outcome] = runner.run_line('ni "odd name/Add"')
    assert outcome.error is None and outcome.result.op.name == "odd name/Add"


def test_bad_option_value_is_one_line_and_the_shell_goes_on(shell):
    out, err = shell("pt fc2/MatMul:output_0 -p many; ls")
    assert err.strip() == ("error: pt: Invalid value for '-p' / '--print': 'many' is not a valid integer range.")
    assert "Op types of step 0" in out


def test_internal_errors_are_caught_and_marked(runner, monkeypatch):
    monkeypatch.setattr("precision_tool.repl.ops.list_ops", lambda *a: 1 / 0)
    [outcome] = runner.run_line("ls")
    assert outcome.error == "internal error: ZeroDivisionError: division by zero"
    assert isinstance(outcome.internal, ZeroDivisionError)


def test_a_missing_thing_is_the_users_error_and_a_bare_key_error_is_a_bug(runner, monkeypatch):
    from precision_tool.errors import NotFoundError

    monkeypatch.setattr("precision_tool.repl.ops.list_ops", lambda *a: (_ for _ in ()).throw(
        NotFoundError("step 9 is not a complete step of t.h5")))
    [outcome] = runner.run_line("ls")
    assert outcome.error == "step 9 is not a complete step of t.h5" and outcome.internal is None
    monkeypatch.setattr("precision_tool.repl.ops.list_ops", lambda *a: {}["oops"])
    [outcome] = runner.run_line("ls")
    assert outcome.error == "internal error: KeyError: 'oops'" and isinstance(outcome.internal, KeyError)


def test_a_file_system_refusal_is_the_users_error_not_a_bug(runner, monkeypatch):
    import errno

    def refuse(*args):
        raise OSError(errno.EROFS, "Read-only file system", "out\nput.csv")

    monkeypatch.setattr("precision_tool.repl.ops.list_ops", refuse)
    [outcome] = runner.run_line("ls")
    assert outcome.error == "out\\nput.csv: read-only file system" and outcome.internal is None
    monkeypatch.setattr("precision_tool.repl.ops.list_ops", lambda *a: open("/nonexistent/x"))
    [outcome] = runner.run_line("ls")  # a file that is not there is no file-system refusal: still a bug
    assert outcome.error.startswith("internal error: FileNotFoundError") and outcome.internal is not None


def test_blank_line_does_nothing(runner):
    assert runner.run_line("   ") == []


def test_did_you_mean_only_when_something_is_close(runner):
    assert "did you mean 'vcs'" in runner.run_line("vsc")[0].error
    assert "did you mean" not in runner.run_line("frobnicate")[0].error


def test_a_huge_name_is_not_echoed_back_whole(runner):
    name = "layer/" * 20_000 + "Add"
    [outcome] = runner.run_line(f"ni {name}")
    assert outcome.error is not None and len(outcome.error) <= 400
    assert "characters]…" in outcome.error


def test_the_toolbar_fits_the_terminal():
    from precision_tool.repl.app import toolbar_text

    dumps = [("golden", "golden_run_of_a_very_long_experiment_name.h5"), ("target", "npu_run_of_the_same.h5")]
    assert toolbar_text(dumps, "not compared yet", 200) == (
        " golden: golden_run_of_a_very_long_experiment_name.h5  target: npu_run_of_the_same.h5 | not compared yet"
        " | help · exit ")
    assert toolbar_text(dumps, "not compared yet", 100) == (
        " golden: golden_run_…ment_name.h5  target: npu_run_of_the_same.h5 | not compared yet")
    assert toolbar_text(dumps, "not compared yet", 80) == (
        " golden: golden…name.h5  target: npu_ru…same.h5 | not compared yet")
