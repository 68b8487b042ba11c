"""Reading a contiguous dataset's bytes in place: where they lie in the file, and read-only mappings of them.

Used by `precision_tool.dump.reader` for float tensors and packs; a dataset
stored any other way (chunked, filtered, external) is read through h5py
(`read_dataset`, which names a dataset HDF5 cannot read and why).

A file cut short while it is mapped (truncated, or rewritten in place by
``cp``) would end the process with SIGBUS at the next read past its new
end. The file's size is checked before each mapping, and every mapping is
registered with the C extension's guard (`precision_tool._native`, see
``guard_*`` there), which turns such a read into a read of zeros and marks
the mapping: `mapped_chunks` checks its chunk once the consumer is done with
it, and `check_cut_short` (run after every command, and on its errors) raises the one-line
error for any mapping that was marked. Where there is no guard (no C
extension, a full table of mappings), the bytes are read into memory with
``preadv`` instead, which sees a shorter file as a short read.
"""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from precision_tool.errors import InputError


def raw_offset(file, dataset, dtype: str, stored: np.dtype, size: int) -> int | None:
    """Where a float32/float64 dataset's bytes lie in the file, in one piece and as they are; None otherwise."""
    if (dtype not in ("float32", "float64", "uint8") or stored != np.dtype(dtype) or not stored.isnative
            or size == 0 or dataset.shape == () or dataset.chunks is not None):  # filters need chunks
        return None
    try:
        if file.driver != "sec2" or file.userblock_size or dataset.id.get_create_plist().get_external_count():
            return None
        return dataset.id.get_offset()  # None until the data is written
    except (AttributeError, OSError, ValueError):
        return None


CUT_WHILE_READ = "cut short while it was read (truncated or rewritten in place?); nothing read from it was used"


def mapped_chunks(file, path: str, offset: int, dtype: np.dtype, size: int, limit: int) -> Iterator[np.ndarray]:
    """``size`` values of ``dtype`` at ``offset``, as read-only views of a mapping of ``limit`` values at a time
    (copies where the mapping guard is not available); InputError naming ``path`` when the file is shorter."""
    import mmap

    itemsize = dtype.itemsize
    for start in range(0, size, limit):
        count = min(limit, size - start)
        begin = offset + start * itemsize
        try:
            fd = file.id.get_vfd_handle()  # each time: raises once the dump is closed, never maps a reused fd
        except ValueError:
            raise InputError(path, "the dump was closed while its tensors were read") from None
        if begin + count * itemsize > os.fstat(fd).st_size:  # a mapping past the end would fault, not fail
            raise InputError(path, f"tensor data cut short: bytes {begin}-{begin + count * itemsize} "
                                   f"are past the end of the file")
        if _guard() is None:
            yield _read_copy(fd, path, begin, count, dtype)
            continue
        aligned = begin - begin % mmap.ALLOCATIONGRANULARITY
        try:
            mapping = mmap.mmap(fd, begin - aligned + count * itemsize, access=mmap.ACCESS_READ, offset=aligned)
        except OSError:  # a file system that cannot map files (ENODEV: some FUSE and network mounts)
            yield _read_copy(fd, path, begin, count, dtype)
            continue
        except ValueError:  # "mmap length is greater than file size": cut short since the fstat above
            raise InputError(path, CUT_WHILE_READ) from None
        address = _watch(mapping, path)
        if address is None:  # the guard's table is full: a copy, which cannot fault
            mapping.close()
            yield _read_copy(fd, path, begin, count, dtype)
            continue
        yield np.frombuffer(mapping, dtype, count, begin - aligned)  # the view keeps the mapping alive
        if _guard().guard_faulted(address):  # the consumer read past the file's end (zeros): not to be used
            raise InputError(path, CUT_WHILE_READ)


def _read_copy(fd: int, path: str, begin: int, count: int, dtype: np.dtype) -> np.ndarray:
    """``count`` values of ``dtype`` at byte ``begin`` of ``fd``, read into a new read-only array."""
    values = np.empty(count, dtype)
    buffer = memoryview(values).cast("B")
    done = 0
    while done < len(buffer):
        read = os.preadv(fd, [buffer[done:]], begin + done)
        if not read:  # the file ended before the bytes its size covered a moment ago
            raise InputError(path, CUT_WHILE_READ)
        done += read
    values.flags.writeable = False
    return values


_WATCHED: dict[int, str] = {}  # address of a mapping the guard covers -> its dump's path
_FAULTED: list[str] = []  # dumps a released mapping of which was read past its file's end, not yet reported
_STATE: dict = {}  # "guard": the C extension once its handler is set, or None


def _guard():
    """The C extension with its SIGBUS handler set (once), else None."""
    if "guard" not in _STATE:
        try:
            from precision_tool import _native
        except ImportError:  # built without a C compiler
            _native = None
        usable = _native is not None and hasattr(_native, "guard_install") and _native.guard_install()
        _STATE["guard"] = _native if usable else None
    return _STATE["guard"]


