"""Torch tensors as the engine sees them: numpy float32 containers, logical formats, statistics.

Under `simulate_npu` a tensor stays a float32 torch tensor (so autograd and
every kernel keep working) whose values are exact in a 16-bit format; that
*logical* format rides on the tensor as a Python attribute, the way the
numpy engine keeps formats beside its float32 arrays.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from precision_tool import native
from precision_tool.dump.records import TensorStats
from precision_tool.dump.stats import CANCELLATION as _STATS_CANCELLATION
from precision_tool.dump.stats import SMALL_COUNT as _SMALL_STATS
from precision_tool.dump.stats import stats_tuple
from precision_tool.engine.formats import FORMATS, Format
from precision_tool.torch.device_stats import device_stats
from precision_tool.torch.ops import dtype_name

FORMAT_ATTR = "_precision_tool_format"  # the logical Format of a float32 tensor under simulation
_LOW_DTYPES = (torch.float16, torch.bfloat16)
_STRIDED = torch.strided
_BLOCK = 1024  # values per float32 partial sum in `array_stats`
_SCREEN_MAX = 1 << 14  # up to this many values `all_finite` screens with the C extension, faster there
_CANCELLATION = 1e-6  # variance / mean^2 below which E[x^2] - mean^2 has lost its digits
_LIMITS = {name: fmt.max for name, fmt in FORMATS.items()}  # |x| at the format's max counts as saturated
EMPTY_STATS = tuple(getattr(TensorStats.empty(), name) for name in TensorStats.__dataclass_fields__)
_TORCH_FORMATS = {torch.float16: FORMATS["float16"], torch.bfloat16: FORMATS["bfloat16"],
                  torch.float32: FORMATS["float32"], torch.float64: FORMATS["float64"]}


def torch_format(dtype) -> Format | None:
    """The engine Format of a torch float dtype; None for other dtypes."""
    return _TORCH_FORMATS.get(dtype)


def logical_format(tensor: torch.Tensor) -> Format | None:
    """The format a float32 tensor's values are exact in, when a simulated op tagged it."""
    return getattr(tensor, FORMAT_ATTR, None)


def set_logical_format(tensor: torch.Tensor, fmt: Format | None) -> None:
    """Tag ``tensor`` with ``fmt`` (None or float32: untag)."""
    if fmt is None or fmt.bits >= 32:
        if getattr(tensor, FORMAT_ATTR, None) is not None:
            setattr(tensor, FORMAT_ATTR, None)
    else:
        setattr(tensor, FORMAT_ATTR, fmt)


def logical_dtype(tensor: torch.Tensor) -> str:
    """The dtype name a dump records for ``tensor``: its logical format, else its torch dtype."""
    fmt = getattr(tensor, FORMAT_ATTR, None)
    return fmt.name if fmt is not None else dtype_name(tensor.dtype)


def to_numpy(tensor: torch.Tensor, copy: bool = False) -> np.ndarray:
    """The values of ``tensor`` as numpy: float32 for 16-bit floats, else its own dtype.

    Without ``copy`` the array may share memory with the tensor.
    """
    t = tensor.detach() if tensor.requires_grad else tensor  # (a detach costs more than the test)
    if not t.is_cpu:
        t = t.cpu()
        copy = False
    if t.dtype in _LOW_DTYPES:
        return t.float().numpy()
    try:
        array = t.numpy()
    except RuntimeError:  # a conjugate or negative view: numpy wants the bits resolved first
        array = t.resolve_conj().resolve_neg().numpy()
    return array.copy() if copy else array


def storage_array(tensor: torch.Tensor) -> np.ndarray:
    """The values of ``tensor`` for the dump writer, as it stores them where that needs no conversion: a
    float16 CPU tensor as float16, a bfloat16 one as its bits (uint16), both without a copy; else `to_numpy`.
    Only for arrays that go to the writer (`precision_tool.dump.storage.to_storage` takes both as they are):
    statistics read float values."""
    t = tensor.detach() if tensor.requires_grad else tensor
    if t.is_cpu:
        if t.dtype is torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        if t.dtype is torch.float16:
            return t.numpy()
    return to_numpy(tensor)


