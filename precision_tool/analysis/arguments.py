"""Op arguments that differ between golden and target: the same op called differently.

A dump records each op's non-tensor arguments (``OpRecord.attrs``: a torch
op's ``args``/``kwargs`` with tensors as placeholders, an engine op's
attributes). Where the target calls an op with another epsilon, another
approximation (``gelu(approximate="tanh")``), another scale or axis than
golden does, no kernel is wrong and the error it makes can sit far below
what a value-based judgement notices; the argument itself is the evidence.

Numbers and strings are compared. Tensors, dtypes, memory formats, devices,
dtype flags (``half_to_float``, ``non_blocking``) and a dtype's extremes
(``torch.finfo(dtype).min`` as a mask value) legitimately differ between a
float32 golden run and a low-precision target, so they are left out. A torch
op's other flags say what it computes (``native_batch_norm``'s ``training``:
a BatchNorm left in eval mode normalises with its running statistics;
``native_dropout``'s ``train``, ``embedding``'s ``scale_grad_by_freq``): those
the op's schema names (recorded by the capture in ``attrs["flags"]``) are compared too
(`flag_paths`), positional or keyword.
"""

from __future__ import annotations

import math
from typing import Iterator

import ml_dtypes
import numpy as np

_SKIPPED_KEYS = {"overload", "dtype", "layout", "device", "memory_format", "pin_memory", "non_blocking", "copy",
                 "half_to_float", "out_dtype", "flags", "names"}


def _dtype_constants() -> frozenset[float]:
    """The extremes a model derives from its dtype (``torch.finfo(dtype).min`` as a mask value, say): they
    differ with the target's precision by design."""
    values = set()
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        info = ml_dtypes.finfo(dtype)
        for value in (info.max, info.min, info.tiny, info.eps, info.smallest_subnormal):
            values |= {float(value), -float(value)}
    return frozenset(values)


_DTYPE_CONSTANTS = _dtype_constants()


def writes_dtype_constant(record) -> bool:
    """Whether ``record`` reads no float tensor and is given a format's extreme (``scalar_tensor(finfo(float16)
    .min)``, a mask value): it writes a constant that follows the run's precision, golden's another."""
    from precision_tool.analysis.replay import is_float

    reads_float = any(is_float(t.dtype) and t.stats.count for t in record.inputs)
    return not reads_float and _holds_dtype_constant(record.attrs or {})


def _holds_dtype_constant(value) -> bool:
    if isinstance(value, dict):
        return any(_holds_dtype_constant(v) for k, v in value.items() if k not in _SKIPPED_KEYS)
    if isinstance(value, (list, tuple)):
        return any(_holds_dtype_constant(v) for v in value)
    return isinstance(value, float) and value in _DTYPE_CONSTANTS


def scalar_arguments(attrs: dict | None, flags: frozenset[str] = frozenset()) -> dict[str, object]:
    """path -> value of every number and string among ``attrs`` (placeholders and dtype-like values left out), and
    of the booleans at the paths in ``flags``."""
    found = dict(_walk(attrs or {}, ""))
    for path in flags:
        value = _at(attrs or {}, path)
        if isinstance(value, bool):
            found[path] = value
    return found


def _at(attrs: dict, path: str):
    """The value at ``args[5]`` or ``kwargs.train`` of a torch op's attrs (None where there is none)."""
    if path.startswith("args["):
        args, index = attrs.get("args") or [], int(path[5:-1])
        return args[index] if index < len(args) else None
    return (attrs.get("kwargs") or {}).get(path.removeprefix("kwargs."))


def _schema_flags(attrs: dict) -> tuple[tuple[int, str], ...]:
    """(position, name) of each bool argument of a torch op's schema, as the capture recorded them in its attrs
    (``"flags"``), dtype flags left out; () where none were recorded (dumps written before 2026-11-26)."""
    flags = attrs.get("flags")
    if not isinstance(flags, list):
        return ()
    return tuple((int(flag[0]), str(flag[1])) for flag in flags
                 if isinstance(flag, list) and len(flag) == 2 and isinstance(flag[0], int)
                 and flag[1] not in _SKIPPED_KEYS)


