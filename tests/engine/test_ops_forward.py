"""Hand-computed forward values and gradients of the ops, on the golden devices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from precision_tool.engine import functional as F
from precision_tool.engine.device import golden
from precision_tool.engine.ops import REGISTRY
from precision_tool.engine.ops.base import BLACK, CAST, MATRIX, MOVEMENT, VECTOR, WHITE
from .gradcheck import OneOpRunner, OpCase, run_graph

A = np.array([[1.0, 2.0], [3.0, 4.0]])
LN3 = math.log(3)

EXACT = [
    # (id, build, inputs, expected): values exact in float32 and float64
    ("Add-broadcast", F.add, [A, np.array([10.0, 20.0])], [[11, 22], [13, 24]]),
    ("Sub", F.sub, [A, np.array([[1.0], [2.0]])], [[0, 1], [1, 2]]),
    ("Mul", F.mul, [A, A], [[1, 4], [9, 16]]),
    ("RealDiv", F.div, [A, np.array([2.0, 4.0])], [[0.5, 0.5], [1.5, 1]]),
    ("BiasAdd-NCHW", lambda x, b: F.bias_add(x, b, "NCHW"), [np.zeros((1, 2, 1, 2)), np.array([1.0, 2.0])],
     [[[[1, 1]], [[2, 2]]]]),
    ("MatMul", F.matmul, [A, A], [[7, 10], [15, 22]]),
    ("MatMul-tb", lambda a, b: F.matmul(a, b, transpose_b=True), [A, A], [[5, 11], [11, 25]]),
    ("BatchMatMul", F.batch_matmul, [np.stack([A, 2 * A]), np.eye(2)], [A, 2 * A]),
    ("Relu", F.relu, [np.array([-1.0, 0.0, 2.0])], [0, 0, 2]),
    ("Exp", F.exp, [np.array([0.0])], [1]),
    ("Log", F.log, [np.array([1.0])], [0]),
    ("Sqrt", F.sqrt, [np.array([4.0, 0.25])], [2, 0.5]),
    ("Rsqrt", F.rsqrt, [np.array([4.0, 0.25])], [0.5, 2]),
    ("Pow", lambda x: F.pow(x, 1.5), [np.array([4.0, 0.25])], [8, 0.125]),
    ("Square", F.square, [np.array([-3.0, 0.5])], [9, 0.25]),
    ("Tanh", F.tanh, [np.array([0.0])], [0]),
    ("Sigmoid", F.sigmoid, [np.array([0.0])], [0.5]),
    ("MSELoss", F.mse_loss, [np.array([1.0, 2.0]), np.zeros(2)], 2.5),
    ("BatchNorm-NC", lambda x, g, b: F.batch_norm(x, g, b, eps=0.0),
     [np.array([[1.0, 0.0], [3.0, 4.0]]), np.array([2.0, 2.0]), np.array([1.0, 0.0])], [[-1, -2], [3, 2]]),
    ("BatchNorm-NCHW", lambda x, g, b: F.batch_norm(x, g, b, eps=0.0),
     [np.array([1.0, 3.0, 1.0, 3.0]).reshape(2, 1, 1, 2), np.array([1.0]), np.array([0.0])],
     np.array([-1.0, 1.0, -1.0, 1.0]).reshape(2, 1, 1, 2)),
    ("LayerNorm", lambda x, g, b: F.layer_norm(x, g, b, eps=0.0),
     [np.array([[1.0, 3.0], [2.0, 6.0]]), np.array([1.0, 3.0]), np.array([0.0, 1.0])], [[-1, 4], [-1, 4]]),
    ("ReduceSum-all", F.reduce_sum, [A], 10),
    ("ReduceSum-axis0", lambda x: F.reduce_sum(x, axis=0), [A], [4, 6]),
    ("ReduceMean-axis1", lambda x: F.reduce_mean(x, axis=1, keepdims=True), [A], [[1.5], [3.5]]),
    ("ReduceMax-axis1", lambda x: F.reduce_max(x, axis=1), [np.array([[1.0, 3.0, 2.0]])], [3]),
    ("Reshape", lambda x: F.reshape(x, (4,)), [A], [1, 2, 3, 4]),
    ("Transpose", lambda x: F.transpose(x, (1, 0)), [A], [[1, 3], [2, 4]]),
    ("Concat", lambda a, b: F.concat([a, b], axis=1), [A, np.array([[5.0], [6.0]])], [[1, 2, 5], [3, 4, 6]]),
    ("MaxPool", F.max_pool, [np.arange(16.0).reshape(1, 1, 4, 4)], [[[[5, 7], [13, 15]]]]),
    ("MaxPool-k3-s1", lambda x: F.max_pool(x, 3, 1), [np.arange(16.0).reshape(1, 1, 4, 4)],
     [[[[10, 11], [14, 15]]]]),
    ("AvgPool-crop", F.avg_pool, [np.arange(9.0).reshape(1, 1, 3, 3)], [[[[2]]]]),
    ("Gather", F.gather, [np.arange(8.0).reshape(4, 2), np.array([[3, 0], [1, 1]])],
     [[[6, 7], [0, 1]], [[2, 3], [2, 3]]]),
    ("Dropout-rate0", lambda x: F.dropout(x, 0.0), [A], A),
]

CLOSE = [
    # (id, build, inputs, expected): transcendental results, to float64 rounding
    ("Gelu", F.gelu, [np.array([0.0, 1.0, -1.0, 2.0])],
     [0.0, 0.8411919906082768, -0.15880800939172324, 1.954597694087775]),
    ("Sigmoid-ln3", F.sigmoid, [np.array([LN3, -LN3])], [0.75, 0.25]),
    ("Softmax", F.softmax, [np.array([[0.0, LN3], [1000.0, 1000.0]])], [[0.25, 0.75], [0.5, 0.5]]),
    ("LogSoftmax", F.log_softmax, [np.array([[0.0, 0.0], [0.0, LN3]])],
     [[-math.log(2), -math.log(2)], [-math.log(4), math.log(0.75)]]),
    ("SoftmaxCrossEntropy", F.softmax_cross_entropy, [np.array([[0.0, 0.0], [0.0, LN3]]), np.array([0, 1])],
     (math.log(2) - math.log(0.75)) / 2),
    ("Tanh-1", F.tanh, [np.array([1.0])], [(math.e**2 - 1) / (math.e**2 + 1)]),
    ("Exp-1", F.exp, [np.array([1.0])], [math.e]),
]


def _feed(inputs):
    return {f"x{i}": np.asarray(a) for i, a in enumerate(inputs)}


@pytest.mark.parametrize("float64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("build, inputs, expected", [c[1:] for c in EXACT], ids=[c[0] for c in EXACT])
def test_exact_forward_values(build, inputs, expected, float64):
    out, _ = run_graph(build, _feed(inputs), golden(float64=float64))
    assert out.dtype == (np.float64 if float64 else np.float32)
    np.testing.assert_array_equal(out, np.asarray(expected, dtype=out.dtype))


@pytest.mark.parametrize("build, inputs, expected", [c[1:] for c in CLOSE], ids=[c[0] for c in CLOSE])
def test_transcendental_forward_values(build, inputs, expected):
    out, _ = run_graph(build, _feed(inputs), golden(float64=True))
    np.testing.assert_allclose(out, expected, rtol=4e-16, atol=1e-300)


def _input_grads(build, inputs, seed):
    """Input gradients, read through a wrapper graph that makes every float input a parameter."""
    floats = [np.asarray(a, np.float64) for a in inputs if np.asarray(a).dtype.kind == "f"]
    ints = {i: a for i, a in enumerate(inputs) if np.asarray(a).dtype.kind != "f"}

    def wrapped(*params):
        it = iter(params)
        return build(*[ints[i] if i in ints else next(it) for i in range(len(inputs))])

    runner = OneOpRunner(OpCase("", wrapped, floats))
    runner.forward(floats)
    return runner.backward(np.asarray(seed, np.float64))


def test_reduce_max_shares_the_gradient_among_ties():
    (grad,) = _input_grads(lambda x: F.reduce_max(x, axis=1), [np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]])],
                           [1.0, 4.0])
    np.testing.assert_array_equal(grad, [[0, 0.5, 0.5], [4, 0, 0]])


def test_max_pool_sends_the_gradient_to_the_first_maximum():
    x = np.array([[[[1.0, 5.0], [5.0, 2.0]]]])
    (grad,) = _input_grads(F.max_pool, [x], [[[[3.0]]]])
    np.testing.assert_array_equal(grad, [[[[0, 3], [0, 0]]]])


def test_gather_gradient_adds_repeated_rows():
    params = np.zeros((4, 2))
    (grad,) = _input_grads(F.gather, [params, np.array([[3, 0], [1, 1]])], np.ones((2, 2, 2)))
    np.testing.assert_array_equal(grad, [[1, 1], [2, 2], [0, 0], [1, 1]])


def test_softmax_cross_entropy_gradient_is_softmax_minus_one_hot_over_batch():
    (grad,) = _input_grads(F.softmax_cross_entropy, [np.array([[0.0, 0.0], [0.0, LN3]]), np.array([0, 1])], 1.0)
    np.testing.assert_allclose(grad, [[-0.25, 0.25], [0.125, -0.125]], rtol=1e-15)


def test_cast_gradient_passes_through():
    (grad,) = _input_grads(lambda x: F.cast(x, "float16"), [np.array([1.5, -2.0])], [3.0, 4.0])
    np.testing.assert_array_equal(grad, [3, 4])


EXPECTED_REGISTRATION = {
    "MatMul": (MATRIX, WHITE), "BatchMatMul": (MATRIX, WHITE), "Conv2D": (MATRIX, WHITE),
    **{t: (VECTOR, BLACK) for t in ("Exp", "Log", "Pow", "Rsqrt", "Softmax", "LogSoftmax", "LayerNorm",
                                    "BatchNorm", "SoftmaxCrossEntropy", "MSELoss", "ReduceSum", "ReduceMean")},
    **{t: (MOVEMENT, None) for t in ("Reshape", "Transpose", "Concat", "Gather", "MaxPool")},
    "Cast": (CAST, None),
    **{t: (VECTOR, "gray") for t in ("BiasAdd", "Add", "Sub", "Mul", "RealDiv", "Sqrt", "Square", "Relu", "Gelu",
                                     "Tanh", "Sigmoid", "ReduceMax", "AvgPool", "Dropout")},
}


@pytest.mark.parametrize("op_type", EXPECTED_REGISTRATION)
def test_registration_category_and_amp_list(op_type):
    category, amp = EXPECTED_REGISTRATION[op_type]
    op = REGISTRY[op_type]
    assert op.category == category
    if amp is not None:  # movement and cast ignore the lists
        assert op.amp == amp