_ROUND16 = getattr(native.extension, "round16", None)  # None: Format.round does every rounding
_ROUND16_KINDS = {"float16": 0, "bfloat16": 1, "float32": 2}
_FLOAT32 = torch.float32


def _native_kind(tensor: torch.Tensor, fmt: Format, contiguous: bool = True) -> int | None:
    """The `round16` kind of rounding ``tensor`` into ``fmt`` in C, or None where Format.round must do it:
    the C loop reads a contiguous float32 CPU tensor's memory at its data pointer (``contiguous=False``: the
    caller makes it contiguous first)."""
    if _ROUND16 is None or tensor.dtype is not _FLOAT32 or not tensor.is_cpu or tensor.is_neg() \
            or (contiguous and not tensor.is_contiguous()):
        return None
    return _ROUND16_KINDS.get(fmt.name)


def round_to(tensor: torch.Tensor, fmt: Format, overflow_mode: str) -> tuple[torch.Tensor, bool]:
    """A new float32 tensor of ``tensor``'s values rounded into ``fmt``; and whether that overflowed.

    In range (no |x| at the format's overflow threshold, no NaN) the C
    extension's `round16` rounds it, bit for bit as `Format.round`: a
    transpose or permute of dense memory (a transposed weight) where it lies,
    into a result of the same layout, which the kernel then reads as it reads
    the unrounded tensor; another strided tensor is copied contiguous first
    and rounded there. Else, and without the extension, `Format.round` does,
    which applies the overflow mode.
    """
    kind = _native_kind(tensor, fmt, contiguous=False)
    if kind is not None:
        if tensor.is_contiguous():
            result = torch.empty(tensor.shape, dtype=_FLOAT32)
            if _ROUND16(tensor.data_ptr(), result.data_ptr(), result.numel(), kind):
                return result, False
        elif memory_order(tensor).is_contiguous():  # dense: its memory, value for value, in a like layout
            result = torch.empty_strided(tensor.shape, tensor.stride(), dtype=_FLOAT32)
            if _ROUND16(tensor.data_ptr(), result.data_ptr(), result.numel(), kind):
                return result, False
        elif (layout := _row_layout(tensor)) is not None:  # rows of a wider tensor (gates): gathered as rounded
            result = torch.empty(tensor.shape, dtype=_FLOAT32)
            if _ROUND16(tensor.data_ptr(), result.data_ptr(), result.numel(), kind, layout[0], layout[1], layout[0]):
                return result, False
        else:
            result = tensor.contiguous()  # a copy of its own
            address = result.data_ptr()
            if _ROUND16(address, address, result.numel(), kind):
                return result, False
    array = to_numpy(tensor)
    rounded, overflow = fmt.round(array, overflow_mode)
    if rounded is array:
        rounded = array.copy()
    result = torch.from_numpy(np.ascontiguousarray(rounded).reshape(tensor.shape))
    if tensor.device.type != "cpu":
        result = result.to(tensor.device)
    return result, overflow


def round_in_place(tensor: torch.Tensor, fmt: Format, overflow_mode: str) -> bool:
    """Round ``tensor``'s values into ``fmt`` where they are; return whether that overflowed.

    Like `round_to`, the C extension writes in-range values in place (as the
    numpy path below does, without counting a write in the tensor's version):
    a dense tensor's memory in any order, rows of a wider tensor row by row.
    """
    kind = _native_kind(tensor, fmt, contiguous=False)
    if kind is not None:
        address = tensor.data_ptr()
        if tensor.is_contiguous() or memory_order(tensor).is_contiguous():  # dense: its memory, in any order
            if _ROUND16(address, address, tensor.numel(), kind):
                return False
        elif (layout := _row_layout(tensor)) is not None:  # rows of a wider tensor: only its own values
            if _ROUND16(address, address, tensor.numel(), kind, layout[0], layout[1], layout[1]):
                return False
    array = to_numpy(tensor)
    rounded, overflow = fmt.round(array, overflow_mode)
    if rounded is not array:
        if tensor.device.type == "cpu" and tensor.dtype == torch.float32 and not tensor.is_neg():
            np.copyto(array, rounded.reshape(array.shape))  # ``array`` is a view of the tensor
        else:
            with torch.no_grad():
                tensor.copy_(torch.from_numpy(np.ascontiguousarray(rounded).reshape(tensor.shape)))
    return overflow


