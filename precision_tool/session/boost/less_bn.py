"""LessBN: fewer BatchNorms in residual blocks, the full-normalisation head, gradient centralisation.

* **Removing BatchNorm.** MindSpore's graph pass matches ResNet, MobileNet
  and DenseNet block patterns and removes some of their BatchNorm nodes.
  Here the pattern is found on the traced graph, for any model: an ``Add``
  of a module scope that reads one value from outside the scope (the block
  input, the identity path) and one from inside (the residual branch) is a
  residual block; walking the branch back to the block input, its BatchNorm
  ops in execution order are collected, and all but the last are removed
  (the last, feeding the Add, keeps the branch output normalised). For the
  ``cnn`` model that removes ``block1/bn1`` and ``block2/bn1`` and keeps the
  stem's BatchNorm and both ``bn2``. This choice of which BatchNorms go is
  this tool's: the C++ pass's 16 patterns are not reproduced.
* **FN head** (``fn_flag``): the last Dense of the model (module-tree order)
  becomes ``y = multiplier * (L2Normalize(x, axis=1) @ L2Normalize(W))``
  with W normalised per output unit, a learnable scalar multiplier (init 1)
  and no bias, as CommonHeadLastFN. It starts from the Dense's own weight so
  that golden and boost runs compare weight for weight (MindSpore
  initialises it afresh). L2Normalize is traced as Square, ReduceSum, Add
  (epsilon 1e-12, where MindSpore takes max(sum, 1e-4)), Rsqrt and Mul;
  its ops are named ``boost/fn_head/<head path>/...``.
* **Gradient centralisation** (``gc_flag``): before the update, every
  gradient with more than one dimension loses its mean over all axes but
  the output axis (axis 0 for a convolution's (out, in, kh, kw) weight, the
  last axis for a Dense's (in, out) weight), one op per parameter named
  ``boost/less_bn/gc/<param>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from precision_tool.engine import functional as F
from precision_tool.engine.graph import Graph, GraphBuilder, Parameter
from precision_tool.engine.hooks import OPTIMIZER
from precision_tool.engine.layers import BatchNorm, Dense, Module, trace

FN_EPSILON = 1e-12
FN_PREFIX = ("boost", "fn_head")
GC_PREFIX = "boost/less_bn/gc"


class RemovedBatchNorm(Module):
    """Where LessBN removed a BatchNorm: passes its input through, traces nothing."""

    def forward(self, x):
        return x


class FullNormalizationHead(Module):
    """``multiplier * (L2Normalize(x, axis=1) @ L2Normalize(weight, axis=0))``; weight (in, out), no bias."""

    def __init__(self, weight: np.ndarray):
        self.weight = Parameter(np.array(weight, np.float32))
        self.multiplier = Parameter(np.ones(1, np.float32))

    def __call__(self, x):
        builder = GraphBuilder.current()
        with builder.prefixed(*FN_PREFIX), builder.scope(self.__dict__.get("_scope_name", "fn_head")):
            return self.forward(x)

    def forward(self, x):
        return F.mul(F.matmul(l2_normalize(x, 1), l2_normalize(self.weight, 0)), self.multiplier)


def l2_normalize(x, axis: int):
    """``x / sqrt(sum(x^2, axis) + FN_EPSILON)`` traced from primitive ops."""
    total = F.reduce_sum(F.square(x), axis=axis, keepdims=True)
    return F.mul(x, F.rsqrt(F.add(total, FN_EPSILON)))


def residual_batch_norms(graph: Graph) -> list[str]:
    """Names of the BatchNorm ops LessBN removes, in execution order (see the module docstring)."""
    producers = {value.uid: node for node in graph.nodes for value in node.outputs}
    order = {node.name: i for i, node in enumerate(graph.nodes)}
    removed: list[str] = []
    for node in graph.nodes:
        if node.type != "Add" or "/" not in node.name:
            continue
        scope = node.name.rsplit("/", 1)[0] + "/"
        inside = [v for v in node.inputs if _inside(producers.get(v.uid), scope)]
        if len(inside) != 1 or len(node.inputs) != 2:
            continue
        norms = sorted(_branch_batch_norms(inside[0], producers, scope), key=order.__getitem__)
        removed += [name for name in norms[:-1] if name not in removed]
    return sorted(removed, key=order.__getitem__)


def _inside(node, scope: str) -> bool:
    return node is not None and node.name.startswith(scope)


def _branch_batch_norms(value, producers, scope: str) -> set[str]:
    found, seen, stack = set(), set(), [value]
    while stack:
        node = producers.get(stack.pop().uid)
        if not _inside(node, scope) or node.name in seen:
            continue
        seen.add(node.name)
        if node.type == "BatchNorm":
            found.add(node.name)
        stack.extend(node.inputs)
    return found


@dataclass
class LessBNResult:
    """What LessBN changed in the model."""

    removed_ops: list[str] = field(default_factory=list)  # BatchNorm op names golden runs and boost does not
    removed_modules: list[str] = field(default_factory=list)
    fn_head: str | None = None  # the module path of the replaced Dense
    replaced_ops: list[str] = field(default_factory=list)  # the Dense's ops the FN head replaces


def apply_less_bn(model: Module, fn_flag: bool) -> LessBNResult:
    """Rewrite ``model`` in place: remove residual-branch BatchNorms, and the last Dense with ``fn_flag``."""
    graph = trace(model)
    result = LessBNResult()
    for op in residual_batch_norms(graph):
        path = op.rsplit("/", 1)[0]
        if not isinstance(model.module(path), BatchNorm):
            continue  # a BatchNorm op traced by a module that is not a BatchNorm layer: left alone
        parent, _, name = path.rpartition("/")
        model.module(parent).replace_child(name, RemovedBatchNorm())
        result.removed_ops.append(op)
        result.removed_modules.append(path)
    if fn_flag:
        dense = [(path, m) for path, m in model.named_modules() if isinstance(m, Dense) and path]
        if dense:
            path, layer = dense[-1]
            parent, _, name = path.rpartition("/")
            model.module(parent).replace_child(name, FullNormalizationHead(layer.weight.value))
            result.fn_head = path
            result.replaced_ops = [n.name for n in graph.nodes if n.name.startswith(path + "/")]
    return result


def output_axes(model: Module) -> dict[str, int]:
    """The output axis of every parameter: the last for Dense-style (in, out) weights, else 0."""
    axes = {}
    for path, module in model.named_modules():
        for name, member in module.__dict__.get("_members", {}).items():
            if isinstance(member, Parameter):
                full = f"{path}/{name}" if path else name
                axes[full] = member.value.ndim - 1 if isinstance(module, (Dense, FullNormalizationHead)) else 0
    return axes


def centralize(grad: np.ndarray, axis: int) -> np.ndarray:
    """``grad`` minus its mean over every axis but ``axis`` (unchanged for ndim <= 1)."""
    if grad.ndim <= 1:
        return grad
    others = tuple(a for a in range(grad.ndim) if a != axis % grad.ndim)
    return (grad - grad.mean(axis=others, keepdims=True, dtype=np.float32)).astype(np.float32)


def gradient_centralization(executor, grads: dict[str, np.ndarray], axes: dict[str, int]) -> dict[str, np.ndarray]:
    """Centralised gradients, one recorded op per parameter with more than one dimension."""
    result = dict(grads)
    for name, grad in grads.items():
        if grad.ndim > 1:
            axis = axes.get(name, 0)
            (result[name],) = executor.run_external(f"{GC_PREFIX}/{name}", "GradCentralization", OPTIMIZER,
                                                    lambda g, axis=axis: [centralize(g, axis)], [grad])
    return result
