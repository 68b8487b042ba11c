"""The fusion passes of the simulated NPU, in priority order (longer patterns first).

pass name -> pattern -> fused op type:

- MatMulBiasAddGeluFusionPass: MatMul -> BiasAdd -> Gelu -> MatMulBiasAddGelu
- MatMulBiasAddReluFusionPass: MatMul -> BiasAdd -> Relu -> MatMulBiasAddRelu
- MatMulBiasAddFusionPass: MatMul -> BiasAdd -> MatMulBiasAdd
- Conv2DBatchNormReluFusionPass: Conv2D -> BatchNorm -> Relu -> Conv2DBatchNormRelu
- Conv2DBatchNormFusionPass: Conv2D -> BatchNorm -> Conv2DBatchNorm
- LayerNormFusionPass: TF's composite layer norm (ReduceMean, Sub, Square, ReduceMean,
  Add(eps), Rsqrt, Mul, Mul(gamma), Add(beta); see `layers.LayerNorm`) -> LayerNormFused
- SoftmaxScaleMaskFusionPass: Mul(x, scale constant) -> [Add(mask)] -> Softmax -> ScaledMaskedSoftmax

A chain fuses only when every intermediate value is read by nodes of the
chain alone and is not a graph output. How the fused kernels compute is in
`engine.ops.fused`.
"""

from __future__ import annotations

from precision_tool.engine.fusion.base import FusionPass, register_pass, single_consumer
from precision_tool.engine.graph import CONST, Node, Value
from precision_tool.engine.ops import fused


def _next(value: Value, consumers, graph_outputs, op_type: str, slot: int | None = 0) -> Node | None:
    """The only reader of ``value`` if it is an ``op_type`` taking it at ``slot`` (None: any slot)."""
    node = single_consumer(value, consumers, graph_outputs)
    if node is None or node.type != op_type:
        return None
    if slot is not None and (len(node.inputs) <= slot or node.inputs[slot].uid != value.uid):
        return None
    return node


def _other_input(node: Node, value: Value) -> Value | None:
    """The input of a two-input ``node`` that is not ``value``."""
    a, b = node.inputs
    if a.uid == value.uid:
        return b
    return a if b.uid == value.uid else None


def chain(*op_types: str):
    """A matcher for a straight chain, each op reading the previous one's output at input 0."""

    def match(node: Node, consumers, graph_outputs) -> list[Node] | None:
        if node.type != op_types[0]:
            return None
        nodes = [node]
        for op_type in op_types[1:]:
            following = _next(nodes[-1].outputs[0], consumers, graph_outputs, op_type)
            if following is None:
                return None
            nodes.append(following)
        return nodes

    return match


def _build_matmul_bias(nodes: list[Node]):
    matmul, bias_add = nodes[:2]
    attrs = {
        "transpose_a": matmul.attrs.get("transpose_a", False),
        "transpose_b": matmul.attrs.get("transpose_b", False),
        "data_format": bias_add.attrs.get("data_format", "NHWC"),
    }
    return [*matmul.inputs, bias_add.inputs[1]], attrs


def _build_conv_batch_norm(nodes: list[Node]):
    conv, batch_norm = nodes[:2]
    attrs = {
        "stride": conv.attrs.get("stride", 1),
        "padding": conv.attrs.get("padding", 0),
        "eps": batch_norm.attrs.get("eps", 1e-5),
    }
    return [*conv.inputs, *batch_norm.inputs[1:]], attrs


def _is_last_axis_mean(node: Node | None) -> bool:
    return (node is not None and node.type == "ReduceMean" and bool(node.attrs.get("keepdims"))
            and node.attrs.get("axis") in (-1, (-1,)))


