"""Compiling a traced graph for a device: fusion, then a format for every value."""

from __future__ import annotations

from dataclasses import dataclass, field

from precision_tool.engine.device import DeviceProfile
from precision_tool.engine.formats import Format, get_format
from precision_tool.engine.graph import OP, Graph, Node
from precision_tool.engine.ops import OpDef, get_op
from precision_tool.engine.precision import NodePrecision, decide
from precision_tool.errors import NotFoundError


@dataclass
class CompiledNode:
    """A node with its kernel and the formats it computes in."""

    node: Node
    op: OpDef
    precision: NodePrecision
    input_formats: tuple[Format | None, ...]  # None for integer inputs


@dataclass
class Program:
    """A graph compiled for one device."""

    graph: Graph
    device: DeviceProfile
    nodes: list[CompiledNode]
    value_formats: dict[int, Format]  # value uid -> format it is held in
    fusion_counts: dict[str, int] = field(default_factory=dict)

    def node(self, name: str) -> CompiledNode:
        for compiled in self.nodes:
            if compiled.node.name == name:
                return compiled
        raise NotFoundError(f"no node named {name!r} in the program")


def compile_graph(graph: Graph, device: DeviceProfile) -> Program:
    """Apply the device's fusion passes, then decide every node's formats."""
    fusion_counts: dict[str, int] = {}
    if device.kind == "npu":
        from precision_tool.engine.fusion import apply_fusion

        graph, fusion_counts = apply_fusion(graph, device.fusion.enabled)
    policy = device.policy
    origin = device.origin
    formats: dict[int, Format] = {}
    for value in [*graph.inputs.values(), *graph.params.values()]:
        formats[value.uid] = origin
    compiled = []
    for node in graph.nodes:
        op = get_op(node.type)
        input_formats = tuple(_value_format(v, formats, origin) for v in node.inputs)
        activations = [f for v, f in zip(node.inputs, input_formats) if f is not None and v.kind == OP]
        membership = device.mixlists.membership(node.type, op.amp)
        cast_to = get_format(node.attrs["dtype"]) if op.category == "cast" else None
        if cast_to is not None and origin.bits == 64:
            cast_to = origin  # a float64 golden run stays float64 throughout
        precision = decide(op.category, membership, policy, origin, activations, cast_to)
        for value in node.outputs:
            formats[value.uid] = precision.output
        compiled.append(CompiledNode(node, op, precision, input_formats))
    return Program(graph, device, compiled, formats, fusion_counts)


def _value_format(value, formats: dict[int, Format], origin: Format) -> Format | None:
    if not value.is_float:
        return None
    return formats.get(value.uid, origin)
