"""Elementwise arithmetic: Add, Sub, Mul, RealDiv, BiasAdd and friends."""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import register, unbroadcast


@register("Add")
class Add:
    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a.shape, b.shape)
        return ctx.out(a + b)

    @staticmethod
    def backward(ctx, dy):
        a_shape, b_shape = ctx.saved
        return ctx.out(unbroadcast(dy, a_shape)), ctx.out(unbroadcast(dy, b_shape))


@register("Sub")
class Sub:
    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a.shape, b.shape)
        return ctx.out(a - b)

    @staticmethod
    def backward(ctx, dy):
        a_shape, b_shape = ctx.saved
        return ctx.out(unbroadcast(dy, a_shape)), ctx.out(unbroadcast(-dy, b_shape))


@register("Mul")
class Mul:
    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a, b)
        return ctx.out(a * b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved
        return ctx.out(unbroadcast(dy * b, a.shape)), ctx.out(unbroadcast(dy * a, b.shape))


@register("RealDiv")
class RealDiv:
    @staticmethod
    def forward(ctx, a, b):
        y = ctx.out(a / b)
        ctx.save(a, b)
        return y

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved
        da = dy / b
        db = -dy * a / (b * b)
        return ctx.out(unbroadcast(da, a.shape)), ctx.out(unbroadcast(db, b.shape))


@register("BiasAdd")
class BiasAdd:
    """Add a bias vector along the last axis (``data_format="NHWC"``) or axis 1 (``"NCHW"``)."""

    @staticmethod
    def forward(ctx, x, bias, data_format="NHWC"):
        ctx.save(x.ndim, data_format)
        if data_format == "NCHW" and x.ndim > 2:
            bias = bias.reshape((-1,) + (1,) * (x.ndim - 2))
        return ctx.out(x + bias)

    @staticmethod
    def backward(ctx, dy, data_format="NHWC"):
        ndim, data_format = ctx.saved
        channel_axis = 1 if data_format == "NCHW" and ndim > 2 else ndim - 1
        axes = tuple(i for i in range(ndim) if i != channel_axis)
        return ctx.out(dy), ctx.out(dy.sum(axis=axes))
