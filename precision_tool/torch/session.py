"""The one dispatch mode behind `dump` and `simulate_npu`, and the steps they share.

Both context managers register with a process-wide `Session`, which pushes a
single TorchDispatchMode while some context wants aten ops. One mode, not two
stacked ones, so that the order the two are entered in does not matter: every
aten op is named once, simulated if a simulator is active, and then recorded
with the numbers it really produced (simulated values and overflow flags when
simulating). A step that no op-level recorder records and no simulator runs
goes without the mode (`Session._ops_wanted`): its ops cost what they cost
without capture, and the steps around it are named and numbered as if it had
been seen.

Steps. A step ends after each ``optimizer.step()`` (of any torch.optim
optimizer; the next op starts the next step), or when `step` is called; the
first explicit `step` call turns the optimizer rule off for the rest of the
session, so ``opt.step(); d.step(loss)`` ends one step, not two, and neither
does ``scaler.step(opt); scaler.update(); d.step(loss, scaler.get_scale())``
(a loss scaler's update stays in the step its optimizer ended). Steps count
from 0 when the first context is entered. Single-threaded use only: the
session is global, like the module hooks it installs.
"""

from __future__ import annotations

import gc
import math
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from precision_tool.dump.layout import JsonReady
from precision_tool.dump.records import MODULE_TYPE_PREFIX
from precision_tool.engine.hooks import BACKWARD
from precision_tool.torch.modules import QUIET, ModuleGradients, float_leaves, trained, without_modes
from precision_tool.torch.naming import Namer
from precision_tool.torch.param_grads import note_parameter_gradients
from precision_tool.torch.process import StepTailHook, compiled_code_eager, freeze_heap, run_eagerly
from precision_tool.torch.ops import (AUTOCAST_STEP_WARNING, AtenOp, AutocastOptimizerWarning, as_float,
                                     autocast_dtype, complete_collective, compute_dtype, dtype_name, encode_args,
                                     flat_tensors, on_meta, op_info, result_tensors)
from precision_tool.torch.tensors import FORMAT_ATTR, logical_dtype

_current_node = torch._C._current_autograd_node
# one call into C saying whether any autocast region is active, before asking which (`autocast_dtype`)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_current_mode = torch.utils._python_dispatch._get_current_dispatch_mode


class OpCall:
    """One op execution as the session, the simulator and the recorders pass it along."""

    __slots__ = ("info", "step", "exec_index", "name", "direction", "node", "args", "kwargs",
                 "inputs", "input_dtypes", "outputs", "output_dtypes", "compute_dtype", "overflow",
                 "inherited", "forward_op", "_attrs")

    def __init__(self, info: AtenOp, step: int, exec_index: int, name: str, direction: str, node,
                 args: tuple, kwargs: dict):
        self.info = info
        self.step = step
        self.exec_index = exec_index
        self.name = name
        self.direction = direction
        self.node = node
        self.args, self.kwargs = args, kwargs  # what the kernel is called with
        self.inputs: list = []
        self.input_dtypes: list[str] | None = None
        self.outputs: list = []
        self.output_dtypes: list[str] | None = None
        self.compute_dtype = ""
        self.overflow: bool | None = None  # None: not simulated, recorders judge from the outputs
        self.inherited = False
        self.forward_op = ""
        self._attrs: dict | None = None

    @property
    def attrs(self) -> dict:
        """The op's arguments for replay, tensors as input slots (in `inputs` order); built on first use."""
        if self._attrs is None:
            encoded_args, encoded_kwargs, _ = encode_args(self.args, self.kwargs)
            self._attrs = JsonReady(overload=self.info.overload, args=encoded_args, kwargs=encoded_kwargs)
            if self.info.flags:  # what the analysis compares as flags (`analysis.arguments.flag_paths`)
                self._attrs["flags"] = [list(flag) for flag in self.info.flags]
            if encoded_args:  # what its evidence calls them (`analysis.arguments.argument_changes`)
                self._attrs["names"] = list(self.info.arg_names[:len(encoded_args)])
            if self.direction == BACKWARD:
                self._attrs["autograd_node"] = self.node.name()
                if self.forward_op:
                    self._attrs["forward_op"] = self.forward_op
        return self._attrs


