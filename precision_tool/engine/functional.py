"""The functional API: each call traces one op into the active GraphBuilder.

Layouts: images are NCHW, convolution weights (out, in, kh, kw), matrices
row-major with the batch first. Every function returns a `Value`.
"""

from __future__ import annotations

from typing import Sequence

from precision_tool.engine.graph import GraphBuilder, Value


def _op(op_type: str, inputs: list, float_output: bool = True, **attrs) -> Value:
    (out,) = GraphBuilder.current().add(op_type, inputs, attrs, float_outputs=float_output)
    return out


# Matrix ops
def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False) -> Value:
    return _op("MatMul", [a, b], transpose_a=transpose_a, transpose_b=transpose_b)


def batch_matmul(a, b, transpose_a: bool = False, transpose_b: bool = False) -> Value:
    return _op("BatchMatMul", [a, b], transpose_a=transpose_a, transpose_b=transpose_b)


def bias_add(x, bias, data_format: str = "NHWC") -> Value:
    """``x + bias`` along the last axis (NHWC) or the channel axis 1 (NCHW)."""
    return _op("BiasAdd", [x, bias], data_format=data_format)


def conv2d(x, w, stride: int = 1, padding: int = 0) -> Value:
    """2-D convolution of NCHW ``x`` with (out, in, kh, kw) ``w``; symmetric zero padding."""
    return _op("Conv2D", [x, w], stride=stride, padding=padding)


# Normalization
def batch_norm(x, gamma, beta, eps: float = 1e-5) -> Value:
    """Training-mode batch norm over N, H, W of NCHW ``x`` (or N of (N, C))."""
    return _op("BatchNorm", [x, gamma, beta], eps=eps)


def layer_norm(x, gamma, beta, eps: float = 1e-5) -> Value:
    """Layer norm over the last axis."""
    return _op("LayerNorm", [x, gamma, beta], eps=eps)


# Activations
def relu(x) -> Value:
    return _op("Relu", [x])


def gelu(x) -> Value:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return _op("Gelu", [x])


def tanh(x) -> Value:
    return _op("Tanh", [x])


def sigmoid(x) -> Value:
    return _op("Sigmoid", [x])


# Softmax and losses
def softmax(x, axis: int = -1) -> Value:
    """Softmax; subtracts the row max before exp, as every library kernel does."""
    return _op("Softmax", [x], axis=axis)


def log_softmax(x, axis: int = -1) -> Value:
    return _op("LogSoftmax", [x], axis=axis)


def softmax_cross_entropy(logits, labels) -> Value:
    """Mean cross-entropy of (N, C) logits against (N,) integer labels."""
    return _op("SoftmaxCrossEntropy", [logits, labels])


def mse_loss(prediction, target) -> Value:
    """Mean of squared differences over all elements."""
    return _op("MSELoss", [prediction, target])


# Elementwise math
def add(a, b) -> Value:
    return _op("Add", [a, b])


def sub(a, b) -> Value:
    return _op("Sub", [a, b])


def mul(a, b) -> Value:
    return _op("Mul", [a, b])


def div(a, b) -> Value:
    return _op("RealDiv", [a, b])


def exp(x) -> Value:
    return _op("Exp", [x])


def log(x) -> Value:
    return _op("Log", [x])


def sqrt(x) -> Value:
    return _op("Sqrt", [x])


def rsqrt(x) -> Value:
    return _op("Rsqrt", [x])


def pow(x, exponent: float) -> Value:  # noqa: A001 (mirrors the op name)
    return _op("Pow", [x], exponent=float(exponent))


def square(x) -> Value:
    return _op("Square", [x])


# Reductions
def reduce_sum(x, axis=None, keepdims: bool = False) -> Value:
    return _op("ReduceSum", [x], axis=_axis(axis), keepdims=keepdims)


def reduce_mean(x, axis=None, keepdims: bool = False) -> Value:
    return _op("ReduceMean", [x], axis=_axis(axis), keepdims=keepdims)


def reduce_max(x, axis=None, keepdims: bool = False) -> Value:
    """Max; the gradient is shared equally among tied maxima."""
    return _op("ReduceMax", [x], axis=_axis(axis), keepdims=keepdims)


def _axis(axis):
    if axis is None or isinstance(axis, int):
        return axis
    return tuple(axis)


# Shape and data movement
def reshape(x, shape: Sequence[int]) -> Value:
    return _op("Reshape", [x], shape=tuple(shape))


def transpose(x, perm: Sequence[int]) -> Value:
    return _op("Transpose", [x], perm=tuple(perm))


def concat(values: Sequence, axis: int = 0) -> Value:
    return _op("Concat", list(values), axis=axis)


def cast(x, dtype: str) -> Value:
    """Round to ``dtype`` (float16, bfloat16, float32); the compute dtype is the target."""
    return _op("Cast", [x], dtype=dtype)


def max_pool(x, kernel: int = 2, stride: int | None = None) -> Value:
    """Max pooling over H, W of NCHW ``x`` (no padding)."""
    return _op("MaxPool", [x], kernel=kernel, stride=stride or kernel)


def avg_pool(x, kernel: int = 2, stride: int | None = None) -> Value:
    """Average pooling over H, W of NCHW ``x`` (no padding)."""
    return _op("AvgPool", [x], kernel=kernel, stride=stride or kernel)


def gather(params, indices) -> Value:
    """Rows of ``params`` picked by integer ``indices`` (an embedding lookup)."""
    return _op("Gather", [params, indices])


def dropout(x, rate: float) -> Value:
    """Inverted dropout; the mask is seeded by run seed, step and op name."""
    return _op("Dropout", [x], rate=float(rate))
