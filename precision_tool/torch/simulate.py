"""`simulate_npu`: run PyTorch's float32 ops with the simulated NPU's numerics.

For every floating-point aten op the precision mode picks a compute and an
output format (`precision_tool.engine.precision.decide`, with the aten
category map of `precision_tool.torch.ops`). The op then runs the way the
numpy engine runs its kernels: inputs rounded to the compute format, the
kernel in float32 (so matrix ops accumulate in float32), every output rounded
once to the output format by `Format.round`, which saturates (``saturation``:
+-max, NaN -> 0) or overflows to inf/NaN (``inf_nan``) and raises the sticky
float status. Tensors stay float32 torch tensors holding values exact in
their format, so autograd works unchanged and backward ops are simulated too.

Ops that already run in float16/bfloat16 (``torch.autocast``, ``.half()``)
or float64 run natively; their outputs still pass through the overflow mode
and raise the status. Gradient accumulation into parameters, optimizer
updates and a loss scaler's arithmetic (GradScaler's unscale, check and
scale update) run in float32, as the engine's optimizer and an NPU's
loss-scale manager do; an inf/NaN they produce still raises the status.
"""

from __future__ import annotations

import math
import weakref

import torch

from precision_tool import defaults, native
from precision_tool.engine.formats import FLOAT32, check_overflow_mode
from precision_tool.engine.ops.base import MOVEMENT
from precision_tool.engine.precision import MixLists, decide, load_mixlist, policy_for
from precision_tool.engine.status import FloatStatus, OpRef
from precision_tool.torch.ops import complete_collective, dtype_name, flat_tensors, result_tensors
from precision_tool.torch.session import SESSION, OpCall
from precision_tool.torch.tensors import (FORMAT_ATTR, has_nonfinite, round_in_place, round_to,
                                          saturate_in_place, set_logical_format)

_FLOAT32 = torch.float32
_STRIDED = torch.strided
_TENSOR = torch.Tensor
_ROUND16 = getattr(native.extension, "round16", None)  # None: `round_in_place` does every rounding
_KINDS = {"float16": 0, "bfloat16": 1, "float32": 2} if _ROUND16 is not None else {}  # round16's kinds
OVERFLOW_OPS_LIMIT = 10_000  # `overflow_ops` keeps the first this many


class _AnyAtenOp:
    """The op types a ``modify_mixlist`` file may name here: any ``namespace.op``."""

    def __contains__(self, op_type) -> bool:
        return isinstance(op_type, str) and "." in op_type


