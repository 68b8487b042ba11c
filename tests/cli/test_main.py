import subprocess
import sys

from precision_tool import __version__


def test_help_lists_every_command(run_cli):
    result = run_cli("--help")
    assert result.status == 0
    for name in ("demo", "collect", "inspect", "compare", "check", "baseline", "diagnose", "shell"):
        assert f"  {name}" in result.stdout


def test_version(run_cli):
    result = run_cli("--version")
    assert result.status == 0
    assert result.stdout.strip() == f"precision-tool, version {__version__}"


def test_help_imports_neither_h5py_nor_numpy():
    code = (
        "import sys\n"
        "from precision_tool.cli.main import main\n"
        "main(['--help'])\n"
        "heavy = [m for m in ('h5py', 'numpy', 'rich', 'prompt_toolkit') if m in sys.modules]\n"
        "print('HEAVY:' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY:"


def test_unknown_command_is_a_usage_error(run_cli):
    result = run_cli("frobnicate")
    assert result.status == 2
    assert "No such command 'frobnicate'" in result.stderr


def test_a_commands_exit_code_is_returned(monkeypatch):
    import click

    from precision_tool.cli import main as cli_main

    @click.command("exits-one")
    @click.pass_context
    def exits_one(ctx):
        ctx.exit(1)

    monkeypatch.setitem(cli_main.COMMANDS, "exits-one", ("tests.cli.test_main:_unused", "test"))
    monkeypatch.setattr(cli_main.LazyGroup, "get_command", lambda self, ctx, name: exits_one)
    assert cli_main.main(["exits-one"]) == 1


def test_the_console_script_keeps_freed_memory_for_the_next_step(monkeypatch):
    import platform

    from precision_tool.cli import main as cli_main

    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert cli_main.keep_freed_memory()  # both mallopt settings accepted
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not cli_main.keep_freed_memory()  # elsewhere: nothing to tune, nothing raised


def test_no_command_prints_the_help_as_it_reads_and_exits_2(run_cli):
    result = run_cli()
    assert (result.status, result.stdout) == (2, "")
    lines = result.stderr.splitlines()  # was one line: "precision-tool: error: Usage: ... Commands: demo Run ..."
    assert lines[0] == "Usage: precision-tool [OPTIONS] COMMAND [ARGS]..."
    assert "  compare   Score every op of a target dump against a golden dump." in lines


def test_ranks_given_one_dump_file_says_it_wants_a_run_directory(run_cli, tmp_path):
    dump = tmp_path / "golden.h5"
    dump.write_bytes(b"")
    result = run_cli("ranks", dump)
    assert result.status == 2
    assert result.stderr == (f"precision-tool: error: Invalid value for 'RUN': {dump} is one dump; ranks reads a run "
                             "directory (rank0.h5, rank1.h5, ... and run.json, as collect --ranks writes it) "
                             "(see 'precision-tool ranks --help')\n")  # was "Directory '...' is a file."