def match_layer_norm(node: Node, consumers, graph_outputs) -> list[Node] | None:
    """ReduceMean, Sub, Square, ReduceMean, Add(eps), Rsqrt, Mul, Mul(gamma), Add(beta)."""
    if not _is_last_axis_mean(node):
        return None
    x = node.inputs[0]
    sub = _next(node.outputs[0], consumers, graph_outputs, "Sub", slot=1)
    if sub is None or sub.inputs[0].uid != x.uid:
        return None
    centered = sub.outputs[0]
    readers = consumers.get(centered.uid, [])
    square = next((n for n in readers if n.type == "Square"), None)
    if len(readers) != 2 or square is None or centered.uid in graph_outputs:
        return None
    variance = _next(square.outputs[0], consumers, graph_outputs, "ReduceMean")
    if not _is_last_axis_mean(variance):
        return None
    add_eps = _next(variance.outputs[0], consumers, graph_outputs, "Add", slot=None)
    if add_eps is None or _other_input(add_eps, variance.outputs[0]).kind != CONST:
        return None
    rsqrt = _next(add_eps.outputs[0], consumers, graph_outputs, "Rsqrt")
    scaled = rsqrt and _next(rsqrt.outputs[0], consumers, graph_outputs, "Mul", slot=None)
    if not scaled or not any(n is scaled for n in readers) or _other_input(scaled, rsqrt.outputs[0]) is not centered:
        return None
    times_gamma = _next(scaled.outputs[0], consumers, graph_outputs, "Mul", slot=None)
    plus_beta = times_gamma and _next(times_gamma.outputs[0], consumers, graph_outputs, "Add", slot=None)
    if not plus_beta:
        return None
    return [node, sub, square, variance, add_eps, rsqrt, scaled, times_gamma, plus_beta]


def _build_layer_norm(nodes: list[Node]):
    mean, _, _, variance, add_eps, _, scaled, times_gamma, plus_beta = nodes
    eps = _other_input(add_eps, variance.outputs[0])
    gamma = _other_input(times_gamma, scaled.outputs[0])
    beta = _other_input(plus_beta, times_gamma.outputs[0])
    return [mean.inputs[0], gamma, beta, eps], {}


def match_scaled_softmax(node: Node, consumers, graph_outputs) -> list[Node] | None:
    """Mul(x, scale constant) -> optional Add(mask) -> Softmax."""
    if node.type != "Mul" or _scale_slot(node) is None:
        return None
    scaled = node.outputs[0]
    masked = _next(scaled, consumers, graph_outputs, "Add", slot=None)
    if masked is not None:
        scaled = masked.outputs[0]
    softmax = _next(scaled, consumers, graph_outputs, "Softmax")
    if softmax is None:
        return None
    return [node, masked, softmax] if masked is not None else [node, softmax]


def _scale_slot(mul: Node) -> int | None:
    """Which input of ``mul`` is the scale constant (the other one is not a constant)."""
    kinds = [v.kind for v in mul.inputs]
    if kinds.count(CONST) != 1:
        return None
    return kinds.index(CONST)


def _build_scaled_softmax(nodes: list[Node]):
    mul, softmax = nodes[0], nodes[-1]
    slot = _scale_slot(mul)
    inputs = [mul.inputs[1 - slot], mul.inputs[slot]]
    if len(nodes) == 3:
        inputs.append(_other_input(nodes[1], mul.outputs[0]))
    return inputs, {"axis": softmax.attrs.get("axis", -1)}


for _pass in (
    FusionPass("MatMulBiasAddGeluFusionPass", fused.MATMUL_BIAS_ADD_GELU,
               chain("MatMul", "BiasAdd", "Gelu"), _build_matmul_bias),
    FusionPass("MatMulBiasAddReluFusionPass", fused.MATMUL_BIAS_ADD_RELU,
               chain("MatMul", "BiasAdd", "Relu"), _build_matmul_bias),
    FusionPass("MatMulBiasAddFusionPass", fused.MATMUL_BIAS_ADD,
               chain("MatMul", "BiasAdd"), _build_matmul_bias),
    FusionPass("Conv2DBatchNormReluFusionPass", fused.CONV2D_BATCH_NORM_RELU,
               chain("Conv2D", "BatchNorm", "Relu"), _build_conv_batch_norm),
    FusionPass("Conv2DBatchNormFusionPass", fused.CONV2D_BATCH_NORM,
               chain("Conv2D", "BatchNorm"), _build_conv_batch_norm),
    FusionPass("LayerNormFusionPass", fused.LAYER_NORM_FUSED, match_layer_norm, _build_layer_norm),
    FusionPass("SoftmaxScaleMaskFusionPass", fused.SCALED_MASKED_SOFTMAX,
               match_scaled_softmax, _build_scaled_softmax),
):
    register_pass(_pass)
