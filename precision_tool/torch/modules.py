"""Module boundaries in backward: the gradients of the loss with respect to a module call's outputs and inputs.

When a module's forward returns with grad enabled, a hook goes on each of its
floating-point outputs and inputs that require grad. In backward each hook
receives the gradient of the loss with respect to that tensor: for an output,
what flows into the module (``input_i`` of the backward record, as for a
backward op); for an input, what flows out of it (``output_i``). For an
input also read elsewhere (a residual stream) that is the whole gradient of
the loss with respect to it, not the module's share. The record is written
when every hook has fired, or at the step's end with what arrived; gradients
that never arrive (an output the loss does not use) are absent slots.
"""

from __future__ import annotations

import contextlib
import types
import weakref

import torch
from torch.utils._python_dispatch import _disable_current_modes

from precision_tool.torch.ops import dtype_name
from precision_tool.torch.process import run_eagerly
from precision_tool.torch.tensors import functorch_wrapped as _wrapped, stats_of


class _Quiet:
    """While entered, the capture's dispatch mode runs every op as it comes, naming and recording nothing.

    `without_modes` enters it when that mode is the only one on the stack: the
    ops then run as they would with no mode (the mode adds nothing to them),
    for a counter update instead of popping the mode stack and pushing it back,
    which costs tens of microseconds a module call.
    """

    __slots__ = ("depth", "mode")

    def __init__(self) -> None:
        self.depth = 0
        self.mode = None  # the capture's mode while it is pushed (set by the session)

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1


QUIET = _Quiet()
_NO_MODE = contextlib.nullcontext()
_stack_length = torch._C._len_torch_dispatch_stack
_stack_at = torch._C._get_dispatch_stack_at


def without_modes():
    """Leave the capture's dispatch mode while reading tensors; nothing to leave at module level (no mode)."""
    length = _stack_length()
    if not length:
        return _NO_MODE
    if length == 1 and QUIET.mode is not None and _stack_at(0) is QUIET.mode:
        return QUIET
    return _disable_current_modes()


def float_leaves(value) -> list:
    """The distinct floating-point tensors in nested tuples, lists and dicts (model outputs are dicts), but those
    a torch.func transform wraps (vmap's, grad's: no memory of their own to read; the ops on what they wrap are
    recorded at op level)."""
    if isinstance(value, torch.Tensor):  # most modules return one tensor
        return [value] if value.is_floating_point() and not _wrapped(value) else []
    found: list = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() and id(item) not in seen and not _wrapped(item):
                seen.add(id(item))
                found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def trained(module) -> dict:
    """A forward module record's attrs: how many parameters of its own (not its children's) the step trains,
    those requiring grad, ``{"trains": n}``. Module records hold no parameter, so a module-level diagnosis reads
    here which calls read parameters an update changes (`precision_tool.analysis.module_updates`)."""
    count = sum(1 for p in module._parameters.values() if p is not None and p.requires_grad)
    known = _TRAINS.get(count)
    if known is None:  # one dict per count: the writer encodes a record's attrs again only for another object
        known = _TRAINS[count] = {"trains": count}
    return known


_TRAINS: dict[int, dict] = {}


class GradientSummary:
    """What a stats-only record needs of a gradient, taken when it arrives instead of a copy of it: its dtype,
    shape and statistics (a copy of every boundary gradient, held until its module's record is complete, can
    be a good share of a model's activations)."""

    __slots__ = ("dtype", "shape", "stats")

    def __init__(self, grad: torch.Tensor):
        self.dtype = dtype_name(grad.dtype)  # a copy's: the logical format tag stays on the original
        self.shape = tuple(grad.shape)
        self.stats = stats_of(grad, self.dtype)


