"""Run metadata a crafted dump holds: an array of strings where a string is expected, and a terminal's escape
sequences. `precheck` exited 3 (internal error) on the first, and `inspect` and `precheck` wrote the second to
the terminal as is (it cleared the screen and forged a line)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
ESCAPES = "mlp\x1b[2J\x1b[31m\nFAKE LINE\r"


def _with_model(tmp_path, value, name: str) -> Path:
    path = tmp_path / name
    shutil.copy(ROOT / "sample_dumps" / "npu.h5", path)
    with h5py.File(path, "r+") as f:
        f.attrs["model"] = value
    return path


def test_a_model_given_as_an_array_of_strings_is_a_setting_that_differs(run_cli, tmp_path):
    target = _with_model(tmp_path, np.array([b"a", b"b"]), "array.h5")
    result = run_cli("precheck", ROOT / "sample_dumps" / "golden.h5", target)
    assert result.status == 1, result.stderr
    assert 'model (golden sensor, target ["a","b"])' in result.stderr


def test_escape_sequences_in_the_metadata_reach_no_terminal(run_cli, tmp_path):
    target = _with_model(tmp_path, ESCAPES, "escapes.h5")
    shown = "mlp\\x1b[2J\\x1b[31m\\nFAKE LINE\\r"
    inspected = run_cli("inspect", target)
    assert inspected.status == 0 and "\x1b" not in inspected.stdout and shown in inspected.stdout
    checked = run_cli("precheck", ROOT / "sample_dumps" / "golden.h5", target)
    assert "\x1b" not in checked.stdout + checked.stderr and shown in checked.stderr


def test_a_huge_model_name_is_shown_cut_to_its_start_and_length(run_cli, tmp_path):
    # (a 1 MB name was echoed whole: 2.4 MB from precheck, a 1 MB warning from compare; 20 MB ran past a minute)
    target = _with_model(tmp_path, "M" * 1_000_000, "huge.h5")
    shown = "M" * 200 + "... (1000000 characters)"
    checked = run_cli("precheck", ROOT / "sample_dumps" / "golden.h5", target)
    assert checked.status == 1 and len(checked.stdout) + len(checked.stderr) < 5000
    assert f"model (golden sensor, target {shown})" in checked.stderr
    compared = run_cli("compare", ROOT / "sample_dumps" / "golden.h5", target)
    assert len(compared.stderr) < 2000 and f"target '{shown}'" in compared.stderr


def test_a_npy_file_that_holds_no_real_numbers_is_one_line_and_exit_2(run_cli, tmp_path):
    # (float128, strings and records were internal errors, exit 3; complex values lost their imaginary part)
    cases = {"f128.npy": np.zeros(4, dtype=np.longdouble), "str.npy": np.array(["a", "b"]),
             "rec.npy": np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "cplx.npy": np.ones(3, dtype=complex)}
    golden, target = ROOT / "sample_dumps" / "golden.h5", ROOT / "sample_dumps" / "npu.h5"
    for name, values in cases.items():
        np.save(tmp_path / name, values)
        result = run_cli("shell", "--golden", golden, "--target", target, "-c", f"pt {tmp_path / name}")
        assert result.status == 2, (name, result.stderr)
        assert f"{tmp_path / name}: holds {values.dtype} values: a .npy tensor must hold real numbers" in \
            result.stderr, result.stderr
    (tmp_path / "text.npy").write_text("hello")
    result = run_cli("shell", "--golden", golden, "--target", target, "-c", f"pt {tmp_path / 'text.npy'}")
    assert result.status == 2 and "not a readable .npy file: no numpy header (another format, or a pickle)" in \
        result.stderr and "allow_pickle" not in result.stderr


def test_an_interrupted_demo_says_which_partial_dumps_it_left_beside_the_kept_ones(tmp_path):
    # (`demo --force` stopped by Ctrl-C kept the previous dumps and left golden.h5.partial unmentioned)
    import os
    import time

    from precision_tool.cli.demo import _partials_left
    from precision_tool.collect.demo import demo_paths

    paths = demo_paths(tmp_path)
    for path in paths:
        Path(path).write_bytes(b"a previous dump")
    started = time.time()
    assert _partials_left(paths, started) is None
    partial = Path(f"{paths[0]}.partial")
    partial.write_bytes(b"this run's")
    assert _partials_left(paths, started) == f"the previous dumps are kept; {partial} keeps this run's, incomplete"
    os.utime(partial, (started - 60, started - 60))  # an older run's: not this one's to speak of
    assert _partials_left(paths, started) is None
