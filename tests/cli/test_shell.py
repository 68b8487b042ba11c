"""`precision-tool shell` over real dumps: every command through the REPL runner and through its batch twin.

The batch twin of a shell command is ``precision-tool shell FILES -c "CMD"``;
`vcs` also has ``precision-tool compare`` and `ac` has ``precision-tool diagnose``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from precision_tool.cli.main import main
from precision_tool.repl.runner import Runner
from precision_tool.repl.session import ShellSession

STEPS = "2"


@pytest.fixture(scope="session")
def dumps(tmp_path_factory):
    """A golden run, and an npu run whose loss scale overflows fp16 gradients, in every mode."""
    root = tmp_path_factory.mktemp("shell_dumps")
    runs = {
        "golden": ["--device", "golden"],
        "target": ["--device", "npu", "--loss-scale", "fixed:1e9"],
        "overflow": ["--device", "npu", "--loss-scale", "fixed:1e9", "--mode", "overflow"],
        "fusion-off": ["--device", "npu", "--loss-scale", "fixed:1e9", "--mode", "fusion-off"],
    }
    paths = {}
    for role, options in runs.items():
        paths[role] = root / f"{role}.h5"
        assert main(["collect", "mlp", "-o", str(paths[role]), "--steps", STEPS, *options]) == 0
    return paths


@pytest.fixture
def files(dumps):
    return [str(dumps[role]) for role in ("golden", "target", "overflow", "fusion-off")]


@pytest.fixture
def runner(dumps):
    with ShellSession.open([str(p) for p in dumps.values()]) as session:
        yield Runner(session)


def ok(runner, line):
    [outcome] = runner.run_line(line)
    assert outcome.error is None, outcome.error
    return outcome.result


def twin(run_cli, files, commands):
    """The batch twin: ``shell FILES -c CMDS``; must succeed."""
    result = run_cli("shell", *files, "-c", commands)
    assert result.status == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


# -- roles and bad input ---------------------------------------------------------
def test_roles_come_from_metadata(runner):
    assert [role for role, _ in runner.session.describe()] == ["golden", "target", "overflow", "fusion-off"]


def test_roles_can_be_given_explicitly(run_cli, dumps):
    out = twin(run_cli, ["--golden", dumps["golden"], "--target", dumps["target"]], "ls -t Softmax")
    assert "SoftmaxCrossEntropy" in out


def test_a_second_dump_of_one_role_is_refused(run_cli, dumps):
    result = run_cli("shell", dumps["golden"], dumps["golden"], "-c", "ls")
    assert result.status == 2
    assert result.stderr.strip().endswith("give one with --golden")
    assert result.stderr.count("\n") == 1


def test_a_missing_file_is_exit_2_in_one_line(run_cli, tmp_path):
    result = run_cli("shell", tmp_path / "nope.h5", "-c", "ls")
    assert result.status == 2 and result.stderr.count("\n") == 1 and "nope.h5" in result.stderr


def test_inputs_are_never_modified(run_cli, files):
    before = {f: (os.stat(f).st_mtime_ns, Path(f).read_bytes()) for f in files}
    twin(run_cli, files, "pt fc1/MatMulBiasAddRelu:output_0; cp fc1/MatMulBiasAddRelu:output_0; ls")
    assert before == {f: (os.stat(f).st_mtime_ns, Path(f).read_bytes()) for f in files}
    assert sorted(p.name for p in Path(files[0]).parent.iterdir()) == sorted(Path(f).name for f in files)


# -- every command: the REPL runner, then its batch twin ------------------------
def test_ls(runner, run_cli, files):
    counts = {c.type: c.count for c in ok(runner, "ls").counts}
    assert counts["MatMulBiasAddRelu"] == 4 and counts["SoftmaxCrossEntropy"] == 2
    assert [op.name for op in ok(runner, "ls -t Softmax -n Soft").ops] == ["SoftmaxCrossEntropy"] * 2
    out = twin(run_cli, files, "ls; ls -f BiasAddRelu")
    assert "MatMulBiasAddRelu" in out and "fc1/MatMulBiasAddRelu" in out and "total" in out


def test_ni(runner, run_cli, files):
    info = ok(runner, "ni fc1")
    assert info.op.name == "fc1/MatMulBiasAddRelu" and info.op.pass_name == "MatMulBiasAddReluFusionPass"
    assert set(info.sides) >= {"target", "golden:fc1/MatMul", "fusion-off:fc1/Relu"}
    assert info.slots[-1].counterparts["golden"] == "fc1/Relu:output_0"
    assert info.slots[-1].metric.cosine > 0.999
    out = twin(run_cli, files, "ni fc1")
    assert "MatMulBiasAddReluFusionPass" in out and "vs golden: cosine" in out and "as fc1/Relu:output_0" in out


def test_pt(runner, run_cli, files, dumps):
    view = ok(runner, "pt golden:fc1/MatMul:output_0@1 -p 4")
    assert view.shown == 4 and view.label == "golden:fc1/MatMul:output_0@1"
    from precision_tool.dump.reader import open_dump

    with open_dump(dumps["golden"]) as golden:
        record = golden.op(1, "fc1/MatMul")
        np.testing.assert_array_equal(view.values, golden.tensor(1, record.exec_index, "output_0").ravel()[:4])
    out = twin(run_cli, files, "pt golden:fc1/MatMul:output_0@1 -p 4")
    assert "golden:fc1/MatMul:output_0@1" in out and "first 4 of" in out


def test_cp(runner, run_cli, files):
    result = ok(runner, "cp fc1/MatMulBiasAddRelu:output_0 -p 3")
    assert result.right == "golden:fc1/Relu:output_0@0" and result.cosine > 0.999
    exact = ok(runner, "cp golden:fc1/MatMul:output_0 golden:fc1/MatMul:output_0")
    assert exact.allclose and exact.cosine == 1.0 and exact.mismatched == 0
    out = twin(run_cli, files, "cp fc1/MatMulBiasAddRelu:output_0 -al 0 -rl 0 -p 2")
    assert "AllClose     False" in out and "first 2 of" in out


def test_of(runner, run_cli, files):
    report = ok(runner, "of -l 2")
    assert report.total > 2 and len(report.entries) == 2 and report.source.endswith("overflow.h5")
    out = twin(run_cli, files, "of -l 2")
    assert "op executions raised the float status" in out and "hint: gradient overflow" in out and "[3]" not in out


def test_fu(runner, run_cli, files):
    report = ok(runner, "fu")
    assert report.passes == {"MatMulBiasAddReluFusionPass": 2, "MatMulBiasAddFusionPass": 1} and report.compared
    out = twin(run_cli, files, "fu")
    assert "MatMulBiasAddReluFusionPass" in out and "Fusion passes applied" in out


def test_rerun(runner, run_cli, files):
    attribution = ok(runner, "rerun fc2 --device npu")
    assert attribution.name == "fc2/MatMulBiasAddRelu" and attribution.introduced is not None
    assert ok(runner, "rerun fc2 --device golden").replay_device == "golden"
    out = twin(run_cli, files, "rerun fc2")
    assert "rerun fc2/MatMulBiasAddRelu" in out and "Introduced" in out and "Inherited" in out


def test_vcs_and_its_compare_twin(runner, run_cli, files, dumps):
    selection = ok(runner, "vcs -c 0.99 -l 3")
    assert len(selection.rows) == 3 and selection.threshold == 0.99
    assert runner.session.comparison is selection.report  # cached: the next vcs only filters
    assert ok(runner, "vcs -l 0").report is selection.report
    names = [op.name for op in selection.rows]
    out = twin(run_cli, files, "vcs -c 0.99 -l 3")
    batch = run_cli("compare", dumps["golden"], dumps["target"], "-c", "0.99", "-l", "3", "--format", "json")
    assert batch.status == 0
    listed = json.loads(batch.stdout)
    assert "Flagged ops (first 3 of" in out
    listed_ops = list(dict.fromkeys((row["step"], row["exec_index"], row["op"]) for row in listed["rows"]))
    assert [(op.step, op.exec_index, op.name) for op in selection.rows] == listed_ops
    assert len(names) == 3


def test_vcs_rejects_what_compare_rejects(runner, run_cli, dumps):
    [outcome] = runner.run_line("vcs -c 2")
    batch = run_cli("compare", dumps["golden"], dumps["target"], "-c", "2")
    assert batch.status == 2
    assert outcome.error.startswith("vcs: Invalid value for '-c' / '--cosine'")
    assert outcome.error.split(": ", 1)[1] in batch.stderr


def test_ac_and_its_diagnose_twin(runner, run_cli, files, dumps):
    check = ok(runner, "ac -l 1")
    assert len(check.diagnosis.overflow.entries) == 1 and check.flagged is None
    assert ok(runner, "ac -c").flagged is not None
    out = twin(run_cli, files, "ac -l 1")
    assert "Verdict: " + check.diagnosis.verdict.cls in out
    batch = run_cli("diagnose", dumps["golden"], dumps["target"], "--overflow", dumps["overflow"],
                    "--fusion-off", dumps["fusion-off"], "--format", "json")
    assert batch.status == 0, batch.stderr
    assert json.loads(batch.stdout)["verdict"] == check.diagnosis.verdict.to_dict()


def test_help_through_the_batch_twin(run_cli, files):
    out = twin(run_cli, files, "help; help vcs")
    assert "rerun" in out and "Usage: vcs [OPTIONS]" in out and "-c, --cosine" in out


# -- batch behaviour ---------------------------------------------------------------
def test_a_failing_command_under_c_exits_2_after_running_the_rest(run_cli, files):
    result = run_cli("shell", *files, "-c", "frob; ls -t Softmax")
    assert result.status == 2
    assert result.stderr.splitlines() == ["error: unknown command 'frob' (type 'help' for the list)",  # nothing close
                                          "precision-tool: error: 1 shell command failed"]
    assert "SoftmaxCrossEntropy" in result.stdout


def test_piped_stdin_is_read_line_by_line_without_prompts(run_cli, files):
    result = run_cli("shell", *files, stdin="# a comment\nls -t Softmax\n\nexit\nls\n")
    assert result.status == 0 and result.stderr == ""
    assert "PrecisionTool >" not in result.stdout and result.stdout.count("2 ops of step 0 match") == 1


def test_piped_stdin_with_a_bad_command_exits_2(run_cli, files):
    result = run_cli("shell", *files, stdin="ni nothing-like-this\n")
    assert result.status == 2 and "no op in the target dump matches 'nothing-like-this'" in result.stderr


def test_shell_never_runs_a_system_command(run_cli, files, tmp_path, monkeypatch):
    victim = tmp_path / "keep"
    victim.write_text("x")
    monkeypatch.chdir(tmp_path)
    result = run_cli("shell", *files, "-c", f"rm {victim}; run rm {victim}; !rm {victim}")
    assert result.status == 2 and victim.exists()
    assert result.stderr.count("unknown command") == 3


# -- a real terminal ---------------------------------------------------------------
@pytest.mark.slow
def test_real_terminal_session(files, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    exe = shutil.which("precision-tool") or str(Path(sys.executable).with_name("precision-tool"))
    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", XDG_DATA_HOME=str(tmp_path / "data"))
    started = time.monotonic()
    child = pexpect.spawn(exe, ["shell", *files], env=env, dimensions=(50, 140), encoding="utf-8", timeout=15)
    try:
        child.expect_exact("PrecisionTool > ")
        startup = time.monotonic() - started  # reported, not asserted (see docs/shell.md)
        assert "golden: golden.h5" in child.before  # the greeting names the loaded dumps
        child.sendline("ls")
        child.expect_exact("total")
        child.expect_exact("PrecisionTool > ")
        child.sendline("vcs -c 0.99")
        child.expect_exact("Flagged ops")
        child.expect_exact("compared ")
        child.expect_exact("PrecisionTool > ")
        child.sendline("help")
        child.expect_exact("exit, quit")
        child.expect_exact("PrecisionTool > ")
        child.sendline("rm -rf /tmp")
        child.expect_exact("unknown command 'rm'")
        child.expect_exact("PrecisionTool > ")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    history = (tmp_path / "data" / "precision-tool" / "history").read_text()
    assert "+vcs -c 0.99" in history and "+exit" in history
    print(f"shell reached its prompt in {startup:.2f} s")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_screen_in_tmux(files, tmp_path):
    """The screen as a user sees it: prompt, results, and the bottom toolbar with the loaded dumps."""
    import subprocess

    exe = shutil.which("precision-tool") or str(Path(sys.executable).with_name("precision-tool"))
    name = f"pt-test-{os.getpid()}"
    socket = ["-S", str(tmp_path / "tmux.sock")]  # a private server: never the user's tmux
    command = f"env XDG_DATA_HOME={tmp_path / 'data'} {exe} shell {' '.join(files)}"

    def tmux(*args):
        return subprocess.run(["tmux", *socket, *args], capture_output=True, text=True, check=True).stdout

    def screen_shows(text, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-p", "-t", name)
            if text in screen:
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared; screen:\n{screen}")

    tmux("new-session", "-d", "-s", name, "-x", "140", "-y", "45", command)
    try:
        screen_shows("PrecisionTool >")  # capture-pane drops trailing blanks
        screen = screen_shows("| not compared yet | help")  # the bottom toolbar, drawn with the prompt
        assert "golden: golden.h5  target: target.h5  overflow: overflow.h5  fusion-off: fusion-off.h5" in screen
        tmux("send-keys", "-t", name, "vcs -c 0.99 -l 2", "Enter")
        screen = screen_shows("| comparison loaded |")
        assert "Flagged ops (first 2 of" in screen
        tmux("send-keys", "-t", name, "ni fc1/MatMulBiasA", "Tab")
        screen_shows("ni fc1/MatMulBiasAddRelu")  # completed in place
        tmux("send-keys", "-t", name, "C-u", "frob", "Enter")
        screen_shows("unknown command 'frob'")
        tmux("send-keys", "-t", name, "exit", "Enter")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the session ends with the shell
            listed = subprocess.run(["tmux", *socket, "list-sessions", "-F", "#S"], capture_output=True, text=True)
            if listed.returncode != 0 or name not in listed.stdout:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("exit did not end the shell")
    finally:
        subprocess.run(["tmux", *socket, "kill-server"], capture_output=True)


def test_inspect_is_reachable_from_the_shell_with_the_batch_commands_json(run_cli):
    samples = [Path(__file__).resolve().parents[2] / "sample_dumps" / n for n in ("golden.h5", "npu.h5")]
    shell = run_cli("shell", *samples, "-c", "inspect golden --format json")
    batch = run_cli("inspect", samples[0], "--format", "json")
    assert shell.status == batch.status == 0, shell.stderr
    assert json.loads(shell.stdout) == json.loads(batch.stdout)
    table = run_cli("shell", *samples, "-c", "inspect")  # the target by default
    assert "npu.h5" in table.stdout and "recorded" in table.stdout and "28 ops" in table.stdout


@pytest.mark.parametrize("shell_line, batch_args", [
    ("vcs -c 0.99 -l 2 --format json", ("compare", "-c", "0.99", "-l", "2", "--format", "json")),
    ("ac --format json", ("diagnose", "--format", "json")),
    ("check --min-cosine 0.99 --format json", ("check", "--min-cosine", "0.99", "--format", "json")),
])
def test_shell_twins_print_the_batch_commands_json(run_cli, shell_line, batch_args):
    samples = [Path(__file__).resolve().parents[2] / "sample_dumps" / n for n in ("golden.h5", "npu.h5")]
    shell = run_cli("shell", *samples, "-c", shell_line)
    batch = run_cli(batch_args[0], *samples, *batch_args[1:])
    assert shell.status == 0 and batch.status in (0, 1), shell.stderr + batch.stderr  # check: 1, it fails
    assert json.loads(shell.stdout) == json.loads(batch.stdout)
