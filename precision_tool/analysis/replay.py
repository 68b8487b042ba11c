"""Replaying one recorded op through the shared engine.

Dumps record every op's type, attributes, compute dtype and tensors, so any
forward op can be run again on other inputs (usually the golden run's) with
the numerics the target ran it with, or exactly in float64. Replays of torch
dumps go through `precision_tool.torch.replay`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FLOAT64, Format, get_format
from precision_tool.engine.ops import KernelContext, get_op
from precision_tool.errors import PrecisionToolError


class NotReplayable(PrecisionToolError):
    """This op cannot be replayed (optimizer ops, backward of fused ops, unknown types)."""


@dataclass(frozen=True)
class Numerics:
    """How a replay computes: compute and output formats and the overflow mode."""

    compute: Format
    output: Format
    overflow_mode: str

    @classmethod
    def of(cls, record: OpRecord, overflow_mode: str) -> "Numerics":
        """The numerics ``record`` ran with; NotReplayable for ops that compute in integers."""
        if not is_float(record.compute_dtype):
            raise NotReplayable(f"{record.name}: computes in {record.compute_dtype}, not a float format")
        outputs = record.outputs
        output = get_format(outputs[0].dtype) if outputs and is_float(outputs[0].dtype) else \
            get_format(record.compute_dtype)
        return cls(get_format(record.compute_dtype), output, overflow_mode)


EXACT = Numerics(FLOAT64, FLOAT64, "inf_nan")


def is_float(dtype: str) -> bool:
    """True for the float formats ops compute in."""
    return dtype in ("float16", "bfloat16", "float32", "float64")


def restore_attrs(attrs: dict) -> dict:
    """Attributes as the kernels expect them: JSON lists back to tuples."""
    def fix(value):
        if isinstance(value, list):
            return tuple(fix(v) for v in value)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    return {key: fix(value) for key, value in attrs.items()}


def replay_forward(record: OpRecord, inputs: list[np.ndarray], numerics: Numerics,
                   seed: int = 0) -> tuple[list[np.ndarray], bool]:
    """Run ``record``'s op forward on ``inputs``; return its outputs and whether it overflowed.

    Float inputs are rounded to the compute format first, as the executor's
    implicit casts do; integer inputs pass through.
    """
    if record.direction != "forward":
        raise NotReplayable(f"{record.name}: only forward ops can be replayed ({record.direction} recorded)")
    try:
        op = get_op(record.type)
    except PrecisionToolError:
        raise NotReplayable(f"{record.name}: op type {record.type!r} is not an engine op") from None
    compute = numerics.compute
    ctx = KernelContext(compute, numerics.output, numerics.overflow_mode,
                        (seed, record.step, zlib.crc32(record.name.encode())))
    cast = []
    for array in inputs:
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array, overflow = compute.round(array.astype(compute.container, copy=False), numerics.overflow_mode)
            ctx.overflowed |= overflow
        cast.append(array)
    with np.errstate(all="ignore"):
        result = op.forward(ctx, *cast, **restore_attrs(record.attrs))
    outputs = list(result) if isinstance(result, tuple) else [result]
    return outputs, ctx.overflowed


def ideal_forward(record: OpRecord, inputs: list[np.ndarray], numerics: Numerics,
                  seed: int = 0) -> list[np.ndarray]:
    """What the compute dtype alone explains: inputs rounded to it, the op exact, the output rounded once."""
    rounded = []
    for array in inputs:
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array, _ = numerics.compute.round(array.astype(numerics.compute.container, copy=False),
                                              numerics.overflow_mode)
            array = array.astype(np.float64)
        rounded.append(array)
    exact, _ = replay_forward(record, rounded, EXACT, seed)
    return [numerics.output.round(y.astype(numerics.output.container), numerics.overflow_mode)[0]
            for y in exact]
