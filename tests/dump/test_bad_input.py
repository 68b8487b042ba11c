import h5py
import pytest

from precision_tool.dump.reader import open_dump
from precision_tool.errors import InputError
from dumpfakes import write_synthetic


def _problem(path) -> str:
    with pytest.raises(InputError) as info:
        open_dump(path)
    assert info.value.path == str(path)
    assert "\n" not in str(info.value)
    return info.value.problem


def test_missing_file(tmp_path):
    assert _problem(tmp_path / "nope.h5") == "no such file"


def test_empty_path(run_cli):
    """An empty path (shell --target "") said ": is a directory, not a dump file": Path("") is the current one."""
    with pytest.raises(InputError) as info:
        open_dump("")
    assert str(info.value) == "'': an empty path: give a dump file"
    result = run_cli("shell", "--target", "", "-c", "ls")
    assert (result.status, result.stderr) == (2, "precision-tool: error: '': an empty path: give a dump file\n")


def test_directory(tmp_path):
    assert "directory" in _problem(tmp_path)


def test_text_file(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("not a dump\n")
    assert _problem(path) == "not an HDF5 file"


def test_empty_file(tmp_path):
    path = tmp_path / "empty.h5"
    path.write_bytes(b"")
    assert _problem(path) == "not an HDF5 file"


def test_truncated_file(tmp_path):
    path = tmp_path / "cut.h5"
    write_synthetic(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "truncated" in _problem(path)


def test_hdf5_that_is_not_a_dump(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = [1, 2, 3]
    assert "not a precision-tool dump" in _problem(path)


@pytest.mark.parametrize("version", [3, 99, "1", 0])
def test_unknown_schema_version(tmp_path, version):
    path = tmp_path / "future.h5"
    write_synthetic(path, steps=1)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = version
    assert "unknown dump schema version" in _problem(path)


def _damaged(tmp_path, damage, pack_limit=None):
    path = tmp_path / "damaged.h5"
    write_synthetic(path, steps=2, **({} if pack_limit is None else {"pack_limit": pack_limit}))
    with h5py.File(path, "r+") as f:
        damage(f)
    return path


def _read_problem(path) -> str:
    with pytest.raises(InputError) as info:
        with open_dump(path) as dump:
            dump.ops()
    assert info.value.path == str(path)
    return info.value.problem


def test_negative_steps_complete(tmp_path):
    path = _damaged(tmp_path, lambda f: f.attrs.__setitem__("steps_complete", -1))
    assert _problem(path) == "/ attribute steps_complete: -1 is not a whole number >= 0"


def test_more_steps_complete_than_steps(tmp_path):
    path = _damaged(tmp_path, lambda f: f.attrs.__setitem__("steps_complete", 5))
    assert _problem(path) == "/ attribute steps_complete: says 5 steps were committed, but /steps holds 2"


def test_a_step_without_its_op_index_is_not_dropped(tmp_path):
    path = _damaged(tmp_path, lambda f: f.__delitem__("steps/000001/op_index"))
    assert _read_problem(path) == "/steps/000001/op_index: missing (the step has index without it)"


def test_an_index_of_the_wrong_type(tmp_path):
    def damage(f):
        del f["steps/000000/index"]
        f["steps/000000/index"] = [1.0, 2.0]
    assert _read_problem(_damaged(tmp_path, damage)) == (
        "/steps/000000/index: wrong type: plain float64 values instead of the writer's 18 columns "
        "(op, kind, slot, ...)")


def test_an_op_index_pointing_past_the_index(tmp_path):
    def damage(f):
        rows = f["steps/000000/op_index"][()]
        rows["n_tensors"][2] = 1000
        del f["steps/000000/op_index"]
        f["steps/000000/op_index"] = rows
    assert _read_problem(_damaged(tmp_path, damage)) == (
        "/steps/000000/op_index: op 2: first_tensor + n_tensors is 1006, past the end of index (8 rows)")


def test_a_zero_size_tensor(tmp_path):
    def damage(f):
        path = "steps/000000/ops/000000__block|MatMul/input_0"
        dtype = f[path].dtype
        del f[path]
        f.create_dataset(path, shape=(0,), dtype=dtype)
    path = _damaged(tmp_path, damage, pack_limit=-1)
    with open_dump(path) as dump, pytest.raises(InputError) as info:
        dump.tensor(0, 0, "input_0")
    assert info.value.problem == ("/steps/000000/ops/000000__block|MatMul/input_0: holds 0 values where the "
                                  "index says 32 (float16)")
