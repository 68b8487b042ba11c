"""`TensorStatsCache`: a step's statistics of tensors, computed once for each piece of memory and version.

The torch capture (`precision_tool.torch.capture`) asks it for the statistics of every input and output of
every op; most are the same memory an earlier op wrote.
"""

from __future__ import annotations

import weakref

import torch

from precision_tool.torch.tensors import (_LIMITS, _SMALL_STATS, _STATS_AT, _STATS_AT_KINDS, _STATS_CANCELLATION,
                                          _STRIDED, _stats_elsewhere, _stats_where_they_lie, memory_order, stats_of)


class TensorStatsCache:
    """Per-step memo of `stats_of` by the memory a tensor views, and its version.

    Most op inputs are earlier ops' outputs, often as other tensor objects
    over the same memory (autograd's saved tensors, reshapes), and often
    after the tensor object the statistics were computed from is gone (an
    activation autograd saved for backward). An entry counts only while the
    storage it was computed from is alive (a weak reference: torch keeps one
    Python object per live storage), so freed memory reused by a new tensor
    is never mistaken for it; a tensor changed in place has a new version
    and gets new statistics. Contiguous values are keyed by where they start
    and how many there are, whatever their shape: the same values in the
    same order, whose statistics are the very numbers computing them again
    would give. Other layouts are keyed by their shape and strides too.

    Statistics known without computing them (`put`: a copy's are its
    source's, summed in the source's order, which can differ in the last
    bit) are kept apart, under the tensor's shape and strides and only while
    that tensor object lives, so that which tensors reuse them, and so the
    numbers recorded, do not depend on the sharing above.

    Most inputs are moreover the very tensor objects an earlier op returned,
    so a table by object answers them first, without the memory order or
    the memory key. Its entries hold the object's data pointer, shape and
    strides besides its version, since assigning to ``.data`` changes what a
    tensor views without a new version.
    """

    def __init__(self) -> None:
        self._entries: dict = {}  # memory key -> (weak reference to the storage, version, stats, stamp)
        self._copies: dict = {}  # `_view_key` -> (weak reference to the tensor, version, stats, stamp), from `put`
        self._objects: dict = {}  # id(tensor) -> (weak reference, version, dtype, data pointer, shape, strides,
        #                           stats, stamp)
        self._written: dict[int, int] = {}  # storage's data pointer -> stamp of the last write into it
        self._stamp = 0

    def get(self, tensor: torch.Tensor, dtype: str) -> tuple:
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter
            version = -1
        writes = self._written  # storage's data pointer -> stamp of its last write; entries older are stale
        entry = self._objects.get(id(tensor))
        if entry is not None and entry[0]() is tensor and entry[1] == version and entry[2] == dtype \
                and entry[3] == tensor.data_ptr() and entry[4] == tensor.shape and entry[5] == tensor.stride() \
                and (not writes or entry[7] >= writes.get(entry[8], 0)):
            return entry[6]
        if tensor.layout is not _STRIDED:
            return stats_of(tensor, dtype)
        count = tensor.numel()
        if not count:
            return stats_of(tensor, dtype)
        if tensor.is_contiguous():  # `memory_order`, `_memory_key` and `_stats_where_they_lie` of the common case
            pointer, torch_dtype, device = tensor.data_ptr(), tensor.dtype, tensor.device
            key = (pointer, count, torch_dtype, device, dtype)
            if self._copies:
                entry = self._copies.get((pointer, tensor.shape, tensor.stride(), torch_dtype, device, dtype))
                if entry is not None and entry[1] == version and (not writes or entry[3] >= writes.get(entry[4], 0)) \
                        and entry[0]() is not None:
                    return entry[2]
            entry = self._entries.get(key)
            if entry is not None and entry[1] == version and (not writes or entry[3] >= writes.get(entry[4], 0)) \
                    and entry[0]() is not None:
                self._remember(tensor, version, dtype, entry[2], entry[4])
                return entry[2]
            kind = _STATS_AT_KINDS.get(torch_dtype)
            stats = None
            if kind is not None and _STATS_AT is not None and device.type == "cpu" and not tensor.is_neg() and pointer:
                stats = _STATS_AT(pointer, count, kind, _STATS_CANCELLATION, _LIMITS.get(dtype, 0.0), _SMALL_STATS)
            return self._store(tensor, key, version, dtype, stats or _stats_elsewhere(tensor, dtype))
        else:
            values = memory_order(tensor)  # a transpose hits the entry of the tensor it transposes
            if self._copies:
                entry = self._copies.get(_view_key(values, dtype))
                if entry is not None and entry[1] == version and (not writes or entry[3] >= writes.get(entry[4], 0)) \
                        and entry[0]() is not None:
                    return entry[2]
            key = _memory_key(values, dtype)
        entry = self._entries.get(key)
        if entry is not None and entry[1] == version and (not writes or entry[3] >= writes.get(entry[4], 0)) \
                and entry[0]() is not None:
            self._remember(tensor, version, dtype, entry[2], entry[4])
            return entry[2]
        return self._compute(tensor, values, key, version, dtype)

    def written(self, tensor: torch.Tensor, dtype: str) -> tuple:
        """Statistics of a tensor that the op in flight has just written (``add_``, ``out=``), computed afresh.

        The dispatcher counts the write (the tensor's version) only after the
        op returns from the Python mode, so inside the mode the tensor still
        shows the version it had as an input: its entries are replaced, under
        the version it will have.

        A tensor written through an alias with a version counter of its own
        (``p.data.clamp_()``, ``p.data.mul_()``) shows no new version: the
        write is stamped on the storage, and statistics computed before it,
        for any tensor over that storage, no longer count.
        """
        if tensor.layout != torch.strided or tensor.numel() == 0:
            return stats_of(tensor, dtype)
        self._stamp += 1
        self._written[tensor.untyped_storage().data_ptr()] = self._stamp
        values = memory_order(tensor)
        return self._compute(tensor, values, _memory_key(values, dtype), _version(tensor) + 1, dtype)

    def overwritten(self, tensor: torch.Tensor) -> None:
        """``tensor`` was written where its version does not show it (an argument a kernel updates without its
        schema saying so: a BatchNorm's running statistics): statistics computed before, for any tensor over
        its storage, no longer count."""
        if tensor.layout == torch.strided and tensor.numel():
            self._stamp += 1
            self._written[tensor.untyped_storage().data_ptr()] = self._stamp

    def put(self, tensor: torch.Tensor, dtype: str, stats: tuple) -> None:
        """Remember statistics known without computing them (a copy's are its source's)."""
        if tensor.layout == torch.strided and tensor.numel():
            self._copies[_view_key(memory_order(tensor), dtype)] = (weakref.ref(tensor), _version(tensor), stats,
                                                                   self._stamp, _storage_pointer(tensor))

    def clear(self) -> None:
        self._entries.clear()
        self._copies.clear()
        self._objects.clear()
        self._written.clear()

    def _compute(self, tensor: torch.Tensor, values: torch.Tensor, key: tuple, version: int, dtype: str) -> tuple:
        stats = _stats_where_they_lie(values, dtype) or _stats_elsewhere(values, dtype)
        return self._store(tensor, key, version, dtype, stats)

    def _store(self, tensor: torch.Tensor, key: tuple, version: int, dtype: str, stats: tuple) -> tuple:
        """File ``tensor``'s new statistics under its memory ``key`` and under the object itself."""
        stamp = self._stamp
        try:
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage to key them by (a ZeroTensor): not kept
            return stats
        self._entries[key] = (weakref.ref(storage), version, stats, stamp, pointer)  # see `_storage_ref`
        self._objects[id(tensor)] = (weakref.ref(tensor), version, dtype, tensor.data_ptr(), tensor.shape,
                                     tensor.stride(), stats, stamp, pointer)  # `_remember`
        return stats

    def _remember(self, tensor: torch.Tensor, version: int, dtype: str, stats: tuple, storage: int) -> None:
        """File statistics found under the memory key under the object too (``storage``: its storage's pointer,
        where a write through another alias is stamped)."""
        self._objects[id(tensor)] = (weakref.ref(tensor), version, dtype, tensor.data_ptr(), tensor.shape,
                                     tensor.stride(), stats, self._stamp, storage)


def _storage_ref(tensor: torch.Tensor) -> weakref.ref:
    """A weak reference to the memory ``tensor`` views: its storage's Python object lives as long as the storage."""
    return weakref.ref(tensor.untyped_storage())


def _storage_pointer(tensor: torch.Tensor) -> int:
    """The data pointer of the storage ``tensor`` views (0 for a tensor without one: a sparse or meta tensor)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _memory_key(values: torch.Tensor, dtype: str) -> tuple:
    """Where ``values`` (as `memory_order` gives them) lie: contiguous ones by their start and count alone."""
    if values.is_contiguous():
        return values.data_ptr(), values.numel(), values.dtype, values.device, dtype
    return _view_key(values, dtype)


def _view_key(values: torch.Tensor, dtype: str) -> tuple:
    return values.data_ptr(), values.shape, values.stride(), values.dtype, values.device, dtype


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors have no version counter
        return -1
