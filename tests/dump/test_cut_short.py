"""Tensors read in place from a dump that is cut short meanwhile: an InputError naming it, never a SIGBUS.

`precision_tool.dump.mapping` maps a tensor's bytes; a read past the end of a file cut short after the mapping
was made is a SIGBUS. The mapping guard (`_native.guard_*`) reads zeros there instead and marks the mapping;
without the guard the bytes are copied with ``preadv``. Cases that could kill the process run in a subprocess.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from precision_tool.compare.memory import MemoryDump
from precision_tool.dump import mapping
from precision_tool.dump.reader import open_dump
from precision_tool.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
BIG = np.arange(1 << 17, dtype=np.float32).reshape(256, 512)  # 512 KiB: past PACK_LIMIT, a dataset of its own
CHUNK = 1 << 14  # values a chunk: 64 KiB, 8 chunks


@pytest.fixture
def big(tmp_path):
    dump = MemoryDump(role="golden")
    dump.add("fc/Op", "Op", {"output_0": BIG})
    return dump.save(tmp_path / "big.h5")


def _offset(path) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        found = []
        f.visititems(lambda name, item: found.append(item.id.get_offset())
                     if isinstance(item, h5py.Dataset) and item.size == BIG.size else None)
    return found[0]


_READER = """
import os, sys
import numpy as np
from precision_tool.dump.reader import open_dump
from precision_tool.errors import InputError

path, cut = sys.argv[1], int(sys.argv[2])
with open_dump(path) as dump:
    chunks = dump.tensor_chunks(0, 0, "output_0", {chunk}, mapped=True)
    first = next(chunks)
    os.truncate(path, cut)
    print("sum", float(first.sum()))  # pages past the new end: a SIGBUS without the guard
    try:
        next(chunks)
    except InputError as exc:
        print("error", exc)
"""


@pytest.mark.parametrize("cut", ["start", "mid-chunk"])
def test_a_mapped_chunk_read_past_a_new_end_is_an_error_not_a_sigbus(big, cut):
    offset = _offset(big)
    length = offset if cut == "start" else offset + CHUNK * 4 // 2  # half of the first chunk kept
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", _READER.format(chunk=CHUNK), big, str(length)],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    kept = BIG.reshape(-1)[:(length - offset) // 4]  # the rest of the chunk reads as zeros
    assert result.stdout.splitlines() == [f"sum {float(kept.sum(dtype=np.float32))}",
                                          f"error {big}: {mapping.CUT_WHILE_READ}"]


def test_without_the_guard_chunks_are_copies_with_the_same_values(big, monkeypatch):
    monkeypatch.setitem(mapping._STATE, "guard", None)
    with open_dump(big) as dump:
        chunks = list(dump.tensor_chunks(0, 0, "output_0", CHUNK, mapped=True))
    assert [c.size for c in chunks] == [CHUNK] * 8 and not any(c.flags.writeable for c in chunks)
    assert np.array_equal(np.concatenate(chunks), BIG.reshape(-1))
    assert all(c.base is None for c in chunks)  # its own memory, not a view of a mapping


def test_without_the_guard_a_file_cut_short_is_an_error(big, monkeypatch):
    monkeypatch.setitem(mapping._STATE, "guard", None)
    offset = _offset(big)
    with open_dump(big) as dump:
        chunks = dump.tensor_chunks(0, 0, "output_0", CHUNK, mapped=True)
        assert np.array_equal(next(chunks), BIG.reshape(-1)[:CHUNK])
        os.truncate(big, offset + CHUNK * 4 + 100)
        with pytest.raises(InputError, match="tensor data cut short: bytes"):
            next(chunks)


def test_a_copy_that_meets_the_end_of_the_file_is_an_error(big):
    size = os.path.getsize(big)
    with open(big, "rb") as handle:
        with pytest.raises(InputError, match=re.escape(mapping.CUT_WHILE_READ)):
            mapping._read_copy(handle.fileno(), str(big), size - 8, 4, np.dtype(np.float32))


def test_a_dump_shorter_or_modified_since_it_was_opened_is_named_by_the_check(big, tmp_path):
    other = MemoryDump(role="golden")
    other.add("fc/Op", "Op", {"output_0": BIG[:1]})
    kept = other.save(tmp_path / "kept.h5")
    with open_dump(big) as dump, open_dump(kept):
        mapping.check_cut_short()  # nothing changed
        os.truncate(big, os.path.getsize(big) - 1)
        assert dump.changed_while_read()
        with pytest.raises(InputError, match=f"^{re.escape(f'{big}: {mapping.CUT_WHILE_READ}')}$"):
            mapping.check_cut_short()
    mapping.check_cut_short()  # closed: no longer looked at
    with open_dump(kept) as dump:
        os.utime(kept, ns=(1, 1))
        assert dump.changed_while_read()


_NPY = """
import os, sys
from precision_tool.dump.mapping import check_cut_short
from precision_tool.errors import InputError
from precision_tool.repl.tensor_commands import _load_npy

