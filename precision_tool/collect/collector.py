"""`Collector`: a session hook that records a run to an HDF5 dump.

Use it as a hook, or as a context manager that marks the dump incomplete when
the block raises (Ctrl-C included)::

    from precision_tool.collect import collect_to
    from precision_tool.engine.device import npu
    from precision_tool.session import Session, SessionConfig

    with collect_to("run.h5", mode="stats", steps="0,5-7", ops="block1/*") as collector:
        Session(SessionConfig(model="transformer", device=npu()), hooks=[collector]).run()

The session's ``on_run_end`` closes the dump as complete; leaving the block
by an exception closes it as incomplete, with every finished step readable.
One collector records one run.

Statistics are computed in batches (`StatsBatch`): ``after_op`` queues the
op, its tensors' (kind, slot, dtype, shape, row) and the arrays new to the
step; once the queued arrays hold 256 Ki values their statistics are
computed in one C call (or a few numpy calls). Queued ops are written at
the step's end, or as soon as 128 Ki values wait while ops with tensor data
are queued (dump mode: the data is not kept for long), in one
`DumpWriter.add_ops` call that takes their statistics as one float64
matrix, gathered from the batch's rows: no tuple per tensor is built on the
way to the step's index table. The step's arrays are
told apart by identity (a reshape or transpose by the array it views)
through weak references, so an array is kept only until its batch is
computed. That relies on what the engine guarantees: kernels and the
optimizer return new arrays and never modify their inputs or outputs
afterwards (movement ops may return views, of arrays nobody modifies
either). A hook that changes an event's arrays in place must be registered
before the collector: the collector may read them after later ops ran, and
never reads an array twice in a step.
"""

from __future__ import annotations

import operator
import sys
import weakref

import numpy as np

from precision_tool.collect import modes as M
from precision_tool.collect.selection import Selection
from precision_tool.dump.records import StepRecord
from precision_tool.dump.stats import StatsBatch
from precision_tool.dump.storage import FLOAT_DTYPES
from precision_tool.dump.writer import DumpWriter
from precision_tool.engine.hooks import OpEvent, StepResult
from precision_tool.errors import ConfigError

_FLOATS = frozenset(FLOAT_DTYPES)
_WRITE_AT = 1 << 17  # values waiting for statistics at which ops with data are written
_NAN, _INF, _SATURATED = 6, 7, 8  # columns of a statistics row
_ROW = operator.itemgetter(4)  # of a (kind, index, dtype, shape, row) tensor entry


