"""The CI gate and diagnose cannot be fooled: incomplete or live targets, other models, swapped roles, NaN options."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest

from precision_tool.dump.reader import open_dump
from precision_tool.dump.writer import DumpWriter
from tests.faults.writes_helpers import assert_outcome, command, digests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Golden and target mlp runs and a golden cnn run, three steps each, collected by the console script."""
    folder = tmp_path_factory.mktemp("gate")
    paths = {"golden": folder / "golden.h5", "target": folder / "target.h5", "cnn": folder / "cnn.h5"}
    for model, device, name in (("mlp", "golden", "golden"), ("mlp", "npu", "target"), ("cnn", "golden", "cnn")):
        subprocess.run(command("collect", model, "--device", device, "--steps", "3", "-o", paths[name]),
                       check=True, capture_output=True)
    return paths


def _cut_short(source, path, planned: int = 100) -> Path:
    """A copy of ``source`` as a run killed after its committed steps would leave it: complete false."""
    shutil.copyfile(source, path)
    with h5py.File(path, "r+") as f:
        f.attrs["complete"] = False
        f.attrs["steps"] = planned
    return path


def _run(run_cli, *args, inputs):
    before = digests(*inputs)
    return run_cli(*args), before


GATES = ("check", "diagnose", "baseline")


def _gate_args(gate, golden, target, tmp_path):
    extra = ("-o", tmp_path / "baseline.json") if gate == "baseline" else ()
    return (gate, golden, target, *extra)


@pytest.mark.parametrize("gate", GATES)
def test_a_target_killed_after_3_of_100_steps_is_refused(runs, tmp_path, run_cli, gate):
    target = _cut_short(runs["golden"], tmp_path / "killed.h5")  # the same numbers: only the steps are missing
    result, before = _run(run_cli, *_gate_args(gate, runs["golden"], target, tmp_path), inputs=[runs["golden"], target])
    assert_outcome(result.status, result.stderr, 2, before, says="incomplete (killed or failed): 3 of 100 steps")
    assert str(target) in result.stderr and "--allow-incomplete" in result.stderr
    assert not (tmp_path / "baseline.json").exists()


@pytest.mark.parametrize("gate", GATES)
def test_an_incomplete_golden_is_refused(runs, tmp_path, run_cli, gate):
    golden = _cut_short(runs["golden"], tmp_path / "killed-golden.h5")
    result, before = _run(run_cli, *_gate_args(gate, golden, runs["target"], tmp_path),
                          inputs=[golden, runs["target"]])
    assert_outcome(result.status, result.stderr, 2, before, says="the golden run is incomplete")


def test_allow_incomplete_checks_the_committed_steps_and_says_so(runs, tmp_path, run_cli):
    target = _cut_short(runs["golden"], tmp_path / "killed.h5")
    result, before = _run(run_cli, "check", runs["golden"], target, "--allow-incomplete",
                          inputs=[runs["golden"], target])
    assert_outcome(result.status, result.stderr, 0, before, lines=2, says="warning: ")
    assert "3 of 100 steps committed; only those are compared" in result.stderr
    assert "planned different step counts: golden 3, target 100" in result.stderr
    assert "PASSED" in result.stdout


def test_a_target_still_being_written_is_refused(runs, tmp_path, run_cli):
    live = tmp_path / "live.h5"
    writer = DumpWriter(live, {"model": "mlp", "role": "target", "mode": "dump", "steps": 100})
    try:
        partial = Path(f"{live}.partial")
        result, before = _run(run_cli, "check", runs["golden"], partial, inputs=[runs["golden"]])
        assert_outcome(result.status, result.stderr, 2, before, says="still being written by another process")
        with open_dump(partial) as dump:
            assert dump.being_written
    finally:
        writer.close(complete=False)


def test_a_target_being_replaced_by_a_new_run_is_refused(runs, tmp_path, run_cli):
    target = tmp_path / "target.h5"
    shutil.copyfile(runs["target"], target)  # the previous run, complete
    writer = DumpWriter(target, {"model": "mlp", "role": "target", "mode": "dump", "steps": 100})
    try:
        result, before = _run(run_cli, "check", runs["golden"], target, inputs=[runs["golden"], target])
        assert_outcome(result.status, result.stderr, 2, before, says="a new target run is being written to replace it")
    finally:
        writer.close(complete=False)


