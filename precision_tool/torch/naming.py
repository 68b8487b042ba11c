"""Op names that are the same in every run and on every device: scope, op type, call index.

====================  =============================================  ==============================================
direction             name                                           example
====================  =============================================  ==============================================
forward               ``<module path>/<op type>_<k>``                ``Model/encoder/layers.0/self_attn/aten.addmm_1``
backward              ``<forward op name>/<op type>_<k>``            ``Model/fc1/aten.addmm_0/aten.mm_1``
backward (grad acc.)  ``<parameter path>/<op type>_<k>``             ``Model/fc1/weight/aten.add__0``
optimizer             ``optimizer/<class>/<op type>_<k>``            ``optimizer/SGD/aten.add__3``
====================  =============================================  ==============================================

``k`` counts the calls of that op type in that scope since the step began,
so an extra call elsewhere shifts nothing (msprobe's global per-API counters
shift every later name, ``../shared/reference/MSPROBE.md``). The module path
starts with the class name of the outermost module called and then follows
attribute paths (``layers.0``) from each calling module to the module it
calls. A backward op is named after the forward op whose autograd node runs
it: the forward op that created a node is found from autograd's sequence
numbers, which count nodes as they are created, just before the op reaches
the dispatcher.

Activation checkpointing runs a module's forward again during backward: its
ops are named as forward ops of that module (the module keeps the path its
first call had), counted afresh, so that they take the names of the first
call's ops; the nodes they make name the backward ops that run them (the
first call of reentrant checkpointing ran under no_grad and made none), as in
a run without checkpointing. Reentrant checkpointing's own node names its
own ops (``CheckpointFunctionBackward/aten.add_0``), not after the first op
of the block it wraps, which would give them the names of that op's backward.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.modules import module as _torch_module

from precision_tool.engine.hooks import BACKWARD, FORWARD, OPTIMIZER
from precision_tool.torch.process import compiled_code_eager, run_eagerly

_CHECKPOINT_NODE = "CheckpointFunctionBackward"  # torch.utils.checkpoint's reentrant Function
_sequence_nr = torch._C._autograd._get_sequence_nr
_current_node = torch._C._current_autograd_node


class Namer:
    """Tracks the module scope (with global module hooks) and hands out op names."""

    def __init__(self) -> None:
        # (module, path, entered during backward, the arguments it was called with)
        self._stack: list[tuple[torch.nn.Module, str, bool, tuple]] = []
        self._paths: dict[int, str] = {}  # id(module) -> the path of its first call
        self._counters: dict[tuple[str, str], int] = {}
        self._recomputed: dict[tuple[str, str], int] = {}  # the counters of the recomputation under way
        self._forward_of: dict[int, str] = {}  # autograd sequence nr -> name of the forward op that made it
        self._previous_forward_of: dict[int, str] = {}
        self._param_names: dict[int, str] = {}
        self._relative: dict[tuple[int, int], str | None] = {}
        self._seen_modules: set[int] = set()
        self._hooked_seen = False  # a module with full backward hooks has run (`_as_called`)
        self._last_seq = -1
        self._handles: list = []
        self._late: dict[int, object] = {}  # id(module) -> the handle of the hook that leaves it after its own hooks
        self._paused = False  # no op is named (the session's dispatch mode is not pushed)
        self._compiled_seen = False  # a torch.compile wrapper was called since `install`
        self._eager_back = None  # ends the eager run of a fullgraph=True model's call (`compiled_code_eager`)
        self.on_leave = None  # called as (module, path, args, kwargs, output) when a module's forward returns
        self.on_enter = None  # called as (module, args) when a module is about to run, while set

    def install(self) -> None:
        """Start following module calls (global forward hooks)."""
        from torch.nn.modules import module

        self._handles = [
            module.register_module_forward_pre_hook(self._enter),
            module.register_module_forward_hook(self._leave, with_kwargs=True, always_call=True),
        ]
        self._last_seq = _sequence_nr()
        self._counters.clear()
        self._paused = True  # until the session pushes its dispatch mode
        self._compiled_seen = False

    def uninstall(self) -> None:
        for handle in [*self._handles, *self._late.values()]:
            handle.remove()
        if self._compiled_seen:  # what dynamo compiled during the capture breaks its graphs where the hooks were:
            self._compiled_seen = False  # compiled again on its next call, without them
            import torch._dynamo

            torch._dynamo.reset()
        self._handles = []
        self._late.clear()
        self._stack.clear()
        self._counters.clear()
        self._relative.clear()
        self._seen_modules.clear()
        self._param_names.clear()
        self._paths.clear()
        self._forward_of.clear()
        self._previous_forward_of.clear()

    def pause(self) -> None:
        """No op will be named until `resume`: autograd nodes made meanwhile get no names either."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._last_seq = _sequence_nr()

    def new_step(self) -> None:
        """Call counters start again; forward names stay findable for one more step."""
        self._counters.clear()
        self._previous_forward_of = self._forward_of
        self._forward_of = {}

    @property
    def module_path(self) -> str:
        return self._stack[-1][1] if self._stack else ""

    def name(self, op_type: str, node, optimizer) -> tuple[str, str]:
        """The direction and the name of the op about to run.

        ``node`` is the autograd node being executed (backward), ``optimizer``
        the optimizer whose ``step`` is running; both None in forward.
        """
        counters = self._counters
        if node is not None and not (self._stack and self._stack[-1][2]):
            direction, scope = BACKWARD, self._backward_scope(node)
        elif optimizer is not None:
            direction, scope = OPTIMIZER, f"optimizer/{type(optimizer).__name__}"
        else:
            direction, scope = FORWARD, self._stack[-1][1] if self._stack else ""
            if self._stack and self._stack[-1][2]:  # recomputed in backward: counted as in the module's first call
                counters = self._recomputed
        key = (scope, op_type)
        k = counters.get(key, 0)
        counters[key] = k + 1
        name = f"{scope}/{op_type}_{k}" if scope else f"{op_type}_{k}"
        seq = _sequence_nr()
        if seq != self._last_seq:
            if direction == FORWARD:  # this op's autograd node was created just before dispatch (or, under
                # no_grad in a custom Function's forward, that Function's: its backward ops are named after it)
                self._forward_of[seq - 1] = name
            self._last_seq = seq
        return direction, name

    def forward_op_of(self, node) -> str:
        """The name of the forward op that created autograd ``node``; "" when unknown."""
        seq = node._sequence_nr()
        return self._forward_of.get(seq) or self._previous_forward_of.get(seq) or ""

    def _backward_scope(self, node) -> str:
        if node.name() == _CHECKPOINT_NODE:  # reentrant checkpointing's own node: it runs the recomputation and
            return _CHECKPOINT_NODE  # the block's backward, whose ops have names of their own, and adds of its own
        forward = self.forward_op_of(node)
        if forward:
            return forward
        variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter it accumulates into
        if variable is not None:
            return self._param_names.get(id(variable), "AccumulateGrad")
        return node.name()

    # -- module scope ---------------------------------------------------------

    def _enter(self, module: torch.nn.Module, args) -> None:
        wrapper = _COMPILED in module._modules  # torch.compile's: its module runs inside, named as uncompiled
        if not self._compiled_seen and (wrapper or getattr(module, "_compiled_call_impl", None) is not None):
            self._compiled_seen = True  # (or module.compile()) code compiled before the hooks were installed calls
            import torch._dynamo  # none of them, and the calls inside go unseen: compiled again, it calls them

            torch._dynamo.reset()
            if not self._paused:  # ops are intercepted: dynamo compiles nothing under the capture's dispatch mode
                warnings.warn(COMPILED_EAGER_WARNING, CompiledEagerWarning, stacklevel=3)
        if wrapper and getattr(getattr(module, "dynamo_ctx", None), "fullgraph", False) and not self._stack:
            self._eager_back = compiled_code_eager()  # fullgraph=True: the hooks would break its graph, an error
        if wrapper or type(module).__name__ == "GraphModule" and self._stack and self._compiled_seen and not any(
                self._relative_name(caller, module) is not None for caller, *_ in self._stack):
            return  # (a compiled model's graphs, GraphModules run inside its modules' calls: no module of it)
        if self.on_enter is not None:
            self.on_enter(module, args)
        if module._forward_hooks:
            self._leave_after_its_hooks(module)
        path = self._path_of(module)
        recomputing = _current_node() is not None  # checkpointing's recomputation, in backward
        if recomputing and not any(frame[2] for frame in self._stack):
            self._recomputed = {}  # a recomputation begins: its ops take the names of the first call's
        self._stack.append((module, path, recomputing, args))
        if not self._hooked_seen and _backward_hooked(module):
            self._hooked_seen = True  # (from here on, children's arguments are looked at: `_as_called`)
        if id(module) not in self._seen_modules:
            self._seen_modules.add(id(module))
            for name, param in module._parameters.items():
                if param is not None:
                    self._param_names.setdefault(id(param), f"{path}/{name}")

    def _leave_after_its_hooks(self, module: torch.nn.Module) -> None:
        """A module with forward hooks of its own (a user's, scaling or clamping its output) is left by a hook of
        ours that runs after them, the last of its hooks: global hooks run before a module's own, so the output
        recorded would be the one before the user's hooks changed it, and their ops would run in the caller's
        scope. Registered before the call (torch reads the hooks it runs once the forward returns)."""
        handle = self._late.get(id(module))
        hooks = module._forward_hooks
        if handle is None or handle.id not in hooks:
            self._late[id(module)] = module.register_forward_hook(self._leave_late, with_kwargs=True,
                                                                  always_call=True)
        elif next(reversed(hooks)) != handle.id:
            hooks.move_to_end(handle.id)  # (a hook the user added since)

    def _leave_late(self, module: torch.nn.Module, args, *rest) -> None:
        self._leave(module, args, *rest, late=True)

    def _leave(self, module: torch.nn.Module, args, *rest, late: bool = False) -> None:
        """A module's forward returned, as (module, args, kwargs, output); or raised, as (module, args, None):
        torch calls the hooks it always calls with three arguments then (a recomputation that checkpointing
        stops early, once it has the tensors the backward node needs, ends with an exception). A module with
        hooks of its own is left after them (`_leave_after_its_hooks`)."""
        if not late and id(module) in self._late and self._late[id(module)].id in module._forward_hooks \
                or _COMPILED in module._modules:
            if _COMPILED in module._modules and self._eager_back is not None and not self._stack:
                back, self._eager_back = self._eager_back, None
                back()
            return
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0] if rest else None)
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is module:
                if not self._paused:
                    self._name_custom_nodes(stack[i][1])
                if self.on_leave is not None:
                    # a module with full backward hooks runs on copies of its arguments that autograd routes
                    # through them, whose gradients are its own path's share, before the hooks change them: the
                    # arguments it was called with hold the whole gradient, as the hooks leave it
                    called = args if not self._hooked_seen else stack[i][3] if _backward_hooked(module) else \
                        _as_called(args, stack[:i])  # (nothing to look at before such a module has run)
                    self.on_leave(module, stack[i][1], called, kwargs, output)
                del stack[i:]
                return

    def _name_custom_nodes(self, path: str) -> None:
        """Autograd nodes made inside a module by no op the dispatcher saw (a custom autograd.Function)
        get a name in that module, so that their backward ops are named after it."""
        seq = _sequence_nr()
        if seq == self._last_seq or self._last_seq < 0:
            return
        key = (path, "autograd.Function")
        for nr in range(self._last_seq, seq):
            if nr not in self._forward_of:
                k = self._counters.get(key, 0)
                self._counters[key] = k + 1
                self._forward_of[nr] = f"{path}/autograd.Function_{k}"
        self._last_seq = seq

    def _path_of(self, module: torch.nn.Module) -> str:
        for caller, caller_path, *_ in reversed(self._stack):
            relative = self._relative_name(caller, module)
            if relative is not None:
                path = f"{caller_path}/{relative}" if relative else caller_path
                self._paths.setdefault(id(module), path)
                return path
        # called from outside every module: the model, or a module recomputed during backward
        return self._paths.get(id(module)) or type(module).__name__

    def _relative_name(self, caller: torch.nn.Module, module: torch.nn.Module) -> str | None:
        key = (id(caller), id(module))
        if key in self._relative:
            return self._relative[key]
        found = None
        if module is caller:
            found = ""
        else:
            for name, child in caller._modules.items():
                if child is module:
                    found = name
                    break
            else:
                for name, child in caller.named_modules():
                    if child is module:
                        found = name
                        break
        if found and _COMPILED in found:  # a module compiled by torch.compile inside the model: its wrapper's
            found = ".".join(part for part in found.split(".") if part != _COMPILED)  # name, as golden's
        self._relative[key] = found
        return found


