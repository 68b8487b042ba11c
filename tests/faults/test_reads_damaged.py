"""Damaged but valid HDF5 dumps, made with h5py from a real collected dump: exit 2, the file and HDF5 path named."""

from __future__ import annotations

import shutil
import subprocess

import h5py
import numpy as np
import pytest

from tests.faults.writes_helpers import assert_outcome, command, digests

STEP = "/steps/000001"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A golden and a target mlp run, three steps each, collected by the console script."""
    folder = tmp_path_factory.mktemp("reads")
    paths = {"golden": folder / "golden.h5", "target": folder / "target.h5"}
    for device, path in (("golden", paths["golden"]), ("npu", paths["target"])):
        subprocess.run(command("collect", "mlp", "--device", device, "--steps", "3", "-o", path),
                       check=True, capture_output=True)
    return paths


def _first_tensor(f) -> str:
    """The step's first pack: the small tensors of a step are packed into a few byte datasets (schema 2)."""
    return f"{STEP}/packs/{sorted(f[f'{STEP}/packs'])[0]}"


def _replace_table(f, name, change):
    rows = f[f"{STEP}/{name}"][()]
    change(rows)
    del f[f"{STEP}/{name}"]
    f[f"{STEP}/{name}"] = rows


def _set(column, value, row=0):
    def change(rows):
        rows[column][row] = value
    return change


def _zero_size_tensor(f):
    path = _first_tensor(f)
    dtype = f[path].dtype
    del f[path]
    f.create_dataset(path, shape=(0,), dtype=dtype)
    return path


