"""Fused kernels: what one NPU kernel computes in place of the op chain it replaced.

A fused kernel keeps every intermediate in its compute format: each elementary
step (x^3, a multiply, an add, tanh, exp, a sum, a divide) computes in
float32 and is rounded before the next step reads it. The unfused chain on
the npu rounds only once per op, each op computing in float32 inside, and in
the mixed modes its black-list ops (softmax, the norms) even run wholly in
float32. So on the npu fused numbers differ from unfused ones; golden never
fuses (`program.compile_graph`).

- Matrix part: multiply-accumulate in float32, one rounding (the L0C buffer).
  The vector epilogue of a matrix-anchored kernel (bias, activation, batch
  norm) runs in the kernel's *output* format: the compute format in every
  precision mode except cube_fp16in_fp32out / force_fp32, where the Cube
  hands float32 out and vector work stays float32.
- Normalization statistics (LayerNormFused, Conv2DBatchNorm*) in ONE pass:
  var = E[x^2] - E[x]^2, each mean rounded to the compute format, clamped at
  0. This is the classic fused-kernel shortcut; it cancels catastrophically
  when |mean| >> std, where a two-pass variance would not.
- The final result is rounded with ``ctx.out``.
- Backward chains the original ops' backward math with intermediates rounded
  the same way and returns one gradient per fused input, in input order
  (including the eps and scale constants the kernels take as inputs). With a
  float64 context rounding is the identity, so the math is checked exactly
  against finite differences in ``tests/engine/test_fusion.py``.
"""

from __future__ import annotations

import math

import numpy as np

from precision_tool.engine.formats import FLOAT32, FLOAT64
from precision_tool.engine.ops.base import BLACK, MATRIX, VECTOR, WHITE, KernelContext, get_op, register, unbroadcast
from precision_tool.engine.ops.matrix import _matmul, matmul_grads

MATMUL_BIAS_ADD = "MatMulBiasAdd"
MATMUL_BIAS_ADD_RELU = "MatMulBiasAddRelu"
MATMUL_BIAS_ADD_GELU = "MatMulBiasAddGelu"
CONV2D_BATCH_NORM = "Conv2DBatchNorm"
CONV2D_BATCH_NORM_RELU = "Conv2DBatchNormRelu"
LAYER_NORM_FUSED = "LayerNormFused"
SCALED_MASKED_SOFTMAX = "ScaledMaskedSoftmax"

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


# Epilogue activations: forward(r, z) -> (y unrounded, saved); grad(r, z, saved) -> dy/dz.
class _Identity:
    @staticmethod
    def forward(r, z):
        return z, None

    @staticmethod
    def grad(r, z, saved):
        return 1.0


class _Relu:
    @staticmethod
    def forward(r, z):
        return np.maximum(z, 0), None

    @staticmethod
    def grad(r, z, saved):
        return (z > 0).astype(z.dtype)


class _Gelu:
    """tanh-approximate GELU, every step rounded."""

    @staticmethod
    def forward(r, x):
        inner = r(_GELU_C * r(x + r(_GELU_A * r(x * x * x))))
        t = r(np.tanh(inner))
        return r(0.5 * x) * r(1 + t), t

    @staticmethod
    def grad(r, x, t):
        sech2 = r(1 - r(t * t))
        dinner = r(_GELU_C * r(1 + r(3 * _GELU_A * r(x * x))))
        return r(r(0.5 * r(1 + t)) + r(r(0.5 * x) * r(sech2 * dinner)))


def _raw_context(ctx: KernelContext) -> KernelContext:
    """A context that does not round: a plain op kernel called in it gives the exact-in-container result."""
    return KernelContext(FLOAT64 if ctx.dtype == np.float64 else FLOAT32, overflow_mode=ctx.overflow_mode)


