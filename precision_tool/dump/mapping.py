"""Reading a contiguous dataset's bytes in place: where they lie in the file, and read-only mappings of them.

Used by `precision_tool.dump.reader` for float tensors and packs; a dataset
stored any other way (chunked, filtered, external) is read through h5py
(`read_dataset`, which names a dataset HDF5 cannot read and why).
"""

from __future__ import annotations

import os
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


def mapped_chunks(file, path: str, offset: int, dtype: np.dtype, size: int, limit: int) -> Iterator[np.ndarray]:
    """``size`` values of ``dtype`` at ``offset``, as read-only views of a mapping of ``limit`` values at a time."""
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
        aligned = begin - begin % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, begin - aligned + count * itemsize, access=mmap.ACCESS_READ, offset=aligned)
        yield np.frombuffer(mapping, dtype, count, begin - aligned)  # the view keeps the mapping alive


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
