"""Re-running one recorded aten op through PyTorch, on golden numerics or the simulated NPU's.

A torch dump records, for every op, the overload and its non-tensor
arguments (``attrs``: ``{"overload", "args", "kwargs"}`` with tensors as
``{"tensor": i, "dtype": torch dtype}`` slots). `replay` rebuilds the call
with the given input arrays in those slots and runs
``torch.ops.aten.<name>.<overload>`` on them. The shell's ``rerun`` uses it
for dumps whose metadata says ``framework: torch``.
"""

from __future__ import annotations

import numpy as np
import torch

from precision_tool import defaults
from precision_tool.dump.records import OpRecord
from precision_tool.engine.device import DEVICES
from precision_tool.engine.precision import PRECISION_MODES, PRECISION_MODES_V2
from precision_tool.errors import PrecisionToolError, choice_error
from precision_tool.torch.ops import decode_args, lookup, op_info, result_tensors
from precision_tool.torch.tensors import round_to, set_logical_format, to_numpy, torch_format



class NotReplayable(PrecisionToolError):
    """The record lacks what a replay needs (no arguments recorded, an op this PyTorch lacks)."""


def replay(op_record: OpRecord, input_arrays, device: str = "golden", precision_mode: str | None = None,
           overflow_mode: str = defaults.OVERFLOW_MODE, precision_mode_v2: str | None = None,
           exact: bool = False) -> list[np.ndarray]:
    """The outputs of ``op_record``'s aten op run again on ``input_arrays`` (a list by input slot, or a dict).

    ``device="golden"`` runs it in plain PyTorch; ``"npu"`` under `simulate_npu`
    with ``precision_mode`` and ``overflow_mode``. Optimizer ops always run
    golden, as they did when recorded. ``exact`` (golden only) computes in
    float64 whatever dtypes were recorded: the op as exact arithmetic gives it.
    """
    if exact:
        func, args, kwargs = _rebuild(op_record, input_arrays, None, exact=True)
        with torch.no_grad():
            try:
                result = func(*args, **kwargs)
            except RuntimeError as exc:  # a kernel without float64 (some oneDNN ops)
                raise NotReplayable(f"{op_record.name}: no float64 kernel ({str(exc).splitlines()[0]})") from None
        return [to_numpy(t, copy=True) for t in result_tensors(op_info(func), args, kwargs, result)]
    outputs, _ = replay_op(op_record, input_arrays, device, precision_mode, overflow_mode, precision_mode_v2)
    return outputs


def replay_op(op_record: OpRecord, input_arrays, device: str = "golden", precision_mode: str | None = None,
              overflow_mode: str = defaults.OVERFLOW_MODE,
              precision_mode_v2: str | None = None) -> tuple[list[np.ndarray], bool]:
    """`replay`, also returning whether the replayed op overflowed (raised the simulated float status)."""
    if device not in DEVICES:
        raise choice_error("device", device, DEVICES)
    func, args, kwargs = _rebuild(op_record, input_arrays, overflow_mode if device == "npu" else None)
    with torch.no_grad():
        try:
            if device == "npu" and op_record.direction != "optimizer":
                from precision_tool.torch.simulate import simulate_npu

                with simulate_npu(precision_mode, overflow_mode, precision_mode_v2=precision_mode_v2) as sim:
                    result = func(*args, **kwargs)
                overflowed = bool(sim.status)
            else:
                result = func(*args, **kwargs)
                overflowed = False
        except RuntimeError as exc:  # inputs the kernel refuses (golden's, of another shape than the call's)
            raise NotReplayable(f"{op_record.name}: its kernel refuses these inputs "
                                f"({str(exc).splitlines()[0]})") from None
    outputs = result_tensors(op_info(func), args, kwargs, result)
    arrays = [to_numpy(t, copy=True) for t in outputs]
    if device == "golden":
        overflowed = any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays)
    return arrays, overflowed