class _Summaries:
    """The `GradientSummary` of each gradient tensor that arrived this step, by the tensor object: nested
    module calls share their boundary tensors (a block's output is its last layer's output), so one gradient
    reaches the hooks of two or three calls, and is summarised once. An entry counts while its tensor lives
    unchanged (same object, same version)."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[int, tuple] = {}  # id(grad) -> (weak reference, version, summary)

    def of(self, grad: torch.Tensor) -> GradientSummary:
        version = grad._version
        known = self._known.get(id(grad))
        if known is not None and known[0]() is grad and known[1] == version:
            return known[2]
        summary = GradientSummary(grad)
        self._known[id(grad)] = (weakref.ref(grad), version, summary)
        return summary

    def clear(self) -> None:
        self._known.clear()


class PendingGradients:
    """One module call waiting for the gradients at its boundary."""

    __slots__ = ("name", "module_type", "step", "waiting", "open", "outputs", "inputs", "summarise")

    def __init__(self, name: str, module_type: str, step: int, summarise: bool = False):
        self.name, self.module_type, self.step = name, module_type, step
        self.summarise = summarise  # keep a `GradientSummary` of each float gradient, not a copy
        self.waiting = 0
        self.open = True  # still in ModuleGradients._pending (a list: membership tests would cost O(n))
        self.outputs: dict[int, torch.Tensor] = {}  # forward input index -> gradient (backward outputs)
        self.inputs: dict[int, torch.Tensor] = {}  # forward output index -> gradient (backward inputs)


class ModuleGradients:
    """Hooks module boundaries in forward and hands their gradients to ``write(pending)`` in backward."""

    def __init__(self, write):
        self._write = write
        self._pending: list[PendingGradients] = []
        self._summaries = _Summaries()
        # (id(tensor), version) -> (weak reference, [(pending, slots, index)], the hook's handle id): one hook a
        # tensor object and version a step, however many module calls it bounds (a block's output is its last
        # layer's output and the next block's input); a hook costs about 10 us to add and to run (`_hook`)
        self._hooked: dict[tuple, tuple] = {}

    def watch(self, name: str, module_type: str, step: int, inputs: list, outputs: list,
              summarise: bool = False) -> None:
        """Hook a module call's float inputs and outputs that take part in autograd; ``summarise``: the records
        want statistics only (`GradientSummary`)."""
        if not torch.is_grad_enabled():
            return
        pending = PendingGradients(name, module_type, step, summarise)
        for tensors, slots in ((outputs, pending.inputs), (inputs, pending.outputs)):
            for index, tensor in enumerate(tensors):
                if tensor.requires_grad:
                    pending.waiting += 1
                    self._hook(tensor, (pending, slots, index))
        if pending.waiting:
            self._pending.append(pending)

    def _hook(self, tensor: torch.Tensor, target: tuple) -> None:
        """Hand ``tensor``'s gradient to ``target`` (pending, slots, index) in backward.

        Targets of one tensor object share a hook while it is the last one on the tensor (a hook someone else
        added after it may change the gradient the hooks after it see) and the tensor's version stays (torch
        gives a hook registered after an in-place write the gradient of the new values).
        """
        key = (id(tensor), tensor._version)
        known = self._hooked.get(key)
        hooks = tensor._backward_hooks if known is not None and known[0]() is tensor else None
        if hooks and next(reversed(hooks)) == known[2]:
            known[1].append(target)
            return
        targets = [target]
        handle = tensor.register_hook(self._arrived(targets))
        self._hooked[key] = (weakref.ref(tensor), targets, handle.id)

    def _arrived(self, targets: list):
        def hook(grad):
            if grad is None:
                return None
            summary = copy = None
            for pending, slots, index in targets:  # in the order the module calls were hooked, as torch runs hooks
                if not pending.open:
                    continue
                if not grad.is_floating_point():
                    slots[index] = grad
                elif pending.summarise:
                    if summary is None:
                        with without_modes():  # the hook runs inside the capture: keep its reads out of it
                            summary = self._summaries.of(grad)
                    slots[index] = summary
                else:
                    if copy is None:
                        with without_modes():
                            copy = grad.detach().clone()
                    slots[index] = copy
                pending.waiting -= 1
                if pending.waiting == 0:
                    pending.open = False
                    self._pending.remove(pending)
                    self._write(pending)
            return None

        return hook

    def flush(self) -> None:
        """The step ends: write what arrived for the calls still waiting, forget the rest."""
        pending, self._pending = self._pending, []
        self._summaries.clear()
        self._hooked.clear()
        for item in pending:
            item.open = False
            if item.inputs or item.outputs:
                self._write(item)


run_eagerly(*(code for code in ModuleGradients._arrived.__code__.co_consts if isinstance(code, types.CodeType)))
