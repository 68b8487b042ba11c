"""`pt` and `cp`: look at one tensor, or compare two, without writing any file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from precision_tool.dump.records import TensorRecord
from precision_tool.dump.stats import tensor_stats
from precision_tool.errors import InputError, PrecisionToolError
from precision_tool.repl.elementwise import compare_arrays
from precision_tool.repl.ops import counterpart, find_op, pick_direction, pick_step
from precision_tool.commands.results import Candidates, TensorView
from precision_tool.repl.tensors import TensorRef, parse_tensor


class TensorNotFound(PrecisionToolError):
    """The tensor named on the line is not in the dump, or holds statistics only."""


@dataclass
class LoadedTensor:
    label: str
    record: TensorRecord | None  # None for a .npy file
    array: np.ndarray | None  # None when the dump kept statistics only
    op: object = None  # the OpRecord it came from
    ref: TensorRef | None = None  # the reference with side and step filled in


def print_tensor(session, text: str, count: int) -> TensorView:
    """`pt`: statistics of a tensor and its first ``count`` values (flattened)."""
    tensor = load_tensor(session, parse_tensor(text), default_side=session.primary_role, need_data=False,
                         command="pt")
    if tensor.record is not None:
        dtype, shape, stats = tensor.record.dtype, tuple(tensor.record.shape), tensor.record.stats
    else:
        array = tensor.array
        dtype, shape, stats = str(array.dtype), tuple(array.shape), tensor_stats(array, str(array.dtype))
    values = None if tensor.array is None else tensor.array.ravel()[:max(count, 0)]
    total = int(np.prod(shape)) if shape else 1
    return TensorView(tensor.label, dtype, shape, stats, values, 0 if values is None else int(values.size), total)


def compare_tensors(session, left: str, right: str | None, count: int, atol: float, rtol: float):
    """`cp`: LEFT against the reference RIGHT (by default the same tensor on the golden side)."""
    default_left = "target" if session.has("target") else session.primary_role
    a = load_tensor(session, parse_tensor(left), default_side=default_left, need_data=True, command="cp")
    right_ref = parse_tensor(right) if right else _golden_twin(a)
    b = load_tensor(session, right_ref, default_side="golden", need_data=True, command="cp")
    return compare_arrays(a.array, b.array, left_label=a.label, right_label=b.label,
                          atol=atol, rtol=rtol, show=count)


def load_tensor(session, ref: TensorRef, default_side: str | None, need_data: bool,
                command: str = "") -> LoadedTensor:
    """Resolve a parsed TENSOR on its side (or read the .npy file), read-only."""
    if ref.path:
        return LoadedTensor(ref.path, None, _load_npy(ref.path))
    side = ref.side or default_side
    dump = session.dump(side or "target", command)
    name = find_op(session, side, ref.op)
    if isinstance(name, Candidates):
        shown = ", ".join(name.names[:5]) + (", ..." if name.total > 5 else "")
        raise TensorNotFound(f"{ref.op!r} matches {name.total} ops on the {side} side ({shown}); "
                             "give the full name")
    direction = pick_direction(session, side, name, ref.direction)
    step = pick_step(session, side, name, direction, ref.step)
    op = dump.op(step, name, direction)
    resolved = TensorRef(op=name, slot=ref.slot, side=side, step=step, direction=direction)
    try:
        record = op.tensor(ref.slot)
    except KeyError:
        slots = ", ".join(t.slot for t in op.tensors) or "none"
        raise TensorNotFound(f"{name!r} has no {ref.slot} on the {side} side; slots: {slots}") from None
    array = None
    if record.has_data:
        array = np.asarray(dump.tensor(step, op.exec_index, ref.slot))
    elif need_data:
        raise TensorNotFound(f"{resolved.label()}: the {side} dump kept statistics only (stats mode)")
    return LoadedTensor(resolved.label(), record, array, op, resolved)


def _golden_twin(left: LoadedTensor) -> TensorRef:
    """The golden tensor LEFT stands for: the same name, or a fused op's original."""
    if left.ref is None:
        raise PrecisionToolError("cp with a .npy file needs a RIGHT tensor too")
    name, slot = counterpart(left.op, left.ref.slot, "golden")
    return TensorRef(op=name, slot=slot, side="golden", step=left.ref.step, direction=left.ref.direction)


def _npy_problem(message: str) -> str:
    """What numpy's ValueError on loading a .npy file means, in this tool's words."""
    if "Python objects" in message:
        return "it holds Python objects"
    if "pickled" in message:  # (what numpy says of any file without its magic bytes)
        return "no numpy header (another format, or a pickle)"
    if "mmap length" in message:
        return "shorter than its header says (cut short?)"
    return "its header is not numpy's"


def _load_npy(path: str) -> np.ndarray:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(path, "no such .npy file")
    from precision_tool.dump.mapping import guarded

    try:
        values = np.load(file, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:  # (numpy's own words suggest allow_pickle, or show its parser's internals)
        raise InputError(path, f"not a readable .npy file: {_npy_problem(str(exc))}") from None
    except OSError as exc:
        raise InputError(path, f"not a readable .npy file ({exc})") from None
    if not isinstance(values, np.ndarray) or values.dtype.names is not None or values.dtype.kind not in "biuf" or \
            values.dtype.itemsize > 8:
        raise InputError(path, f"holds {values.dtype} values: a .npy tensor must hold real numbers (integers, "
                         "booleans, float16 to float64)")
    return guarded(values, path)  # a file cut short while mapped: one line after the command, not a SIGBUS
