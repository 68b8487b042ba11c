"""Torch tensors as the engine sees them: numpy float32 containers, logical formats, statistics.

Under `simulate_npu` a tensor stays a float32 torch tensor (so autograd and
every kernel keep working) whose values are exact in a 16-bit format; that
*logical* format rides on the tensor as a Python attribute, the way the
numpy engine keeps formats beside its float32 arrays.
"""

from __future__ import annotations

import math

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
# 8-bit floats of fp8 recipes: read as float32 (exactly) for their statistics, their values kept by no dump
_FLOAT8 = frozenset(getattr(torch, name) for name in (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, name))
_LOW_DTYPES = (torch.float16, torch.bfloat16, *_FLOAT8)  # floats numpy has no dtype for: read as float32
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


def in_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s values lie in strided memory the capture reads and stores as they are; a sparse
    tensor's (an ``nn.Embedding(sparse=True)`` gradient) lie in index and value tensors of its own, and a dump
    keeps only their statistics (`stats_of`), as it does of an 8-bit float's (no format of the dump holds it)."""
    return tensor.layout is _STRIDED and not tensor.is_nested and tensor.dtype not in _FLOAT8 \
        and not tensor.is_complex() and not tensor.is_quantized and not tensor._is_zerotensor()


def stored_values(tensor: torch.Tensor) -> np.ndarray | None:
    """`storage_array` of ``tensor``, or None (statistics only) where its values are not in strided memory."""
    return storage_array(tensor) if in_memory(tensor) else None


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
    a dense tensor's memory in any order, rows of a wider tensor row by row; a sparse tensor's stored values
    (an ``nn.Embedding(sparse=True)`` gradient), which the zeros it leaves out need not join.
    """
    if tensor.layout is not _STRIDED:
        values = _stored_values_view(tensor)
        return round_in_place(values, fmt, overflow_mode) if values is not None else False
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
    if not in_memory(tensor):
        values = _sparse_values(tensor)
        return True if values is None else all_finite(values)
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
        return _sparse_stats(tensor, dtype)
    values = memory_order(tensor)
    return _stats_where_they_lie(values, dtype) or _stats_elsewhere(values, dtype)


def _stored_values_view(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor of a sparse tensor's stored values, sharing its memory (COO uncoalesced: a write there is a
    write into the sparse tensor); None for layouts without one (nested tensors)."""
    if tensor.layout is torch.sparse_coo:
        return tensor._values()
    if tensor.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return tensor.values()
    return None


def _sparse_values(tensor: torch.Tensor) -> torch.Tensor | None:
    """The stored values of a sparse tensor (COO coalesced: a repeated index is one value, their sum), as a
    strided tensor; None for other layouts (nested tensors)."""
    if tensor.layout is torch.sparse_coo:
        return tensor.detach().coalesce().values()
    if tensor.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return tensor.detach().values()
    return None


def _sparse_stats(tensor: torch.Tensor, dtype: str) -> tuple:
    """Statistics of the dense tensor a sparse ``tensor`` stands for: its stored values and the zeros it
    leaves out, which add to the count, the extremes and the mean's denominator, and to no sum. Computed from
    the stored values only (a vocabulary's embedding gradient touches a few rows). EMPTY_STATS for complex
    values and layouts without stored values (nested tensors)."""
    values = None if tensor.is_complex() else _sparse_values(tensor)
    if values is None:
        return EMPTY_STATS
    stats = stats_of(values, dtype)
    count, low, high, mean, _, norm, nan, inf, saturated = stats
    zeros = tensor.numel() - count
    if zeros <= 0:
        return stats
    if not count:
        low = high = mean = norm = 0.0
    finite = count - nan - inf  # the sums cover the finite values (`stats._nonfinite_stats`)
    total = mean * finite if finite else 0.0
    mean = total / (finite + zeros)
    variance = max(norm * norm / (finite + zeros) - mean * mean, 0.0)
    low, high = (min(low, 0.0), max(high, 0.0)) if finite else (0.0, 0.0)
    return tensor.numel(), low, high, mean, math.sqrt(variance), norm, nan, inf, saturated


def _stats_elsewhere(values: torch.Tensor, dtype: str) -> tuple:
    """Statistics the C pass does not take: numpy's of a CPU tensor's values; a device tensor's reduced on the
    device (`device_stats`), where copying every value to the host would cost more than the op."""
    if values.is_complex() or values.is_quantized or values.is_meta or functorch_wrapped(values):  # (no number
        return EMPTY_STATS  # format of a dump holds them; no values; a torch.func wrapper, no memory to read)
    if values._is_zerotensor():  # (forward-mode AD's zero tangent: zeros, none stored)
        count = values.numel()
        return (count, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0) if count else EMPTY_STATS
    if values.is_cpu:
        return array_stats(to_numpy(values), dtype)
    return device_stats(values, dtype)


# whether a tensor is a torch.func transform's wrapper (vmap's, grad's): no memory of its own to read
functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                            lambda tensor: False)
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