def replay_as_recorded(op_record: OpRecord, input_arrays, metadata: dict) -> tuple[list[np.ndarray], bool]:
    """`replay_op` with the numerics of the run ``metadata`` (a dump's root metadata) describes.

    A simulated run (``device: npu``) replays under `simulate_npu` with its
    precision and overflow modes; any other run replays in plain PyTorch with
    the recorded torch dtypes, which reproduces ``torch.autocast`` runs too.
    """
    if metadata.get("device") != "npu":
        return replay_op(op_record, input_arrays, "golden")
    mode = str(metadata.get("precision_mode") or "") or None
    v2 = mode if mode in PRECISION_MODES_V2 and mode not in PRECISION_MODES else None
    return replay_op(op_record, input_arrays, "npu", None if v2 else mode,
                     str(metadata.get("overflow_mode") or defaults.OVERFLOW_MODE), v2)


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NUMPY_FLOATS = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def _widen(value):
    """A float dtype argument (``dtype=torch.float16``) as float64, for exact replays."""
    if isinstance(value, torch.dtype):
        return torch.float64 if value in _FLOAT_DTYPES else value
    if isinstance(value, (list, tuple)):
        return type(value)(_widen(v) for v in value)
    return value


def _rebuild(op_record: OpRecord, input_arrays, overflow_mode: str | None, exact: bool = False):
    """The op and its arguments; with an ``overflow_mode`` (npu replays) float32 inputs recorded as
    float16/bfloat16 are first rounded into that format (golden inputs held as the target held them)."""
    attrs = op_record.attrs or {}
    if "args" not in attrs:
        raise NotReplayable(f"{op_record.name}: the dump holds no arguments for this op")
    try:
        func = lookup(op_record.type, attrs.get("overload", "default"))
    except KeyError as exc:
        raise NotReplayable(f"{op_record.name}: {exc.args[0]}") from None
    slots = op_record.inputs
    if isinstance(input_arrays, dict):
        input_arrays = [input_arrays[t.slot] for t in slots]
    input_arrays = list(input_arrays)
    if len(input_arrays) != len(slots):
        raise NotReplayable(f"{op_record.name}: {len(slots)} inputs recorded, {len(input_arrays)} given")
    torch_dtypes = _slot_dtypes(attrs)
    tensors = []
    for i, (record, array) in enumerate(zip(slots, input_arrays)):
        array = np.asarray(array)
        dtype = torch_dtypes.get(i)
        if exact and array.dtype.kind == "f":
            dtype = torch.float64
        wide = _NUMPY_FLOATS.get(dtype)
        # one copy, converted by numpy where it can: torch's .to() of a large tensor threads, and stalls
        # for milliseconds on a busy two-core machine (a diagnosis makes hundreds of them)
        tensor = torch.from_numpy(np.array(array, dtype=wide if wide is not None else array.dtype, copy=True))
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        fmt = torch_format(getattr(torch, record.dtype, None))
        if overflow_mode is not None and tensor.dtype == torch.float32 and fmt is not None and fmt.bits < 32:
            tensor, _ = round_to(tensor, fmt, overflow_mode)
            set_logical_format(tensor, fmt)
        tensors.append(tensor)
    try:
        args, kwargs = decode_args(attrs["args"], attrs.get("kwargs", {}), tensors)
    except (ValueError, IndexError) as exc:
        raise NotReplayable(f"{op_record.name}: {exc}") from None
    if exact:
        args, kwargs = tuple(_widen(a) for a in args), {k: _widen(v) for k, v in kwargs.items()}
    return func, args, kwargs


def _slot_dtypes(attrs: dict) -> dict[int, torch.dtype]:
    """Input slot -> the torch dtype the tensor had when recorded."""
    found: dict[int, torch.dtype] = {}

    def walk(value):
        if isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            if "tensor" in value and isinstance(getattr(torch, str(value.get("dtype")), None), torch.dtype):
                found[value["tensor"]] = getattr(torch, value["dtype"])

    walk(attrs.get("args", []))
    walk(list(attrs.get("kwargs", {}).values()))
    return found
