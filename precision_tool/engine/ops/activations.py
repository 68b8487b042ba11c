"""Activations: Relu, Gelu, Tanh, Sigmoid."""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import register


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
