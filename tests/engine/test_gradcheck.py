"""Every registered (non-fused) op: float64 gradients against central differences, and float32 hygiene."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from precision_tool.engine import functional as F
from precision_tool.engine.device import FusionSwitch, golden, npu
from precision_tool.engine.ops import REGISTRY, KernelContext
from .gradcheck import OneOpRunner, OpCase, check_gradients

_rng = np.random.default_rng(20261122)


def rand(*shape, low=-1.0, high=1.0):
    return _rng.uniform(low, high, shape)


def positive(*shape):
    return rand(*shape, low=0.5, high=2.0)


def away_from_zero(*shape):
    """Values at least 0.1 from 0, where Relu has its kink."""
    x = rand(*shape, low=0.1, high=1.0)
    return x * _rng.choice([-1.0, 1.0], shape)


def distinct(*shape):
    """Values at least 0.05 apart, so no max is tied under a 1e-6 perturbation."""
    n = int(np.prod(shape))
    return (_rng.permutation(n) * 0.05 + rand(n, low=0, high=0.01)).reshape(shape)


LABELS = np.array([0, 3, 1, 4])
LABELS_2D = np.array([[0, 2, 1], [3, 3, 0]])
INDICES = np.array([[0, 2], [2, 4], [4, 0]])  # repeats: the gradient must add up

CASES = [
    OpCase("MatMul", F.matmul, [rand(3, 4), rand(4, 5)]),
    OpCase("MatMul", lambda a, b: F.matmul(a, b, transpose_a=True), [rand(4, 3), rand(4, 5)], "ta"),
    OpCase("MatMul", lambda a, b: F.matmul(a, b, transpose_b=True), [rand(3, 4), rand(5, 4)], "tb"),
    OpCase("MatMul", lambda a, b: F.matmul(a, b, True, True), [rand(4, 3), rand(5, 4)], "ta-tb"),
    OpCase("BatchMatMul", F.batch_matmul, [rand(2, 3, 4), rand(2, 4, 5)]),
    OpCase("BatchMatMul", lambda a, b: F.batch_matmul(a, b, transpose_b=True),
           [rand(2, 3, 4), rand(5, 4)], "broadcast-tb"),
    OpCase("BiasAdd", F.bias_add, [rand(2, 3, 4), rand(4)], "NHWC"),
    OpCase("BiasAdd", lambda x, b: F.bias_add(x, b, "NCHW"), [rand(2, 3, 2, 2), rand(3)], "NCHW"),
    OpCase("Conv2D", lambda x, w: F.conv2d(x, w, stride=2, padding=1), [rand(2, 2, 5, 5), rand(3, 2, 3, 3)],
           "s2-p1"),
    OpCase("Conv2D", F.conv2d, [rand(1, 2, 4, 5), rand(2, 2, 2, 3)], "s1-p0"),
    OpCase("Conv2D", F.conv2d, [rand(2, 3, 2, 3), rand(4, 3, 1, 1)], "1x1"),
    OpCase("BatchNorm", F.batch_norm, [rand(3, 2, 2, 3), positive(2), rand(2)], "NCHW"),
    OpCase("BatchNorm", F.batch_norm, [rand(4, 3), positive(3), rand(3)], "NC"),
    OpCase("LayerNorm", F.layer_norm, [rand(2, 3, 5), positive(5), rand(5)]),
    OpCase("Relu", F.relu, [away_from_zero(3, 4)]),
    OpCase("Gelu", F.gelu, [rand(3, 4, low=-3, high=3)]),
    OpCase("Tanh", F.tanh, [rand(3, 4, low=-2, high=2)]),
    OpCase("Sigmoid", F.sigmoid, [rand(3, 4, low=-3, high=3)]),
    OpCase("Softmax", F.softmax, [rand(3, 4, low=-2, high=2)]),
    OpCase("Softmax", lambda x: F.softmax(x, axis=0), [rand(3, 4)], "axis0"),
    OpCase("LogSoftmax", F.log_softmax, [rand(3, 4, low=-2, high=2)]),
    OpCase("LogSoftmax", lambda x: F.log_softmax(x, axis=0), [rand(3, 4)], "axis0"),
    OpCase("SoftmaxCrossEntropy", lambda x: F.softmax_cross_entropy(x, LABELS), [rand(4, 5, low=-2, high=2)]),
    OpCase("SoftmaxCrossEntropy", lambda x: F.softmax_cross_entropy(x, LABELS_2D), [rand(2, 3, 4)], "NTC"),
    OpCase("MSELoss", F.mse_loss, [rand(3, 4), rand(3, 4)]),
    OpCase("Add", F.add, [rand(3, 4), rand(4)]),
    OpCase("Add", F.add, [rand(3, 4), rand(3, 4)], "same-shape"),
    OpCase("Sub", F.sub, [rand(3, 1), rand(3, 4)]),
    OpCase("Mul", F.mul, [rand(3, 4), rand(3, 1)]),
    OpCase("RealDiv", F.div, [rand(3, 4), positive(4)]),
    OpCase("Exp", F.exp, [rand(3, 4, low=-2, high=2)]),
    OpCase("Log", F.log, [positive(3, 4)]),
    OpCase("Sqrt", F.sqrt, [positive(3, 4)]),
    OpCase("Rsqrt", F.rsqrt, [positive(3, 4)]),
    OpCase("Pow", lambda x: F.pow(x, 2.5), [positive(3, 4)], "2.5"),
    OpCase("Pow", lambda x: F.pow(x, -1.5), [positive(3, 4)], "-1.5"),
    OpCase("Square", F.square, [rand(3, 4)]),
    OpCase("ReduceSum", F.reduce_sum, [rand(3, 4)], "all"),
    OpCase("ReduceSum", lambda x: F.reduce_sum(x, axis=(0, 2)), [rand(2, 3, 4)], "axes02"),
    OpCase("ReduceSum", lambda x: F.reduce_sum(x, axis=-1, keepdims=True), [rand(2, 3, 4)], "keepdims"),
    OpCase("ReduceMean", F.reduce_mean, [rand(3, 4)], "all"),
    OpCase("ReduceMean", lambda x: F.reduce_mean(x, axis=1), [rand(2, 3, 4)], "axis1"),
    OpCase("ReduceMax", F.reduce_max, [distinct(3, 4)], "all"),
    OpCase("ReduceMax", lambda x: F.reduce_max(x, axis=1, keepdims=True), [distinct(2, 3, 4)], "keepdims"),
    OpCase("Reshape", lambda x: F.reshape(x, (3, 4)), [rand(2, 6)]),
    OpCase("Transpose", lambda x: F.transpose(x, (2, 0, 1)), [rand(2, 3, 4)]),
    OpCase("Concat", lambda a, b, c: F.concat([a, b, c], axis=1), [rand(2, 1), rand(2, 3), rand(2, 2)]),
    OpCase("Cast", lambda x: F.cast(x, "float16"), [rand(3, 4)]),
    OpCase("MaxPool", F.max_pool, [distinct(2, 2, 4, 5)], "k2"),
    OpCase("MaxPool", lambda x: F.max_pool(x, 3, 1), [distinct(1, 2, 5, 5)], "k3-s1"),
    OpCase("AvgPool", F.avg_pool, [rand(2, 2, 5, 5)], "k2"),
    OpCase("AvgPool", lambda x: F.avg_pool(x, 3, 2), [rand(1, 2, 7, 7)], "k3-s2"),
    OpCase("Gather", lambda p: F.gather(p, INDICES), [rand(5, 3)]),
    OpCase("Dropout", lambda x: F.dropout(x, 0.5), [rand(3, 4, 5)], "0.5"),
    OpCase("Dropout", lambda x: F.dropout(x, 0.0), [rand(3, 4)], "0"),
]


def _unfused_types() -> set[str]:
    """Registered op types except the fused kernels (owned by ops/fused.py, checked there)."""
    return {t for t, op in REGISTRY.items() if not op.forward.__module__.startswith("precision_tool.engine.ops.fused")}


def test_every_unfused_op_has_a_gradient_check():
    assert {case.op_type for case in CASES} == _unfused_types()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradient_matches_central_differences(case):
    check_gradients(case)


@pytest.fixture
def float32_only(monkeypatch):
    """Make ``ctx.out`` fail on anything but an array of the compute dtype (no hidden float64 upcasts)."""
    original = KernelContext.out

    def out(self, y):
        assert np.asarray(y).dtype == self.dtype, f"ctx.out got {np.asarray(y).dtype}, computing in {self.dtype}"
        return original(self, y)

    monkeypatch.setattr(KernelContext, "out", out)


FLOAT32_DEVICES = {
    "golden": golden(),
    "force_fp16": npu(precision_mode="force_fp16", fusion_switch=FusionSwitch(all_off=True)),
    "mixed_bf16": npu(precision_mode="allow_mix_precision_bf16", fusion_switch=FusionSwitch(all_off=True)),
}


@pytest.mark.parametrize("device", FLOAT32_DEVICES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_float32_kernels_stay_float32_and_do_not_warn(case, device, float32_only):
    runner = OneOpRunner(case, FLOAT32_DEVICES[device])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = runner.forward([np.asarray(a, np.float32) for a in case.arrays])
        grads = runner.backward(np.ones(np.shape(out), np.float32))
    assert out.dtype == np.float32
    assert [g.dtype for g in grads] == [np.float32] * len(grads)
    assert [g.shape for g in grads] == [np.shape(a) for a in case.arrays]
