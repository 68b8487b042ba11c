"""`diagnose --overflow/--fusion-off`: the extra dumps are other runs of the target's device, not golden or target
again (before, any dump was taken, and said nothing)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "sample_dumps"


@pytest.mark.parametrize("args, named, says", [
    (("--overflow", "golden.h5"), "golden.h5", "is the golden dump given again; --overflow takes another run of the "
                                               "target's model (in overflow mode)"),
    (("--fusion-off", "npu.h5"), "npu.h5", "is the target dump given again; --fusion-off takes another run of the "
                                           "target's model (with fusion off)"),
    (("--fusion-off", "copy.h5"), "copy.h5", "is a golden run; --fusion-off takes a run of the target's device "
                                             "(with fusion off)"),
])
def test_an_extra_dump_that_is_golden_or_target_is_refused(run_cli, tmp_path, args, named, says):
    shutil.copy(SAMPLES / "golden.h5", tmp_path / "copy.h5")
    where = {name: (tmp_path if name == "copy.h5" else SAMPLES) / name for name in ("golden.h5", "npu.h5", "copy.h5")}
    result = run_cli("diagnose", SAMPLES / "golden.h5", SAMPLES / "npu.h5", args[0], where[args[1]])
    assert (result.status, result.stdout, result.stderr) == (2, "", f"precision-tool: error: {where[named]}: {says}\n")


def test_the_overflow_and_fusion_off_runs_of_the_target_are_taken(run_cli):
    result = run_cli("diagnose", SAMPLES / "golden.h5", SAMPLES / "npu.h5", "--overflow", SAMPLES / "overflow.h5",
                     "--fusion-off", SAMPLES / "fusion_off.h5", "--format", "json")
    assert result.status == 0 and result.stderr == ""


@pytest.mark.parametrize("option, command", [("--overflow", "of"), ("--fusion-off", "fu")])
def test_the_shells_of_and_fu_refuse_them_as_ac_does(run_cli, option, command):
    """`of` read golden.h5 given as --overflow ("No op raised the float status") and `fu` golden as the fusion-off
    run (an unfused error of 0), while `ac` in the same shell refused them."""
    result = run_cli("shell", "--golden", SAMPLES / "golden.h5", "--target", SAMPLES / "npu.h5", option,
                     SAMPLES / "golden.h5", "-c", command)
    assert result.status == 2 and result.stdout == ""
    assert result.stderr.splitlines()[0] == (f"error: {SAMPLES / 'golden.h5'}: is the golden dump given again; "
                                             f"{option} takes another run of the target's model "
                                             f"({'in overflow mode' if command == 'of' else 'with fusion off'})")