def _watch(mapping, path: str) -> int | None:
    """Register ``mapping`` with the guard until it is released; its address, or None when the table is full."""
    address = np.frombuffer(mapping, np.uint8).__array_interface__["data"][0]
    if not _guard().guard_add(address, len(mapping)):
        return None
    _WATCHED[address] = path
    weakref.finalize(mapping, _release, address)
    return address


def guarded(array: np.ndarray, path: str) -> np.ndarray:
    """A ``np.memmap`` of file ``path`` (``np.load(..., mmap_mode="r")``) registered with the guard, so that a
    file cut short while it is read is `check_cut_short`'s error; a copy in memory where there is no guard."""
    mapping = getattr(array, "_mmap", None)
    if mapping is None or _guard() is None or _watch(mapping, str(path)) is None:
        return np.array(array)
    return array


def _release(address: int) -> None:
    path = _WATCHED.pop(address, None)
    if _guard().guard_remove(address) and path is not None:
        _FAULTED.append(path)


def watch_file(dump, watch: bool = True) -> None:
    """Have `check_cut_short` look at open ``dump`` (its ``changed_while_read()``) until it is closed
    (``watch=False``) or released."""
    if watch:
        _OPEN.add(dump)
    else:
        _OPEN.discard(dump)


def file_state(file) -> tuple[int, int] | None:
    """(size, modification time in ns) of an open h5py ``file``; None when closed or not a plain file."""
    try:
        if file.driver == "fileobj":  # read through a file object (`dump.undo`): its handle is no descriptor
            return None
        info = os.fstat(file.id.get_vfd_handle())
    except (AttributeError, OSError, TypeError, ValueError):
        return None
    return info.st_size, info.st_mtime_ns


def changed_since(file, opened: tuple[int, int] | None, growing: bool) -> bool:
    """Whether ``file`` is shorter than it was (``opened``: its `file_state` then), or, unless it is ``growing``
    (being written), modified since."""
    now = file_state(file) if opened is not None else None
    if now is None:
        return False
    return now[0] < opened[0] or (not growing and now[1] != opened[1])


_OPEN: weakref.WeakSet = weakref.WeakSet()  # the open dumps `check_cut_short` looks at


def check_cut_short() -> None:
    """InputError naming a dump that was cut short or rewritten while it was read: a mapping of it read past
    the file's end (zeros), or the file is now shorter (or, unless it is being written, modified)."""
    guard = _STATE.get("guard")
    faulted = list(_FAULTED)
    _FAULTED.clear()
    if guard is not None:
        faulted += [path for address, path in list(_WATCHED.items()) if guard.guard_faulted(address)]
    faulted += [dump.path for dump in list(_OPEN) if dump.changed_while_read()]
    if faulted:
        raise InputError(faulted[0], CUT_WHILE_READ)


@contextmanager
def checked_reads() -> Iterator[None]:
    """Run a command's work; a dump cut short while it was read is the error, whatever the work made of it."""
    try:
        yield
    except Exception:
        check_cut_short()  # a zero read can surface as another error first (an integrity check): name the cause
        raise
    check_cut_short()


def chunk_selections(shape: tuple[int, ...], max_elements: int) -> Iterator[tuple]:
    """Index tuples covering ``shape`` in C order, each of at most ``max_elements`` values."""
    if not shape:
        yield ()
        return
    if 0 in shape:
        return
    inner = 1
    split = len(shape)  # dims[split:] fit whole in one chunk
    while split > 0 and inner * shape[split - 1] <= max_elements:
        split -= 1
        inner *= shape[split]
    if split == 0:
        yield tuple(slice(None) for _ in shape)
        return
    axis = split - 1
    per_chunk = max(1, max_elements // inner)
    for outer in np.ndindex(*shape[:axis]):
        for start in range(0, shape[axis], per_chunk):
            yield (*outer, slice(start, min(start + per_chunk, shape[axis])))


def read_dataset(path: str, where: str, dataset, selection=()) -> np.ndarray:
    """``dataset[selection]`` as an array; InputError naming dump ``path`` and dataset ``where`` when HDF5
    cannot read it (a compression filter this HDF5 lacks, a damaged chunk), never an error from deep in h5py."""
    try:
        return np.asarray(dataset[selection])
    except (OSError, RuntimeError) as exc:
        missing = _missing_filter(dataset)
        reason = f"compressed with HDF5 filter {missing}, which this HDF5 does not have" if missing else str(exc)
        raise InputError(path, f"{where}: unreadable ({reason})") from None


def _missing_filter(dataset) -> str | None:
    """The first filter of ``dataset`` that is not available here ("32001 (blosc)"), else None."""
    try:
        import h5py

        plist = dataset.id.get_create_plist()
        for number in range(plist.get_nfilters()):
            code, _, _, name = plist.get_filter(number)
            if not h5py.h5z.filter_avail(code):
                label = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
                return f"{code} ({label})" if label else str(code)
    except (AttributeError, OSError, RuntimeError, ValueError):
        pass
    return None
