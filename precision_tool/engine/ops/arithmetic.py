"""Elementwise arithmetic and math: Add, Sub, Mul, RealDiv, BiasAdd, Exp, Log, Sqrt, Rsqrt, Pow, Square.

Exp, Log, Pow and Rsqrt are on the mixed-precision black list (they stay
float32); the others follow their inputs. Backward kernels use the forward
output where the framework gradient ops do (ExpGrad, SqrtGrad, RsqrtGrad),
so in low precision they see the rounded, possibly saturated, result.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import BLACK, register, unbroadcast


@register("Add")
class Add:
    """``a + b`` with numpy broadcasting."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a.shape, b.shape)
        return ctx.out(a + b)

    @staticmethod
    def backward(ctx, dy):
        a_shape, b_shape = ctx.saved
        da = ctx.out(unbroadcast(dy, a_shape))
        db = ctx.out(unbroadcast(dy, b_shape))
        # in float32 ctx.out returns its argument: keep the two gradients distinct arrays
        return da, (db.copy() if db is da else db)


@register("Sub")
class Sub:
    """``a - b`` with numpy broadcasting."""

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
    """``a * b`` with numpy broadcasting."""

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
    """``a / b`` with numpy broadcasting."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save(a, b)
        return ctx.out(a / b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved
        da = dy / b
        # -dy a / b**2 as (dy / b) (a / b): b * b overflows float32 long before the quotient does
        db = -da * (a / b)
        return ctx.out(unbroadcast(da, a.shape)), ctx.out(unbroadcast(db, b.shape))


@register("BiasAdd")
class BiasAdd:
    """Add a bias vector along the last axis (``data_format="NHWC"``) or axis 1 (``"NCHW"``)."""

    @staticmethod
    def forward(ctx, x, bias, data_format="NHWC"):
        ctx.save(x.ndim)
        if data_format == "NCHW" and x.ndim > 2:
            bias = bias.reshape((-1,) + (1,) * (x.ndim - 2))
        return ctx.out(x + bias)

    @staticmethod
    def backward(ctx, dy, data_format="NHWC"):
        (ndim,) = ctx.saved
        channel_axis = 1 if data_format == "NCHW" and ndim > 2 else ndim - 1
        axes = tuple(i for i in range(ndim) if i != channel_axis)
        return ctx.out(dy), ctx.out(dy.sum(axis=axes))


@register("Exp", amp=BLACK)
class Exp:
    @staticmethod
    def forward(ctx, x):
        y = ctx.out(np.exp(x))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        return (ctx.out(dy * y),)


@register("Log", amp=BLACK)
class Log:
    @staticmethod
    def forward(ctx, x):
        ctx.save(x)
        return ctx.out(np.log(x))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        return (ctx.out(dy / x),)


@register("Sqrt")
class Sqrt:
    @staticmethod
    def forward(ctx, x):
        y = ctx.out(np.sqrt(x))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        return (ctx.out(0.5 * dy / y),)


@register("Rsqrt", amp=BLACK)
class Rsqrt:
    """``1 / sqrt(x)``."""

    @staticmethod
    def forward(ctx, x):
        y = ctx.out(1 / np.sqrt(x))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        return (ctx.out(-0.5 * dy * (y * y * y)),)


@register("Pow", amp=BLACK)
class Pow:
    """``x ** exponent`` for a float attribute ``exponent``."""

    @staticmethod
    def forward(ctx, x, exponent):
        ctx.save(x)
        return ctx.out(np.power(x, float(exponent)))

    @staticmethod
    def backward(ctx, dy, exponent):
        (x,) = ctx.saved
        p = float(exponent)
        return (ctx.out(dy * (p * np.power(x, p - 1))),)


@register("Square")
class Square:
    @staticmethod
    def forward(ctx, x):
        ctx.save(x)
        return ctx.out(x * x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        return (ctx.out(2 * dy * x),)
