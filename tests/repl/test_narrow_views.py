"""The shell's views on an 80-column terminal (the width of a pipe): nothing folds a name or a number into the
next line, and a line that wraps stays indented under its entry."""

from __future__ import annotations

from pathlib import Path

import pytest

SAMPLES = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "sample_dumps").glob("*.h5"))


@pytest.fixture
def shell80(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")

    def run(line: str) -> list[str]:
        result = run_cli("shell", *SAMPLES, "-c", line)
        assert result.status == 0, result.stderr
        return [text.rstrip() for text in result.stdout.splitlines()]

    return run


def test_ls_with_a_filter_keeps_names_and_passes_whole(shell80):
    assert shell80("ls -f Fusion")[:4] == [
        "6 ops of step 0 match pass~'Fusion' (target: npu.h5)",
        "# Dir Name                  Type              Pass",
        "─" * 73,
        "0 fwd norm/LayerNormFused   LayerNormFused    LayerNormFusionPass"]


def test_fu_keeps_the_suspect_on_one_line_and_indents_what_wraps(shell80):
    lines = shell80("fu")
    assert lines[:5] == ["Fusion passes applied", "Pass                          Count", "─" * 35,
                         "LayerNormFusionPass           1", "MatMulBiasAddFusionPass       1"]
    at = lines.index("Fused-op suspects, worst first")
    assert lines[at + 1:at + 6] == [
        "# Step Fused op            Pass                Introduced err Unfused err Ratio",
        "─" * 79,
        "1    0 norm/LayerNormFused LayerNormFusionPass          38.42    0.006614  5808",
        "  [1] norm/LayerNormFused replaces norm/ReduceMean, norm/Sub, norm/Square,",
        "      norm/ReduceMean_1, norm/Add, norm/Rsqrt, norm/Mul, norm/Mul_1, norm/Add_1"]
    assert all(line.startswith("      ") for line in lines[at + 6:])


def test_of_indents_the_lines_an_entry_wraps_to(shell80):
    lines = shell80("of -l 1")
    entry = lines[lines.index("showing 1 of 2, in execution order") + 1:]
    assert entry[0] == "[1] FIRST  step 0 backward #7  norm/LayerNormFused (LayerNormFused)  float16"
    assert entry[1:3] == ["    no output holds inf, nan or a saturated value: the overflow is inside the",
                          "    kernel"]
    assert all(line.startswith("    ") for line in entry[1:])


def test_ni_wraps_a_side_under_its_name_and_pt_shows_as_many_columns_as_values(shell80):
    lines = shell80("ni norm/LayerNormFused")
    at = lines.index("Tensors")
    assert lines[at + 1:at + 4] == [
        "  input_0   target     fp16  (32, 16)    [26.09, 33.06]  mean 29.98  std 1.01",
        "            fusion-off fp16  (32, 16)    [26.09, 33.06]  mean 29.98  std 1.01",
        "            as norm/ReduceMean:input_0"]
    values = shell80("pt norm/LayerNormFused -p 3")
    assert "│ nan 0  inf 0  saturated 0" in values[3]
    assert [line.strip("│ ") for line in values[5:8]] == [
        "Index   +0         +1         +2", "─" * 37, "0       0.390625   0.140625   0.90625"]


def test_ls_of_a_step_the_dump_lacks_and_a_missing_role_are_errors_that_read_right(run_cli):
    golden, npu = (s for s in SAMPLES if s.endswith(("golden.h5", "npu.h5")))
    result = run_cli("shell", golden, npu, "-c", "ls -s 99; inspect overflow")
    assert (result.status, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        "error: the target dump recorded no op at step 99; steps: 0, 1",
        "error: inspect needs an overflow dump; start the shell with --overflow FILE or pass an overflow dump "
        "among FILES",
        "precision-tool: error: 2 shell commands failed"]


def test_rerun_of_an_op_it_cannot_replay_does_not_say_it_replayed_it(run_cli):
    result = run_cli("shell", *SAMPLES, "-c", "rerun norm/LayerNormFused --direction backward")
    out = [line.strip("│ ") for line in result.stdout.splitlines()]
    assert "Introduced       not replayable (see the note)" in out
