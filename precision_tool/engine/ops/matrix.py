"""Cube ops: MatMul, BatchMatMul and Conv2D.

Matrix ops multiply and accumulate in float32 (the L0C buffer) and round once
to their output format, in backward too.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import MATRIX, WHITE, register, unbroadcast


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