def test_a_collect_killed_mid_run_fails_the_gate(runs, tmp_path):
    path = tmp_path / "run.h5"
    partial = Path(f"{path}.partial")
    proc = subprocess.Popen(command("collect", "mlp", "--device", "npu", "--steps", "100000", "-o", path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size > 400_000):
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    before = digests(runs["golden"], partial)
    result = subprocess.run(command("check", runs["golden"], partial), capture_output=True, text=True, timeout=120)
    assert_outcome(result.returncode, result.stderr, 2, before, says="of 100000 steps committed")


@pytest.mark.parametrize("gate", GATES)
def test_different_models_are_refused(runs, tmp_path, run_cli, gate):
    result, before = _run(run_cli, *_gate_args(gate, runs["golden"], runs["cnn"], tmp_path),
                          inputs=[runs["golden"], runs["cnn"]])
    assert_outcome(result.status, result.stderr, 2, before, says="different models: golden 'mlp'")


@pytest.mark.parametrize("gate", GATES)
def test_swapped_golden_and_target_are_refused(runs, tmp_path, run_cli, gate):
    result, before = _run(run_cli, *_gate_args(gate, runs["target"], runs["golden"], tmp_path),
                          inputs=[runs["golden"], runs["target"]])
    assert_outcome(result.status, result.stderr, 2, before, says="golden and target are swapped")


def test_a_different_seed_is_a_warning(runs, tmp_path, run_cli):
    other = tmp_path / "seed7.h5"
    subprocess.run(command("collect", "mlp", "--device", "golden", "--steps", "3", "--seed", "7", "-o", other),
                   check=True, capture_output=True)
    result, before = _run(run_cli, "check", runs["golden"], other, inputs=[runs["golden"], other])
    assert result.status == 1  # different weights and data: the tensors differ, and the gate says so
    assert "Traceback" not in result.stderr
    assert "warning: the runs differ in seed: golden 0, target 7" in result.stderr
    assert digests(runs["golden"], other) == before


NAN_OPTIONS = [
    ("check", "--min-cosine", "nan"), ("check", "--min-cosine", "NaN"), ("check", "--min-cosine", "inf"),
    ("check", "--min-cosine", "-inf"), ("check", "--min-cosine", "1.5"), ("check", "--max-abs-err", "nan"),
    ("check", "--max-abs-err", "inf"), ("check", "--max-abs-err", "-1"), ("compare", "-c", "nan"),
    ("compare", "--cosine", "inf"),
]


@pytest.mark.parametrize("cmd, option, value", NAN_OPTIONS)
def test_non_finite_thresholds_are_refused_at_parse_time(runs, run_cli, cmd, option, value):
    result, before = _run(run_cli, cmd, runs["golden"], runs["target"], option, value,
                          inputs=[runs["golden"], runs["target"]])
    assert_outcome(result.status, result.stderr, 2, before, says=f"{option}")
    assert repr(value) in result.stderr


@pytest.mark.parametrize("line", ["cp fc1/MatMulBiasAddRelu -rl nan", "cp fc1/MatMulBiasAddRelu -al inf",
                                  "vcs -c nan"])
def test_non_finite_thresholds_are_refused_in_the_shell(runs, run_cli, line):
    result, before = _run(run_cli, "shell", runs["golden"], runs["target"], "-c", line,
                          inputs=[runs["golden"], runs["target"]])
    # the shell prints the command's error, then its one-line summary for -c
    assert_outcome(result.status, result.stderr, 2, before, lines=2, says="is not a finite number")


def test_accelerate_train_mode_on_golden_is_refused_as_precision_mode_is(tmp_path, run_cli):
    for option, value in (("--precision-mode", "force_fp16"), ("--accelerate-train-mode", "fast|step|0.5")):
        result = run_cli("collect", "mlp", "--device", "golden", option, value, "-o", tmp_path / "x.h5")
        assert_outcome(result.status, result.stderr, 2, {}, says=f"{option} applies to --device npu only")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", [2**64, 2**70, -1])
def test_a_seed_out_of_64_bits_is_refused(tmp_path, run_cli, seed):
    result = run_cli("collect", "mlp", "--device", "golden", "--seed", seed, "-o", tmp_path / "x.h5")
    assert_outcome(result.status, result.stderr, 2, {}, says="--seed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", [2**63, 2**64 - 1])
def test_the_largest_seeds_are_stored_exactly(tmp_path, run_cli, seed):
    path = tmp_path / "x.h5"
    result = run_cli("collect", "mlp", "--device", "golden", "--seed", seed, "--steps", "1", "-o", path)
    assert result.status == 0, result.stderr
    with open_dump(path) as dump:
        assert dump.metadata["seed"] == seed


def test_the_shell_s_ac_refuses_different_models_and_compare_warns(runs, run_cli):
    """The shell's ac is diagnose's twin: under -c it fails the command (exit 2); compare, which shows whatever it
    is given, says so on stderr."""
    inputs = [runs["golden"], runs["cnn"]]
    result, before = _run(run_cli, "shell", "--golden", runs["golden"], "--target", runs["cnn"], "-c", "ac",
                          inputs=inputs)
    assert_outcome(result.status, result.stderr, 2, before, lines=2, says="different models: golden 'mlp'")
    assert result.stderr.endswith("precision-tool: error: 1 shell command failed\n")  # (the shell's own count)
    shown = run_cli("compare", *inputs)
    assert shown.status == 0 and "warning: the dumps are of different models: golden 'mlp'" in shown.stderr
