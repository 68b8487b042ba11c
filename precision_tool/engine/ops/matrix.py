"""Cube ops: MatMul, BatchMatMul and Conv2D, all on the mixed-precision white list.

Matrix ops multiply and accumulate in float32 (the L0C buffer) and round once
to their output format, in backward too.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import MATRIX, WHITE, register, unbroadcast
from precision_tool.engine.ops.spatial import col2im, im2col, out_size


def _matmul(a, b, transpose_a=False, transpose_b=False):
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def matmul_grads(a, b, dy, transpose_a=False, transpose_b=False):
    """Gradients of ``op(a) @ op(b)`` with respect to ``a`` and ``b``."""
    if transpose_a:
        da = _matmul(b, dy, transpose_b, True)
    else:
        da = _matmul(dy, b, False, not transpose_b)
    if transpose_b:
        db = _matmul(dy, a, True, transpose_a)
    else:
        db = _matmul(a, dy, not transpose_a, False)
    return unbroadcast(da, a.shape), unbroadcast(db, b.shape)


@register("MatMul", category=MATRIX, amp=WHITE)
class MatMul:
    """2-D matrix product, optionally with either side transposed."""

    @staticmethod
    def forward(ctx, a, b, transpose_a=False, transpose_b=False):
        ctx.save(a, b)
        return ctx.out(_matmul(a, b, transpose_a, transpose_b))

    @staticmethod
    def backward(ctx, dy, transpose_a=False, transpose_b=False):
        a, b = ctx.saved
        da, db = matmul_grads(a, b, dy, transpose_a, transpose_b)
        return ctx.out(da), ctx.out(db)


@register("BatchMatMul", category=MATRIX, amp=WHITE)
class BatchMatMul:
    """Batched matrix product over leading axes, with numpy broadcasting."""

    forward = MatMul.forward
    backward = MatMul.backward


def _pad(x: np.ndarray, padding: int) -> np.ndarray:
    if padding == 0:
        return x
    n, c, h, w = x.shape
    padded = np.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=x.dtype)
    padded[:, :, padding:padding + h, padding:padding + w] = x
    return padded


@register("Conv2D", category=MATRIX, amp=WHITE)
class Conv2D:
    """Convolution of NCHW ``x`` with (out, in, kh, kw) ``w``: im2col, then one matmul."""

    @staticmethod
    def forward(ctx, x, w, stride=1, padding=0):
        stride, padding = int(stride), int(padding)
        out_c, _, kh, kw = w.shape
        padded = _pad(x, padding)
        cols = im2col(padded, kh, kw, stride)  # (N, C*kh*kw, Ho*Wo)
        ho, wo = out_size(padded.shape[2], kh, stride), out_size(padded.shape[3], kw, stride)
        kernel = w.reshape(out_c, -1)
        ctx.save(cols, kernel, w.shape, padded.shape)
        return ctx.out(np.matmul(kernel, cols).reshape(x.shape[0], out_c, ho, wo))

    @staticmethod
    def backward(ctx, dy, stride=1, padding=0):
        cols, kernel, w_shape, padded_shape = ctx.saved
        stride, padding = int(stride), int(padding)
        n, out_c = dy.shape[:2]
        dy = dy.reshape(n, out_c, -1)
        # one matmul per image, then a float32 sum: tensordot's transposed copies cost five times more
        dw = np.matmul(dy, cols.transpose(0, 2, 1)).sum(axis=0).reshape(w_shape)
        dpadded = col2im(np.matmul(kernel.T, dy), padded_shape, w_shape[2], w_shape[3], stride)
        h, w = padded_shape[2] - 2 * padding, padded_shape[3] - 2 * padding
        dx = dpadded[:, :, padding:padding + h, padding:padding + w]
        return ctx.out(dx), ctx.out(dw)
