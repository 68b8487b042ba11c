"""Op kernels with forward and backward; importing this package registers them all."""

from precision_tool.engine.ops import (  # noqa: F401  (registration side effect)
    activations,
    arithmetic,
    fused,
    losses,
    matrix,
    normalization,
    reductions,
    shape,
    spatial,
)
from precision_tool.engine.ops.base import REGISTRY, KernelContext, OpDef, get_op, register

__all__ = ["REGISTRY", "KernelContext", "OpDef", "get_op", "register"]