def saturate_in_place(tensor: torch.Tensor, overflow_mode: str) -> bool:
    """For a tensor computed natively (a real fp16/bf16/fp32 tensor): raise on inf/NaN, saturate if asked."""
    if all_finite(tensor):
        return False
    if overflow_mode == "saturation":
        big = torch.finfo(tensor.dtype).max
        with torch.no_grad():
            torch.nan_to_num(tensor, nan=0.0, posinf=big, neginf=-big, out=tensor)
    return True


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no inf or NaN.

    ``np.isfinite`` checks every value; on small arrays, where its fixed
    cost dominates, the C extension's float64 sums screen them in one call
    first: only inf and NaN make the sums of finite float32 values
    non-finite (float64 values whose squares overflow are then checked one
    by one).
    """
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return True
    if _native_kind(tensor, FORMATS["float32"]) is not None:  # float32 range check: finite
        address = tensor.data_ptr()
        return _ROUND16(address, address, tensor.numel(), 2)
    if not tensor.is_cpu:  # checked on the device: one boolean crosses, not the values
        return bool(torch.isfinite(tensor).all())
    array = to_numpy(memory_order(tensor)).reshape(-1)
    # stats_rows gives a row, or None: not finite (or a variance lost to cancellation, which says nothing here)
    if native.extension is not None and array.size <= _SCREEN_MAX and array.dtype.char in "fd" \
            and array.flags.c_contiguous and native.extension.stats_rows((array,), 0.0)[0] is not None:
        return True
    return bool(np.isfinite(array).all())


def has_nonfinite(tensors) -> bool:
    """Whether any float tensor among ``tensors`` holds an inf or NaN."""
    return not all(all_finite(t) for t in tensors)


def stats_of(tensor: torch.Tensor, dtype: str) -> tuple:
    """Statistics of ``tensor``'s values as a `TensorStats` field tuple."""
    if tensor.is_complex() or tensor.layout != torch.strided:
        return EMPTY_STATS
    values = memory_order(tensor)
    return _stats_where_they_lie(values, dtype) or _stats_elsewhere(values, dtype)


def _stats_elsewhere(values: torch.Tensor, dtype: str) -> tuple:
    """Statistics the C pass does not take: numpy's of a CPU tensor's values; a device tensor's reduced on the
    device (`device_stats`), where copying every value to the host would cost more than the op."""
    if values.is_complex():
        return EMPTY_STATS
    if values.is_cpu:
        return array_stats(to_numpy(values), dtype)
    return device_stats(values, dtype)


_STATS_AT = getattr(native.extension, "stats_at", None)  # None: numpy's path for every tensor
_STATS_AT_KINDS = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


def _stats_where_they_lie(values: torch.Tensor, dtype: str) -> tuple | None:
    """`array_stats` of a contiguous CPU float tensor by the C extension's ``stats_at``, read at its data
    pointer: no numpy view, and float16/bfloat16 widened on the fly instead of copied to float32; the same
    row to the bit (the same float64 sums in the same order; a few values, up to `stats.SMALL_COUNT`, summed
    exactly as `stats_tuple`'s math.fsum sums them). None where the numpy path must answer: no extension,
    another layout or dtype, or a row the C pass declines (inf/NaN, a variance lost to cancellation)."""
    kind = _STATS_AT_KINDS.get(values.dtype)
    if kind is None or _STATS_AT is None or not values.is_cpu or values.is_neg():
        return None
    count = values.numel()
    if not count:
        return None
    if values.is_contiguous():
        return _STATS_AT(values.data_ptr(), count, kind, _STATS_CANCELLATION, _LIMITS.get(dtype, 0.0), _SMALL_STATS)
    layout = _row_layout(values)
    if layout is None:
        return None
    return _STATS_AT(values.data_ptr(), count, kind, _STATS_CANCELLATION, _LIMITS.get(dtype, 0.0), _SMALL_STATS,
                     *layout)