def _channel_shape(ndim: int, data_format: str) -> tuple[int, ...]:
    """Where a per-channel vector broadcasts: the last axis, or axis 1 for NCHW."""
    if data_format == "NCHW" and ndim > 2:
        return (-1,) + (1,) * (ndim - 2)
    return (-1,)


def _register_matmul_bias(op_type: str, activation) -> None:
    """Register a MatMul -> BiasAdd -> ``activation`` kernel as ``op_type``."""

    class Kernel:
        @staticmethod
        def forward(ctx, a, b, bias, transpose_a=False, transpose_b=False, data_format="NHWC"):
            r = ctx.out  # the epilogue format (see the module docstring)
            product = r(_matmul(a, b, transpose_a, transpose_b))
            z = r(product + bias.reshape(_channel_shape(product.ndim, data_format)))
            y, saved = activation.forward(r, z)
            ctx.save(a, b, bias.shape, z, saved)
            return ctx.out(y)

        @staticmethod
        def backward(ctx, dy, transpose_a=False, transpose_b=False, data_format="NHWC"):
            r = ctx.out
            a, b, bias_shape, z, saved = ctx.saved
            dz = r(dy * activation.grad(r, z, saved))
            dbias = r(_bias_grad(dz, data_format))
            da, db = matmul_grads(a, b, dz, transpose_a, transpose_b)
            return ctx.out(da), ctx.out(db), ctx.out(dbias.reshape(bias_shape))

    Kernel.__name__ = Kernel.__qualname__ = op_type
    register(op_type, category=MATRIX, amp=WHITE)(Kernel)


def _bias_grad(dz: np.ndarray, data_format: str) -> np.ndarray:
    channel = 1 if data_format == "NCHW" and dz.ndim > 2 else dz.ndim - 1
    return dz.sum(axis=tuple(i for i in range(dz.ndim) if i != channel))


_register_matmul_bias(MATMUL_BIAS_ADD, _Identity)
_register_matmul_bias(MATMUL_BIAS_ADD_RELU, _Relu)
_register_matmul_bias(MATMUL_BIAS_ADD_GELU, _Gelu)


def normalize_one_pass(r, x: np.ndarray, axes: tuple[int, ...], eps) -> tuple[np.ndarray, np.ndarray]:
    """(x - mean) * rsqrt(var + eps) with var = E[x^2] - E[x]^2, every step rounded by ``r``."""
    mean = r(x.mean(axis=axes, keepdims=True))
    mean_sq = r(r(x * x).mean(axis=axes, keepdims=True))
    var = np.maximum(r(mean_sq - r(mean * mean)), 0)  # cancellation can make it negative
    inv_std = r(1 / np.sqrt(r(var + eps)))
    return r(r(x - mean) * inv_std), inv_std


def normalize_backward(r, dn: np.ndarray, n: np.ndarray, inv_std: np.ndarray, axes) -> np.ndarray:
    """Gradient through n = (x - mean) * inv_std with batch statistics over ``axes``."""
    mean_dn = r(dn.mean(axis=axes, keepdims=True))
    mean_dn_n = r(r(dn * n).mean(axis=axes, keepdims=True))
    return r(inv_std * r(r(dn - mean_dn) - r(n * mean_dn_n)))


