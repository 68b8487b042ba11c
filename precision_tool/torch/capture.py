"""`dump`: record every aten op of a PyTorch run, forward, backward and optimizer, into a dump.

Modes, as for the engine's collector:

``dump``
    inputs and outputs of every op, as data, with statistics;
``stats``
    statistics only (the cheapest; what CI baselines want);
``overflow``
    only the ops whose result overflowed (non-finite, or the simulated
    float status raised), with their inputs and outputs, in execution order.

Inputs are recorded as the kernel computed from them: under `simulate_npu`
that is after rounding to the compute format, with the logical dtype
(float16/bfloat16) although the torch tensor is float32. View ops (``view``,
``t``, ``transpose``, ...) compute nothing and are not recorded unless
``record_views=True``; neither are ops without a floating-point tensor
(``num_batches_tracked += 1``). Both still count for naming.
"""

from __future__ import annotations

import math
import os
import sys

import torch

from precision_tool.dump.layout import INPUT, OUTPUT, PARAMETER_GRADIENTS, dumps
from precision_tool.dump.partial import check_target
from precision_tool.dump.records import StepRecord
from precision_tool.dump.writer import REPEAT
from precision_tool.engine.formats import FORMATS
from precision_tool.engine.hooks import BACKWARD
from precision_tool.errors import ConfigError, choice_error
from precision_tool.torch.modules import GradientSummary
from precision_tool.torch.ops import args_signature, autocast_dtype, flat_tensors
from precision_tool.torch.session import SESSION, OpCall
from precision_tool.torch.statscache import TensorStatsCache
from precision_tool.torch.tensors import (EMPTY_STATS, array_stats, has_nonfinite, in_memory, logical_dtype,
                                         stats_of, storage_array, stored_values, to_numpy)

MODES = ("dump", "stats", "overflow")
LEVELS = ("op", "module")  # every aten op and module call; module calls only (no op is intercepted)
_MODULE_ATTRS: dict = {}
_NAN, _INF = 6, 7  # positions of the NaN and Inf counts in a statistics tuple
ROLES = ("golden", "target", "overflow")


