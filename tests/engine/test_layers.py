"""The layer API: hierarchical names, parameter paths, traced op sequences, attention softmaxes."""

import numpy as np
import pytest

from precision_tool.engine import functional as F
from precision_tool.engine import layers as L
from precision_tool.engine.device import golden, npu
from precision_tool.engine.executor import Executor
from precision_tool.engine.graph import GraphBuilder
from precision_tool.engine.program import compile_graph
from precision_tool.errors import ConfigError


class Mlp(L.Module):
    def __init__(self, rng):
        self.fc1 = L.Dense(6, 8, activation="gelu", rng=rng)
        self.fc2 = L.Dense(8, 3, rng=rng)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class MlpNet(L.Model):
    def __init__(self, seed=0, task="classification"):
        rng = np.random.default_rng(seed)
        self.data = L.DataSpec("features", (6,), task, num_classes=3, output_dim=3)
        self.mlp = Mlp(rng)

    def forward(self, x):
        return self.mlp(x)


class AttentionNet(L.Model):
    """Features of shape (seq_len, dim) -> attention -> mean over the sequence -> classes."""

    def __init__(self, softmax="naive", causal=False):
        rng = np.random.default_rng(0)
        self.data = L.DataSpec("features", (4, 8), "classification", num_classes=2)
        self.attn = L.MultiHeadAttention(8, 2, rng=rng, softmax=softmax, causal=causal)
        self.head = L.Dense(8, 2, rng=rng)

    def forward(self, x):
        return self.head(F.reduce_mean(self.attn(x), 1))


def run(graph, device, feeds):
    """One forward pass; returns the outputs and the executor (for its float status)."""
    executor = Executor(compile_graph(graph, device))
    executor.begin_step(0)
    return executor.forward(feeds, dict(graph.initial_params)), executor


def test_names_are_hierarchical_and_stable_across_traces():
    first = [n.name for n in L.trace(MlpNet()).nodes]
    assert first == [n.name for n in L.trace(MlpNet()).nodes]
    assert first == ["mlp/fc1/MatMul", "mlp/fc1/BiasAdd", "mlp/fc1/Gelu",
                     "mlp/fc2/MatMul", "mlp/fc2/BiasAdd", "SoftmaxCrossEntropy"]


def test_dense_with_gelu_traces_matmul_biasadd_gelu_and_the_loss():
    graph = L.trace(MlpNet())
    assert [n.type for n in graph.nodes[:3]] == ["MatMul", "BiasAdd", "Gelu"]
    assert graph.nodes[0].inputs[1].name == "mlp/fc1/weight"
    assert graph.nodes[1].inputs[1].name == "mlp/fc1/bias"
    assert list(graph.outputs) == ["logits", "loss"]
    assert graph.outputs["logits"] is graph.nodes[4].outputs[0]
    assert graph.inputs["x"].is_float and not graph.inputs["labels"].is_float


def test_regression_uses_mse_and_float_labels():
    graph = L.trace(MlpNet(task="regression"))
    assert graph.nodes[-1].name == "MSELoss"
    assert graph.inputs["labels"].is_float


def test_parameter_paths_follow_attributes_and_name_the_graph_params():
    model = MlpNet()
    paths = [p for p, _ in model.named_parameters()]
    assert paths == ["mlp/fc1/weight", "mlp/fc1/bias", "mlp/fc2/weight", "mlp/fc2/bias"]
    graph = L.trace(model)
    assert list(graph.params) == paths
    assert [p.name for p in model.parameters()] == paths
    assert graph.initial_params["mlp/fc1/weight"].shape == (6, 8)
    assert graph.initial_params["mlp/fc1/weight"].dtype == np.float32


def test_sequential_children_are_numbered():
    rng = np.random.default_rng(0)
    seq = L.Sequential(L.Dense(4, 4, rng=rng), L.Relu(), L.Dense(4, 2, rng=rng))
    assert [p for p, _ in seq.named_parameters()] == ["0/weight", "0/bias", "2/weight", "2/bias"]
    seq.name_parameters()
    with GraphBuilder() as b:
        with b.scope("body"):
            seq(b.input("x"))
    assert [n.name for n in b.graph.nodes] == ["body/0/MatMul", "body/0/BiasAdd", "body/1/Relu",
                                               "body/2/MatMul", "body/2/BiasAdd"]


def test_initial_weights_depend_only_on_the_rng():
    same = L.trace(MlpNet(seed=3)).initial_params, L.trace(MlpNet(seed=3)).initial_params
    other = L.trace(MlpNet(seed=4)).initial_params
    for name, value in same[0].items():
        np.testing.assert_array_equal(value, same[1][name])
    assert not np.array_equal(same[0]["mlp/fc1/weight"], other["mlp/fc1/weight"])