def _tensor_of_other_size(f):
    path = _first_tensor(f)
    dtype, size = f[path].dtype, f[path].size
    del f[path]
    f.create_dataset(path, shape=(size // 2,), dtype=dtype)
    return path


def _tensor_of_text(f):
    path = _first_tensor(f)
    del f[path]
    f[path] = "not numbers"
    return path


def _tensor_as_group(f):
    path = _first_tensor(f)
    del f[path]
    f.create_group(path)
    return path


def _tensor_removed(f):
    path = _first_tensor(f)
    del f[path]
    return path


def _table_of_wrong_type(name, dtype):
    def damage(f):
        n = f[f"{STEP}/{name}"].shape[0]
        del f[f"{STEP}/{name}"]
        f[f"{STEP}/{name}"] = np.arange(n, dtype=dtype)
        return f"{STEP}/{name}"
    return damage


def _empty_table(name):
    def damage(f):
        dtype = f[f"{STEP}/{name}"].dtype
        del f[f"{STEP}/{name}"]
        f.create_dataset(f"{STEP}/{name}", shape=(0,), dtype=dtype)
        return f"{STEP}/{name}"
    return damage


def _two_dimensional_index(f):
    rows = f[f"{STEP}/index"][()]
    del f[f"{STEP}/index"]
    f[f"{STEP}/index"] = np.stack([rows, rows], 1)
    return f"{STEP}/index"


def _table_value(name, column, value, row=0):
    def damage(f):
        _replace_table(f, name, _set(column, value, row))
        return f"{STEP}/{name}"
    return damage


def _removed(name):
    def damage(f):
        del f[f"{STEP}/{name}"]
        return f"{STEP}/{name}"
    return damage


def _root_attr(name, value):
    def damage(f):
        f.attrs[name] = value
        return f"/ attribute {name}"
    return damage


def _step_attr(name, value):
    def damage(f):
        f[STEP].attrs[name] = value
        return STEP
    return damage


def _step_as_dataset(f):
    del f[STEP]
    f[STEP] = 1
    return STEP


# name -> (damage, the commands that must refuse it). inspect reads the index but no tensor; compare and
# check read both; a step's loss is read by inspect only.
INDEX_COMMANDS = ("compare", "check", "inspect")
TENSOR_COMMANDS = ("compare", "check")
DAMAGES = {
    "zero-size pack": (_zero_size_tensor, TENSOR_COMMANDS),
    "pack cut short": (_tensor_of_other_size, TENSOR_COMMANDS),
    "pack of text": (_tensor_of_text, TENSOR_COMMANDS),
    "pack replaced by a group": (_tensor_as_group, TENSOR_COMMANDS),
    "pack removed": (_tensor_removed, TENSOR_COMMANDS),
    "index of the wrong type": (_table_of_wrong_type("index", np.float64), INDEX_COMMANDS),
    "op_index of the wrong type": (_table_of_wrong_type("op_index", np.int32), INDEX_COMMANDS),
    "empty index": (_empty_table("index"), INDEX_COMMANDS),
    "empty op_index": (_empty_table("op_index"), INDEX_COMMANDS),
    "2-D index": (_two_dimensional_index, INDEX_COMMANDS),
    "op_index past the end of index": (_table_value("op_index", "first_tensor", 10**6), INDEX_COMMANDS),
    "op_index tensor count past the end": (_table_value("op_index", "n_tensors", 10**6, -1), INDEX_COMMANDS),
    "op_index direction out of range": (_table_value("op_index", "direction", 9), INDEX_COMMANDS),
    "index op out of range": (_table_value("index", "op", 10**6), INDEX_COMMANDS),
    "index kind out of range": (_table_value("index", "kind", 7), INDEX_COMMANDS),
    "index rank out of range": (_table_value("index", "ndim", 200), INDEX_COMMANDS),
    "index pack out of range": (_table_value("index", "pack", -7), INDEX_COMMANDS),
    "index pack that does not exist": (_table_value("index", "pack", 999), TENSOR_COMMANDS),
    "index offset past its pack": (_table_value("index", "offset", 10**9), TENSOR_COMMANDS),
    "op attrs not JSON": (_table_value("op_index", "attrs", b"{not json"), TENSOR_COMMANDS),
    "malformed fusion entry": (_table_value("op_index", "fusion", b'{"pass_name":"P","output_origins":[[1]]}'),
                               TENSOR_COMMANDS),
    "op name not UTF-8": (_table_value("op_index", "name", b"\xff\xfe"), TENSOR_COMMANDS),
    "repeated execution index": (_table_value("op_index", "exec_index", 0, 1), INDEX_COMMANDS),
    "negative dimension": (_table_value("index", "shape", [-5, 16, 0, 0, 0, 0, 0, 0]), INDEX_COMMANDS),
    "op_index removed": (_removed("op_index"), INDEX_COMMANDS),
    "index removed": (_removed("index"), INDEX_COMMANDS),
    "negative steps_complete": (_root_attr("steps_complete", -1), INDEX_COMMANDS),
    "steps_complete past the steps": (_root_attr("steps_complete", 99), INDEX_COMMANDS),
    "steps_complete as text": (_root_attr("steps_complete", "three"), INDEX_COMMANDS),
    "complete as text": (_root_attr("complete", "yes"), INDEX_COMMANDS),
    "long_shapes not JSON": (_step_attr("long_shapes", "{oops"), INDEX_COMMANDS),
    "loss as text": (_step_attr("loss", "low"), ("inspect",)),
    "step replaced by a dataset": (_step_as_dataset, INDEX_COMMANDS),
}
CASES = [(name, cmd) for name, (_, commands) in DAMAGES.items() for cmd in commands]


@pytest.mark.parametrize("damage, cmd", CASES, ids=[f"{cmd}-{name.replace(' ', '_')}" for name, cmd in CASES])
def test_a_damaged_target_is_a_bad_input(runs, tmp_path, run_cli, damage, cmd):
    path = tmp_path / "damaged.h5"
    shutil.copyfile(runs["target"], path)
    with h5py.File(path, "r+") as f:
        where = DAMAGES[damage][0](f)
    inputs = [runs["golden"], path]
    before = digests(*inputs)
    args = ("inspect", path) if cmd == "inspect" else (cmd, runs["golden"], path)
    result = run_cli(*args)
    assert_outcome(result.status, result.stderr, 2, before, says=str(path))
    named = where.split(" attribute ")[-1] if " attribute " in where else where
    assert named in result.stderr, result.stderr  # the HDF5 path (or root attribute) that is wrong
    assert "internal error" not in result.stderr


def test_an_undamaged_copy_still_reads(runs, tmp_path, run_cli):
    path = tmp_path / "copy.h5"
    shutil.copyfile(runs["target"], path)
    before = digests(runs["golden"], path)
    for args in (("inspect", path), ("compare", runs["golden"], path)):
        result = run_cli(*args)
        assert result.status == 0, result.stderr
    assert digests(runs["golden"], path) == before
