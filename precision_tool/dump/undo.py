"""The undo record that makes a dump's commit atomic, and the view of a dump whose commit was cut short.

A commit overwrites HDF5 structures that committed steps depend on (the
superblock, object headers, the /steps link index, global heaps); a kill
between two of those writes would leave them out of step. So before it
overwrites anything, the writer (`precision_tool.dump.guarded`) appends
this record past the end of the file: the bytes each overwrite replaces,
and the size the file had at the last commit. Once every overwrite is
done, truncating the file to its new size removes the record in one step.

A file that ends with a whole record (its trailer and checksum match) was
killed inside a commit: `rolled_back` reads it as it was at the last
commit, the old bytes laid over the new and the file cut at the size
recorded, without modifying it. The record is::

    b"PTUNDO01", size at last commit (u8), n (u8),
    n x (offset (u8), length (u8), the old bytes),
    trailer: body length (u8), crc32 of the body (u4), b"PTUNDOE1"
"""

from __future__ import annotations

import os
import struct
import weakref
import zlib

HEAD = b"PTUNDO01"
TAIL = b"PTUNDOE1"
_HEAD = struct.Struct("<8sQQ")
_ENTRY = struct.Struct("<QQ")
_TRAILER = struct.Struct("<QI8s")


def encode(committed_size: int, regions: list[tuple[int, bytes]]) -> bytes:
    """The record of ``regions`` ((offset, the bytes there before the commit)), trailer included."""
    parts = [_HEAD.pack(HEAD, committed_size, len(regions))]
    for offset, old in regions:
        parts += [_ENTRY.pack(offset, len(old)), old]
    body = b"".join(parts)
    return body + _TRAILER.pack(len(body), zlib.crc32(body), TAIL)


def read_record(fd: int) -> tuple[int, list[tuple[int, bytes]]] | None:
    """(size at the last commit, [(offset, old bytes)]) of the record ending file ``fd``; None when it has none."""
    size = os.fstat(fd).st_size
    if size < _TRAILER.size + _HEAD.size:
        return None
    trailer = os.pread(fd, _TRAILER.size, size - _TRAILER.size)
    if len(trailer) != _TRAILER.size:  # cut short since fstat (a writer replacing the file in place)
        return None
    length, checksum, tail = _TRAILER.unpack(trailer)
    start = size - _TRAILER.size - length
    if tail != TAIL or start < 0 or length < _HEAD.size:
        return None
    body = os.pread(fd, length, start)
    if len(body) != length or zlib.crc32(body) != checksum:
        return None
    head, committed_size, count = _HEAD.unpack_from(body)
    if head != HEAD:
        return None
    regions, position = [], _HEAD.size
    for _ in range(count):
        offset, width = _ENTRY.unpack_from(body, position)
        position += _ENTRY.size
        regions.append((offset, body[position:position + width]))
        position += width
    return committed_size, regions


class RolledBackFile:
    """A read-only file object for h5py: a dump killed inside a commit, as it was at its last commit."""

    def __init__(self, fd: int, committed_size: int, regions: list[tuple[int, bytes]]):
        self._fd = fd
        self._size = committed_size
        self._regions = regions
        self._position = 0
        weakref.finalize(self, os.close, fd)  # h5py never closes a file object: the descriptor goes with it

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, self._size)[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        start = self._position
        data = bytearray(os.pread(self._fd, max(0, min(len(view), self._size - start)), start))
        end = start + len(data)
        for offset, old in self._regions:
            low, high = max(start, offset), min(end, offset + len(old))
            if low < high:
                data[low - start:high - start] = old[low - offset:high - offset]
        view[:len(data)] = data
        self._position = end
        return len(data)

    def read(self, size: int = -1) -> bytes:
        buffer = bytearray(size if size >= 0 else max(0, self._size - self._position))
        return bytes(buffer[:self.readinto(buffer)])

    def write(self, data) -> int:
        raise OSError("a dump is read-only")

    def flush(self) -> None:
        """Nothing was written."""


def rolled_back(path: str) -> RolledBackFile | None:
    """``path`` as it was at its last commit when a kill cut a commit short; None when it was not."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        record = read_record(fd)
    except OSError:
        record = None
    if record is None:
        os.close(fd)
        return None
    return RolledBackFile(fd, *record)
