"""Atomic commits: the file a writer killed after any one of its writes would leave reads back whole.

A SIGKILL stops a writer between two system calls (the page cache keeps
every finished write), so replaying a writer's writes one by one builds
every file a kill can leave. Each must read as it was at the last finished
commit: no more steps, and no fewer.
"""

import hashlib
import os

import numpy as np
import pytest

from precision_tool.dump import undo
from precision_tool.dump.guarded import GuardedFile
from precision_tool.dump.reader import open_dump
from precision_tool.dump.records import OpRecord, StepRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.dump.writer import DumpWriter

STEPS, OPS = 3, 12


def _values(step: int, op: int) -> np.ndarray:
    rng = np.random.default_rng(step * 100 + op)
    shape = (40, 70) if op % 3 == 0 else (4, 5)  # packed, and (past the pack limit) a dataset of its own
    return rng.standard_normal(shape).astype(np.float16).astype(np.float32)


def _record_writes(path, monkeypatch) -> tuple[list, int, list[int]]:
    """Every pwrite and ftruncate of a writer of STEPS steps, how many had been made when the empty dump was
    created, and when each step was committed."""
    calls, committed = [], []
    real_pwrite, real_truncate = os.pwrite, os.ftruncate

    def pwrite(fd, data, offset):
        calls.append((offset, bytes(memoryview(data).cast("B"))))
        return real_pwrite(fd, data, offset)

    def ftruncate(fd, size):
        calls.append((size, None))
        return real_truncate(fd, size)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    writer = DumpWriter(path, {"model": "synthetic", "role": "target"})
    created = len(calls)
    for step in range(STEPS):
        writer.begin_step(step)
        for op in range(OPS):
            x = _values(step, op)
            record = OpRecord(step, op, f"layer{op}/Add", "Add", "forward", "float16", False,
                              (TensorRecord("output_0", "float16", x.shape, tensor_stats(x, "float16")),))
            writer.write_op(record, {"output_0": x})
        writer.end_step(StepRecord(step, float(step), 1.0, False), extra={"note": f"step {step} " * 40})
        committed.append(len(calls))
    monkeypatch.undo()
    return calls, created, committed


def _replay(calls, path):
    """Yield the number of calls made, after each, with ``path`` holding the file they leave."""
    content = bytearray()
    for made, (offset, data) in enumerate(calls, 1):
        if data is None:
            del content[offset:]
            content.extend(bytes(offset - len(content)))
        else:
            content.extend(bytes(max(0, offset + len(data) - len(content))))
            content[offset:offset + len(data)] = data
        with open(path, "wb") as f:
            f.write(content)
        yield made


def test_a_kill_after_any_write_leaves_the_steps_committed_before_it(tmp_path, monkeypatch):
    calls, created, committed = _record_writes(tmp_path / "run.h5", monkeypatch)
    killed = tmp_path / "killed.h5"
    rolled_back = 0
    for made in _replay(calls, killed):
        if made < created:
            continue  # killed before the empty dump was made: no step of it is promised
        expected = sum(1 for at in committed if at <= made)
        rolled_back += undo.rolled_back(str(killed)) is not None
        before = hashlib.sha256(killed.read_bytes()).hexdigest()
        with open_dump(killed) as dump:
            assert (made, dump.steps_complete, dump.complete) == (made, expected, False)
            assert [s.step for s in dump.steps()] == list(range(expected))
            if expected:
                last = expected - 1
                assert dump.step_attrs(last)["note"] == f"step {last} " * 40
                for op in range(OPS):
                    np.testing.assert_array_equal(dump.tensor(last, op, "output_0"), _values(last, op))
        assert hashlib.sha256(killed.read_bytes()).hexdigest() == before  # read, never repaired
    assert rolled_back >= STEPS  # every step's commit, cut short, was read as the one before


def test_a_record_cut_short_or_damaged_is_no_record(tmp_path):
    record = undo.encode(4096, [(0, b"superblock"), (800, b"header")])
    path = tmp_path / "f"
    for content, found in [(b"x" * 100 + record, True), (b"x" * 100 + record[:-1], False),
                           (b"x" * 100 + record[:20] + b"?" + record[21:], False), (record[-20:], False), (b"", False)]:
        path.write_bytes(content)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert (undo.read_record(fd) == (4096, [(0, b"superblock"), (800, b"header")])) is found
        finally:
            os.close(fd)


def test_a_rolled_back_view_lays_the_old_bytes_over_the_new_and_ends_at_the_committed_size(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"NEWNEW-tail-" + undo.encode(7, [(0, b"old"), (5, b"dd")]))
    view = undo.rolled_back(str(path))
    assert view.seek(0, 2) == 7
    view.seek(0)
    assert view.read() == b"oldNEdd"
    view.seek(4)
    assert view.read(10) == b"Edd"
    with pytest.raises(OSError):
        view.write(b"x")


def _guarded(tmp_path, content: bytes):
    path = tmp_path / "f"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDWR)
    return path, fd, GuardedFile(fd)  # the size it has now is its last commit's


def test_writes_over_the_committed_bytes_wait_for_the_commit_and_read_back_meanwhile(tmp_path):
    path, fd, guarded = _guarded(tmp_path, b"0123456789")
    try:
        guarded.seek(2)
        guarded.write(b"ab")
        guarded.seek(9)
        guarded.write(b"XYZ")  # one byte over the committed ones, two past them
        guarded.seek(0)
        assert guarded.read(20) == b"01ab45678XYZ"
        assert path.read_bytes() == b"0123456789YZ"
        guarded.commit()
        assert path.read_bytes() == b"01ab45678XYZ" and guarded.seek(0, 2) == 12
        guarded.truncate(14)  # HDF5 extends the file: it reads as zeros before the commit makes it so
        guarded.seek(10)
        assert guarded.read(10) == b"YZ\0\0" and len(path.read_bytes()) == 12
        guarded.truncate(4)  # below the last commit: cut at the next
        assert path.read_bytes() == b"01ab45678XYZ"
        guarded.commit()
        assert path.read_bytes() == b"01ab"
    finally:
        os.close(fd)


def test_a_ctrl_c_inside_a_commit_finishes_it_and_is_raised_later(tmp_path, monkeypatch):
    path, fd, guarded = _guarded(tmp_path, b"0123456789")
    real, calls = os.pwrite, []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the signal arrived between the record and the writes
        return real(fd, data, offset)

    try:
        guarded.seek(0)
        guarded.write(b"AB")
        monkeypatch.setattr(os, "pwrite", pwrite)
        guarded.commit()
        assert path.read_bytes() == b"AB23456789" and guarded.interrupted
        assert calls == [10, 0, 10, 0]  # the record past the end, the write; again, the same
    finally:
        os.close(fd)