def flag_paths(op_type: str, *attrs: dict | None) -> frozenset[str]:
    """The paths (``args[5]``, ``kwargs.train``) at which a torch op's calls ``attrs`` pass a flag that says what
    the op computes: the bool arguments its schema names, dtype flags (``half_to_float``) left out."""
    calls = [a for a in attrs if a and "args" in a]
    if not calls or "." not in op_type:
        return frozenset()
    flags = _schema_flags(calls[0])
    names = {name for _, name in flags}
    paths = {f"args[{i}]" for i, _ in flags}
    paths |= {f"kwargs.{key}" for a in calls for key in (a.get("kwargs") or {}) if key in names}
    return frozenset(paths)


def _walk(value, path: str) -> Iterator[tuple[str, object]]:
    if isinstance(value, dict):
        if "tensor" in value or len(value) == 1 and next(iter(value)) in _SKIPPED_KEYS:
            return  # a tensor placeholder, or an encoded dtype / memory format / device
        for key, item in value.items():
            if key in _SKIPPED_KEYS:
                continue
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, float) and value in _DTYPE_CONSTANTS:
        return  # finfo(dtype).min and the like: they follow the precision, not the model
    elif isinstance(value, (int, float, str)):
        yield path, value


def argument_changes(golden_attrs: dict | None, target_attrs: dict | None, op_type: str = "",
                     numbers_only: bool = False, carried: float = 0.0) -> list[str]:
    """``args[4]: 1e-12 in golden, 0.1 in target`` for each number or string argument that differs, or that
    only one side passes (``approximate: not given in golden, 'tanh' in target``); with ``op_type`` (a torch
    op's), its flags too (`flag_paths`); ``numbers_only``: numbers and flags passed on both sides. A float
    within INTRODUCED_EXCESS times ``carried`` (relative) of golden's is the same: a number the script computed
    from the data (a ``float(rms)`` it divides by) carries the data's error, as the op's inputs do."""
    flags = flag_paths(op_type, golden_attrs, target_attrs) if op_type else frozenset()
    golden, target = scalar_arguments(golden_attrs, flags), scalar_arguments(target_attrs, flags)
    names = max(_names(target_attrs), _names(golden_attrs), key=len)  # (the longer: a run passing fewer)
    changes = []
    for path in sorted(golden.keys() | target.keys()):
        g, t = golden.get(path, _MISSING), target.get(path, _MISSING)
        if g is not _MISSING and t is not _MISSING and (_same(g, t) or _within(g, t, carried)):
            continue
        if numbers_only and not (isinstance(g, (int, float)) and isinstance(t, (int, float))):
            continue
        changes.append(f"{_named(path, names)}: {_shown(g)} in golden, {_shown(t)} in target")
    return changes


def _names(attrs: dict | None) -> list[str]:
    """A torch op's positional argument names, as the capture recorded them (``"names"``; else the bool ones,
    from ``"flags"``, for dumps written before 2026-11-27): position -> name."""
    if not attrs:
        return []
    names = attrs.get("names")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    found: list[str] = []
    for position, name in _schema_flags(attrs):
        found += [""] * (position + 1 - len(found))
        found[position] = name
    return found


def _named(path: str, names: list[str]) -> str:
    """``args[5] (training)``: a positional argument's path with its schema name, where known."""
    if not path.startswith("args[") or not names:
        return path
    position = int(path[5:path.index("]")])
    return f"{path} ({names[position]})" if position < len(names) and names[position] else path


class _Missing:
    pass


_MISSING = _Missing()


def _shown(value) -> str:
    return "not given" if value is _MISSING else repr(value)