class Collector:
    """Records what ``mode`` asks for, for the selected steps and ops, to ``path``.

    ``mode`` is ``dump``, ``stats``, ``overflow``, ``fusion-off`` or a
    combination (see `precision_tool.collect.modes`); ``steps`` is a set of
    step numbers or a spec like ``"0,5-7"``; ``ops`` one fnmatch pattern or
    several; ``op_types`` a set or ``"MatMul,Softmax"``; ``backward=False``
    skips backward ops. ``command`` is stored as the dump's command line.
    """

    def __init__(self, path, mode="dump", *, steps=None, ops=None, op_types=None, backward: bool = True,
                 command: str | None = None, overwrite: bool = True, modules=None):
        self.path = str(path)
        self.overwrite = overwrite  # False: refuse to replace an existing dump (a dump being written never is)
        self.modes = M.parse_modes(mode)
        self.selection = Selection.build(steps, ops, op_types, backward, modules)
        self.command = command if command is not None else " ".join(sys.argv)
        self.writer: DumpWriter | None = None
        self.role: str | None = None  # known once the run begins (it depends on the device)
        self.closed = False
        self.ops_recorded = 0
        self.tensors_recorded = 0
        self.steps_run = 0
        self._every_op = M.records_every_op(self.modes)
        # overflow mode alone: the executor builds events only for the ops that raise the float status
        self.only_overflowing_ops = not self._every_op
        self._data = M.records_data(self.modes)
        self._overflow = M.OVERFLOW in self.modes
        self._decisions: dict[tuple[str, str, str], bool] = {}
        self._every_op_selected = self.selection.every_op  # no op filter: no decision to look up
        self._stats = StatsBatch()  # rows of the step's distinct arrays
        self._seen: dict = {}  # identity of an array (see _slots) -> (weak reference, row in self._stats)
        self._queued: list[tuple] = []  # ops waiting for their statistics, in execution order
        self._tensors: list[tuple] = []  # (kind, index, dtype, shape, row in self._stats) of their tensors
        self._queued_data: list | None = None  # per queued op: None or its arrays; None while no op has any
        self._later: list = []  # scratch lists of StatsBatch.take, kept empty between ops
        self._leftover: list = []
        self._in_step = False
        self._step_overflows = 0

    @property
    def mode(self) -> str:
        return M.primary_mode(self.modes)

    # -- hook methods -------------------------------------------------------

    def on_run_begin(self, metadata: dict) -> None:
        if self.writer is not None or self.closed:
            raise ConfigError("a Collector records one run; make a new one for the next run")
        root = self.root_metadata(metadata)
        self.role = root["role"]
        self.writer = DumpWriter(self.path, root, overwrite=self.overwrite, keep_previous=True)

    def on_step_begin(self, step: int) -> None:
        writer = self._writer()
        self._in_step = self.selection.wants_step(step)
        self._step_overflows = 0
        self._forget()
        writer.begin_step(step)

    def after_op(self, event: OpEvent) -> None:
        if event.overflow:
            self._step_overflows += 1
            if self._in_step and self._overflow:
                self._queue(event, True)
                return
        if not (self._in_step and self._every_op):
            return
        if not self._every_op_selected:
            key = (event.name, event.direction, event.type)
            wanted = self._decisions.get(key)
            if wanted is None:
                wanted = self._decisions[key] = self.selection.wants_op(event)
            if not wanted:
                return
        self._queue(event, self._data)

    def on_step_end(self, result: StepResult) -> None:
        writer = self._writer()
        if self._queued:
            self._write_queued()
        self._forget()
        extra = {"overflow_ops": self._step_overflows, "evaluation": result.extra.get("evaluation")}
        record = StepRecord(result.step, result.loss, result.loss_scale, result.overflow, result.skipped,
                            result.precision_mode)
        writer.end_step(record, extra)
        self.steps_run += 1

    def on_run_end(self, summary: dict) -> None:
        if self.writer is not None and not self.closed:
            self.writer.set_metadata(accelerate_switch_step=summary.get("accelerate_switch_step"),
                                     global_step=summary.get("global_step"),
                                     evaluations=summary.get("evaluations") or [])
        self.close(complete=True)

    # -- lifecycle ----------------------------------------------------------

    def close(self, complete: bool = True) -> None:
        """Close the dump; ``complete=False`` marks a run that did not finish."""
        if self.closed:
            return
        self.closed = True
        if self.writer is not None:
            self.writer.close(complete=complete)

    @property
    def size_bytes(self) -> int:
        return self.writer.size_bytes if self.writer is not None else 0

    def __enter__(self) -> "Collector":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)

    # -- internals ----------------------------------------------------------

    def root_metadata(self, metadata: dict) -> dict:
        """The dump's root attributes: the session's metadata plus what this collection was."""
        device = metadata.get("device") if isinstance(metadata.get("device"), dict) else {}
        kind = device.get("device", "")
        root = {
            "command": self.command,
            "role": M.role_for(self.modes, kind),
            "mode": self.mode,
            "modes": list(self.modes),
            "selection": self.selection.describe(),
            "device_kind": kind,
            "precision_mode": device.get("precision_mode", ""),
            "precision_mode_v2": device.get("precision_mode_v2", ""),
            "effective_precision_mode": device.get("effective_precision_mode", ""),
            "overflow_mode": device.get("overflow_mode", ""),
            "fusion_switch": device.get("fusion"),
        }
        root.update({k: v for k, v in metadata.items() if k not in root})
        return root

    def _writer(self) -> DumpWriter:
        if self.writer is None:  # a hook registered after the run began: record without run metadata
            self.on_run_begin({})
        return self.writer

    def _queue(self, event: OpEvent, with_data: bool) -> None:
        """Queue the op, and its new arrays in the statistics batch."""
        arrays = [] if with_data else None
        stats = self._stats
        if arrays is None and stats.native_pass:  # `_slots` inlined: the path of every op in stats mode
            tensors, later, leftover = self._tensors, self._later, self._leftover
            before = len(tensors)
            stats.take(event, _FLOATS, self._seen, tensors, later, leftover)
            if leftover:
                _fill(event, leftover, stats, self._seen, tensors)
            if later:
                stats.settle(later)
                later.clear()
            count = len(tensors) - before
        else:
            count = _slots(event, stats, self._seen, self._tensors, arrays)
        if with_data and self._queued_data is None:
            self._queued_data = [None] * len(self._queued)
        if self._queued_data is not None:
            self._queued_data.append(arrays)
        self._queued.append((event.exec_index, event.direction, event.name, event.type, event.compute_dtype,
                             event.overflow, event.fusion, event.attrs, count))
        if with_data and self._stats.queued >= _WRITE_AT:
            self._write_queued()  # keep no more than about a batch of data waiting

    def _write_queued(self) -> None:
        """Compute the statistics still pending and write the queued ops, their statistics as one matrix."""
        tensors = self._tensors
        stats = self._stats.matrix()[np.fromiter(map(_ROW, tensors), np.intp, count=len(tensors))]
        for position, counts in self._stats.saturated.items():  # rare: values at some format's max
            for row, tensor in enumerate(tensors):
                if tensor[4] == position:
                    stats[row, _SATURATED] = counts.get(tensor[2], 0)
        self.writer.add_ops(self._queued, tensors, stats, self._nonfinite_inputs(stats), self._queued_data)
        self.tensors_recorded += len(tensors)
        self.ops_recorded += len(self._queued)
        self._queued, self._tensors, self._queued_data = [], [], None

    def _nonfinite_inputs(self, stats: np.ndarray):
        """Per queued op, whether an input holds NaN or Inf; None when no tensor does."""
        nonfinite = (stats[:, _NAN] > 0) | (stats[:, _INF] > 0)
        if not nonfinite.any():
            return None
        counts = [op[8] for op in self._queued]
        op_of = np.repeat(np.arange(len(counts)), counts)
        is_input = np.fromiter((t[0] == 0 for t in self._tensors), bool, count=len(self._tensors))
        inherited = np.zeros(len(counts), bool)
        inherited[op_of[nonfinite & is_input]] = True
        return inherited

    def _forget(self) -> None:
        """Start a step: no queued ops, no rows, no arrays seen."""
        self._queued, self._tensors, self._queued_data = [], [], None
        self._stats.clear()
        self._seen = {}


