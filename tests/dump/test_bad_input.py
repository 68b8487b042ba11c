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


@pytest.mark.parametrize("version", [2, 99, "1"])
def test_unknown_schema_version(tmp_path, version):
    path = tmp_path / "future.h5"
    write_synthetic(path, steps=1)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = version
    assert "unknown dump schema version" in _problem(path)