def _backward_hooked(module: torch.nn.Module) -> bool:
    """Whether torch runs ``module`` on copies of its arguments for full backward hooks (its own or global)."""
    return bool(module._backward_hooks or module._backward_pre_hooks or _torch_module._global_backward_hooks
                or _torch_module._global_backward_pre_hooks)


def _as_called(args: tuple, frames: list) -> tuple:
    """``args`` with each copy torch made for an enclosing module's full backward hooks (a child reading its
    parent's input) replaced by the argument that module was called with: the copy's gradient is the parent's
    own path's share, the argument's the whole, as in a run without the hooks."""
    if not any(isinstance(a, torch.Tensor) and type(a.grad_fn).__name__ == _HOOK_NODE for a in args):
        return args
    called = {}
    for frame in frames:
        if _backward_hooked(frame[0]):
            for a in frame[3]:
                if isinstance(a, torch.Tensor):
                    called[(a.data_ptr(), a.shape, a.dtype)] = a
    return tuple(called.get((a.data_ptr(), a.shape, a.dtype), a)
                 if isinstance(a, torch.Tensor) and type(a.grad_fn).__name__ == _HOOK_NODE else a for a in args)


_HOOK_NODE = "BackwardHookFunctionBackward"
_COMPILED = "_orig_mod"  # the attribute torch.compile's OptimizedModule holds the compiled module in
run_eagerly(Namer._enter, Namer._leave, Namer._leave_late)
COMPILED_EAGER_WARNING = (
    "the model is compiled with torch.compile: an op-level capture runs it eagerly (dynamo compiles nothing under "
    "its dispatch mode), so the dump holds eager numerics; capture with level=\"module\" to record what the "
    "compiled code computes, module by module")


class CompiledEagerWarning(UserWarning):
    """A torch.compile'd model ran under an op-level capture, which runs it eagerly."""