class simulate_npu:  # noqa: N801 - used like a function: ``with simulate_npu(...)``
    """Context manager: ops inside compute with the simulated NPU's formats and overflow mode.

    ``precision_mode`` / ``precision_mode_v2`` take the Ascend values
    (`precision_tool.engine.precision`; default ``allow_fp32_to_fp16``),
    ``modify_mixlist`` a JSON file moving aten op types (``"aten.mm"``)
    between the black, white and gray lists, or that JSON object as a dict. ``sim.status`` is the sticky
    float status and ``sim.overflow_ops`` the ops that raised it, in order.
    """

    def __init__(self, precision_mode: str | None = None, overflow_mode: str = defaults.OVERFLOW_MODE, *,
                 precision_mode_v2: str | None = None, modify_mixlist=None):
        self.policy = policy_for(precision_mode, precision_mode_v2)
        self.overflow_mode = check_overflow_mode(overflow_mode)
        self.precision_mode = precision_mode_v2 or precision_mode or defaults.NPU_PRECISION_MODE
        self.mixlists = load_mixlist(modify_mixlist, _AnyAtenOp()) if modify_mixlist else MixLists()
        self.status = FloatStatus()
        self.overflow_ops: list[OpRef] = []
        self._raised = 0  # op executions that raised the status, all told
        self._scaled_at = 0  # ... when a GradScaler first scaled a loss since its last update (torch_npu's scaler
        self._window_open = False  # clears the status there, once an iteration: micro-batches share the window)
        self._scale_hook: _ScaleHook | None = None
        self._parameters = _RoundedParameters()
        self._plans: dict = {}  # ids of (op info, float input count, inputs' formats) -> `_Plan`

    def __enter__(self) -> "simulate_npu":
        SESSION.attach(simulator=self)
        self._scale_hook = _ScaleHook(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._scale_hook.remove()
        SESSION.detach(simulator=self)

    def step(self, loss=None, loss_scale=None) -> None:
        """End the current step (see `precision_tool.torch.step`)."""
        SESSION.explicit_step(loss, loss_scale)

    # -- one op ---------------------------------------------------------------

    def run(self, call: OpCall, before):
        """Run ``call`` with simulated numerics; ``before()`` is called just before the kernel."""
        info = call.info
        floats, format_ids, all_float32 = _float_inputs(call.args, call.kwargs)
        if (info.mutated or info.hidden_writes) and self._parameters:
            self._parameters.written(call)
        if info.loss_scaling and self._status_says_overflow(info):
            result = self._status_found(call, floats, before)
        elif (not all_float32 or info.collective or call.direction == "optimizer" or info.loss_scaling
                or (call.node is not None and _accumulates_grad(call))
                or (info.cast and call.kwargs.get("dtype", torch.float32) != torch.float32)):
            result = self._run_native(call, floats, before, saturate=bool(floats) and call.direction != "optimizer"
                                      and not info.loss_scaling)
        else:
            key = (id(info), len(floats), *format_ids)  # (hashing the frozen dataclasses costs more)
            plan = self._plans.get(key) or self._plan(key, info, floats)
            if plan.movement:
                result = self._run_movement(call, plan, before)
            else:
                result = self._run_compute(call, plan, before)
        if call.overflow:
            self._raise(call, floats)
        return result

    def _plan(self, key: tuple, info, floats: list) -> "_Plan":
        """`decide` for an op of ``info`` on the float tensors ``floats`` (their logical formats; the others are
        float32), and what follows from it; kept under ``key``."""
        formats = [fmt for t in floats if (fmt := getattr(t, FORMAT_ATTR, None)) is not None]
        membership = self.mixlists.membership(info.type, info.amp)
        precision = decide(info.category, membership, self.policy, FLOAT32, formats)
        plan = self._plans[key] = _Plan(precision, len(floats), formats, info)
        return plan

    def _run_native(self, call: OpCall, floats: list, before, saturate: bool):
        if before is not None:
            before()
        result = call.info.func(*call.args, **call.kwargs)
        complete_collective(call.info, result)
        call.outputs = result_tensors(call.info, call.args, call.kwargs, result)
        call.compute_dtype = dtype_name(floats[0].dtype) if floats else ""
        mode = self.overflow_mode if saturate else "inf_nan"
        overflow = False
        for out in call.outputs:
            if out.is_floating_point():
                overflow |= saturate_in_place(out, mode)
                if out.dtype is _FLOAT32 and getattr(out, FORMAT_ATTR, None) is not None:
                    setattr(out, FORMAT_ATTR, None)  # `set_logical_format(out, None)`
        # a constant asked for as infinite (``scalar_tensor(-inf)``, an attention mask) computes nothing that
        # overflows: the float status stays as it was
        call.overflow = overflow and (bool(floats) or not _asks_infinity(call.args, call.kwargs))
        return result

    def _status_says_overflow(self, info) -> bool:
        """For a GradScaler's op: whether it is the unscale-and-check, in the saturation mode, after an op raised
        the status since the loss was scaled (the scale update closes that window)."""
        if info.type == _UPDATE:
            self._window_open = False
        return info.type == _UNSCALE and self.overflow_mode == "saturation" and self._raised > self._scaled_at

    def _status_found(self, call: OpCall, floats: list, before):
        """A GradScaler's unscale-and-check after an op raised the status since the loss was scaled, in the
        saturation mode: as torch_npu's kernel does there, it reads the float status, counts the overflow in
        ``found_inf`` and leaves the gradients as they are (saturated values hold no inf for the check to
        find, and the update is skipped anyway)."""
        if before is not None:
            before()
        found_inf = call.args[1] if len(call.args) > 1 else call.kwargs["found_inf"]
        found_inf.add_(1.0)
        call.outputs = result_tensors(call.info, call.args, call.kwargs, None)
        call.compute_dtype = dtype_name(floats[0].dtype) if floats else ""
        return None

    def _run_movement(self, call: OpCall, plan: "_Plan", before):
        if before is not None:
            before()
        result = call.info.func(*call.args, **call.kwargs)
        call.outputs = outputs = _outputs(call, result)
        fmt, tag = plan.output, plan.output_tag
        rounds = not plan.movement_exact and fmt.bits < 32 and not call.info.is_view  # else nothing to round
        overflow = False
        for out in outputs:
            if out.dtype is _FLOAT32:
                if rounds:
                    overflow |= _round_output(out, fmt, plan.output_kind, self.overflow_mode)
                _tag(out, tag)
        call.compute_dtype = fmt.name
        call.overflow = overflow
        return result

    def _run_compute(self, call: OpCall, plan: "_Plan", before):
        overflow = False
        if not plan.inputs_ready:  # some input is not yet in the compute format: round it
            overflow = self._cast_inputs(call, plan.compute)
        if before is not None:
            before()
        result = call.info.func(*call.args, **call.kwargs)
        keep = call.info.float32_outputs
        if isinstance(result, _TENSOR) and not keep:  # the common case, `_outputs`' first, without a loop
            call.outputs = [result]
            if result.dtype is _FLOAT32:
                kind = plan.output_kind
                if not (kind is not None and result.is_contiguous() and result.is_cpu and not result.is_neg()
                        and _ROUND16(address := result.data_ptr(), address, result.numel(), kind)):
                    overflow |= _round_output(result, plan.output, kind, self.overflow_mode)
                if (tag := plan.output_tag) is not None:  # `_tag`
                    setattr(result, FORMAT_ATTR, tag)
                elif getattr(result, FORMAT_ATTR, None) is not None:
                    setattr(result, FORMAT_ATTR, None)
            call.compute_dtype = plan.compute.name
            call.overflow = overflow
            return result
        call.outputs = outputs = _outputs(call, result)
        mode = self.overflow_mode
        for i, out in enumerate(outputs):
            if out.dtype is _FLOAT32:
                if i in keep:
                    overflow |= _round_output(out, FLOAT32, _KINDS.get("float32"), mode)
                    _tag(out, None)
                else:
                    overflow |= _round_output(out, plan.output, plan.output_kind, mode)
                    _tag(out, plan.output_tag)
        call.compute_dtype = plan.compute.name
        call.overflow = overflow
        return result

    def _cast_inputs(self, call: OpCall, compute) -> bool:
        """Round ``call``'s float inputs that are not yet in the 16-bit format ``compute`` into it (a parameter's
        copy kept for the step, an in-place op's destination where it lies); whether that overflowed."""
        overflow = False
        written = {id(t) for t in flat_tensors(call.info.mutated_args(call.args, call.kwargs))} \
            if call.info.mutated else _NOTHING
        cast: dict[int, torch.Tensor] = {}

        def to_compute(t):
            nonlocal overflow
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                return t
            fmt = getattr(t, FORMAT_ATTR, None)
            if fmt is compute or (fmt is not None and fmt.bits < compute.bits):
                return t
            if id(t) in written:  # an in-place op computes from its rounded destination
                if call.info.overwrites:  # ... unless it never reads it (uniform_, fill_)
                    return t
                overflow |= round_in_place(t, compute, self.overflow_mode)
                set_logical_format(t, compute)
                return t
            if id(t) not in cast:
                rounded = self._parameters.get(t, compute, call.step)
                if rounded is None:
                    rounded, flag = round_to(t, compute, self.overflow_mode)
                    overflow |= flag
                    set_logical_format(rounded, compute)
                    if not flag:
                        self._parameters.put(t, compute, rounded)
                cast[id(t)] = rounded
            return cast[id(t)]

        keep = call.info.float32_args
        call.args = tuple(a if i in keep else _map(to_compute, a) for i, a in enumerate(call.args))
        call.kwargs = {k: _map(to_compute, v) for k, v in call.kwargs.items()}
        return overflow

    def _raise(self, call: OpCall, floats: list) -> None:
        call.inherited = has_nonfinite(floats)
        ref = OpRef(call.step, call.name, call.info.type, call.direction, call.exec_index)
        self.status.raise_(ref)
        self._raised += 1
        if len(self.overflow_ops) < OVERFLOW_OPS_LIMIT:
            self.overflow_ops.append(ref)


_UNSCALE, _UPDATE = "aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_"


class _ScaleHook:
    """While ``sim`` runs, ``torch.amp.GradScaler.scale`` marks where the float status window of a torch_npu
    scaler opens: it clears the status at its first ``scale`` since its last update, in the saturation mode.
    An overflow in forward before the loss is scaled does not skip the update; one in any micro-batch's
    backward does. Removed like a hook handle."""

    def __init__(self, sim: "simulate_npu"):
        from torch.amp import GradScaler

        original = self._original = GradScaler.scale

        def scale(scaler, outputs):
            if not sim._window_open:
                sim._scaled_at, sim._window_open = sim._raised, True
            return original(scaler, outputs)

        GradScaler.scale = scale

    def remove(self) -> None:
        from torch.amp import GradScaler

        GradScaler.scale = self._original


class _Plan:
    """`decide`'s formats for one op info and its inputs' formats, with what the op's path asks of them."""

    __slots__ = ("compute", "output", "output_tag", "output_kind", "inputs_ready", "movement", "movement_exact",
                 "_kept")

    def __init__(self, precision, floats: int, activations: list, info) -> None:
        compute, output = self.compute, self.output = precision.compute, precision.output
        self.output_tag = output if output.bits < 32 else None  # what `set_logical_format` tags
        self.output_kind = _KINDS.get(output.name)
        tagged_all = len(activations) == floats
        # every float input already in the compute format, or a narrower one: nothing to round before the kernel
        self.inputs_ready = compute.bits >= 32 or (tagged_all and all(
            fmt is compute or fmt.bits < compute.bits for fmt in activations))
        # every float input in the output format already (untagged ones are float32): a movement rounds nothing
        self.movement = info.category == MOVEMENT
        self.movement_exact = all(fmt is output for fmt in activations) and (tagged_all or output is FLOAT32)
        self._kept = (info, activations)  # (the key holds their ids: they stay theirs)


def _float_inputs(args: tuple, kwargs: dict) -> tuple[list, list, bool]:
    """A call's floating-point tensor arguments (in lists too), in order; the ids of the logical formats of
    those that have one (`FORMAT_ATTR`); and whether there are some and all are float32. One pass: every op
    asks."""
    floats, format_ids, all_float32 = [], [], True
    for value in ((*args, *kwargs.values()) if kwargs else args):
        if isinstance(value, _TENSOR):
            dtype = value.dtype
            if dtype is not _FLOAT32:
                if not dtype.is_floating_point:
                    continue
                all_float32 = False
            floats.append(value)
            if (fmt := getattr(value, FORMAT_ATTR, None)) is not None:
                format_ids.append(id(fmt))
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, _TENSOR):
                    dtype = item.dtype
                    if dtype is not _FLOAT32:
                        if not dtype.is_floating_point:
                            continue
                        all_float32 = False
                    floats.append(item)
                    if (fmt := getattr(item, FORMAT_ATTR, None)) is not None:
                        format_ids.append(id(fmt))
    return floats, format_ids, all_float32 and bool(floats)