def _register_conv_batch_norm(op_type: str, activation) -> None:
    """Register a Conv2D -> BatchNorm (batch statistics) -> ``activation`` kernel as ``op_type``."""

    class Kernel:
        @staticmethod
        def forward(ctx, x, w, gamma, beta, stride=1, padding=0, eps=1e-5):
            r = ctx.out  # the epilogue format (see the module docstring)
            raw = _raw_context(ctx)
            c = r(get_op("Conv2D").forward(raw, x, w, stride=stride, padding=padding))
            ctx.overflowed |= raw.overflowed
            shape = _channel_shape(c.ndim, "NCHW")
            n, inv_std = normalize_one_pass(r, c, _batch_axes(c), eps)
            z = r(r(n * gamma.reshape(shape)) + beta.reshape(shape))
            y, saved = activation.forward(r, z)
            ctx.save(raw, n, inv_std, gamma, z, saved)
            return ctx.out(y)

        @staticmethod
        def backward(ctx, dy, stride=1, padding=0, eps=1e-5):
            r = ctx.out
            raw, n, inv_std, gamma, z, saved = ctx.saved
            axes = _batch_axes(n)
            dz = r(dy * activation.grad(r, z, saved))
            dgamma = r(r(dz * n).sum(axis=axes))
            dbeta = r(dz.sum(axis=axes))
            dn = r(dz * gamma.reshape(_channel_shape(n.ndim, "NCHW")))
            dc = normalize_backward(r, dn, n, inv_std, axes)
            dx, dw = get_op("Conv2D").backward(raw, dc, stride=stride, padding=padding)[:2]
            ctx.overflowed |= raw.overflowed
            return ctx.out(dx), ctx.out(dw), ctx.out(dgamma), ctx.out(dbeta)

    Kernel.__name__ = Kernel.__qualname__ = op_type
    register(op_type, category=MATRIX, amp=WHITE)(Kernel)


def _batch_axes(x: np.ndarray) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


_register_conv_batch_norm(CONV2D_BATCH_NORM, _Identity)
_register_conv_batch_norm(CONV2D_BATCH_NORM_RELU, _Relu)


@register(LAYER_NORM_FUSED, category=VECTOR, amp=BLACK)
class LayerNormFused:
    """Layer norm over the last axis from the composite primitives; ``eps`` is the fused Add's constant."""

    @staticmethod
    def forward(ctx, x, gamma, beta, eps):
        r = ctx.round
        n, inv_std = normalize_one_pass(r, x, (-1,), eps)
        ctx.save(n, inv_std, gamma, beta.shape, np.shape(eps))
        return ctx.out(r(n * gamma) + beta)

    @staticmethod
    def backward(ctx, dy):
        r = ctx.round
        n, inv_std, gamma, beta_shape, eps_shape = ctx.saved
        dgamma = unbroadcast(r(dy * n), gamma.shape)
        dbeta = unbroadcast(dy, beta_shape)
        dn = r(dy * gamma)
        dx = normalize_backward(r, dn, n, inv_std, (-1,))
        # n depends on eps through inv_std: dn/deps = -n * inv_std^2 / 2
        deps = unbroadcast(r(dn * r(-0.5 * r(n * r(inv_std * inv_std)))), eps_shape)
        return ctx.out(dx), ctx.out(dgamma), ctx.out(dbeta), ctx.out(deps)


@register(SCALED_MASKED_SOFTMAX, category=VECTOR, amp=BLACK)
class ScaledMaskedSoftmax:
    """softmax(x * scale [+ mask]) along ``axis``, max subtracted, every step rounded."""

    @staticmethod
    def forward(ctx, x, scale, mask=None, axis=-1):
        r, axis = ctx.round, int(axis)
        z = r(x * scale)
        if mask is not None:
            z = r(z + mask)
        e = r(np.exp(r(z - z.max(axis=axis, keepdims=True))))
        y = ctx.out(e / r(e.sum(axis=axis, keepdims=True)))
        ctx.save(x, scale, None if mask is None else mask.shape, y)
        return y

    @staticmethod
    def backward(ctx, dy, axis=-1):
        r, axis = ctx.round, int(axis)
        x, scale, mask_shape, y = ctx.saved
        dz = r(y * r(dy - r(r(dy * y).sum(axis=axis, keepdims=True))))
        grads = [ctx.out(unbroadcast(r(dz * scale), x.shape)),
                 ctx.out(unbroadcast(r(dz * x), np.shape(scale)))]
        if mask_shape is not None:
            grads.append(ctx.out(unbroadcast(dz, mask_shape)))
        return tuple(grads)
