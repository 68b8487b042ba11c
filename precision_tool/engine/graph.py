"""The traced op graph: values, nodes, hierarchical names and the builder.

A model is traced once into a `Graph`; devices then compile it (fusion
passes, precision assignment) and the executor runs it every step. Node names
are built from the module scope and the op type (``block1/attn/Softmax``), with
``_1``, ``_2`` ... for repeats in one scope, so they are the same on every run
and every device: dumps and comparisons key on them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from precision_tool.errors import ConfigError, NotFoundError

# Kinds of graph values.
INPUT = "input"  # data fed every step
PARAM = "param"  # trainable weight, updated by the optimizer
CONST = "const"  # a fixed array traced from a Python or numpy constant
OP = "op"  # produced by a node


class Value:
    """A symbolic tensor: a graph input, a parameter, or a node output."""

    __slots__ = ("name", "kind", "producer", "slot", "is_float", "uid")

    def __init__(self, name: str, kind: str, producer: "Node | None" = None, slot: int = 0,
                 is_float: bool = True, uid: int = 0):
        self.name = name
        self.kind = kind
        self.producer = producer
        self.slot = slot
        self.is_float = is_float
        self.uid = uid

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.kind})"

    # Operators keep model code readable; they trace the very ops the functional API does
    # (`precision_tool.engine.functional` builds on this module, so they trace here, not through it).
    def __add__(self, other):
        return _trace("Add", self, other)

    def __radd__(self, other):
        return _trace("Add", other, self)

    def __sub__(self, other):
        return _trace("Sub", self, other)

    def __rsub__(self, other):
        return _trace("Sub", other, self)

    def __mul__(self, other):
        return _trace("Mul", self, other)

    def __rmul__(self, other):
        return _trace("Mul", other, self)

    def __truediv__(self, other):
        return _trace("RealDiv", self, other)

    def __matmul__(self, other):
        return _trace("MatMul", self, other, transpose_a=False, transpose_b=False)


def _trace(op_type: str, a, b, **attrs) -> "Value":
    """One binary op traced into the active builder, as `functional` traces it."""
    (out,) = GraphBuilder.current().add(op_type, [a, b], attrs, float_outputs=True)
    return out


@dataclass
class FusionInfo:
    """What a fused node replaced, so comparisons can map it back."""

    pass_name: str
    original_names: tuple[str, ...]
    original_types: tuple[str, ...]
    # For each fused output: the (original op name, output slot) it stands for.
    output_origins: tuple[tuple[str, int], ...]
    # For each fused input: the (original op name, input slot) that consumed it;
    # the gradient a fused backward returns for it stands for that op's input gradient.
    input_origins: tuple[tuple[str, int], ...]


@dataclass
class Node:
    """One op in the graph."""

    name: str
    type: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    fusion: FusionInfo | None = None

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.type})"


class Parameter:
    """A trainable weight with its initial value; named from the module tree."""

    __slots__ = ("value", "name")

    def __init__(self, value: np.ndarray, name: str = ""):
        self.value = np.asarray(value, dtype=np.float32)
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.shape})"


@dataclass
class Graph:
    """A traced model: nodes in execution order plus its inputs, parameters and outputs."""

    nodes: list[Node] = field(default_factory=list)
    inputs: dict[str, Value] = field(default_factory=dict)
    params: dict[str, Value] = field(default_factory=dict)
    initial_params: dict[str, np.ndarray] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, Value] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        """The node called ``name``; KeyError names it when absent."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise NotFoundError(f"no node named {name!r} in the graph")

    def consumers(self) -> dict[int, list[Node]]:
        """Map each value's uid to the nodes that read it."""
        users: dict[int, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                users.setdefault(value.uid, []).append(node)
        return users

    def op_types(self) -> set[str]:
        return {node.type for node in self.nodes}


class GraphBuilder:
    """Records ops into a `Graph` while a model's forward runs.

    Use it as a context manager; the functional API (`engine.functional`)
    adds nodes to the innermost active builder.
    """

    _active: list["GraphBuilder"] = []

    def __init__(self) -> None:
        self.graph = Graph()
        self._scope: list[str] = []
        self._used_names: dict[str, int] = {}
        self._param_values: dict[int, Value] = {}
        self._next_uid = 0

    def __enter__(self) -> "GraphBuilder":
        GraphBuilder._active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        GraphBuilder._active.remove(self)

    @classmethod
    def current(cls) -> "GraphBuilder":
        if not cls._active:
            raise RuntimeError("ops can only be traced inside a GraphBuilder context")
        return cls._active[-1]

    def _uid(self) -> int:
        self._next_uid += 1
        return self._next_uid

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Nest the names of the ops traced inside under ``name``."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    @contextlib.contextmanager
    def prefixed(self, *prefix: str) -> Iterator[None]:
        """Name the ops traced inside ``prefix/<current scope>/...``: ops a graph rewrite introduced."""
        saved = self._scope
        self._scope = [*prefix, *saved]
        try:
            yield
        finally:
            self._scope = saved

    def unique_name(self, base: str) -> str:
        """``base`` itself the first time, then ``base_1``, ``base_2``, ..."""
        count = self._used_names.get(base, 0)
        self._used_names[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def input(self, name: str, is_float: bool = True) -> Value:
        """Declare a data input fed every step."""
        if name in self.graph.inputs:
            raise ConfigError(f"graph input {name!r} declared twice")
        value = Value(name, INPUT, is_float=is_float, uid=self._uid())
        self.graph.inputs[name] = value
        return value

    def param(self, param: Parameter) -> Value:
        """The graph value of a parameter, created on its first use."""
        value = self._param_values.get(id(param))
        if value is None:
            if not param.name:
                raise ConfigError("parameter has no name; build models from the layer API's Module")
            if param.name in self.graph.params:
                raise ConfigError(f"two parameters are both named {param.name!r}")
            value = Value(param.name, PARAM, uid=self._uid())
            self._param_values[id(param)] = value
            self.graph.params[param.name] = value
            self.graph.initial_params[param.name] = param.value
        return value

    def add(self, op_type: str, inputs: list, attrs: dict | None = None, n_outputs: int = 1,
            float_outputs: bool = True) -> tuple[Value, ...]:
        """Append a node of ``op_type``; return its output values."""
        values = tuple(self.as_value(x) for x in inputs)
        name = self.unique_name("/".join([*self._scope, op_type]))
        node = Node(name, op_type, values, (), dict(attrs or {}))
        node.outputs = tuple(
            Value(name if n_outputs == 1 else f"{name}:{i}", OP, node, i, float_outputs, self._uid())
            for i in range(n_outputs)
        )
        self.graph.nodes.append(node)
        return node.outputs

    def as_value(self, x) -> Value:
        """Turn a Value, Parameter or Python/numpy constant into a graph value."""
        if isinstance(x, Value):
            return x
        if isinstance(x, Parameter):
            return self.param(x)
        if isinstance(x, (int, float, np.ndarray, np.generic, list)):
            array = np.asarray(x)
            is_float = not np.issubdtype(array.dtype, np.integer) and array.dtype != bool
            if is_float:
                array = array.astype(np.float32)
            name = self.unique_name("/".join([*self._scope, "Const"]))
            value = Value(name, CONST, is_float=is_float, uid=self._uid())
            self.graph.constants[name] = array
            return value
        raise TypeError(f"cannot use {type(x).__name__} as an op input")

    def output(self, name: str, value: Value) -> None:
        """Name a value the executor returns (``logits``, ``loss``)."""
        self.graph.outputs[name] = value