def _outputs(call: OpCall, result) -> list:
    """`result_tensors`, a lone tensor first."""
    if isinstance(result, torch.Tensor):
        return [result]
    return result_tensors(call.info, call.args, call.kwargs, result)


def _round_output(out: torch.Tensor, fmt, kind, overflow_mode: str) -> bool:
    """`round_in_place`, its common cases straight by the C extension: a contiguous float32 CPU tensor, and a
    matrix of rows inside wider ones (an LSTM's gates); in range, each is what `round_in_place` would do."""
    if kind is not None and out.is_cpu and not out.is_neg() and out.layout is _STRIDED:
        if out.is_contiguous():
            address = out.data_ptr()
            if _ROUND16(address, address, out.numel(), kind):
                return False  # (else nothing was written: `round_in_place` checks again, then applies the mode)
        elif out.dim() == 2:
            (rows, cols), (row_stride, col_stride) = out.shape, out.stride()
            if col_stride == 1 and row_stride > cols >= 2 and rows > 1:  # `_row_layout`'s (cols, row_stride)
                address = out.data_ptr()
                if _ROUND16(address, address, out.numel(), kind, cols, row_stride, row_stride):
                    return False
    return round_in_place(out, fmt, overflow_mode)


def _tag(out: torch.Tensor, fmt) -> None:
    """`set_logical_format` with a format below 32 bits or None."""
    if fmt is not None:
        setattr(out, FORMAT_ATTR, fmt)
    elif getattr(out, FORMAT_ATTR, None) is not None:
        setattr(out, FORMAT_ATTR, None)