def _row_layout(values: torch.Tensor) -> tuple[int, int] | None:
    """(values a row, values between rows) where ``values`` lie as evenly spaced rows of contiguous values in
    their order (a chunk or slice of the last dimension: an LSTM's gates), which ``stats_at`` gathers in C
    in the order numpy's ``reshape(-1)`` copies them; None for other layouts."""
    shape, strides = values.shape, values.stride()
    if not strides or strides[-1] != 1:
        return None
    stride, expected = None, None
    for size, step in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        if size == 1:
            continue
        if stride is None:
            stride = expected = step
        elif step != expected:
            return None
        expected = step * size
    cols = shape[-1]
    if stride is None or stride < cols or cols < 2:  # (one value a row is a 1-D stride: numpy sums it its way)
        return None
    return cols, stride


def array_stats(array: np.ndarray, dtype: str) -> tuple:
    """`precision_tool.dump.stats.stats_tuple`, faster on large finite float32 arrays without the C extension.

    With ``precision_tool._native`` built, the shared helper takes one C pass
    in float64 and is the fastest: this is that. Without it, the sum and the
    sum of squares accumulate in float32 over blocks of 1024 values
    (pairwise for the sum) and add the block results in float64: a relative
    error below 1e-8 in practice, 1e-5 at worst, against the shared helper's
    float64 throughout, for half the passes over memory. Arrays with
    inf/NaN, squares beyond float32, a variance that would cancel, or fewer
    than 4 blocks take the shared helper.
    """
    flat = array.reshape(-1)
    if native.extension is not None or flat.dtype != np.float32 or flat.size < 4 * _BLOCK:
        return stats_tuple(flat, dtype)
    whole = flat.size - flat.size % _BLOCK
    blocks = flat[:whole].reshape(-1, _BLOCK)
    tail = flat[whole:].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN or float32 overflow: the helper handles them
        total = float(np.add.reduce(np.add.reduce(blocks, axis=1), dtype=np.float64)) + float(tail.sum())
        squares = float(np.add.reduce(np.einsum("ij,ij->i", blocks, blocks), dtype=np.float64)) + float(tail @ tail)
    count = flat.size
    mean = total / count
    variance = squares / count - mean * mean
    if not (math.isfinite(total) and math.isfinite(squares)) or variance < _CANCELLATION * mean * mean:
        return stats_tuple(flat, dtype)
    low, high = float(flat.min()), float(flat.max())
    limit = _LIMITS.get(dtype)
    saturated = 0
    if limit is not None and (high >= limit or -low >= limit):
        saturated = int(np.count_nonzero(np.abs(flat) >= limit))
    return (count, low, high, mean, math.sqrt(variance), math.sqrt(squares), 0, 0, saturated)


def memory_order(tensor: torch.Tensor) -> torch.Tensor:
    """The same values as a contiguous tensor without copying, when the layout allows (transposes,
    permutes); statistics do not depend on the order of the values."""
    dims = tensor.dim()
    if dims < 2 or tensor.is_contiguous():
        return tensor
    if dims == 2:  # a transpose, the common case: no sort
        transposed = tensor.t()
        return transposed if transposed.is_contiguous() else tensor
    order = sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), -tensor.shape[d]))
    permuted = tensor.permute(order)
    return permuted if permuted.is_contiguous() else tensor


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
            if kind is not None and _STATS_AT is not None and device.type == "cpu" and not tensor.is_neg():
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
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
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
