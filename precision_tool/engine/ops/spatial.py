"""Pooling over NCHW images (MaxPool, AvgPool) and the window helpers Conv2D's im2col uses.

Windows are visited one kernel offset at a time: a (kh, kw) kernel costs
kh * kw vectorised passes over the output, never a Python loop over pixels.
Pools take no padding; an incomplete last window is dropped.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import MOVEMENT, register


def out_size(size: int, kernel: int, stride: int) -> int:
    """How many windows of ``kernel`` at ``stride`` fit in ``size``."""
    return (size - kernel) // stride + 1


def offsets(kh: int, kw: int, stride: int, ho: int, wo: int):
    """For each kernel offset (i, j): the index picking that element of every window in (..., H, W)."""
    for i in range(kh):
        for j in range(kw):
            yield i, j, (Ellipsis, slice(i, i + stride * (ho - 1) + 1, stride),
                         slice(j, j + stride * (wo - 1) + 1, stride))


def im2col(x: np.ndarray, kh: int, kw: int, stride: int) -> np.ndarray:
    """The (N, C*kh*kw, Ho*Wo) matrix of every window of NCHW ``x``, in (C, kh, kw) row order."""
    n, c, h, w = x.shape
    if kh == kw == stride == 1:
        return x.reshape(n, c, h * w)  # a 1x1 convolution needs no copy
    ho, wo = out_size(h, kh, stride), out_size(w, kw, stride)
    cols = np.empty((n, c, kh, kw, ho, wo), dtype=x.dtype)
    for i, j, window in offsets(kh, kw, stride, ho, wo):
        cols[:, :, i, j] = x[window]
    return cols.reshape(n, c * kh * kw, ho * wo)


def col2im(cols: np.ndarray, shape: tuple[int, ...], kh: int, kw: int, stride: int) -> np.ndarray:
    """The adjoint of `im2col`: add every window column back into an NCHW array of ``shape``."""
    n, c, h, w = shape
    ho, wo = out_size(h, kh, stride), out_size(w, kw, stride)
    cols = cols.reshape(n, c, kh, kw, ho, wo)
    x = np.zeros(shape, dtype=cols.dtype)
    for i, j, window in offsets(kh, kw, stride, ho, wo):
        x[window] += cols[:, :, i, j]
    return x


def _pool_geometry(x: np.ndarray, kernel, stride) -> tuple[int, int, int, int]:
    k, s = int(kernel), int(stride or kernel)
    return k, s, out_size(x.shape[-2], k, s), out_size(x.shape[-1], k, s)


@register("MaxPool", category=MOVEMENT)
class MaxPool:
    """Max over each window; the gradient goes to the first maximum in row-major window order."""

    @staticmethod
    def forward(ctx, x, kernel=2, stride=None):
        k, s, ho, wo = _pool_geometry(x, kernel, stride)
        windows = offsets(k, k, s, ho, wo)
        y = x[next(windows)[2]].copy()
        for _, _, window in windows:
            np.maximum(y, x[window], out=y)
        ctx.save(x, y)
        return y

    @staticmethod
    def backward(ctx, dy, kernel=2, stride=None):
        x, y = ctx.saved
        k, s, ho, wo = _pool_geometry(x, kernel, stride)
        dx = np.zeros_like(x, dtype=dy.dtype)
        taken = np.zeros(y.shape, dtype=bool)
        for _, _, window in offsets(k, k, s, ho, wo):
            hit = x[window] == y
            hit &= ~taken
            taken |= hit
            dx[window] += np.where(hit, dy, 0).astype(dy.dtype, copy=False)
        # overlapping windows add several gradients into one element
        return (ctx.out(dx) if s < k else dx,)


@register("AvgPool")
class AvgPool:
    """Mean over each window."""

    @staticmethod
    def forward(ctx, x, kernel=2, stride=None):
        k, s, ho, wo = _pool_geometry(x, kernel, stride)
        windows = offsets(k, k, s, ho, wo)
        total = x[next(windows)[2]].copy()
        for _, _, window in windows:
            total += x[window]
        ctx.save(x.shape)
        return ctx.out(total / (k * k))

    @staticmethod
    def backward(ctx, dy, kernel=2, stride=None):
        (shape,) = ctx.saved
        k = int(kernel)
        s = int(stride or kernel)
        share = dy / (k * k)
        dx = np.zeros(shape, dtype=dy.dtype)
        for _, _, window in offsets(k, k, s, dy.shape[-2], dy.shape[-1]):
            dx[window] += share
        return (ctx.out(dx),)
