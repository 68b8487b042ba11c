"""Where a dump is while it is written (NAME.partial, locked), and what a failed write leaves."""

import errno
import os

import pytest

from precision_tool.dump.partial import GuardedFile
from precision_tool.dump.reader import open_dump
from precision_tool.dump.records import StepRecord
from precision_tool.dump.writer import DumpWriter
from precision_tool.errors import InputError
from tests.dump.dumpfakes import write_synthetic


def _step(writer, step):
    writer.begin_step(step)
    writer.end_step(StepRecord(step, 1.0, 1.0, False))


def test_a_dump_is_at_its_name_only_once_closed(tmp_path):
    path = tmp_path / "run.h5"
    writer = DumpWriter(path, {"role": "target"})
    _step(writer, 0)
    assert not path.exists() and (tmp_path / "run.h5.partial").exists()
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]
    with open_dump(path) as dump:
        assert dump.complete and dump.steps_complete == 1


def test_an_interrupted_dump_is_renamed_into_place_marked_incomplete(tmp_path):
    path = tmp_path / "run.h5"
    with pytest.raises(KeyboardInterrupt):
        with DumpWriter(path, {}) as writer:
            _step(writer, 0)
            raise KeyboardInterrupt
    with open_dump(path) as dump:
        assert not dump.complete and dump.steps_complete == 1


def test_overwrite_false_keeps_an_existing_dump_and_the_default_replaces_it(tmp_path):
    path = tmp_path / "run.h5"
    write_synthetic(path, steps=2)
    before = path.read_bytes()
    with pytest.raises(InputError, match="already exists"):
        DumpWriter(path, {}, overwrite=False)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]
    with DumpWriter(path, {}) as writer:  # the library's default, as before: replace
        _step(writer, 0)
    with open_dump(path) as dump:
        assert dump.steps_complete == 1


def test_a_second_writer_of_a_path_is_refused_even_with_overwrite(tmp_path):
    path = tmp_path / "run.h5"
    first = DumpWriter(path, {})
    _step(first, 0)
    with pytest.raises(InputError, match="is already being written by this process"):  # (another process's
        DumpWriter(path, {}, overwrite=True)  # writer: tests/faults/test_writes_dumps.py)
    _step(first, 1)
    first.close()
    with open_dump(path) as dump:
        assert dump.complete and dump.steps_complete == 2


def test_a_failed_write_drops_every_later_one(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    guarded = GuardedFile(fd)
    guarded.seek(0)
    guarded.write(b"kept")
    os.close(fd)  # every later write fails (EBADF)
    guarded.write(b"lost")
    assert guarded.failure.errno == errno.EBADF and guarded.tell() == 8
    guarded.truncate(0)
    guarded.write(b"also dropped")
    assert (tmp_path / "f").read_bytes() == b"kept"


def test_ctrl_c_inside_an_hdf5_write_is_raised_after_it_and_the_dump_stays_readable(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    writer = DumpWriter(path, {})
    _step(writer, 0)
    real, calls = os.pwrite, []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the signal arrived inside HDF5's callback
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(KeyboardInterrupt):
        _step(writer, 1)
    monkeypatch.undo()
    writer.close(complete=False)
    with open_dump(path) as dump:
        assert not dump.complete and dump.steps_complete >= 1


def test_a_dump_is_never_renamed_over_a_fifo_or_device_nor_written_to_an_empty_name(tmp_path):
    """`torch.dump` and the writer replace an existing dump by default: a FIFO or a device at the path is
    refused before anything is written (as root, a dump once replaced /dev/null), and so is an empty name."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        with pytest.raises(InputError, match="is not a regular file"):
            DumpWriter(path, {"role": "target"})
    assert fifo.is_fifo() and os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    with pytest.raises(InputError, match="is not a file name"):
        DumpWriter("", {"role": "target"})


def test_metadata_that_fails_to_write_leaves_no_partial_dump(tmp_path, monkeypatch):
    """An error or an interrupt while the root metadata is written: no zero-step NAME.partial is left to block
    the next run."""
    def broken(self, metadata, stats_match_data):
        raise KeyboardInterrupt

    monkeypatch.setattr(DumpWriter, "_write_metadata", broken)
    with pytest.raises(KeyboardInterrupt):
        DumpWriter(tmp_path / "run.h5", {"role": "target"})
    assert list(tmp_path.iterdir()) == []


def test_a_left_behind_partial_open_in_a_reader_is_named_as_read_not_written(tmp_path):
    import h5py

    path = tmp_path / "run.h5"
    write_synthetic(f"{path}.partial", steps=1)  # what a killed run leaves
    before = open(f"{path}.partial", "rb").read()
    with h5py.File(f"{path}.partial", "r"):  # a shell or an inspect holds HDF5's shared lock
        with pytest.raises(InputError) as caught:
            DumpWriter(path, {"role": "target"}, overwrite=True)
    assert str(caught.value) == (f"{path}.partial: is open in another process that reads it (the shell, "
                                 "inspect?); close it there, or write elsewhere")
    assert open(f"{path}.partial", "rb").read() == before and not path.exists()
    writer = DumpWriter(path, {"role": "target"}, overwrite=True)  # once it is closed, --force replaces it
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]


def test_a_path_is_free_again_once_its_writer_closes(tmp_path):
    path = tmp_path / "run.h5"
    first = DumpWriter(path, {})
    _step(first, 0)
    first.close()
    with DumpWriter(path, {}, overwrite=True) as second:  # the same process, one writer after the other
        _step(second, 0)
    with open_dump(path) as dump:
        assert dump.complete and dump.steps_complete == 1


def test_a_name_too_long_for_its_partial_suffix_is_written_through_a_shortened_partial(tmp_path):
    from precision_tool.dump.partial import partial_path

    path = tmp_path / ("y" * 250 + ".h5")  # 253 bytes: a legal name; NAME.partial (261) is not
    partial = partial_path(path)
    assert partial == partial_path(str(path))  # every writer of NAME finds the same working file
    assert os.path.dirname(partial) == str(tmp_path) and len(os.path.basename(partial)) == 255
    assert os.path.basename(partial).endswith(".partial") and "~" in os.path.basename(partial)
    writer = DumpWriter(path, {"role": "target"})
    _step(writer, 0)
    with pytest.raises(InputError, match="is already being written"):
        DumpWriter(path, {})
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    with open_dump(path) as dump:
        assert dump.complete and dump.steps_complete == 1
    assert partial_path(tmp_path / "run.h5") == str(tmp_path / "run.h5.partial")