class _Interceptor(TorchDispatchMode):
    def __init__(self, session: "Session"):
        super().__init__()
        self._session = session

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Leave ``__torch_dispatch__`` unwrapped by ``torch._disable_dynamo``, which keeps compiled regions from
        tracing a mode's handler at a few microseconds an aten op: `process.run_eagerly` does, at none."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if QUIET.depth:  # the capture reading tensors (`without_modes`): not an op of the run
            return func(*args, **(kwargs or {}))
        return self._session.dispatch(func, args, kwargs or {})


class Session:
    """Process-wide state shared by the active `dump` and `simulate_npu` contexts."""

    def __init__(self) -> None:
        self.recorders: list = []
        self.simulators: list = []
        self.namer = Namer()
        self.step = 0
        self.exec_index = 0
        self.step_open = False
        self.step_overflow = False
        self.stepped = self.scaled = False  # this step: an optimizer stepped; a loss scaler updated its scale
        self.pending_boundary = False
        self.manual_steps = False
        self.optimizer = None
        self._watching: list = []
        self._mode: _Interceptor | None = None
        self._started = False
        self._compiled_back = None  # puts back the torch.compile stance the pushed mode set (`compiled_code_eager`)
        self._handles: list = []
        self._warned_autocast = False
        self._gradients = ModuleGradients(self._module_gradients)
        self._froze = False
        self._told_autocast = False  # the recorders of the open step know autocast is active
        # id(module) -> (module, its forward records' attrs) this step (`modules.trained`); the module is kept to
        # tell it from one freed since at its address (a model built after the last context's last step)
        self._trains: dict[int, tuple] = {}

    @property
    def simulator(self):
        return self.simulators[-1] if self.simulators else None

    @property
    def active(self) -> bool:
        return self._started

    # -- contexts -------------------------------------------------------------

    def attach(self, recorder=None, simulator=None) -> None:
        if not self._started:
            self._start()
        if recorder is not None:
            self.recorders.append(recorder)
            try:
                began = self.step_open and recorder.begin_step(self.step)
            except BaseException:  # its file could not be opened: not attached, or every later op fails again
                self.detach(recorder=recorder)
                raise
            if began:
                self._watching.append(recorder)
                self._told_autocast = False
        if simulator is not None:
            self.simulators.append(simulator)
        self._sync_mode()

    # -- the dispatch mode, pushed only while some context wants aten ops --------

    def _ops_wanted(self) -> bool:
        """Whether aten ops must be intercepted from here on.

        A simulator always wants them. An op-level recorder wants those of a
        step it records; between steps (an optimizer step done, its loss
        scaler's update maybe still to come) those of the step that ended if
        it records it, or of the next if it will. Module-level recorders see
        module calls, not ops. Steps nobody records then run without the
        mode: ``dump(..., steps=...)`` costs the module hooks in them, not the
        interception of every op.
        """
        if self.simulators:
            return True
        op_level = [r for r in self.recorders if getattr(r, "level", "op") != "module"]
        if not op_level:
            return False
        if self.step_open:
            if any(r in self._watching for r in op_level):
                return True
            if not self.pending_boundary:
                return False
            upcoming = self.step + 1
        else:
            upcoming = self.step
        return any(r.records_step(upcoming) for r in op_level)

    def _sync_mode(self) -> None:
        """Push the dispatch mode when ops are wanted and pop it when not; called only outside dispatch (a
        context entered or left, an optimizer step ended, an explicit step, a module about to run)."""
        self.namer.on_enter = None
        if not self._started:
            return
        wanted = self._ops_wanted()
        if wanted and self._mode is None:
            self._mode = _Interceptor(self)
            self._mode.__enter__()
            QUIET.mode = self._mode
            self.namer.resume()  # autograd nodes made while idle are nobody's
            self._compiled_back = compiled_code_eager()
        elif not wanted and self._mode is not None and _current_mode() is self._mode:  # (under a mode the user
            mode, self._mode = self._mode, None  # pushed after it, it stays)
            QUIET.mode = None
            self.namer.pause()
            self._restore_compiled()
            mode.__exit__(None, None, None)

    def _restore_compiled(self) -> None:
        back, self._compiled_back = self._compiled_back, None
        if back is not None:
            back()

    def step_tail_called(self) -> None:
        """A loss scaler's update ran. Dispatch saw it, unless the mode was popped: then this is the step
        boundary the op marks there (an update also ends an iteration whose optimizer step it skipped, and no
        optimizer hook was called)."""
        self.scaled = True
        if self._mode is not None or self.manual_steps or _current_node() is not None:
            return
        self.pending_boundary = True
        self._sync_mode()

    def _idle_at_op_level(self) -> bool:
        """No op is intercepted although an op-level recorder is attached: steps are then numbered as if ops
        opened them."""
        return self._mode is None and any(getattr(r, "level", "op") != "module" for r in self.recorders)

    def _ops_would_run(self) -> None:
        """What the first op of a call marks in dispatch, where no op is seen: the end of a concluded step, the
        start of the next."""
        if self.pending_boundary:
            self.end_step()
        if not self.step_open:
            self._open_step()

    def _concluding(self) -> bool:
        """Whether an op after an optimizer's step belongs to the step it concluded: one run under no_grad outside
        every module and every optimizer's step (float32 master weights copied back into a 16-bit model, an
        average of the weights updated), not the next iteration's first."""
        return self.optimizer is None and not self.namer.module_path and not torch.is_grad_enabled()

    def _idle_soon(self, *_) -> None:
        """A step nobody records at op level began inside dispatch, where the mode cannot be popped: pop it at
        the next module call."""
        self._sync_mode()

    def detach(self, recorder=None, simulator=None) -> None:
        if recorder is not None and recorder in self.recorders:
            self.recorders.remove(recorder)
            if recorder in self._watching:
                self._watching.remove(recorder)
        if simulator is not None and simulator in self.simulators:
            self.simulators.remove(simulator)
        if not self.recorders and not self.simulators and self._started:
            self._stop()
        else:
            self._sync_mode()  # (a simulator left in a step no recorder records at op level)

    def _start(self) -> None:
        from torch.optim import optimizer

        self.step, self.exec_index = 0, 0
        self._warned_autocast = False
        self.step_open = self.pending_boundary = self.manual_steps = self.step_overflow = False
        self.namer.install()
        self.namer.on_leave = self._module_done
        self._tail = StepTailHook(self)
        self._handles = [optimizer.register_optimizer_step_pre_hook(self._optimizer_begins),
                         optimizer.register_optimizer_step_post_hook(self._optimizer_ends), self._tail]
        self._started = True  # the dispatch mode is pushed by `attach` once a context needs ops
        self._froze = freeze_heap()

    def _stop(self) -> None:
        mode, self._mode = self._mode, None
        QUIET.mode = None
        self._started = False
        self._restore_compiled()
        try:
            if mode is not None:
                mode.__exit__(None, None, None)
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self.namer.uninstall()
            self.namer.on_enter = None
            self.optimizer = None
            self._watching = []
            self._trains.clear()  # (its modules, held no longer than the session)
            if self._froze:
                self._froze = False
                gc.unfreeze()

    def _optimizer_begins(self, optimizer, args, kwargs):
        closure = args[1] if len(args) > 1 else kwargs.get("closure")  # (args: the optimizer, then step's)
        if callable(closure):  # a closure optimizer's (LBFGS): each step() an iteration, its closure the model's
            if self.pending_boundary and not self.manual_steps:  # forward and backward, named and simulated as
                self.end_step()  # such, not as the optimizer's update
            args, kwargs = ((args[0], self._model_code(closure), *args[2:]), kwargs) if len(args) > 1 else \
                (args, {**kwargs, "closure": self._model_code(closure)})
        found_inf = getattr(optimizer, "found_inf", None)  # a GradScaler's hand-off to a fused optimizer, which
        # skips a step with inf/NaN gradients inside its kernel: the step is skipped as where the scaler skips it
        self.optimizer, self.stepped = optimizer, self.stepped or not (
            isinstance(found_inf, torch.Tensor) and found_inf.numel() == 1 and bool(found_inf.item()))
        # another optimizer's step (or the same one's again) before any op of the next iteration: the iteration
        # goes on, one step (two optimizers, one per part of the model; a scaler's step after a plain one)
        self.pending_boundary = False
        if self._idle_at_op_level():  # its ops, unseen, open a step where none is open, as in dispatch
            self._ops_would_run()
        note_parameter_gradients(self._watching, self._trains, optimizer)  # (module level: the gradients it reads)
        if not self._warned_autocast and autocast_dtype():
            self._warned_autocast = True
            warnings.warn(AUTOCAST_STEP_WARNING, AutocastOptimizerWarning, stacklevel=3)
        return (args, kwargs) if callable(closure) else None

    def _model_code(self, closure):
        def run(*args, **kwargs):
            optimizer, self.optimizer = self.optimizer, None
            try:
                return closure(*args, **kwargs)
            finally:
                self.optimizer = optimizer
        return run

    def _optimizer_ends(self, optimizer, args, kwargs) -> None:
        self.optimizer = None
        if not self.manual_steps:
            self.pending_boundary = True
        self._sync_mode()

    # -- steps ----------------------------------------------------------------

    def explicit_step(self, loss=None, loss_scale=None) -> None:
        """End the current step because the user said so; optimizer steps stop ending steps."""
        self.manual_steps = True
        if self._idle_at_op_level() and not self.step_open:  # the step's ops, unseen, opened it (a loop with no
            self._open_step()  # module and no torch.optim optimizer)
        self.end_step(loss, loss_scale)
        self._sync_mode()

    def end_step(self, loss=None, loss_scale=None) -> None:
        """Close the open step in every recorder; the next op opens the next step."""
        self.pending_boundary = False
        if not self.step_open:
            return
        loss = as_float(loss, math.nan)
        loss_scale = as_float(loss_scale, 1.0)
        self._gradients.flush()
        with without_modes():  # a loss scaler skipped the optimizer's step (inf/NaN gradients; its update may come
            skipped = not self.stepped and (self.scaled or self._tail.found_inf())  # after the step's end)
        for recorder in self._watching:
            recorder.end_step(self.step, loss, loss_scale, self.step_overflow, skipped)
        self.namer.new_step()
        self._trains.clear()
        self.step += 1
        self.exec_index = 0
        self.step_open = self.step_overflow = False
        self._watching = []

    def _open_step(self) -> None:
        self.step_open, self.scaled = True, False
        self._tail.found.clear()
        self.stepped = self.optimizer is not None  # (a step opened by an optimizer's first op)
        self._told_autocast = False
        self._watching = [r for r in self.recorders if r.begin_step(self.step)]
        if self._mode is not None and not self.simulators and \
                not any(getattr(r, "level", "op") != "module" for r in self._watching):
            self.namer.on_enter = self._idle_soon

    # -- module boundaries -----------------------------------------------------

    def _module_done(self, module, path: str, args, kwargs, output) -> None:
        """A module's forward returned: its float inputs and outputs go to the recorders that keep modules."""
        if self._mode is None:  # no op intercepted (module level only, or idle): module calls open and end steps
            opened = not self.step_open or self.pending_boundary
            self._ops_would_run()
            if opened and self._ops_wanted():  # (an op-level recorder's step that no earlier call foresaw)
                self._sync_mode()
        elif self.namer.on_enter is not None:
            self._sync_mode()
        if not self.step_open or self.pending_boundary:
            return
        if self._watching and not self._told_autocast and _any_autocast() and autocast_dtype():  # visible here, not
            for recorder in self._watching:  # inside dispatch, in Python; once a step is enough
                recorder.saw_autocast()
            self._told_autocast = True
        watching = [r for r in self._watching if r.modules]
        if not watching:
            return
        with without_modes():  # reading the tensors must not dispatch through the capture itself
            outputs = float_leaves(output)
            if not outputs:
                return
            inputs = float_leaves((args, kwargs))
            exec_index = self.exec_index
            self.exec_index += 1
            module_type = f"{MODULE_TYPE_PREFIX}{type(module).__name__}"
            known = self._trains.get(id(module))
            if known is None or known[0] is not module:
                known = self._trains[id(module)] = (module, trained(module), path)
            attrs = known[1]
            for recorder in watching:
                recorder.module(exec_index, path, module_type, list(enumerate(inputs)), list(enumerate(outputs)),
                                attrs=attrs)
            self._gradients.watch(path, module_type, self.step, inputs, outputs,
                                  summarise=all(getattr(r, "mode", "") == "stats" for r in watching))

    def _module_gradients(self, pending) -> None:
        """A module call's boundary gradients arrived: a backward module record, after the ops that made them."""
        if not self.step_open or pending.step != self.step:
            return
        watching = [r for r in self._watching if r.modules]
        if not watching:
            return
        with without_modes():
            exec_index = self.exec_index
            self.exec_index += 1
            inputs, outputs = sorted(pending.inputs.items()), sorted(pending.outputs.items())
            for recorder in watching:
                recorder.module(exec_index, pending.name, pending.module_type, inputs, outputs, BACKWARD)

    # -- every op -------------------------------------------------------------

    def dispatch(self, func, args: tuple, kwargs: dict):
        info = op_info(func)
        if info.passthrough or on_meta(args, kwargs):  # (meta: shapes without values, a deferred init: nothing to
            # simulate or record)
            result = func(*args, **kwargs)
            if info.alias and self.simulators and isinstance(result, torch.Tensor):
                fmt = getattr(args[0], FORMAT_ATTR, None)
                if fmt is not None:
                    setattr(result, FORMAT_ATTR, fmt)
            return result
        node = _current_node()
        if self.pending_boundary and not (node is None and (info.step_tail or self._concluding())):
            self.end_step()  # (a loss scaler's update after the optimizer: the step it concludes)
        if not self.step_open:
            self._open_step()
        direction, name = self.namer.name(info.type, node, self.optimizer)
        call = OpCall(info, self.step, self.exec_index, name, direction, node, args, kwargs)
        self.exec_index += 1
        watching = [r for r in self._watching if r.wants(call)] if self._watching else None
        simulator = self.simulator
        if simulator is not None:
            before = (lambda: self._before_kernel(call, watching, True)) if watching else None
            result = simulator.run(call, before)
            describe = logical_dtype
        else:
            if watching:
                self._before_kernel(call, watching, False)
            result = func(*args, **kwargs)
            complete_collective(info, result)
            call.outputs = result_tensors(info, args, kwargs, result)
            describe = _torch_dtype
        if call.overflow:
            self.step_overflow = True
        if info.step_tail and node is None and not self.manual_steps:
            self.pending_boundary = True  # a loss scaler's update ends its iteration, also one whose update it skipped
        if watching:
            call.output_dtypes = [describe(t) for t in call.outputs]
            if not call.compute_dtype:
                call.compute_dtype = compute_dtype(call)
            for recorder in watching:
                recorder.after(call)
        return result

    def _before_kernel(self, call: OpCall, watching, simulated: bool) -> None:
        """Just before the kernel runs: its inputs, as the kernel sees them, go to the recorders."""
        call.inputs = flat_tensors((*call.args, *call.kwargs.values()))
        if call.direction == BACKWARD:
            call.forward_op = self.namer.forward_op_of(call.node)
        describe = logical_dtype if simulated else _torch_dtype
        call.input_dtypes = [describe(t) for t in call.inputs]
        for recorder in watching:
            recorder.before(call)


def _torch_dtype(tensor: torch.Tensor) -> str:
    return dtype_name(tensor.dtype)


SESSION = Session()


def step(loss=None, loss_scale=None) -> None:
    """End the current step of every active `dump` / `simulate_npu`, noting its loss (and loss scale).

    Optional when the loop calls ``optimizer.step()``: that ends steps by itself.
    """
    if SESSION.active:
        SESSION.explicit_step(loss, loss_scale)


run_eagerly(_Interceptor.__torch_dispatch__, Session._optimizer_begins, Session._optimizer_ends)
