"""The file object HDF5 writes a dump through: failures recorded, never raised, and commits made atomic.

h5py's file-object driver calls `GuardedFile` for every read and write.
The first failed write (a full disk, an I/O error) is recorded and every
later write dropped, so HDF5 never half-writes its metadata on top of
committed steps.

Commits are atomic. HDF5 rewrites structures the committed steps depend
on (the superblock, which records where the file ends; object headers; the
/steps link index; global heaps) at every flush, and whenever its metadata
cache evicts one in mid-step, in no promised order, one write each: a
SIGKILL between two of them used to leave a dump that could not be read
(``addr overflow``: a structure pointing past the end the superblock
recorded). So a write below the size the file had at the last commit is
held in memory (and read back from there) until `commit`, which first
appends the bytes those writes replace to the file (an undo record,
`precision_tool.dump.undo`), then writes them, then truncates the file to
its new size, removing the record in one step. A reader that finds a whole
record at the end of a file reads it as it was at the last commit. Writes
past that size go straight to the file: nothing committed refers to them.
"""

from __future__ import annotations

import errno
import os

from precision_tool.dump import undo
from precision_tool.errors import InputError
from precision_tool.outputs import problem


class GuardedFile:
    """A file object for h5py that never raises and commits atomically (see the module docstring)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._position = 0
        self.failure: OSError | None = None
        self.interrupted = False  # a KeyboardInterrupt arrived inside an HDF5 call; raised after it returns
        self._committed = self._size = os.fstat(fd).st_size  # the size at the last commit; the size now
        self._held: list[tuple[int, bytes]] = []  # writes below ``_committed``, in order, until `commit`
        self._pending: tuple | None = None  # (where, undo record) of a commit under way
        self._failure_raised = False

    def raise_problems(self, path: str, consequence: str) -> None:
        """Raise what went wrong inside HDF5's calls: a KeyboardInterrupt, or (once) InputError naming ``path``,
        the first failed write and its ``consequence``."""
        if self.interrupted:
            self.interrupted = False
            raise KeyboardInterrupt
        if self.failure is not None and not self._failure_raised:
            self._failure_raised = True
            raise InputError(path, f"{problem(self.failure)}: {consequence}")

    def seek(self, offset: int, whence: int = 0) -> int:
        self._position = (0, self._position, self._size)[whence] + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def write(self, data) -> int:
        view = memoryview(data)
        size, offset = view.nbytes, self._position
        end = offset + size
        if self.failure is None:
            committed = self._committed
            if end <= committed:  # over committed bytes: kept until `commit` (the usual case of the two)
                self._held.append((offset, view.tobytes()))
            elif offset >= committed:
                self._calmly(view.cast("B"), offset)
            else:
                view = view.cast("B")
                self._held.append((offset, view[:committed - offset].tobytes()))
                self._calmly(view[committed - offset:], committed)
        self._position = end
        if end > self._size:
            self._size = end
        return size

    def _calmly(self, view, offset: int) -> None:
        """`_write_at`, which is idempotent; a KeyboardInterrupt inside it writes again and is raised later
        (`interrupted`), so that no write is left half-done."""
        try:
            self._write_at(view, offset)
        except KeyboardInterrupt:
            self.interrupted = True
            self._write_at(view, offset)

    def _write_at(self, view, offset: int) -> None:
        """Write ``view`` (bytes, or a memoryview of bytes) at ``offset``; a failure is recorded, not raised."""
        if self.failure is not None:
            return
        size = len(view)
        try:
            written = os.pwrite(self._fd, view, offset)
            while written < size:  # a short write: the rest, until the disk says why not
                step = os.pwrite(self._fd, view[written:], offset + written)
                if not step:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                written += step
        except OSError as exc:
            self.failure = exc

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        start = self._position
        try:
            data = os.pread(self._fd, len(view), start)
        except KeyboardInterrupt:
            self.interrupted = True
            data = os.pread(self._fd, len(view), start)
        except OSError as exc:
            self.failure = self.failure or exc
            data = b""
        want = min(len(view), self._size - start)
        if len(data) < want:  # past the file's end but not HDF5's (a truncation waiting for the commit): zeros
            data += bytes(want - len(data))
        if self._held:
            data = bytearray(data)
            for offset, held in self._held:  # what HDF5 wrote there last, though not yet in the file
                low, high = max(start, offset), min(start + len(data), offset + len(held))
                if low < high:
                    data[low - start:high - start] = held[low - offset:high - offset]
        view[:len(data)] = data
        self._position += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        buffer = bytearray(size if size >= 0 else 0)
        return bytes(buffer[:self.readinto(buffer)])

    def truncate(self, size: int | None = None) -> int:
        """Set the file's size at the next commit (HDF5 sets it at every flush; bytes past it read as zeros)."""
        self._size = self._position if size is None else size
        return self._size

    def _truncate(self, size: int) -> None:
        if self.failure is None:
            try:
                os.ftruncate(self._fd, size)
            except OSError as exc:
                self.failure = exc

    def flush(self) -> None:
        """Nothing to do: writes past the last commit went straight to the file, the others wait for `commit`."""

    def commit(self) -> None:
        """Put every write since the last commit into the file at once: a kill at any point leaves a file that
        reads as after this commit, or as after the last (nothing once a write failed: it stays as the last)."""
        while True:
            try:
                self._commit()
                return
            except KeyboardInterrupt:  # each part is idempotent: do it again, raise later
                self.interrupted = True

    def _commit(self) -> None:
        if self.failure is not None:
            return
        if self._pending is None:
            try:
                record = undo.encode(self._committed, self._old_bytes()) if self._held else b""
                self._pending = (max(os.fstat(self._fd).st_size, self._size), record)
            except OSError as exc:
                self.failure = exc
                return
        where, record = self._pending
        if record:
            self._write_at(record, where)  # past everything: the file's end is the record's
            for offset, data in self._held:
                self._write_at(data, offset)
        self._truncate(self._size)  # removes the record: the commit is done
        if self.failure is None:
            self._committed = self._size
            self._held, self._pending = [], None

    def _old_bytes(self) -> list[tuple[int, bytes]]:
        """The bytes in the file now under the regions the held writes cover, merged, in order."""
        spans: list[list[int]] = []
        for offset, end in sorted((offset, offset + len(data)) for offset, data in self._held):
            if spans and offset <= spans[-1][1]:
                if end > spans[-1][1]:
                    spans[-1][1] = end
            else:
                spans.append([offset, end])
        pread, fd = os.pread, self._fd
        return [(start, pread(fd, end - start, start)) for start, end in spans]
