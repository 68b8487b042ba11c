"""Runs a compiled program: forward, backward, and externally computed ops (optimizer).

Every op execution gets an execution index, counted from 0 at the start of
each step across forward, backward and optimizer ops. Hooks see each one
before and after it runs; with no hook registered no event is built.
"""

from __future__ import annotations

import zlib

import numpy as np

from precision_tool.engine.formats import Format
from precision_tool.engine.graph import CONST
from precision_tool.engine.hooks import BACKWARD, FORWARD, HookList, OpEvent
from precision_tool.engine.ops import KernelContext
from precision_tool.engine.program import CompiledNode, Program
from precision_tool.engine.status import FloatStatus, OpRef
from precision_tool.errors import NotFoundError


def convert(x: np.ndarray, source: Format | None, target: Format, overflow_mode: str) -> tuple[np.ndarray, bool]:
    """Hold ``x`` (a value of ``source``) in ``target``: exact when widening, else rounded."""
    if source is None:
        return x, False
    if source is target:
        return x, False
    widening = target.bits > source.bits and target.bits >= 32
    if widening:
        return (x if x.dtype == target.container else x.astype(target.container)), False
    return target.round(x, overflow_mode)


class Executor:
    """Executes one program step by step; keeps the tape backward needs."""

    def __init__(self, program: Program, hooks: HookList | None = None,
                 status: FloatStatus | None = None, seed: int = 0):
        self.program = program
        self.hooks = hooks if hooks is not None else HookList()
        self.status = status if status is not None else FloatStatus()
        self.seed = seed
        self.step = 0
        self.exec_index = 0
        self._values: dict[int, np.ndarray] = {}
        self._tape: list[tuple[CompiledNode, KernelContext]] = []
        self._name_seeds = {c.node.name: zlib.crc32(c.node.name.encode()) for c in program.nodes}
        self._constants = {}
        for compiled in program.nodes:
            for value in compiled.node.inputs:
                if value.kind == CONST:
                    array = program.graph.constants[value.name]
                    if array.dtype.kind == "f":
                        array = array.astype(program.device.origin.container)
                    self._constants[value.uid] = array

    @property
    def overflow_mode(self) -> str:
        return self.program.device.overflow_mode

    def begin_step(self, step: int) -> None:
        """Start a step: execution indices count from 0 again."""
        self.step = step
        self.exec_index = 0
        self._values = {}
        self._tape = []

    def forward(self, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run every node; return the graph's named outputs."""
        graph = self.program.graph
        container = self.program.device.origin.container
        values = self._values
        for name, value in graph.inputs.items():
            array = np.asarray(feeds[name])
            values[value.uid] = array.astype(container) if value.is_float and array.dtype != container else array
        for name, value in graph.params.items():
            array = params[name]
            values[value.uid] = array if array.dtype == container else array.astype(container)
        values.update(self._constants)
        casts: dict[tuple[int, str], np.ndarray] = {}
        with np.errstate(all="ignore"):
            for compiled in self.program.nodes:
                self._run_forward(compiled, values, casts)
        return {name: values[v.uid] for name, v in graph.outputs.items()}

    def _run_forward(self, compiled: CompiledNode, values: dict, casts: dict) -> None:
        node = compiled.node
        compute = compiled.precision.compute
        ctx = KernelContext(compute, compiled.precision.output, self.overflow_mode,
                            (self.seed, self.step, self._name_seeds[node.name]))
        inputs = []
        for value, fmt in zip(node.inputs, compiled.input_formats):
            array = values[value.uid]
            if fmt is not None and fmt is not compute:
                key = (value.uid, compute.name)
                cached = casts.get(key)
                if cached is None:
                    cached, overflow = convert(array, fmt, compute, self.overflow_mode)
                    ctx.overflowed |= overflow
                    casts[key] = cached
                array = cached
            inputs.append(array)
        event = self._before(compiled, FORWARD, inputs,
                             [compute.name if f else "int64" for f in compiled.input_formats]) \
            if self.hooks.every_op else None
        result = compiled.op.forward(ctx, *inputs, **node.attrs)
        outputs = result if isinstance(result, tuple) else (result,)
        for value, array in zip(node.outputs, outputs):
            values[value.uid] = array
        self._tape.append((compiled, ctx))
        self._after(event, ctx, list(outputs), [compiled.precision.output.name] * len(outputs),
                    compiled, FORWARD, inputs)

    def backward(self, seeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Back-propagate from named outputs (``{"loss": loss_scale}``); return parameter gradients."""
        graph = self.program.graph
        formats = self.program.value_formats
        grads: dict[int, np.ndarray] = {}
        for name, seed in seeds.items():
            value = graph.outputs[name]
            fmt = formats[value.uid]
            grads[value.uid] = np.asarray(seed, dtype=fmt.container)
        with np.errstate(all="ignore"):
            for compiled, ctx in reversed(self._tape):
                self._run_backward(compiled, ctx, grads)
        result = {}
        for name, value in graph.params.items():
            grad = grads.get(value.uid)
            result[name] = grad if grad is not None else np.zeros_like(self._values[value.uid])
        return result

    def _run_backward(self, compiled: CompiledNode, ctx: KernelContext, grads: dict) -> None:
        node = compiled.node
        if compiled.op.backward is None:
            return
        incoming = [grads.pop(v.uid, None) for v in node.outputs]
        if all(g is None for g in incoming):
            return
        compute = compiled.precision.compute
        output = compiled.precision.output
        ctx.overflowed = False
        dys = []
        for value, grad in zip(node.outputs, incoming):
            if grad is None:
                grad = np.zeros_like(self._values[value.uid])
            grad, overflow = convert(grad, output, compute, self.overflow_mode)
            ctx.overflowed |= overflow
            dys.append(grad)
        event = self._before(compiled, BACKWARD, dys, [compute.name] * len(dys)) if self.hooks.every_op else None
        input_grads = compiled.op.backward(ctx, *dys, **node.attrs)
        out_dtypes = []
        for value, fmt, grad in zip(node.inputs, compiled.input_formats, input_grads):
            out_dtypes.append(output.name if grad is not None else "")
            if grad is None or fmt is None or value.kind == CONST:
                continue
            grad, overflow = convert(grad, output, fmt, self.overflow_mode)
            ctx.overflowed |= overflow
            previous = grads.get(value.uid)
            if previous is not None:
                grad, overflow = fmt.round(previous + grad, self.overflow_mode)
                ctx.overflowed |= overflow
            grads[value.uid] = grad
        self._after(event, ctx, list(input_grads), out_dtypes, compiled, BACKWARD, dys)

    def run_external(self, name: str, op_type: str, direction: str, kernel, inputs: list[np.ndarray],
                     dtype: str = "float32") -> list[np.ndarray]:
        """Run a kernel outside the graph (an optimizer update) under the same hooks and indices.

        ``kernel(*inputs)`` returns a list of outputs; an output that is not
        finite raises the float status.
        """
        event = None
        if self.hooks.every_op:
            event = OpEvent(self.step, name, op_type, self.exec_index, direction, list(inputs),
                            [dtype] * len(inputs), dtype)
            self.hooks.before_op(event)
        self.exec_index += 1
        with np.errstate(all="ignore"):
            outputs = kernel(*inputs)
        overflow = not all(np.isfinite(o).all() for o in outputs)
        if overflow:
            self.status.raise_(OpRef(self.step, name, op_type, direction, self.exec_index - 1))
            if event is None and self.hooks:  # the hooks that see only overflowing ops see this one
                event = OpEvent(self.step, name, op_type, self.exec_index - 1, direction, list(inputs),
                                [dtype] * len(inputs), dtype)
        if event is not None:
            event.outputs = list(outputs)
            event.output_dtypes = [dtype] * len(outputs)
            event.overflow = overflow
            event.status = self.status.raised
            event.status_first = self.status.first
            self.hooks.after_op(event)
        return outputs

    def _before(self, compiled: CompiledNode, direction: str, inputs: list, input_dtypes: list[str]) -> OpEvent:
        node = compiled.node
        event = OpEvent(self.step, node.name, node.type, self.exec_index, direction, inputs,
                        input_dtypes, compiled.precision.compute.name, node.fusion, node.attrs)
        if self.hooks.sees_before_op:
            self.hooks.before_op(event)
        return event

    def _after(self, event: OpEvent | None, ctx: KernelContext, outputs: list, output_dtypes: list[str],
               compiled: CompiledNode, direction: str, inputs: list) -> None:
        index = self.exec_index
        self.exec_index += 1
        if ctx.overflowed:
            node = compiled.node
            self.status.raise_(OpRef(self.step, node.name, node.type, direction, index))
            if event is None and self.hooks:  # the hooks that see only overflowing ops see this one
                compute = compiled.precision.compute.name
                dtypes = [compute if f else "int64" for f in compiled.input_formats] if direction == FORWARD \
                    else [compute] * len(inputs)
                event = OpEvent(self.step, node.name, node.type, index, direction, inputs, dtypes, compute,
                                node.fusion, node.attrs)
        if event is None:
            return
        event.outputs = outputs
        event.output_dtypes = output_dtypes
        event.overflow = ctx.overflowed
        event.status = self.status.raised
        event.status_first = self.status.first
        self.hooks.after_op(event)

    def value(self, name: str) -> np.ndarray:
        """The array of a graph input, parameter or op output by value name (after forward)."""
        graph = self.program.graph
        for compiled in self.program.nodes:
            for value in compiled.node.outputs:
                if value.name == name:
                    return self._values[value.uid]
        for table in (graph.inputs, graph.params):
            if name in table:
                return self._values[table[name].uid]
        raise NotFoundError(f"no value named {name!r} in this run")