def _within(golden, target, carried: float) -> bool:
    """Two floats (not flags, not integers) within INTRODUCED_EXCESS times ``carried`` of each other, relative to
    golden's: as far as an op's output may depart from its inputs' error before the op is blamed."""
    from precision_tool.defaults import INTRODUCED_EXCESS

    return carried > 0.0 and isinstance(golden, float) and isinstance(target, float) and math.isfinite(golden) \
        and math.isfinite(target) and abs(target - golden) <= INTRODUCED_EXCESS * carried * abs(golden)


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0) or (math.isnan(a) and math.isnan(b))
        except (TypeError, ValueError):
            return False
    return a == b


def tensor_positions(attrs: dict | None) -> frozenset[str]:
    """The argument paths that hold tensors (``args[1]``): where an op is called with tensors."""
    found = set()

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            if "tensor" in value:
                found.add(path)
                return
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(attrs or {}, "")
    return frozenset(found)


_LOSS_SCALING = frozenset({"kwargs.grad_scale", "kwargs.found_inf"})


def _optional_tensors(golden_attrs: dict | None, target_attrs: dict | None) -> list[str] | None:
    """The tensor arguments one side passes where the other passes none (``weight: a tensor in golden, not given
    in target``: a cross-entropy's class weights dropped), or None where a tensor of one sits where the other
    passes something else (two different calls that share a name)."""
    golden, target = tensor_positions(golden_attrs), tensor_positions(target_attrs)
    if golden == target:
        return []
    names = max(_names(target_attrs), _names(golden_attrs), key=len)  # (the longer: a run passing fewer)
    found = []
    for path in sorted(golden ^ target):
        if path in _LOSS_SCALING:  # a GradScaler's hand-off to a fused optimizer, in a run with one only
            continue
        other = target_attrs if path in golden else golden_attrs
        if not path.startswith(("args[", "kwargs.")) or _at(other or {}, path) is not None:
            return None
        found.append(f"{_named(path, names)}: " + ("a tensor in golden, not given in target" if path in golden else
                                                    "not given in golden, a tensor in target"))
    return found


def called_differently(record, partner, attribution, agrees: bool = False, numbers_only: bool = False,
                       carried: float | None = None):
    """kernel_bug when ``record`` (the target's op) is called with other numbers or strings than its golden
    ``partner``; the scan asks only once the op's output departs from golden beyond what its inputs carry, so
    the call, not rounding, made the error. None when the calls agree, or when tensors sit in other argument
    positions: then the two are different calls that share a name (an op only one run makes, a loss scaler's
    ``loss * scale``, shifts the call counts of its scope), not one call given other constants. ``agrees``: asked
    although the output agrees with golden's (a BatchNorm's momentum changes only the running statistics it
    updates in place). ``numbers_only``: only numbers and flags count (`argument_changes`). ``carried``: the relative
    error a number computed from the data may carry (default: the op's inputs')."""
    from precision_tool.analysis.results import Verdict
    from precision_tool.analysis.structure import module_path

    if partner is None or partner.type != record.type:
        return None
    dropped = _optional_tensors(partner.attrs, record.attrs)
    if dropped is None:
        return None
    if carried is None:
        carried = attribution.inherited if math.isfinite(attribution.inherited) else 0.0
    changes = ([] if agrees else dropped) + argument_changes(partner.attrs, record.attrs, record.type, numbers_only,
                                                            carried)  # (a mask passed in one run only, the
    # output agreeing: all ones, harmless)
    if not changes:
        return None
    a = attribution
    evidence = (f"{record.name} ({record.type}) is called with other arguments than in golden: "
                + "; ".join(changes[:3]) + (" ..." if len(changes) > 3 else ""),
                f"its output agrees with golden's here ({a.observed:.3g}): the argument changes what the op writes "
                "besides its output (running statistics, say) or what it does with other inputs" if agrees else
                f"observed error {a.observed:.3g}, inherited from its inputs {a.inherited:.3g}: "
                "the difference starts at this call")
    return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence,
                   f"make the target call {record.type} as golden does (see its arguments above)",
                   module=module_path(record.name))
