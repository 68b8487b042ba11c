import hashlib
import json
import os
import sys
from pathlib import Path

import h5py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dump"))  # the synthetic dump writer
from dumpfakes import write_synthetic  # noqa: E402

KEYS = {"schema_version", "complete", "steps_complete", "ops", "overflow_ops", "overflow_steps", "loss",
        "loss_scale", "accelerate_switch_step"}


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest(), os.stat(path).st_mtime_ns


def test_json_has_the_contract_keys(run_cli, tmp_path):
    path = tmp_path / "d.h5"
    write_synthetic(path)
    result = run_cli("inspect", path, "--format", "json")
    assert result.status == 0, result.stderr
    data = json.loads(result.stdout)
    assert KEYS <= set(data)
    assert data["complete"] is True and data["steps_complete"] == 3 and data["ops"] == 9
    assert data["overflow_ops"] == 1 and data["overflow_steps"] == [1]
    assert data["loss"] == [2.0, 1.9, 1.8] and data["loss_scale"] == [1024.0, 2048.0, 4096.0]
    assert data["accelerate_switch_step"] is None
    assert data["model"] == "synthetic" and data["device"] == "npu" and data["role"] == "target"
    assert data["size_bytes"] == path.stat().st_size
    assert data["first_overflows"][0]["name"] == "block/FusedThing"


def test_json_turns_nan_loss_into_null(run_cli, tmp_path):
    from precision_tool.dump.records import StepRecord
    from precision_tool.dump.writer import DumpWriter

    path = tmp_path / "nan.h5"
    with DumpWriter(path, {}) as writer:
        writer.begin_step(0)
        writer.end_step(StepRecord(0, float("nan"), 1.0, True))
    data = json.loads(run_cli("inspect", path, "--format", "json").stdout)
    assert data["loss"] == [None]


def test_table(run_cli, tmp_path):
    path = tmp_path / "d.h5"
    write_synthetic(path)
    result = run_cli("inspect", path)
    assert result.status == 0, result.stderr
    text = result.stdout
    for expected in ("schema 2, complete", "synthetic", "saturation", "9 ops, 24 tensors",
                     "1 op execution in 1 step (1)", "block/FusedThing", "loss and loss scale", "4096"):
        assert expected in text


def test_a_dump_that_records_its_mode_alone_shows_it(run_cli, tmp_path):
    from precision_tool.dump.records import StepRecord
    from precision_tool.dump.writer import DumpWriter

    path = tmp_path / "torch.h5"  # precision_tool.torch writes "mode", not the collector's "modes"
    with DumpWriter(path, {"mode": "stats", "framework": "torch", "seed": 0}) as writer:
        writer.begin_step(0)
        writer.end_step(StepRecord(0, 1.0, 1.0, False))
    lines = [line.rstrip() for line in run_cli("inspect", path).stdout.splitlines()]
    assert "mode      stats" in lines and "seed      0" in lines


def test_incomplete_dump_says_so(run_cli, tmp_path):
    path = tmp_path / "i.h5"
    write_synthetic(path, complete=False)
    table = run_cli("inspect", path).stdout
    assert "INCOMPLETE (3 steps readable)" in table
    data = json.loads(run_cli("inspect", path, "--format", "json").stdout)
    assert data["complete"] is False and data["steps_complete"] == 3


def test_inspect_never_modifies_the_dump(run_cli, tmp_path):
    path = tmp_path / "ro.h5"
    write_synthetic(path)
    before = _digest(path)
    assert run_cli("inspect", path).status == 0
    assert run_cli("inspect", path, "--format", "json").status == 0
    from precision_tool.dump.reader import open_dump

    with open_dump(path) as dump:
        for record in dump.ops():
            for tensor in record.tensors:
                if tensor.has_data:
                    dump.tensor(record.step, record.exec_index, tensor.slot)
                    list(dump.tensor_chunks(record.step, record.exec_index, tensor.slot, 7))
    assert _digest(path) == before


def test_read_only_file_can_be_inspected(run_cli, tmp_path):
    path = tmp_path / "locked.h5"
    write_synthetic(path, steps=1)
    os.chmod(path, 0o444)
    try:
        assert run_cli("inspect", path, "--format", "json").status == 0
    finally:
        os.chmod(path, 0o644)


def _one_line_error(run_cli, path, problem):
    result = run_cli("inspect", path)
    assert result.status == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"precision-tool: error: {path}: ") and problem in lines[0]


def test_bad_inputs(run_cli, tmp_path):
    _one_line_error(run_cli, tmp_path / "missing.h5", "no such file")
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    _one_line_error(run_cli, text, "not an HDF5 file")
    cut = tmp_path / "cut.h5"
    write_synthetic(cut)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    _one_line_error(run_cli, cut, "truncated")
    future = tmp_path / "future.h5"
    write_synthetic(future, steps=1)
    with h5py.File(future, "r+") as f:
        f.attrs["schema_version"] = 3
    _one_line_error(run_cli, future, "unknown dump schema version 3")
    _one_line_error(run_cli, tmp_path, "is a directory")


def test_the_loss_table_is_drawn_like_the_overflow_table_above_it(run_cli, tmp_path):
    path = tmp_path / "d.h5"
    write_synthetic(path)
    lines = [line.rstrip() for line in run_cli("inspect", path).stdout.splitlines()]
    at = lines.index("loss and loss scale")  # a bold title, a rule under the header, no heavy frame
    assert lines[at + 1:at + 4] == ["step   loss   loss scale   overflow", "─" * 35, "   0      2         1024"]