class dump:  # noqa: N801 - used like a function: ``with dump(...)``
    """Context manager writing every op executed inside it to the HDF5 dump at ``path``.

    ``steps`` None records every step, else only the step numbers listed;
    the others run without the dispatch mode (unless a `simulate_npu` is
    active), at about a plain step's cost, and are still counted.
    ``modules`` (default on, off in overflow mode) also records each
    ``nn.Module`` forward call: its float inputs and outputs, as a record
    named by the module path with type ``module.<class>``, after its ops.
    ``role`` defaults to ``overflow`` in overflow mode, ``target`` when a
    `simulate_npu` is active when the first step begins or ``torch.autocast``
    when the dump is entered, else ``golden``. ``model`` names the run in the metadata
    (default: the script's file name); ``metadata`` adds root attributes.
    ``level="module"`` records only the module calls: no aten op is
    intercepted, so capture costs a fraction of what it costs at op level
    (the default, ``"op"``); not in overflow mode, which judges ops.
    ``ops`` and ``modules`` (globs on op names and on the module paths an op
    lies in; they add up), ``op_types`` and ``backward=False`` narrow what is
    recorded, as `precision-tool collect`'s options do (`Selection`). Under
    `precision-tool zoom` the environment sets path, mode, role and filters
    (`precision_tool.collect.zoom_env`), and the region's tensors are recorded
    at op level whatever ``level`` says.

    Under ``torch.distributed`` (a process group initialised when the dump
    is entered) ``path`` is a run directory: each rank writes
    ``path/rank<R>.h5``, with ``rank`` and ``world_size`` in its metadata,
    and rank 0 writes ``path/run.json`` (`precision_tool.dump.runs`).
    Collectives are recorded once their work completes (see
    `precision_tool.torch.ops.complete_collective`).
    """

    def __init__(self, path, mode: str = "dump", steps=None, *, role: str | None = None,
                 model: str | None = None, seed: int | None = None, record_views: bool = False,
                 modules=True, metadata: dict | None = None, level: str = "op", ops=None, op_types=None,
                 backward: bool = True):
        from precision_tool.collect.selection import Selection, parse_op_types, parse_steps
        from precision_tool.collect.zoom_env import zoom_settings

        module_globs = () if isinstance(modules, bool) else modules  # True/False: module records on or off
        modules = modules if isinstance(modules, bool) else True
        zoom = zoom_settings()
        if zoom is not None:
            path, mode, role, steps = zoom.path, zoom.mode, role or zoom.role, zoom.steps
            if zoom.mode == "dump":  # the region, at op level: its globs name ops and modules
                ops, module_globs, op_types, backward = zoom.ops, zoom.modules, None, zoom.backward
                level = "op"
        if mode not in MODES:
            raise choice_error("dump mode", mode, MODES)
        if level not in LEVELS:
            raise choice_error("capture level", level, LEVELS)
        if level == "module" and (mode == "overflow" or not modules):
            raise ValueError("level='module' records module calls: it needs modules=True and a dump or stats mode")
        if role is not None and role not in ROLES:
            raise choice_error("role", role, ROLES)
        try:
            self.path = os.fsdecode(os.fspath(path))  # (a bytes path as its str)
        except TypeError:
            raise ConfigError(f"ptt.dump's path is {type(path).__name__} {path!r:.40}: give the HDF5 file to write "
                              "(a str or os.PathLike)") from None
        self.mode = mode
        self.steps = parse_steps(steps)
        types = parse_op_types(op_types)  # an aten op's type as its name says it too: "mm" is "aten.mm"
        types = None if types is None else frozenset(t if "." in t else f"aten.{t}" for t in types)
        self.selection = Selection.build(self.steps, ops, types, backward, module_globs)
        self._every_op = self.selection.every_op  # (a property: asked once, not per op)
        self._wanted: dict[tuple, bool] = {}
        self.role = role
        self.model = model
        self.seed = seed
        self.record_views = record_views
        self.modules = modules and mode != "overflow"
        self.level = level
        self.extra_metadata = dict(metadata or {})
        if zoom is not None and zoom.runs_float32 is not None:  # what the whole run computes in, for the region's
            self.extra_metadata["runs_float32"] = zoom.runs_float32  # diagnosis (`omissions.runs_float32`)
        self._attrs: dict[str, tuple] = {}  # op name -> (signature of its arguments, attrs)
        self.ops_recorded = 0
        self.steps_written = 0
        self._writer = None
        self._step: int | None = None
        self._step_ops = 0
        self._step_overflow = False
        self._stats = TensorStatsCache()
        self._inputs: list = []  # (stats, array) of the op in flight, taken before its kernel ran
        self._keys: list | None = None  # in dump mode, `_values_key` of each of those (None: not keyed)
        self._mutated = _NO_IDS  # ids of the tensors the op in flight writes in place (its schema's ``(a!)``)
        self._autocast = ""
        self.run_dir: str | None = None  # under torch.distributed: the run directory ``path`` names
        self.rank: int | None = None
        self.world_size: int | None = None
        self._entered = False

    # -- context ---------------------------------------------------------------

    def __enter__(self) -> "dump":
        if self._entered:  # (its writer committed its steps and closed: a second run would find step 0 written)
            raise ConfigError(f"this ptt.dump({self.path!r}) recorded a run already: make a new ptt.dump for each "
                              "run (one with block; several epochs inside it are one run)")
        self._entered = True
        self._join_run()
        if self._writer is None:  # a file that cannot be written is said at the ``with``, not at the first op
            check_target(self.path, overwrite=True, only_dumps=True)
        self._autocast = autocast_dtype()  # autocast is off inside dispatch, where the metadata is written
        SESSION.attach(recorder=self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        concluded = SESSION.pending_boundary  # the optimizer's step ended the open step: its ops are all there
        SESSION.detach(recorder=self)
        try:
            if self._step is not None and (exc_type is None or concluded):  # (an exception in the next batch's
                # loading keeps the step it follows)
                self.end_step(self._step, math.nan, 1.0, False)
            elif self._step is not None and self._step_ops and not issubclass(exc_type, KeyboardInterrupt):
                # the run failed inside the step (a loss gone NaN that the script stops at; not stopped by
                # Ctrl-C): the ops up to the failure, the evidence, kept and marked
                self.end_step(self._step, math.nan, 1.0, False, cut_short=True)
            if self._writer is None and exc_type is None:
                self._open_writer()
        finally:
            if self._writer is not None:
                self._writer.close(complete=exc_type is None)

    def _join_run(self) -> None:
        """Under an initialised process group, write this rank's dump into the run directory ``path``."""
        distributed = getattr(torch, "distributed", None)
        if distributed is None or not distributed.is_available() or not distributed.is_initialized():
            return
        from precision_tool.dump.runs import rank_path, write_manifest

        if self.run_dir is None:
            self.run_dir = self.path
        self.rank, self.world_size = distributed.get_rank(), distributed.get_world_size()
        self.path = rank_path(self.run_dir, self.rank)
        os.makedirs(self.run_dir, exist_ok=True)
        if self.rank == 0:
            write_manifest(self.run_dir, self.world_size, backend=str(distributed.get_backend()))
        self.extra_metadata = {"rank": self.rank, "world_size": self.world_size, **self.extra_metadata}

    def step(self, loss=None, loss_scale=None) -> None:
        """End the current step, noting its loss (see `precision_tool.torch.step`)."""
        SESSION.explicit_step(loss, loss_scale)

    # -- called by the session -------------------------------------------------

    def records_step(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    def begin_step(self, step: int) -> bool:
        """A step begins; return whether this dump records it."""
        if not self.records_step(step):
            return False
        if self._writer is None:
            self._open_writer()
        self._writer.begin_step(step)
        self._step = step
        self._step_ops = 0
        self._step_overflow = False
        self._stats.clear()
        self.tables = {}  # the step's tables besides its index, by name (`param_grads`)
        return True

    def wants_gradient_table(self) -> bool:
        """Whether the open step is the first this dump records and has no table of parameter gradients yet
        (`param_grads`: the diagnosis reads the first step's; a table a step would cost a dataset a step)."""
        return self._step is not None and not self.steps_written and PARAMETER_GRADIENTS not in self.tables

    def wants(self, call: OpCall) -> bool:
        return self.level == "op" and (self.record_views or not call.info.is_view) and \
            (self._every_op or self._selected(call.name, call.info.type, call.direction))

    def _selected(self, name: str, op_type: str, direction: str) -> bool:
        if self._every_op:
            return True
        key = (name, op_type, direction)
        if key not in self._wanted:
            self._wanted[key] = self.selection.wants(name, op_type, direction)
        return self._wanted[key]

    def before(self, call: OpCall) -> None:
        info = call.info
        mutated = _ids(info.mutated_args(call.args, call.kwargs)) if info.mutated else _NO_IDS
        self._mutated = mutated
        written = mutated
        if info.hidden_writes:  # written undeclared (a BatchNorm's running statistics)
            written = set(mutated)
            for position in info.hidden_writes:
                if position < len(call.args) and isinstance(call.args[position], torch.Tensor):
                    written.add(id(call.args[position]))
        if self.mode == "stats" and not written:  # the common case, in one comprehension
            get = self._stats.get
            self._inputs = [(get(tensor, dtype), None) for tensor, dtype in zip(call.inputs, call.input_dtypes)]
            return
        inputs, keys = [], []
        for tensor, dtype in zip(call.inputs, call.input_dtypes):
            key = None
            if info.overwrites and id(tensor) in written:  # never read (uniform_, fill_): may be garbage
                inputs.append((EMPTY_STATS, None))
            elif self.mode == "stats":
                inputs.append((self._stats.get(tensor, dtype), None))
            elif not in_memory(tensor):  # a sparse gradient: statistics only, in every mode
                inputs.append((stats_of(tensor, dtype), None))
            elif self.mode == "overflow":  # the values are read only if the op overflows
                inputs.append((None, to_numpy(tensor, copy=True) if id(tensor) in written else tensor))
            else:  # statistics as every other reader of it records them (bit for bit: the dataflow is followed by
                stats = self._stats.get(tensor, dtype)  # statistics; on a GPU the device's sums and numpy's
                key = _values_key(tensor, dtype, stats)  # differ in the last bit)
                if self._writer.holds(key):
                    array = REPEAT
                elif id(tensor) in written:  # the kernel is about to overwrite it: keep a copy
                    array = to_numpy(tensor, copy=True)
                else:
                    array = storage_array(tensor)
                inputs.append((stats, array))
            keys.append(key)
        self._inputs, self._keys = inputs, keys

    def after(self, call: OpCall) -> None:
        inputs, self._inputs = self._inputs, []
        keys, self._keys = self._keys, None
        for position in call.info.hidden_writes:  # updated without a new version: older statistics are stale
            if position < len(call.args) and isinstance(call.args[position], torch.Tensor):
                self._stats.overwritten(call.args[position])
        if not _any_float(call.output_dtypes) and not _any_float(call.input_dtypes):
            return  # integer bookkeeping (num_batches_tracked += 1): nothing to compare
        if self.mode == "overflow":
            overflow = call.overflow if call.overflow is not None else has_nonfinite(call.outputs)
            if not overflow:
                return
            inputs = [_values(item, dtype) for item, dtype in zip(inputs, call.input_dtypes)]
        with_data = self.mode != "stats"
        output_stats = self._output_stats
        if self.mode == "dump":
            outputs, keys = [], (keys or [None] * len(inputs)) + [None] * len(call.outputs)
            for position, (tensor, dtype) in enumerate(zip(call.outputs, call.output_dtypes), len(inputs)):
                stats = output_stats(call, inputs, tensor, dtype)
                if not in_memory(tensor):  # a sparse gradient: statistics only
                    outputs.append((stats, None))
                    continue
                key = keys[position] = _values_key(tensor, dtype, stats)
                outputs.append((stats, REPEAT if self._writer.holds(key) else storage_array(tensor)))
        else:
            keys = None
            outputs = [(output_stats(call, inputs, t, d), stored_values(t) if with_data else None)
                       for t, d in zip(call.outputs, call.output_dtypes)]
        overflow, inherited = call.overflow, call.inherited
        if overflow is None:
            overflow = False
            for stats, _ in outputs:
                if stats[_NAN] or stats[_INF]:
                    overflow = True
                    inherited = any(_nonfinite(s) for s, _ in inputs)
                    break
            else:
                inherited = False
        entries = [(INPUT, index, dtype, tuple(tensor.shape), item[0])
                   for index, (item, tensor, dtype) in enumerate(zip(inputs, call.inputs, call.input_dtypes))]
        entries += [(OUTPUT, index, dtype, tuple(tensor.shape), item[0])
                    for index, (item, tensor, dtype) in enumerate(zip(outputs, call.outputs, call.output_dtypes))]
        arrays = [item[1] for item in inputs] + [item[1] for item in outputs] if with_data else None
        self._writer.add_op(call.exec_index, call.direction, call.name, call.info.type, call.compute_dtype,
                            bool(overflow), bool(inherited), None, self._same_attrs(call), entries, arrays, keys)
        self._step_overflow |= bool(overflow)
        self._step_ops += 1
        self.ops_recorded += 1

    def saw_autocast(self) -> None:
        """A module ran under torch.autocast although the dump was entered outside it: say so in the metadata."""
        if self._autocast or self._writer is None:
            return
        self._autocast = autocast_dtype()
        if SESSION.simulator is None and self._autocast:
            self._precision_mode = f"autocast_{self._autocast}"
            values = {"autocast": self._autocast, "precision_mode": self._precision_mode}
            if self.role is None and self.mode != "overflow":
                values["role"] = "target"
            self._writer.set_metadata(**values)

    def module(self, exec_index: int, name: str, module_type: str, inputs: list, outputs: list,
               direction: str = "forward", attrs: dict | None = None) -> None:
        """A module boundary: its float (slot index, tensor) inputs and outputs as one module record; in
        backward the gradients at its outputs (inputs) and inputs (outputs), `precision_tool.torch.modules`.
        ``attrs``: the record's (a forward call's parameters it trains: `modules.trained`)."""
        if not outputs or not self._selected(name, module_type, direction):  # nothing flowed out (a backward
            return  # call whose inputs take no gradient), or not selected
        with_data = self.mode != "stats"
        # no op is intercepted at module level, so a write through ``.data`` goes unseen by the statistics
        # cache: statistics of the values stored are taken from them, or the dump contradicts itself
        stats_now = with_data and self.level == "module"
        entries, arrays = [], [] if with_data else None
        keys = [] if with_data and not stats_now else None  # the values the module's ops stored: referred to
        for kind, tensors in ((INPUT, inputs), (OUTPUT, outputs)):
            for index, tensor in tensors:
                if isinstance(tensor, GradientSummary):  # a gradient summarised when it arrived (stats mode)
                    entries.append((kind, index, tensor.dtype, tensor.shape, tensor.stats))
                    continue
                dtype = logical_dtype(tensor)
                stats = stats_of(tensor, dtype) if stats_now else self._stats.get(tensor, dtype)
                entries.append((kind, index, dtype, tuple(tensor.shape), stats))
                if keys is not None and in_memory(tensor):
                    keys.append(_values_key(tensor, dtype, stats))
                    arrays.append(REPEAT if self._writer.holds(keys[-1]) else storage_array(tensor))
                elif keys is not None:
                    keys.append(None)
                    arrays.append(None)
                elif with_data:
                    arrays.append(stored_values(tensor))
        self._writer.add_op(exec_index, direction, name, module_type, entries[-1][2], False, False, None,
                            attrs or _MODULE_ATTRS, entries, arrays, keys)
        self._step_ops += 1
        self.ops_recorded += 1

    def _same_attrs(self, call: OpCall) -> dict:
        """``call.attrs``, or the equal dict recorded under this name before: the writer encodes it once.

        An op repeats its arguments every step, so an equal signature of them
        (`args_signature`) finds the recorded dict without encoding them again.
        """
        signature = (call.info, call.forward_op, call.node.name() if call.direction == BACKWARD else None,
                     args_signature(call.args, call.kwargs))
        previous = self._attrs.get(call.name)
        if previous is not None:
            known, attrs = previous
            if signature[3] is not None and signature == known:
                return attrs
            if signature[3] is None and dumps(attrs) == dumps(call.attrs):  # as stored: 1 and True differ
                return attrs
        self._attrs[call.name] = (signature, call.attrs)
        return call.attrs

    def _output_stats(self, call: OpCall, inputs: list, tensor: torch.Tensor, dtype: str) -> tuple:
        if self._mutated and id(tensor) in self._mutated:
            return self._stats.written(tensor, dtype)  # an in-place or out= result
        if call.info.same_values and inputs and inputs[0][0] is not None and call.input_dtypes[0] == dtype \
                and call.inputs[0].numel() == tensor.numel():
            stats = inputs[0][0]
            self._stats.put(tensor, dtype, stats)
            return stats
        return self._stats.get(tensor, dtype)

    def end_step(self, step: int, loss: float, loss_scale: float, overflow: bool, skipped: bool = False,
                 cut_short: bool = False) -> None:
        if self._step is None:
            return
        self._writer.end_step(StepRecord(step, loss, loss_scale, overflow or self._step_overflow, skipped,
                                         precision_mode=self._precision_mode, ops_recorded=self._step_ops,
                                         cut_short=cut_short), tables=self.tables)
        self._step, self.tables = None, {}
        self._stats.clear()
        self.steps_written += 1

    # -- metadata --------------------------------------------------------------

    def _open_writer(self) -> None:
        from precision_tool.dump.writer import DumpWriter

        self._writer = DumpWriter(self.path, self._metadata())

    def _metadata(self) -> dict:
        simulator = SESSION.simulator
        autocast = self._autocast
        if simulator is not None:
            device, precision_mode, overflow_mode = "npu", simulator.precision_mode, simulator.overflow_mode
        elif autocast:
            device, precision_mode, overflow_mode = "golden", f"autocast_{autocast}", "inf_nan"
        else:
            device, precision_mode, overflow_mode = "golden", "golden_float32", "inf_nan"
        self._precision_mode = precision_mode
        role = self.role or ("overflow" if self.mode == "overflow"
                             else "target" if simulator is not None or autocast else "golden")
        metadata = {
            "role": role, "mode": self.mode, "framework": "torch",
            "model": self.model or os.path.basename(sys.argv[0] or "") or "python",
            "seed": int(self.seed if self.seed is not None else torch.initial_seed()),
            "device": device, "precision_mode": precision_mode, "overflow_mode": overflow_mode,
            "origin_dtype": "float32", "autocast": autocast, "torch_version": torch.__version__,
            "steps_filter": sorted(self.steps) if self.steps is not None else None,
            "selection": self.selection.describe(),
            "record_views": self.record_views, "modules": self.modules, "capture_level": self.level,
        }
        if simulator is not None and simulator.mixlists != type(simulator.mixlists)():
            metadata["modify_mixlist"] = {k: sorted(getattr(simulator.mixlists, k)) for k in ("white", "black", "gray")}
        metadata.update(self.extra_metadata)
        return metadata

    _precision_mode = ""
    tables: dict = {}


def _values(item: tuple, dtype: str) -> tuple:
    """(statistics, array) of an overflow-mode input kept as (None, tensor or array copy)."""
    stats, values = item
    if values is None:
        return stats, None
    if isinstance(values, torch.Tensor):
        values = to_numpy(values)
    return array_stats(values, dtype), values


def _values_key(tensor: torch.Tensor, dtype: str, stats: tuple) -> tuple:
    """What names ``tensor``'s values within a step, for the writer to store them once (`DumpWriter.add_op`).

    ``stats`` are the tensor's statistics from the step's `TensorStatsCache`,
    which hands out the same tuple object again only while the memory they
    were computed from holds the same values (its version, writes through
    other aliases): the same object, over the same view of the same memory,
    means the same values. The key holds the tuple, so that its id is not
    reused while the writer remembers the key.
    """
    return tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device, dtype, id(stats), stats


_NO_IDS: frozenset = frozenset()
_FLOAT_NAMES: dict[str, bool] = {}  # dtype name -> whether it names a floating-point format


def _ids(values) -> frozenset:
    """The ids of the tensors in ``values`` (tensors and lists of tensors)."""
    return frozenset(id(t) for t in flat_tensors(values))


def _any_float(dtypes) -> bool:
    """Whether one of the recorded dtype names is a floating-point format (the tensor's, or its logical one)."""
    for name in dtypes or ():
        known = _FLOAT_NAMES.get(name)
        if known is None:
            known = _FLOAT_NAMES[name] = name in FORMATS or getattr(getattr(torch, name, None), "is_floating_point",
                                                                  False) is True
        if known:
            return True
    return False


def _nonfinite(stats: tuple) -> bool:
    return bool(stats[_NAN] or stats[_INF])