def test_conv_batchnorm_embedding_and_activation_layers_trace_their_ops():
    rng = np.random.default_rng(0)
    conv = L.Conv2d(3, 4, 3, padding=1, bias=True, rng=rng)
    assert conv.weight.shape == (4, 3, 3, 3)
    model = L.Sequential(conv, L.BatchNorm(4), L.Tanh(), L.Sigmoid(), L.Dropout(0.1))
    model.name_parameters()
    with GraphBuilder() as b:
        model(b.input("x"))
    assert [n.type for n in b.graph.nodes] == ["Conv2D", "BiasAdd", "BatchNorm", "Tanh", "Sigmoid", "Dropout"]
    assert b.graph.nodes[1].attrs["data_format"] == "NCHW"
    assert list(b.graph.params) == ["0/weight", "0/bias", "1/gamma", "1/beta"]
    embed = L.Embedding(10, 4, rng=rng)
    embed.name_parameters()
    with GraphBuilder() as b:
        embed(b.input("x", is_float=False))
    assert [n.type for n in b.graph.nodes] == ["Gather"]


def _layer_norm_graph(composite):
    ln = L.LayerNorm(16, composite=composite)
    ln.gamma.value[:] = np.linspace(0.5, 1.5, 16)
    ln.beta.value[:] = np.linspace(-1, 1, 16)
    ln.name_parameters()
    with GraphBuilder() as b:
        b.output("y", ln(b.input("x")))
    return b.graph


def test_composite_layer_norm_traces_tf_primitives_and_matches_the_op_on_golden():
    composite = _layer_norm_graph(True)
    assert [n.type for n in composite.nodes] == ["ReduceMean", "Sub", "Square", "ReduceMean", "Add",
                                                 "Rsqrt", "Mul", "Mul", "Add"]
    x = np.random.default_rng(0).normal(2.0, 3.0, (8, 16)).astype(np.float32)
    want, _ = run(_layer_norm_graph(False), golden(), {"x": x})
    got, _ = run(composite, golden(), {"x": x})
    np.testing.assert_allclose(got["y"], want["y"], rtol=0, atol=2e-6)


def test_stable_attention_traces_scale_mask_softmax():
    graph = L.trace(AttentionNet(softmax="stable", causal=True))
    types = {n.name: n.type for n in graph.nodes}
    assert types["attn/Mul"] == "Mul" and types["attn/Add"] == "Add" and types["attn/Softmax"] == "Softmax"
    assert "attn/q/MatMul" in types and "attn/out/BiasAdd" in types
    mask = graph.constants[graph.node("attn/Add").inputs[1].name]
    np.testing.assert_array_equal(mask, L.causal_mask(4))
    assert mask[0, 1] == L.MASK_VALUE and mask[1, 0] == 0


def _large_scores_input():
    # scores reach ~40: exp overflows fp16 (max 65504 = e^11.09) but not float32 (e^88.7)
    return np.random.default_rng(1).normal(0, 3.0, (2, 4, 8)).astype(np.float32)


def test_naive_attention_softmax_overflows_fp16_first_at_exp():
    graph = L.trace(AttentionNet(softmax="naive"))
    feeds = {"x": _large_scores_input(), "labels": np.array([0, 1])}
    _, executor = run(graph, npu(precision_mode="force_fp16", overflow_mode="saturation"), feeds)
    assert executor.status.raised
    assert executor.status.first.type == "Exp"
    assert executor.status.first.name == "attn/Exp"
    assert np.max(executor.value("attn/Exp")) == 65504.0  # saturated, not inf
    _, reference = run(graph, golden(), feeds)
    assert not reference.status.raised
    assert 11.1 < np.max(reference.value("attn/Mul")) < 80  # the scores that overflow fp16 exp


def test_naive_attention_stays_finite_with_small_scores():
    graph = L.trace(AttentionNet(softmax="naive"))
    feeds = {"x": _large_scores_input() / 10, "labels": np.array([0, 1])}
    _, executor = run(graph, npu(precision_mode="force_fp16"), feeds)
    assert not executor.status.raised


def test_bad_layer_arguments_are_config_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="activation"):
        L.Dense(2, 2, activation="swish", rng=rng)
    with pytest.raises(ConfigError, match="rng"):
        L.Dense(2, 2)
    with pytest.raises(ConfigError, match="multiple of heads"):
        L.MultiHeadAttention(10, 3, rng=rng)
    with pytest.raises(ConfigError, match="softmax"):
        L.MultiHeadAttention(8, 2, rng=rng, softmax="fast")
    with pytest.raises(ConfigError, match="data kind"):
        L.DataSpec("audio", (4,), "classification", num_classes=2)
    with pytest.raises(ConfigError, match="num_classes"):
        L.DataSpec("features", (4,), "classification")


def test_attention_needs_a_sequence_length_for_image_data():
    class ImageAttention(L.Model):
        def __init__(self):
            self.data = L.DataSpec("images", (3, 4, 4), "classification", num_classes=2)
            self.attn = L.MultiHeadAttention(4, 2, rng=np.random.default_rng(0))

        def forward(self, x):
            return self.attn(x)

    with pytest.raises(ConfigError, match="seq_len"):
        L.trace(ImageAttention())


def test_trace_needs_a_dataspec():
    with pytest.raises(ConfigError, match="DataSpec"):
        L.trace(L.Model())
