"""Fusion passes: what they match, what they record, the switch, and how fused kernels compute."""

import json
from dataclasses import replace

import numpy as np
import pytest

from precision_tool.engine import functional as F
from precision_tool.engine import layers as L
from precision_tool.engine.device import FusionSwitch, golden, npu
from precision_tool.engine.executor import Executor
from precision_tool.engine.formats import FLOAT16, FLOAT64
from precision_tool.engine.fusion import PASSES, parse_fusion_switch
from precision_tool.engine.graph import GraphBuilder, Parameter
from precision_tool.engine.ops import KernelContext, get_op
from precision_tool.engine.program import compile_graph
from precision_tool.errors import InputError

ALL_OFF = FusionSwitch(all_off=True)


def params(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [Parameter(rng.normal(0, 0.5, s).astype(np.float32), f"p{i}") for i, s in enumerate(shapes)]


def build(body):
    """A graph whose forward is ``body(x)`` traced in scope "blk", with output "out"."""
    with GraphBuilder() as b:
        x = b.input("x")
        with b.scope("blk"):
            b.output("out", body(x))
    return b.graph


def identity(x):
    return x


def dense(activation=identity):
    w, bias = params((4, 5), (5,))
    return lambda x: activation(F.bias_add(F.matmul(x, w), bias))


def conv_bn(activation=identity):
    w, gamma, beta = params((4, 3, 3, 3), (4,), (4,))
    return lambda x: activation(F.batch_norm(F.conv2d(x, w, padding=1), gamma, beta))


def composite_layer_norm():
    ln = L.LayerNorm(6, composite=True)
    ln.name_parameters()
    return ln


def scaled_softmax(masked):
    mask = L.causal_mask(3)
    return lambda x: F.softmax(F.add(F.mul(x, 0.5), mask) if masked else F.mul(x, 0.5))


MM = [("blk/MatMul", 0), ("blk/MatMul", 1), ("blk/BiasAdd", 1)]
CASES = {
    "MatMulBiasAddGeluFusionPass": (lambda: dense(F.gelu), "MatMulBiasAddGelu",
                                    ["blk/MatMul", "blk/BiasAdd", "blk/Gelu"], MM),
    "MatMulBiasAddReluFusionPass": (lambda: dense(F.relu), "MatMulBiasAddRelu",
                                    ["blk/MatMul", "blk/BiasAdd", "blk/Relu"], MM),
    "MatMulBiasAddFusionPass": (lambda: dense(), "MatMulBiasAdd", ["blk/MatMul", "blk/BiasAdd"], MM),
    "Conv2DBatchNormReluFusionPass": (lambda: conv_bn(F.relu), "Conv2DBatchNormRelu",
                                      ["blk/Conv2D", "blk/BatchNorm", "blk/Relu"],
                                      [("blk/Conv2D", 0), ("blk/Conv2D", 1), ("blk/BatchNorm", 1),
                                       ("blk/BatchNorm", 2)]),
    "Conv2DBatchNormFusionPass": (lambda: conv_bn(), "Conv2DBatchNorm", ["blk/Conv2D", "blk/BatchNorm"],
                                  [("blk/Conv2D", 0), ("blk/Conv2D", 1), ("blk/BatchNorm", 1),
                                   ("blk/BatchNorm", 2)]),
    "LayerNormFusionPass": (composite_layer_norm, "LayerNormFused",
                            ["blk/ReduceMean", "blk/Sub", "blk/Square", "blk/ReduceMean_1", "blk/Add",
                             "blk/Rsqrt", "blk/Mul", "blk/Mul_1", "blk/Add_1"],
                            [("blk/ReduceMean", 0), ("blk/Mul_1", 1), ("blk/Add_1", 1), ("blk/Add", 1)]),
    "SoftmaxScaleMaskFusionPass": (lambda: scaled_softmax(True), "ScaledMaskedSoftmax",
                                   ["blk/Mul", "blk/Add", "blk/Softmax"],
                                   [("blk/Mul", 0), ("blk/Mul", 1), ("blk/Add", 1)]),
}


def test_passes_are_registered_longest_pattern_first():
    assert [p.name for p in PASSES] == list(CASES)


@pytest.mark.parametrize("pass_name", CASES)
def test_each_pass_fuses_its_pattern_and_records_the_originals(pass_name):
    make, fused_type, originals, input_origins = CASES[pass_name]
    program = compile_graph(build(make()), npu())
    assert program.fusion_counts == {pass_name: 1}
    (node,) = [c.node for c in program.nodes]
    assert node.type == fused_type
    assert node.name == f"blk/{fused_type}"
    assert node.fusion.pass_name == pass_name
    assert list(node.fusion.original_names) == originals
    assert node.fusion.output_origins == ((originals[-1], 0),)
    assert list(node.fusion.input_origins) == input_origins
    assert node.outputs[0] is program.graph.outputs["out"]


def test_softmax_without_mask_fuses_scale_and_softmax():
    program = compile_graph(build(scaled_softmax(False)), npu())
    (node,) = [c.node for c in program.nodes]
    assert node.fusion.original_names == ("blk/Mul", "blk/Softmax")
    assert len(node.inputs) == 2


def test_a_second_consumer_of_an_intermediate_blocks_fusion():
    w, bias = params((4, 5), (5,))

    def body(x):
        h = F.bias_add(F.matmul(x, w), bias)
        return F.add(F.gelu(h), h)  # h feeds Gelu and Add

    program = compile_graph(build(body), npu())
    assert program.fusion_counts == {"MatMulBiasAddFusionPass": 1}  # the chain ends at the shared value
    assert [c.node.type for c in program.nodes] == ["MatMulBiasAdd", "Gelu", "Add"]


def test_an_intermediate_graph_output_blocks_fusion():
    w, bias = params((4, 5), (5,))
    with GraphBuilder() as b:
        h = F.matmul(b.input("x"), w)
        b.output("h", h)
        b.output("out", F.bias_add(h, bias))
    assert compile_graph(b.graph, npu()).fusion_counts == {}


def test_layer_norm_with_a_shared_centered_value_is_not_fused():
    ln = composite_layer_norm()
    with GraphBuilder() as b:
        y = ln(b.input("x"))
        b.output("out", F.add(y, b.graph.nodes[1].outputs[0]))  # reuse x - mean
    assert "LayerNormFusionPass" not in compile_graph(b.graph, npu()).fusion_counts


@pytest.mark.parametrize("spec", [{"GraphFusion": {"ALL": "off"}},
                                  {"Switch": {"GraphFusion": {"ALL": "off"}, "UBFusion": {"ALL": "off"}}}])
def test_all_off_switches_every_pass_off(spec):
    switch = parse_fusion_switch(spec)
    assert not any(switch.enabled(p.name) for p in PASSES)
    assert compile_graph(build(dense(F.gelu)), npu(fusion_switch=switch)).fusion_counts == {}


def test_turning_one_pass_off_lets_the_next_one_fuse(tmp_path):
    path = tmp_path / "fusion_switch.cfg"
    path.write_text(json.dumps({"Switch": {"GraphFusion": {"MatMulBiasAddGeluFusionPass": "off"}}}))
    program = compile_graph(build(dense(F.gelu)), npu(fusion_switch=path))
    assert program.fusion_counts == {"MatMulBiasAddFusionPass": 1}
    assert [c.node.name for c in program.nodes] == ["blk/MatMulBiasAdd", "blk/Gelu"]


def test_all_off_with_one_pass_back_on():
    switch = parse_fusion_switch({"GraphFusion": {"ALL": "off", "MatMulBiasAddFusionPass": "on"}})
    assert [p.name for p in PASSES if switch.enabled(p.name)] == ["MatMulBiasAddFusionPass"]


def test_unknown_pass_names_the_valid_ones():
    with pytest.raises(InputError, match="unknown fusion pass 'NoSuchPass'.*LayerNormFusionPass"):
        parse_fusion_switch({"GraphFusion": {"NoSuchPass": "off"}}, "cfg.json")


@pytest.mark.parametrize("spec", [{"GraphFusion": {"ALL": "disabled"}}, {"Other": {}}, [], {"GraphFusion": []}])
def test_bad_switch_values_are_input_errors(spec):
    with pytest.raises(InputError):
        parse_fusion_switch(spec)


class SmallTransformer(L.Model):
    """Composite layer norm, scaled masked softmax and a Dense-Gelu: every vector fusion."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.data = L.DataSpec("features", (4, 8), "classification", num_classes=3)
        self.ln = L.LayerNorm(8, composite=True)
        self.attn = L.MultiHeadAttention(8, 2, rng=rng, causal=True)
        self.ffn = L.Dense(8, 16, activation="gelu", rng=rng)
        self.head = L.Dense(16, 3, rng=rng)

    def forward(self, x):
        h = x + self.attn(self.ln(x))
        return self.head(F.reduce_mean(self.ffn(h), 1))


def run(graph, device, feeds):
    executor = Executor(compile_graph(graph, device))
    executor.begin_step(0)
    outputs = executor.forward(feeds, dict(graph.initial_params))
    grads = executor.backward({"loss": 1.0}) if "loss" in graph.outputs else {}
    return outputs, grads, executor.program


@pytest.fixture(scope="module")
def transformer():
    rng = np.random.default_rng(2)
    feeds = {"x": rng.normal(0, 1, (6, 4, 8)).astype(np.float32), "labels": rng.integers(0, 3, 6)}
    return L.trace(SmallTransformer()), feeds


@pytest.mark.parametrize("mode", ["force_fp16", "allow_mix_precision"])
def test_fusion_changes_the_numbers_on_the_npu(transformer, mode):
    graph, feeds = transformer
    fused, fused_grads, program = run(graph, npu(precision_mode=mode), feeds)
    unfused, unfused_grads, _ = run(graph, npu(precision_mode=mode, fusion_switch=ALL_OFF), feeds)
    assert program.fusion_counts == {"LayerNormFusionPass": 1, "MatMulBiasAddFusionPass": 5,
                                     "SoftmaxScaleMaskFusionPass": 1, "MatMulBiasAddGeluFusionPass": 1}
    assert not np.array_equal(fused["logits"], unfused["logits"])
    assert not np.array_equal(fused_grads["ln/gamma"], unfused_grads["ln/gamma"])
    np.testing.assert_allclose(fused["logits"], unfused["logits"], atol=0.05)  # different, not broken


def test_golden_never_fuses(transformer):
    graph, feeds = transformer
    out, _, program = run(graph, golden(), feeds)
    assert program.fusion_counts == {}
    assert all(c.node.fusion is None for c in program.nodes)
    assert [c.node.name for c in program.nodes] == [n.name for n in graph.nodes]


def _layer_norm_error(device, x, reference):
    out, _, _ = run(build(composite_layer_norm()), device, {"x": x})
    return float(np.max(np.abs(out["out"] - reference)))


@pytest.mark.parametrize("mode, mean", [("force_fp16", 10.0), ("allow_mix_precision", 100.0)])
def test_fused_layer_norm_loses_precision_when_the_mean_dwarfs_the_deviation(mode, mean):
    x = np.random.default_rng(0).normal(mean, 1.0, (32, 6)).astype(np.float32)
    reference, _, _ = run(build(composite_layer_norm()), golden(float64=True), {"x": x.astype(np.float64)})
    fused = _layer_norm_error(npu(precision_mode=mode), x, reference["out"])
    unfused = _layer_norm_error(npu(precision_mode=mode, fusion_switch=ALL_OFF), x, reference["out"])
    assert fused > 10 * unfused


def test_fused_and_unfused_layer_norm_agree_for_centred_inputs():
    x = np.random.default_rng(0).normal(0, 1.0, (32, 6)).astype(np.float32)
    reference, _, _ = run(build(composite_layer_norm()), golden(float64=True), {"x": x.astype(np.float64)})
    fused = _layer_norm_error(npu(precision_mode="force_fp16"), x, reference["out"])
    assert fused < 0.01


def first_overflow(graph, device, feeds):
    """The name of the op that first raised the float status in a forward pass, or None."""
    executor = Executor(compile_graph(graph, device))
    executor.begin_step(0)
    executor.forward(feeds, dict(graph.initial_params))
    return executor.status.first.name if executor.status.raised else None


def test_fused_layer_norm_squares_overflow_fp16_where_the_unfused_chain_does_not():
    feeds = {"x": np.random.default_rng(0).normal(300.0, 1.0, (8, 6)).astype(np.float32)}  # x * x > 65504
    graph = build(composite_layer_norm())
    assert first_overflow(graph, npu(precision_mode="force_fp16"), feeds) == "blk/LayerNormFused"
    assert first_overflow(graph, npu(precision_mode="force_fp16", fusion_switch=ALL_OFF), feeds) is None


def test_cube_fp32_out_runs_the_matmul_epilogue_in_float32():
    # the fused kernel takes its bias in fp16 like its other inputs; make that exact to compare epilogues
    graph = build(dense(F.gelu))
    bias = graph.initial_params["p1"]
    bias[:] = FLOAT16.round(bias)[0]
    x = np.random.default_rng(0).normal(0, 1, (8, 4)).astype(np.float32)
    device = npu(precision_mode="cube_fp16in_fp32out")
    fused, _, program = run(graph, device, {"x": x})
    (compiled,) = program.nodes
    assert (compiled.precision.compute.name, compiled.precision.output.name) == ("float16", "float32")
    unfused, _, _ = run(graph, replace(device, fusion=ALL_OFF), {"x": x})
    np.testing.assert_allclose(fused["out"], unfused["out"], rtol=1e-6, atol=1e-7)


# Fused kernels against the chains they replace and against finite differences, in float64.

def _chain(*steps):
    """Run unfused kernels one after another in float64; each step is (op type, extra inputs, attrs)."""
    def forward(x):
        for op_type, extra, attrs in steps:
            x = get_op(op_type).forward(KernelContext(FLOAT64), x, *extra, **attrs)
        return x
    return forward


def _rng_arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, s) for s in shapes]


def kernel_cases():
    a, b, bias = _rng_arrays((3, 4), (4, 5), (5,))
    x4, w, gamma, beta = _rng_arrays((2, 3, 5, 5), (4, 3, 3, 3), (4,), (4,), seed=1)
    gamma = gamma + 2  # keep BN's scale away from zero
    xl, gl, bl = _rng_arrays((2, 3, 6), (6,), (6,), seed=2)
    xs, mask = _rng_arrays((2, 3, 4), (3, 4), seed=3)
    mm = {"transpose_a": False, "transpose_b": False, "data_format": "NHWC"}
    return {
        "MatMulBiasAddGelu": ([a, b, bias], mm, lambda: _chain(("MatMul", [b], {}), ("BiasAdd", [bias], {}),
                                                           ("Gelu", [], {}))(a)),
        "MatMulBiasAddRelu": ([a, b, bias], mm, lambda: _chain(("MatMul", [b], {}), ("BiasAdd", [bias], {}),
                                                           ("Relu", [], {}))(a)),
        "MatMulBiasAdd": ([a, b.T.copy(), bias], dict(mm, transpose_b=True),
                          lambda: _chain(("MatMul", [b], {}), ("BiasAdd", [bias], {}))(a)),
        "Conv2DBatchNormRelu": ([x4, w, gamma, beta], {"stride": 1, "padding": 1, "eps": 1e-5},
                                lambda: _chain(("Conv2D", [w], {"padding": 1}), ("BatchNorm", [gamma, beta], {}),
                                               ("Relu", [], {}))(x4)),
        "Conv2DBatchNorm": ([x4, w, gamma, beta], {"stride": 2, "padding": 0, "eps": 1e-5},
                            lambda: _chain(("Conv2D", [w], {"stride": 2}), ("BatchNorm", [gamma, beta], {}))(x4)),
        "LayerNormFused": ([xl, gl, bl, np.array(1e-3)], {},
                           lambda: _chain(("LayerNorm", [gl, bl], {"eps": 1e-3}))(xl)),
        "ScaledMaskedSoftmax": ([xs, np.array(0.7), mask], {"axis": -1},
                                lambda: _chain(("Softmax", [], {}))(xs * 0.7 + mask)),
    }


KERNELS = kernel_cases()


@pytest.mark.parametrize("op_type", KERNELS)
def test_fused_forward_equals_the_unfused_chain_in_float64(op_type):
    inputs, attrs, chain = KERNELS[op_type]
    got = get_op(op_type).forward(KernelContext(FLOAT64), *inputs, **attrs)
    np.testing.assert_allclose(got, chain(), rtol=1e-10, atol=1e-12)


def _numeric_gradient(op_type, inputs, attrs, weights, index, eps=1e-6):
    array = inputs[index].copy()
    grad = np.zeros_like(array)
    for i in np.ndindex(array.shape):
        values = []
        for delta in (eps, -eps):
            moved = array.copy()
            moved[i] += delta
            args = [moved if k == index else v for k, v in enumerate(inputs)]
            values.append(np.sum(get_op(op_type).forward(KernelContext(FLOAT64), *args, **attrs) * weights))
        grad[i] = (values[0] - values[1]) / (2 * eps)
    return grad


@pytest.mark.parametrize("op_type", KERNELS)
def test_fused_backward_matches_finite_differences_in_float64(op_type):
    inputs, attrs, _ = KERNELS[op_type]
    op = get_op(op_type)
    ctx = KernelContext(FLOAT64)
    out = op.forward(ctx, *inputs, **attrs)
    weights = np.random.default_rng(7).uniform(-1, 1, out.shape)
    grads = op.backward(ctx, weights, **attrs)
    assert len(grads) == len(inputs)
    for index, grad in enumerate(grads):
        want = _numeric_gradient(op_type, inputs, attrs, weights, index)
        np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7, err_msg=f"{op_type} input {index}")
