"""Groups, datasets and attributes through h5py's low-level API.

The writer creates thousands of small objects per step; h5py's high-level
``create_group``/``create_dataset``/``attrs[...]`` cost about three times
as much per object as these calls, with types and property lists cached.
Every ``parent``/``obj`` argument is a low-level identifier (``Group.id``).
"""

from __future__ import annotations

import numpy as np


class LowLevel:
    """Cached HDF5 types and property lists, and the few creation calls the writer needs."""

    def __init__(self) -> None:
        import h5py
        from h5py import h5a, h5d, h5g, h5p, h5s, h5t

        self._h5a, self._h5d, self._h5g, self._h5s, self._h5t = h5a, h5d, h5g, h5s, h5t
        self._scalar = h5s.create(h5s.SCALAR)
        self._types: dict = {}
        self._types_by_id: dict = {}
        self._spaces: dict = {}
        self._str = h5py.string_dtype("utf-8")
        self._lcpl = h5p.create(h5p.LINK_CREATE)
        self._lcpl.set_char_encoding(h5t.CSET_UTF8)
        # groups list their members in creation order (input_0 ... input_10, not input_10 before input_2)
        self._gcpl = h5p.create(h5p.GROUP_CREATE)
        self._gcpl.set_link_creation_order(h5p.CRT_ORDER_TRACKED | h5p.CRT_ORDER_INDEXED)
        # no modification times: each attribute write would rewrite them (about a third of the cost)
        self._gcpl.set_obj_track_times(False)
        self._dcpl = h5p.create(h5p.DATASET_CREATE)
        self._dcpl.set_obj_track_times(False)
        self._h5p = h5p
        self._table_dcpls: dict[tuple, object] = {}

    def _type(self, dtype: np.dtype):
        # by identity first: hashing a compound dtype walks its fields (a few us, twice a step)
        known = self._types_by_id.get(id(dtype))
        if known is not None and known[0] is dtype:
            return known[1]
        tid = self._types.get(dtype)
        if tid is None:
            tid = self._types[dtype] = self._h5t.py_create(dtype, logical=True)
        if len(self._types_by_id) < 256:
            self._types_by_id[id(dtype)] = (dtype, tid)  # holds the dtype: its id stays its own
        return tid

    def _space(self, shape: tuple):
        space = self._spaces.get(shape)
        if space is None:
            space = self._scalar if not shape else self._h5s.create_simple(shape)
            if len(self._spaces) < 4096:
                self._spaces[shape] = space
        return space

    def group(self, parent, name: str):
        """A new group ``name`` under ``parent``, members in creation order."""
        return self._h5g.create(parent, name.encode(), lcpl=self._lcpl, gcpl=self._gcpl)

    def index_group(self, parent, name: str):
        """A group of many links added one at a time (``/steps``): no creation-order index, so that adding a
        link changes the fewest HDF5 structures (a SIGKILL in mid-commit then leaves it readable more often)."""
        gcpl = self._h5p.create(self._h5p.GROUP_CREATE)
        gcpl.set_obj_track_times(False)
        return self._h5g.create(parent, name.encode(), lcpl=self._lcpl, gcpl=gcpl)

    def anonymous_group(self, file_id):
        """A new group linked nowhere yet (members in creation order); `link` names it."""
        return self._h5g.create(file_id, None, gcpl=self._gcpl)

    def link(self, obj, parent, name: str) -> None:
        """Link ``obj`` into ``parent`` as ``name``."""
        from h5py import h5o

        h5o.link(obj, parent, name.encode(), lcpl=self._lcpl)

    def attr(self, obj, name: str, value) -> None:
        """A new attribute: str as variable-length UTF-8, anything else as its numpy dtype."""
        if isinstance(value, str):  # h5py converts str objects itself: no memory type
            array = np.array(value, dtype=self._str)
            self._h5a.create(obj, name.encode(), self._type(array.dtype), self._space(())).write(array)
            return
        array = np.asarray(value)
        tid = self._type(array.dtype)
        # memory type = file type, given: h5py would otherwise derive it again on every write (a third of the cost)
        self._h5a.create(obj, name.encode(), tid, self._space(array.shape)).write(array, mtype=tid)

    def replace_attr(self, obj, name: str, value) -> None:
        """`attr`, deleting an attribute of that name first (its type may differ)."""
        if self._h5a.exists(obj, name.encode()):
            self._h5a.delete(obj, name.encode())
        self.attr(obj, name, value)

    def set_attr(self, obj, name: str, value) -> None:
        """Overwrite an existing scalar attribute in place (same type)."""
        array = np.asarray(value)
        self._h5a.open(obj, name.encode()).write(array, mtype=self._type(array.dtype))

    def dataset(self, parent, name: str, array: np.ndarray):
        """A contiguous, uncompressed dataset holding ``array``."""
        tid = self._type(array.dtype)
        dataset = self._h5d.create(parent, name.encode(), tid, self._space(array.shape),
                                   dcpl=self._dcpl, lcpl=self._lcpl)
        if array.size:
            # memory type = file type: a plain copy, no per-element conversion (needs no vlen fields)
            dataset.write(self._h5s.ALL, self._h5s.ALL, array, mtype=tid)
        return dataset

    def table(self, parent, name: str, array: np.ndarray):
        """A dataset holding the structured (compound) ``array``, stored as one chunk of its bytes.

        Writing a compound dataset through HDF5's type conversion costs about
        80 us even when the memory and file types are the same; a direct
        chunk write copies the bytes as they are (about 25 us). Readers see
        an ordinary dataset.
        """
        if not array.size:
            return self.dataset(parent, name, array)
        dcpl = self._table_dcpls.get(array.shape)
        if dcpl is None:
            dcpl = self._h5p.create(self._h5p.DATASET_CREATE)
            dcpl.set_obj_track_times(False)
            dcpl.set_chunk(array.shape)
            if len(self._table_dcpls) < 1024:
                self._table_dcpls[array.shape] = dcpl
        dataset = self._h5d.create(parent, name.encode(), self._type(array.dtype), self._space(array.shape),
                                   dcpl=dcpl, lcpl=self._lcpl)
        dataset.write_direct_chunk((0,) * array.ndim, np.ascontiguousarray(array))
        return dataset


def error_reason(exc: BaseException) -> str:
    """The gist of an h5py error's text (its errno or error message part)."""
    text = str(exc)
    for marker in ("errno = ", "error message = "):
        if marker in text:
            return text.split(marker, 1)[1].split(",")[0].strip("' ")
    return text or type(exc).__name__
