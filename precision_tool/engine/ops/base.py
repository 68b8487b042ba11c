"""The op registry and the context a kernel computes in.

An op is a class with two static methods::

    @register("Relu")
    class Relu:
        @staticmethod
        def forward(ctx, x):
            ctx.save(x)
            return ctx.out(np.maximum(x, 0))

        @staticmethod
        def backward(ctx, dy):
            (x,) = ctx.saved
            return (ctx.out(dy * (x > 0)),)

The executor casts the inputs to the kernel's compute format before calling
``forward`` and the incoming gradients before calling ``backward``; the kernel
computes in the container dtype (float32, or float64 on the float64 golden
device) and rounds every result it returns with ``ctx.out``. A fused kernel
that keeps intermediates in the compute format rounds them with ``ctx.round``.
``backward`` returns one gradient per input, ``None`` where there is none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from precision_tool.engine.formats import FLOAT32, Format
from precision_tool.errors import choice_error

# How an op's compute dtype is chosen (see engine/precision.py).
MATRIX = "matrix"  # Cube ops: multiply and accumulate in float32, round once
VECTOR = "vector"  # everything that computes elementwise or reduces
MOVEMENT = "movement"  # exact in any format: follows its input
CAST = "cast"  # an explicit cast to the ``dtype`` attr

# Mixed-precision list membership (Ascend's precision_reduce flag).
WHITE = "white"  # may run in fp16/bf16
BLACK = "black"  # stays in float32
GRAY = "gray"  # follows its input


@dataclass(frozen=True)
class OpDef:
    """A registered op type."""

    type: str
    forward: Callable
    backward: Callable | None
    category: str
    amp: str
    n_outputs: int


REGISTRY: dict[str, OpDef] = {}


def register(op_type: str, *, category: str = VECTOR, amp: str = GRAY, n_outputs: int = 1):
    """Class decorator adding an op type to the registry."""

    def wrap(cls):
        if op_type in REGISTRY:
            raise ValueError(f"op type {op_type!r} registered twice")
        REGISTRY[op_type] = OpDef(
            op_type, cls.forward, getattr(cls, "backward", None), category, amp, n_outputs
        )
        return cls

    return wrap


def get_op(op_type: str) -> OpDef:
    """The registered op ``op_type``; an unknown type lists the known ones."""
    try:
        return REGISTRY[op_type]
    except KeyError:
        raise choice_error("op type", op_type, sorted(REGISTRY)) from None


class KernelContext:
    """What one op execution computes in: formats, overflow mode, saved tensors."""

    __slots__ = ("compute", "output", "overflow_mode", "overflowed", "saved", "seed", "attrs")

    def __init__(self, compute: Format = FLOAT32, output: Format | None = None,
                 overflow_mode: str = "inf_nan", seed: tuple[int, ...] = (0,)):
        self.compute = compute
        self.output = output or compute
        self.overflow_mode = overflow_mode
        self.overflowed = False
        self.saved: tuple = ()
        self.seed = seed
        self.attrs: dict = {}

    @property
    def dtype(self) -> type:
        """The numpy dtype kernels compute in."""
        return self.compute.container

    def round(self, y) -> np.ndarray:
        """Round an intermediate to the compute format (fused kernels)."""
        y, overflow = self.compute.round(y, self.overflow_mode)
        self.overflowed |= overflow
        return y

    def out(self, y) -> np.ndarray:
        """Round a result the kernel returns to the output format."""
        y, overflow = self.output.round(y, self.overflow_mode)
        self.overflowed |= overflow
        return y

    def save(self, *arrays) -> None:
        """Keep what backward needs."""
        self.saved = arrays

    def rng(self) -> np.random.Generator:
        """A generator seeded by run seed, step and op name: the same on every device."""
        return np.random.default_rng(self.seed)


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added to reach ``shape``."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad
