"""One spec per command: the batch CLI and the shell are generated from it, with the same options and handler."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from precision_tool.cli.main import COMMANDS, LazyGroup, cli
from precision_tool.commands.options import NameType, StepType
from precision_tool.commands.registry import REGISTRY, SPECS
from precision_tool.commands.sources import DumpFiles
from precision_tool.commands.spec import CommandSpec
from precision_tool.repl.commands import build_commands
from precision_tool.repl.completion import OpName, StepName, TensorName, TypeName, PassName, suggest
from precision_tool.repl.runner import Runner
from precision_tool.repl.session import ShellSession

SAMPLES = [Path(__file__).resolve().parents[2] / "sample_dumps" / n for n in ("golden.h5", "npu.h5")]
BOTH = [spec for spec in SPECS.values() if spec.in_batch and spec.in_shell]


def _names(params) -> set[str]:
    return {opt for p in params if isinstance(p, click.Option) for opt in (*p.opts, *p.secondary_opts)}


def test_the_registry_covers_every_command_that_reads_dumps():
    assert {"compare", "check", "diagnose", "inspect", "precheck", "baseline"} <= set(SPECS)
    assert {spec.shell for spec in BOTH} >= {"vcs", "ac", "check", "inspect", "precheck"}


@pytest.mark.parametrize("spec", BOTH, ids=lambda s: s.name)
def test_a_spec_for_both_front_ends_is_a_click_command_and_a_shell_command_with_the_same_options(spec):
    batch = LazyGroup().get_command(click.Context(cli), spec.name)
    shell = build_commands()[spec.shell]
    batch_only = _names(spec.batch_params) | _names(p for _, p in spec.inputs)
    shell_only = _names(spec.shell_params)
    assert _names(batch.params) - batch_only == _names(shell.spec.params) - shell_only == _names(spec.params)
    assert shell.source is spec  # one handler: the shell runs the spec the batch command was built from
    shared = {p.name: p for p in spec.params}
    for param in shell.spec.params:  # the very same click parameter objects: types, defaults, messages
        if param.name in shared:
            assert param is shared[param.name]
            assert any(p is param for p in batch.params)


def test_batch_only_specs_are_not_in_the_shell_and_shell_only_ones_not_in_the_batch_cli():
    shell = build_commands()
    assert "baseline" not in shell
    for name, command in shell.items():
        if not command.source.in_batch:
            assert name not in COMMANDS


def test_the_batch_listing_says_what_each_spec_says():
    for name, (target, summary) in COMMANDS.items():
        if target.startswith("spec:"):
            assert target == f"spec:{name}" and SPECS[name].summary == summary


def test_precheck_help_names_every_setting():
    from precision_tool.analysis.precheck import SETTING_NAMES
    from precision_tool.commands.registry import _SETTINGS

    assert _SETTINGS == ", ".join(SETTING_NAMES)


def test_two_specs_of_one_name_are_refused():
    spec = CommandSpec("x", "x", "x", lambda source: None)
    with pytest.raises(ValueError, match="two specs named 'x'"):
        type(REGISTRY)().add(spec, spec)


# -- one handler, the same result ------------------------------------------------------------------------------
def _rows(comparison):
    return [(op.step, op.exec_index, op.name, op.direction) for op in comparison.rows]


def test_shell_vcs_and_batch_compare_give_the_same_result_data():
    values = SPECS["compare"].shell_parser().make_context("vcs", ["--steps", "0", "-l", "3"]).params
    assert values["steps"] == frozenset({0}) and values["limit"] == 3
    with DumpFiles({"golden": str(SAMPLES[0]), "target": str(SAMPLES[1])}) as files:
        batch, _, _ = SPECS["compare"].run(files, dict(values))
    with ShellSession.open([str(p) for p in SAMPLES]) as session:
        [outcome] = Runner(session).run_line("vcs --steps 0 -l 3")
        assert outcome.error is None, outcome.error
        shell = outcome.result
        assert session.comparison is None  # --steps makes a comparison of its own; the whole run's is not made
    assert type(shell) is type(batch)
    assert _rows(shell) == _rows(batch) and len(batch.rows) == 3 and {op.step for op in batch.rows} == {0}
    assert (shell.threshold, shell.limit, shell.total, shell.show_all) == (batch.threshold, 3, batch.total, False)


@pytest.mark.parametrize("shell_line, batch_args", [
    ("vcs --steps 0 -l 3 --format json", ("compare", "--steps", "0", "-l", "3", "--format", "json")),
    ("vcs --all --ops 'fc1*' --format json", ("compare", "--all", "--ops", "fc1*", "--format", "json")),
    ("vcs -c 0.9 --format csv", ("compare", "-c", "0.9", "--format", "csv")),
    ("ac -c -l 1 -a --format json", ("diagnose", "-c", "-l", "1", "-a", "--format", "json")),
    ("check --steps 1 --judge-inputs --format json", ("check", "--steps", "1", "--judge-inputs", "--format", "json")),
    ("precheck --expect device --format json", ("precheck", "--expect", "device", "--format", "json")),
])
def test_the_shell_prints_what_the_batch_command_prints(run_cli, shell_line, batch_args):
    shell = run_cli("shell", *SAMPLES, "-c", shell_line)
    batch = run_cli(batch_args[0], *SAMPLES, *batch_args[1:])
    assert shell.status == 0 and batch.status in (0, 1), shell.stderr + batch.stderr
    assert shell.stdout == batch.stdout


def test_vcs_writes_the_files_compare_writes(run_cli, tmp_path):
    shell = run_cli("shell", *SAMPLES, "-c",
                    f"vcs -o {tmp_path / 'shell.txt'} --plot {tmp_path / 'shell.svg'}; "
                    f"vcs --format json -o {tmp_path / 'shell.json'}")
    batch = [run_cli("compare", *SAMPLES, "-o", tmp_path / "batch.txt", "--plot", tmp_path / "batch.svg"),
             run_cli("compare", *SAMPLES, "--format", "json", "-o", tmp_path / "batch.json")]
    assert shell.status == 0 and all(b.status == 0 for b in batch), shell.stderr
    for suffix in ("txt", "svg", "json"):
        assert (tmp_path / f"shell.{suffix}").read_text() == (tmp_path / f"batch.{suffix}").read_text()
    # the files written are said on stderr, as compare says them
    assert f"wrote {tmp_path / 'shell.svg'}" in shell.stderr and f"wrote {tmp_path / 'shell.json'}" in shell.stderr
    assert "wrote" not in shell.stdout
    assert "compared " in shell.stdout  # the summary line of a table written to a file, as compare prints it


def test_the_shells_json_and_csv_parse_when_a_file_is_written_too(run_cli, tmp_path):
    """`shell -c "check --format json --junit F"` put "wrote F" after the JSON on stdout: it no longer parsed."""
    import csv
    import json

    checked = run_cli("shell", *SAMPLES, "-c", f"check --format json --junit {tmp_path / 'j.xml'}")
    listed = run_cli("shell", *SAMPLES, "-c", f"vcs --format csv --plot {tmp_path / 'p.svg'}")
    assert json.loads(checked.stdout)["passed"] is False
    rows = list(csv.reader(listed.stdout.splitlines()))
    assert rows[0][:2] == ["status", "step"] and all(len(row) == len(rows[0]) for row in rows)
    assert checked.stderr == f"wrote {tmp_path / 'j.xml'}\n" and listed.stderr == f"wrote {tmp_path / 'p.svg'}\n"


def test_vcs_refuses_to_write_over_a_loaded_dump(run_cli):
    before = SAMPLES[1].read_bytes()
    result = run_cli("shell", *SAMPLES, "-c", f"vcs -o {SAMPLES[1]}")
    assert result.status == 2 and "is an input of this command" in result.stderr
    assert SAMPLES[1].read_bytes() == before


def test_vcs_rejects_a_bad_step_list_as_compare_does(run_cli):
    shell = run_cli("shell", *SAMPLES, "-c", "vcs --steps x")
    batch = run_cli("compare", *SAMPLES, "--steps", "x")
    assert shell.status == batch.status == 2
    assert shell.stderr.splitlines()[0].split(": ", 2)[2] in batch.stderr  # "error: vcs: <click's message>"


def test_the_shell_check_table_is_drawn(run_cli):
    result = run_cli("shell", *SAMPLES, "-c", "check")
    assert result.status == 0, result.stderr
    assert "FAILED" in result.stdout and "Failing tensors" in result.stdout


# -- completion from the parameter types -----------------------------------------------------------------------
_SUGGESTION = {"op": OpName, "tensor": TensorName, "type": TypeName, "pass": PassName, "step": StepName}


def test_every_name_and_step_parameter_of_every_shell_command_completes_by_its_type():
    commands = build_commands()
    specs = {name: command.spec for name, command in commands.items()}
    checked = set()
    for name, command in commands.items():
        arguments = [p for p in command.spec.params if isinstance(p, click.Argument)]
        for param in command.spec.params:
            kind = getattr(param.type, "kind", None)
            if not isinstance(param.type, (NameType, StepType)):
                continue
            if isinstance(param, click.Option):
                line = f"{name} {param.opts[0]} x"
            else:
                line = " ".join([name, *["a:output_0"] * arguments.index(param), "x"])
            assert suggest(line, specs) == [_SUGGESTION[kind]("x")], line
            checked.add((name, kind))
    assert {("ni", "op"), ("ni", "step"), ("rerun", "op"), ("pt", "tensor"), ("cp", "tensor"), ("ls", "type"),
            ("ls", "pass"), ("vcs", "op"), ("check", "op")} <= checked


def test_steps_complete_from_the_dumps():
    from precision_tool.repl.completer import build_catalog
    from precision_tool.repl.completion import complete

    with ShellSession.open([str(p) for p in SAMPLES]) as session:
        catalog = build_catalog(Runner(session))
        assert catalog.steps == [0, 1]
        assert [c.text for c in complete("ni fc1 -s ", catalog)] == ["0", "1"]
        assert [c.text for c in complete("vcs --ops fc", catalog)][0].startswith("fc")


def test_help_for_a_generated_command_is_its_specs(run_cli):
    result = run_cli("shell", *SAMPLES, "-c", "help vcs; help precheck")
    assert result.status == 0, result.stderr
    for option in ("--steps", "--ops", "--jobs", "--all", "--plot", "-o, --output", "csv", "--expect"):
        assert option in result.stdout


def test_of_and_fu_print_the_sections_of_diagnoses_json(run_cli):
    import json

    batch = json.loads(run_cli("diagnose", *SAMPLES, "--format", "json").stdout)
    shell = run_cli("shell", *SAMPLES, "-c", "of -l 0 --format json; fu --format json")
    assert shell.status == 0, shell.stderr
    decoder, text = json.JSONDecoder(), shell.stdout
    overflow, end = decoder.raw_decode(text)
    fusion, _ = decoder.raw_decode(text[end:].lstrip())
    assert overflow == batch["overflow"] and fusion == batch["fusion"]


def test_an_ambiguous_op_under_format_json_lists_the_candidates(run_cli):
    result = run_cli("shell", *SAMPLES, "-c", "rerun MatMul --format json")
    assert result.status == 0, result.stderr
    assert "MatMul" in result.stdout


def test_vcs_all_lists_every_compared_op():
    with ShellSession.open([str(p) for p in SAMPLES]) as session:
        runner = Runner(session)
        [outcome] = runner.run_line("vcs --all")
        assert outcome.error is None, outcome.error
        assert outcome.result.rows == list(session.comparison.ops)
    from precision_tool.render.shell_views import render
    from rich.console import Console
    import io

    out = io.StringIO()
    Console(file=out, width=120).print(render(outcome.result))
    assert out.getvalue().startswith(f"All {len(outcome.result.rows)} compared ops")


@pytest.mark.parametrize("line, keys", [
    ("ls -t Soft --format json", {"source", "step", "filters", "ops", "counts"}),
    ("ni fc1/MatMulBiasAddRelu --format json", {"role", "op", "sides", "slots", "metrics_source"}),
    ("pt fc1/MatMulBiasAddRelu:output_0 -p 3 --format json", {"label", "dtype", "shape", "stats", "values"}),
    ("cp fc1/MatMulBiasAddRelu:output_0 -p 2 --format json", {"left", "right", "allclose", "cosine", "mismatches"}),
    ("ni MatMul --format json", {"query", "names", "total"}),  # several ops match: the candidates
])
def test_the_shells_own_commands_that_read_dumps_print_json(run_cli, line, keys):
    import json

    result = run_cli("shell", *SAMPLES, "-c", line)
    assert result.status == 0, result.stderr
    assert keys <= set(json.loads(result.stdout))