def _asks_infinity(args: tuple, kwargs: dict) -> bool:
    """Whether a call's Python-number arguments include an infinity (a constant asked for as +-inf)."""
    return any(isinstance(value, float) and math.isinf(value) for value in (*args, *kwargs.values()))


class _RoundedParameters:
    """The rounded copies of parameters (leaves that require grad, and views of them) that ops computing in a
    16-bit format read, kept for the step: an LSTM reads each weight, transposed, once a time step, and a
    Linear's backward reads its weight again.

    A copy counts while its parameter's storage lives (a weak reference), under the view's start, shape,
    strides and version: an update in place gives a new version. A write through an alias with a version
    counter of its own (``p.data.mul_()``) drops every copy of that storage (`written`). A rounding that
    overflowed is never kept: each op that reads it raises the float status again. Copies of at most
    `LIMIT` bytes are kept a step; they go when the step ends.
    """

    LIMIT = 1 << 29

    def __init__(self) -> None:
        self._entries: dict = {}  # (data pointer, shape, strides, version, format id) -> (storage ref, pointer, copy)
        self._storages: set = set()  # the storage pointers of the entries
        self._step = None
        self._bytes = 0

    def __bool__(self) -> bool:
        return bool(self._entries)

    def get(self, tensor: torch.Tensor, fmt, step: int):
        if step != self._step:
            self._entries.clear()
            self._storages.clear()
            self._step, self._bytes = step, 0
            return None
        if not self._entries:
            return None
        entry = self._entries.get((tensor.data_ptr(), tensor.shape, tensor.stride(), tensor._version, id(fmt)))
        if entry is None or entry[0]() is None:
            return None
        return entry[2]

    def put(self, tensor: torch.Tensor, fmt, rounded: torch.Tensor) -> None:
        base = tensor._base if tensor._base is not None else tensor
        if not (base.requires_grad and base.is_leaf) or self._bytes > self.LIMIT or tensor.layout is not _STRIDED:
            return
        storage = tensor.untyped_storage()
        self._entries[(tensor.data_ptr(), tensor.shape, tensor.stride(), tensor._version, id(fmt))] = (
            weakref.ref(storage), storage.data_ptr(), rounded)
        self._storages.add(storage.data_ptr())
        self._bytes += rounded.numel() * 4

    def written(self, call: OpCall) -> None:
        """``call`` writes its mutated (and undeclared-written) arguments: drop the copies of their storages."""
        written = flat_tensors(call.info.mutated_args(call.args, call.kwargs))
        written += [call.args[i] for i in call.info.hidden_writes
                    if i < len(call.args) and isinstance(call.args[i], torch.Tensor)]
        # where each one's storage starts, as its storage's data_ptr says, without a Python storage object for it
        # (asked of every activation an in-place op writes, it would live as long as theirs); an empty tensor
        # may answer another address, and writes nothing
        storages = {t.data_ptr() - t.storage_offset() * t.element_size() for t in written
                    if t.layout is _STRIDED} & self._storages
        if storages:
            self._entries = {key: entry for key, entry in self._entries.items() if entry[1] not in storages}
            self._storages -= storages


_STRIDED = torch.strided
_NOTHING: frozenset = frozenset()
_NODE_HAS_VARIABLE: dict = {}  # autograd node class -> whether it has ``variable`` (AccumulateGrad)


def _accumulates_grad(call: OpCall) -> bool:
    node = call.node
    if node is None:
        return False
    kind = type(node)
    has = _NODE_HAS_VARIABLE.get(kind)
    if has is None:  # a failed getattr on a node costs an exception: ask each node class once
        has = _NODE_HAS_VARIABLE[kind] = hasattr(kind, "variable")
    return has and getattr(node, "variable", None) is not None


def _map(fn, value):
    if isinstance(value, (list, tuple)):
        return type(value)(fn(v) for v in value)
    return fn(value)