def _slots(event: OpEvent, stats: StatsBatch, seen: dict, tensors: list, arrays: list | None) -> int:
    """Append (kind, index, dtype, shape, row) of each tensor of ``event`` to ``tensors``; return how many.

    New arrays join ``stats``; with ``arrays``, every tensor's array is appended to it. This is
    the Python path (ops with data, or no C extension); in stats mode `Collector._queue` has the
    C pass of `StatsBatch.take` do the same, statistics included, and `_fill` what it leaves.
    """
    before = len(tensors)
    for kind, values, dtypes in ((0, event.inputs, event.input_dtypes), (1, event.outputs, event.output_dtypes)):
        for i, array in enumerate(values):
            if array is not None:
                tensors.append(_slot(kind, i, array, dtypes, stats, seen, arrays))
    return len(tensors) - before


def _fill(event: OpEvent, leftover: list, stats: StatsBatch, seen: dict, tensors: list) -> None:
    """Fill the places `StatsBatch.take` left in ``tensors`` (integer arrays, strided slices); empty ``leftover``."""
    for position, kind, i in leftover:
        values, dtypes = (event.inputs, event.input_dtypes) if kind == 0 else (event.outputs, event.output_dtypes)
        tensors[position] = _slot(kind, i, values[i], dtypes, stats, seen, None)
    leftover.clear()


def _slot(kind: int, i: int, array, dtypes, stats: StatsBatch, seen: dict, arrays: list | None) -> tuple:
    """`_slots` for one array: its (kind, index, dtype, shape, row); with ``arrays``, the array joins it."""
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    dtype = dtypes[i] if i < len(dtypes) else ""
    if dtype not in _FLOATS:
        dtype = array.dtype.name
    key, owner = (id(array), array) if array.base is None else _identity(array)
    entry = seen.get(key)
    if entry is not None and entry[0]() is owner:
        k = entry[1]
    else:  # new to the step (an id reused after its array was freed has a dead reference)
        k = stats.add(array)
        seen[key] = (weakref.ref(owner), k)
    if arrays is not None:
        arrays.append(array)
    return kind, i, dtype, array.shape, k


def _identity(view: np.ndarray) -> tuple:
    """The key and object the statistics of ``view`` are filed under: its base's, when it holds all of it."""
    # a reshape or transpose holds the values of the array it views, in another order, which statistics ignore
    base = view.base
    if type(base) is np.ndarray and base.nbytes == view.nbytes and (
            view.flags.c_contiguous or view.flags.f_contiguous or view.ravel(order="K").base is not None):
        return (id(base) if base.dtype == view.dtype else (id(base), view.dtype.num)), base
    return id(view), view


def collect_to(path, mode="dump", *, steps=None, ops=None, op_types=None, backward: bool = True,
               command: str | None = None, overwrite: bool = True, modules=None) -> Collector:
    """A `Collector` for ``path``; use it as a hook, best inside a ``with`` block."""
    return Collector(path, mode, steps=steps, ops=ops, op_types=op_types, backward=backward, command=command,
                     overwrite=overwrite, modules=modules)