path = sys.argv[1]
values = _load_npy(path)
os.truncate(path, 200)
print("sum", float(values.sum()))  # past byte 200: a SIGBUS without the guard
try:
    check_cut_short()
except InputError as exc:
    print("error", exc)
"""


def test_a_npy_file_the_shell_maps_cut_short_is_an_error_not_a_sigbus(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, BIG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", _NPY, path], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    kept = BIG.reshape(-1)[:(200 - 128) // 4]  # a 128-byte header, then the values
    assert result.stdout.splitlines() == [f"sum {float(kept.sum(dtype=np.float32))}",
                                          f"error {path}: {mapping.CUT_WHILE_READ}"]


def test_a_npy_file_is_read_in_place_or_copied_with_the_same_values(tmp_path, monkeypatch):
    from precision_tool.repl.tensor_commands import _load_npy

    path = tmp_path / "x.npy"
    np.save(path, BIG)
    assert np.array_equal(_load_npy(str(path)), BIG)
    monkeypatch.setitem(mapping._STATE, "guard", None)
    copied = _load_npy(str(path))
    assert np.array_equal(copied, BIG) and not isinstance(copied, np.memmap)


def test_a_file_system_that_cannot_map_files_is_read_with_copies(big, monkeypatch):
    import errno
    import mmap

    def refuse(*args, **kwargs):
        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))

    monkeypatch.setattr(mmap, "mmap", refuse)
    with open_dump(big) as dump:
        chunks = list(dump.tensor_chunks(0, 0, "output_0", CHUNK, mapped=True))
    assert np.array_equal(np.concatenate(chunks), BIG.reshape(-1)) and all(c.base is None for c in chunks)


_FOREIGN = """
import mmap, os, signal, sys
from precision_tool.dump import mapping

assert mapping._guard() is not None  # the handler is set
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGBUS)
else:
    with open(sys.argv[1], "wb") as handle:
        handle.write(b"x" * 8192)
    with open(sys.argv[1], "rb") as handle:
        other = mmap.mmap(handle.fileno(), 8192, access=mmap.ACCESS_READ)  # not the reader's: not registered
    os.truncate(sys.argv[1], 0)
    print(other[5000])
print("survived")
"""


@pytest.mark.parametrize("how", ["fault", "kill"])
@pytest.mark.parametrize("faulthandler", [False, True], ids=["plain", "faulthandler"])
def test_a_sigbus_that_is_not_the_guards_ends_the_process_as_before(tmp_path, how, faulthandler):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    options = ["-X", "faulthandler"] if faulthandler else []
    result = subprocess.run([sys.executable, *options, "-c", _FOREIGN, tmp_path / "other.bin", how],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == -signal.SIGBUS and "survived" not in result.stdout, result
    assert result.stderr.count("Fatal Python error: Bus error") == (1 if faulthandler else 0), result.stderr


def _grown_fstat(real, by: int):
    """os.fstat, reporting ``by`` bytes more than the file holds: as if it was cut short right after the call."""
    def fstat(fd):
        result = real(fd)
        return os.stat_result((*result[:6], result.st_size + by, *result[7:10]))
    return fstat


def test_a_dump_cut_short_between_the_size_check_and_the_mapping_is_an_input_error(big, monkeypatch):
    """Before: mmap's own check failed ("mmap length is greater than file size"), an internal ValueError."""
    size, cut = os.path.getsize(big), _offset(big) + 1000
    with open_dump(big) as dump, pytest.raises(InputError) as info:
        dump.ops(0)  # the tables, read before the cut
        os.truncate(big, cut)
        monkeypatch.setattr(mapping.os, "fstat", _grown_fstat(os.fstat, size - cut))  # the size before the cut
        for chunk in dump.tensor_chunks(0, 0, "output_0", CHUNK, mapped=True):
            pass
    assert info.value.problem == mapping.CUT_WHILE_READ


def test_a_dump_cut_short_while_its_undo_record_is_looked_for_reads(big, monkeypatch):
    """Before: the trailer read short and struct.error escaped from `open_dump` (an internal error)."""
    from precision_tool.dump import undo

    monkeypatch.setattr(undo.os, "fstat", _grown_fstat(os.fstat, 7))
    fd = os.open(big, os.O_RDONLY)
    try:
        assert undo.read_record(fd) is None
    finally:
        os.close(fd)
