"""The fusion-pass framework: match op chains, splice in one fused node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from precision_tool.engine.graph import FusionInfo, Graph, Node, Value


@dataclass(frozen=True)
class FusionPass:
    """A named graph pass.

    ``match(node, consumers, graph_outputs)`` is tried on every node in execution order and
    returns the nodes to fuse (the anchor first, in execution order) or None.
    ``fused_type`` is the registered op type of the fused kernel;
    ``build(nodes)`` returns the fused node's external inputs and attrs.
    """

    name: str
    fused_type: str
    match: Callable[[Node, dict[int, list[Node]], set[int]], list[Node] | None]
    build: Callable[[list[Node]], tuple[list[Value], dict]]


# Passes in priority order: longer patterns before their prefixes.
PASSES: list[FusionPass] = []


def register_pass(fusion_pass: FusionPass) -> FusionPass:
    PASSES.append(fusion_pass)
    return fusion_pass


def external_inputs(nodes: list[Node]) -> list[Value]:
    """Inputs of ``nodes`` produced outside them, first use first, without repeats."""
    inside = {v.uid for n in nodes for v in n.outputs}
    seen: set[int] = set()
    values = []
    for node in nodes:
        for value in node.inputs:
            if value.uid not in inside and value.uid not in seen:
                seen.add(value.uid)
                values.append(value)
    return values


def input_origins(nodes: list[Node], inputs: list[Value]) -> tuple[tuple[str, int], ...]:
    """For each fused input: the (original node, input slot) that consumed it.

    A value passed twice (``MatMul(x, x)``) maps to its successive uses.
    """
    uses = [(node.name, slot, value.uid) for node in nodes for slot, value in enumerate(node.inputs)]
    origins = []
    for value in inputs:
        use = next(u for u in uses if u[2] == value.uid)
        uses.remove(use)
        origins.append(use[:2])
    return tuple(origins)


def single_consumer(value: Value, consumers: dict[int, list[Node]], graph_outputs: set[int]) -> Node | None:
    """The only node reading ``value``, or None when it has several or is a graph output."""
    users = consumers.get(value.uid, [])
    if len(users) != 1 or value.uid in graph_outputs:
        return None
    return users[0]


def apply_fusion(graph: Graph, enabled: Callable[[str], bool]) -> tuple[Graph, dict[str, int]]:
    """A copy of ``graph`` with every enabled pass applied; also the count per pass.

    The fused node takes the execution position of the last node it replaces,
    reuses that node's output value, and is named after the anchor's scope.
    """
    passes = [p for p in PASSES if enabled(p.name)]
    counts: dict[str, int] = {}
    if not passes:
        return graph, counts
    consumers = graph.consumers()
    outputs = {v.uid for v in graph.outputs.values()}
    fused_at: dict[int, Node] = {}  # id(last original node) -> fused node
    absorbed: set[int] = set()
    used_names = {n.name for n in graph.nodes}
    for node in graph.nodes:
        if id(node) in absorbed:
            continue
        for fusion_pass in passes:
            matched = fusion_pass.match(node, consumers, outputs)
            if not matched or any(id(n) in absorbed for n in matched):
                continue
            fused = _fuse(fusion_pass, matched, used_names)
            absorbed.update(id(n) for n in matched)
            fused_at[id(matched[-1])] = fused
            counts[fusion_pass.name] = counts.get(fusion_pass.name, 0) + 1
            break
    nodes = []
    for node in graph.nodes:
        if id(node) in fused_at:
            nodes.append(fused_at[id(node)])
        elif id(node) not in absorbed:
            nodes.append(node)
    fused_graph = Graph(nodes=nodes, inputs=graph.inputs, params=graph.params,
                        initial_params=graph.initial_params, constants=graph.constants,
                        outputs=graph.outputs)
    return fused_graph, counts


def _fuse(fusion_pass: FusionPass, matched: list[Node], used_names: set[str]) -> Node:
    inputs, attrs = fusion_pass.build(matched)
    scope = matched[0].name.rsplit("/", 1)[0] if "/" in matched[0].name else ""
    base = f"{scope}/{fusion_pass.fused_type}" if scope else fusion_pass.fused_type
    name, k = base, 0
    while name in used_names:
        k += 1
        name = f"{base}_{k}"
    used_names.add(name)
    last = matched[-1]
    info = FusionInfo(
        pass_name=fusion_pass.name,
        original_names=tuple(n.name for n in matched),
        original_types=tuple(n.type for n in matched),
        output_origins=((last.name, 0),),
        input_origins=input_origins(matched, inputs),
    )
    return Node(name, fusion_pass.fused_type, tuple(inputs), last.outputs, attrs, info)
