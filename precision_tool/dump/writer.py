"""Writing dumps: one HDF5 file per run, committed step by step.

CONTRACT (implemented by the dump workstream):

    writer = DumpWriter(path, metadata: dict, overwrite=True)  # metadata -> root attributes (JSON-encoded
        # where not scalar); overwrite=False refuses an existing dump; one being written is always refused
    writer.begin_step(step)
    writer.write_op(record: OpRecord, arrays: dict[slot, np.ndarray | None])
        # arrays hold the values (float32 containers); they are stored in record's tensor dtype
        # (float16 as float16, bfloat16 as bfloat16 bits); None or missing -> stats only
    writer.end_step(step_record: StepRecord)   # writes the step's index, commits and flushes
    writer.close(complete=True)                # complete=False when the run was interrupted

Also: ``end_step(record, extra={...})`` adds step attributes,
``set_metadata(**values)`` replaces root attributes, and a ``with`` block
closes with ``complete`` set to whether it raised.

Crash safety: a step is committed with one flush: its group is linked
into /steps as ``steps/NNNNNN`` and counted in the root attribute
``steps_complete``, and the file object HDF5 writes through
(`precision_tool.dump.guarded`) holds every write over the committed file
until the flush is done, then writes them under an undo record that readers
use when a kill cut the commit short. A process killed at any point leaves
a file whose first ``steps_complete`` steps read back; ``complete`` becomes
true only in ``close(complete=True)``. The file uses h5py's default
(oldest) format: 'latest' sets superblock write flags that stop readers
after a crash.

Until `close` the file is ``path.partial``, locked; closing renames it onto
``path``. A failed write (a full disk) drops every later write and raises
InputError at the step's commit: the file stays as a kill then would leave
it. See `precision_tool.dump.partial`.

Ops without tensor data (stats mode) get no group: their rows in the step's
index are the record. The layout is in `precision_tool.dump.layout` and
docs/dump-format.md.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import os
import weakref

import numpy as np

from precision_tool import __version__
from precision_tool.dump import layout
from precision_tool.dump.h5low import LowLevel, error_reason
from precision_tool.dump.index_tables import (JsonColumns, copy_table, describe_tensors, describing_columns,
                                             op_group_attrs, op_table)
from precision_tool.dump.packs import StepPacks
from precision_tool.dump.partial import PartialFile
from precision_tool.dump.records import SCHEMA_VERSION, OpRecord, StepRecord
from precision_tool.dump.storage import to_storage
from precision_tool.errors import InputError

_SCALARS = (str, bool, int, float, np.generic)

# A tensor as the writer takes it: (kind, index, dtype, shape, stats tuple in TensorStats field order)
TensorEntry = tuple


class DumpWriter:
    """Writes one run to one HDF5 file; see the module docstring for the protocol."""

    def __init__(self, path, metadata: dict | None = None, *, overwrite: bool = True,
                 pack_limit: int = layout.PACK_LIMIT, stats_match_data: bool = True, keep_previous: bool = False):
        """``pack_limit``: tensors of at most this many stored bytes are packed (negative: none is).
        ``stats_match_data``: every tensor's statistics given are those of the values given, and the dump says
        so: readers then check one against the other (`precision_tool.dump.integrity`); False: no such mark.
        ``keep_previous``: an incomplete dump does not replace a previous file of its name but stays
        ``NAME.partial`` (`collect`: Ctrl-C loses no finished dump); else it replaces it once it holds a step (a
        torch script's failed run: its failing step is the evidence; one that failed before any leaves it)."""
        import h5py

        self.path = str(path)
        self._keep_previous = keep_previous
        self._target = PartialFile(self.path, overwrite)  # refuses a dump being written, and (unless
        self._io = self._target.file  # ``overwrite``) an existing one
        try:
            self._file = h5py.File(self._io, "w")
        except (OSError, ValueError) as exc:
            self._target.abandon()
            raise InputError(path, f"cannot create the dump: {error_reason(exc)}") from None
        self._h5 = LowLevel()
        self._root = self._file.id
        self._steps = self._h5.index_group(self._root, layout.STEPS)
        self._step: int | None = None
        self._written: set[int] = set()
        self._step_group = None
        self._ops_group = None
        self._op_rows: list[tuple] = []
        self._tensor_rows: list[tuple] = []  # (kind, index, dtype, shape, ...) of each index row
        self._stats_blocks: list[np.ndarray] = []  # float64 (rows, 9) blocks of the statistics, in row order
        self._loose_from = 0  # rows from here on carry their statistics as a tuple in field 4
        self._previous_op_table: tuple | None = None  # (op rows, op_index table) of the last step written
        self._previous_ops: tuple | None = None  # (first index row, ops, their op rows) of a statistics-only add_ops
        self._previous_op_group: tuple | None = None  # (op_index table, the committed step group holding it)
        self._previous_index: tuple | None = None  # (describing columns, op counts, described table, long shapes)
        self._long_shapes: dict[int, list[int]] = {}
        self._with_data: list[int] = []  # index rows whose tensor has a dataset
        self._stored: dict[int, tuple] = {}  # id(array) -> (weakref, dtype, group, slot) written this step
        self._packs = StepPacks(self._h5)  # the step's small tensors, packed (schema 2)
        self._pack_limit = min(int(pack_limit), layout.PACK_LIMIT)
        self._json = JsonColumns()  # op_index's attrs and fusion columns, encoded once per op name
        self._padded: dict[tuple, tuple] = {}
        self._encoded: dict[str, bytes] = {}
        self.steps_complete = 0
        self.ops_written = 0
        self.tensors_written = 0
        self.closed = False
        try:  # no step can be read without the metadata: on failure leave nothing behind (no zero-step .partial)
            self._write_metadata(dict(metadata or {}), bool(stats_match_data))
            self._file.flush()
            self._io.commit()
            if self._io.failure is not None:
                self._io.raise_problems(self.path, "cannot create the dump")
        except BaseException:  # (that failure, metadata that cannot be encoded, an interrupt)
            self.closed = True
            self._file.close()
            self._target.abandon()
            raise

    # -- run metadata -------------------------------------------------------

    def _write_metadata(self, metadata: dict, stats_match_data: bool) -> None:
        fixed = {"schema_version": SCHEMA_VERSION, "tool_version": __version__,
                 "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        metadata.pop(layout.STATS_MATCH_DATA, None)  # what this writer promises, not what a copied dump said
        if stats_match_data:
            fixed[layout.STATS_MATCH_DATA] = True
        values = {**fixed, **{k: v for k, v in metadata.items() if k not in fixed}}
        values.setdefault("accelerate_switch_step", None)
        values["complete"] = False
        values["steps_complete"] = 0
        self._json_keys = set()
        for key, value in values.items():
            if not isinstance(value, _SCALARS):
                value = layout.dumps(value)
                self._json_keys.add(key)
            self._h5.attr(self._root, key, value)
        self._h5.attr(self._root, layout.JSON_KEYS_ATTR, layout.dumps(sorted(self._json_keys)))
        self._h5.attr(self._root, layout.STATS_FIELDS_ATTR, ",".join(layout.STATS_FIELDS))

    def set_metadata(self, **values) -> None:
        """Replace root attributes after the start (e.g. ``accelerate_switch_step`` at run end)."""
        for key, value in values.items():
            if isinstance(value, _SCALARS):
                self._json_keys.discard(key)
            else:
                value = layout.dumps(value)
                self._json_keys.add(key)
            self._h5.replace_attr(self._root, key, value)
        self._h5.replace_attr(self._root, layout.JSON_KEYS_ATTR, layout.dumps(sorted(self._json_keys)))

    # -- steps --------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Open the group of ``step`` (linked at `end_step`); every step run gets one, recorded ops or not."""
        step = int(step)
        if self._step is not None:
            raise ValueError(f"step {self._step} is still open; end it before step {step}")
        if step in self._written:
            raise ValueError(f"step {step} was already written to {self.path}")
        self._step = step
        self._written.add(step)
        self._step_group = self._h5.anonymous_group(self._root)  # linked into /steps by end_step
        self._ops_group = None
        self._op_rows, self._tensor_rows, self._long_shapes, self._with_data = [], [], {}, []
        self._stats_blocks, self._loose_from = [], 0
        self._stored = {}
        self._packs.begin(self._step_group)

    def end_step(self, step_record: StepRecord, extra: dict | None = None, tables: dict | None = None) -> None:
        """Write the step's attributes and index, link it, steps_complete += 1, flush and commit.

        ``extra`` adds step attributes (scalars, or JSON-encoded); ``tables`` datasets of the step's group, by
        name (structured arrays: `layout.PARAMETER_GRADIENTS`).
        """
        if self._step is None:
            self.begin_step(step_record.step)
        if step_record.step != self._step:
            raise ValueError(f"end of step {step_record.step} while step {self._step} is open")
        group, h5 = self._step_group, self._h5
        written = None
        self._packs.flush()
        if self._op_rows:  # a step that recorded nothing has no index tables
            op_table = self._op_table()
            previous = self._previous_op_group
            if previous is not None and previous[0] is op_table:  # the same ops as a committed step before:
                group.links.create_hard(layout.OP_INDEX.encode(), previous[1], layout.OP_INDEX.encode())  # 5 us
            else:
                h5.table(group, layout.OP_INDEX, op_table)
                written = (op_table, group)
            h5.table(group, layout.INDEX, self._tensor_table())
        for name, table in (tables or {}).items():  # (a step's parameter gradients, at module level)
            if table is not None and len(table):
                h5.table(group, name, table)
        values = {  # the step number is the group's name and ops_recorded the length of op_index
            "loss": float(step_record.loss), "loss_scale": float(step_record.loss_scale),
            "overflow": bool(step_record.overflow), "skipped": bool(step_record.skipped),
            "precision_mode": step_record.precision_mode or "",
        }
        if step_record.cut_short:
            values["cut_short"] = True
        if self._long_shapes:
            values["long_shapes"] = layout.dumps(self._long_shapes)
        for key, value in (extra or {}).items():
            if value is not None:
                values[key] = value if isinstance(value, _SCALARS) else layout.dumps(value)
        for key, value in values.items():
            h5.attr(group, key, value)
        h5.link(group, self._steps, layout.step_name(self._step))
        self.steps_complete += 1
        h5.set_attr(self._root, "steps_complete", self.steps_complete)
        self._file.flush()
        self._io.commit()  # all of the step, or (killed before the end) none of it
        if self._io.failure is not None:  # the commit did not reach the disk
            self.steps_complete -= 1
            self._check_io()
        if written is not None:  # later steps with these ops link to this step's op_index
            self._previous_op_group = written
        self._step = None
        self._step_group = self._ops_group = None
        self._stored = {}
        self._check_io()

    # -- ops ----------------------------------------------------------------

    def write_op(self, record: OpRecord, arrays: dict | None = None) -> None:
        """Add one op execution to the open step; tensors in ``arrays`` are stored as data."""
        if self._step is None:
            self.begin_step(record.step)
        elif record.step != self._step:
            raise ValueError(f"op of step {record.step} written while step {self._step} is open")
        arrays = arrays or {}
        tensors, data = [], []
        for t in record.tensors:
            kind, index = layout.parse_slot(t.slot)
            s = t.stats
            array = arrays.get(t.slot)
            shape = tuple(np.shape(array)) if array is not None else tuple(t.shape)
            tensors.append((kind, index, t.dtype, shape,
                            (s.count, s.min, s.max, s.mean, s.std, s.norm, s.nan, s.inf, s.saturated)))
            data.append(array)
        fusion = None
        if record.pass_name:
            fusion = (record.pass_name, record.original_names, record.original_types,
                      record.output_origins, record.input_origins)
        self.add_op(record.exec_index, record.direction, record.name, record.type, record.compute_dtype,
                    record.overflow, record.inherited_nonfinite, fusion, record.attrs, tensors,
                    data if any(a is not None for a in data) else None)

    def add_op(self, exec_index: int, direction: str, name: str, op_type: str, compute_dtype: str,
               overflow: bool, inherited_nonfinite: bool, fusion, attrs: dict | None,
               tensors: list[TensorEntry], arrays: list | None = None, keys: list | None = None) -> None:
        """`write_op` without the records: one op, its statistics as tuples (the torch capture's path).

        ``fusion`` is None or (pass_name, original_names, original_types,
        output_origins, input_origins) (a FusionInfo works); ``arrays`` is
        None (statistics only) or one array or None per tensor entry.
        ``keys``, None or one per entry, names values the caller knows to be
        the same wherever the key recurs within the step (a key holds what
        the values are, their dtype included): a key stored before (`holds`)
        is stored as a reference to them, and its array may be `REPEAT`.
        """
        first = len(self._tensor_rows)
        group = None
        if arrays is not None:
            group = self._write_arrays(exec_index, direction, name, op_type, compute_dtype, overflow, fusion,
                                       first, tensors, [entry[4] for entry in tensors], arrays, keys)
        self._tensor_rows.extend(tensors)  # turned into the index table, column by column, at the step's end
        self._op_rows.append(self._op_row(exec_index, direction, name, op_type, compute_dtype, overflow,
                                          inherited_nonfinite, group is not None, first, len(tensors), fusion,
                                          attrs))
        self.ops_written += 1
        self.tensors_written += len(tensors)

    def add_ops(self, ops: list[tuple], tensors: list[tuple], stats: np.ndarray, inherited=None,
                arrays: list | None = None) -> None:
        """Many ops at once, their statistics as one matrix: the collector's path.

        ``ops`` holds (exec_index, direction, name, op_type, compute_dtype,
        overflow, fusion, attrs, n_tensors, ...) per op; ``tensors`` the
        (kind, index, dtype, shape, ...) of every op's tensors in order, and
        ``stats`` their statistics, a float64 array of one row per tensor in
        `layout.STATS_FIELDS` order. ``inherited`` is None (no op saw a
        non-finite input) or a bool per op; ``arrays`` None (statistics only)
        or, per op, None or one array or None per tensor.
        """
        rows = self._tensor_rows
        self._seal_loose_stats()
        base = len(rows)  # index row of the first of ``tensors``
        op_rows = self._op_rows
        previous = self._previous_ops
        if arrays is None and inherited is None and previous is not None and previous[0] == base \
                and previous[1] == ops:  # the previous step's ops again: so are their rows
            op_rows.extend(previous[2])
        else:
            added = len(op_rows)
            self._op_rows_of(ops, tensors, stats, inherited, arrays, base)
            if arrays is None and inherited is None:
                self._previous_ops = (base, ops, op_rows[added:])
        rows.extend(tensors)
        self._stats_blocks.append(stats)
        self._loose_from = len(rows)
        self.ops_written += len(ops)
        self.tensors_written += len(tensors)

    def _op_rows_of(self, ops: list, tensors: list, stats, inherited, arrays, base: int) -> None:
        """`add_ops`'s op rows (and the datasets of the ops with arrays)."""
        offset = 0  # the op's first tensor in ``tensors``
        op_rows, op_row = self._op_rows, self._op_row
        for position, (exec_index, direction, name, op_type, compute_dtype, overflow, fusion, attrs, count,
                       *_) in enumerate(ops):
            data = arrays[position] if arrays is not None else None
            group = None
            if data is not None:
                group = self._write_arrays(exec_index, direction, name, op_type, compute_dtype, overflow, fusion,
                                           base + offset, tensors[offset:offset + count],
                                           stats[offset:offset + count], data)
            op_rows.append(op_row(exec_index, direction, name, op_type, compute_dtype, overflow,
                                  bool(inherited[position]) if inherited is not None else False,
                                  group is not None, base + offset, count, fusion, attrs))
            offset += count

    def _op_row(self, exec_index, direction, name, op_type, compute_dtype, overflow, inherited_nonfinite,
                has_group, first, count, fusion, attrs) -> tuple:
        """The op's row of the step's ``op_index`` table."""
        encoded = self._encoded
        name_bytes = encoded.get(name) or encoded.setdefault(name, name.encode())
        type_bytes = encoded.get(op_type) or encoded.setdefault(op_type, op_type.encode())
        return (exec_index, _DIRECTION_CODES[direction], overflow, inherited_nonfinite, has_group, first, count,
                name_bytes, type_bytes, compute_dtype,
                self._json.fusion(name, fusion) if fusion is not None else b"",
                self._json.attrs(name, attrs) if attrs else b"")

    def holds(self, key) -> bool:
        """Whether values under ``key`` (`add_op`'s ``keys``) were stored in the open step."""
        return key in self._stored

    def _write_arrays(self, exec_index, direction, name, op_type, compute_dtype, overflow, fusion, first: int,
                      tensors: list, stats, arrays: list, keys: list | None = None):
        """Store each of the op's tensors that has an array; return the op's group, or None when none was needed.

        Small tensors go into the step's packs; a larger one gets a dataset in
        the op's group (created on first need). ``tensors`` are (kind, index,
        dtype, ...) and ``stats`` their statistics (tuples or matrix rows).
        """
        group = None
        for position, (tensor, array) in enumerate(zip(tensors, arrays)):
            if array is None:
                continue
            kind, index, dtype = tensor[:3]
            row = first + position
            self._with_data.append(row)
            # An op's output is usually the next op's input: the same array is stored once per step, and
            # later slots refer to it (a pack position, or a hard link to its dataset: 5 us, not ~150 us)
            key = keys[position] if keys is not None else None
            seen = self._stored.get(id(array) if key is None else key)
            if seen is not None and (key is not None or seen[0]() is array) and seen[1] == dtype:
                if seen[2] is None:
                    self._packs.point(row, seen[3])
                    continue
                stored = None
            else:
                stored = to_storage(array, dtype, has_nan=stats[position][6] > 0)
                if 0 < stored.nbytes <= self._pack_limit:  # no bytes, no pack: an empty step writes none
                    self._remember(array, dtype, None, self._packs.add(row, stored), key)
                    continue
            if group is None:
                group = self._op_group(exec_index, direction, name, op_type, compute_dtype, overflow, fusion)
            slot = layout.slot_name(kind, index)
            if stored is None:
                group.links.create_hard(slot.encode(), seen[2], seen[3])
            else:
                self._write_tensor(group, slot, dtype, array, stored, stats[position], key)
        return group

    def _remember(self, array, dtype: str, group, where, key=None) -> None:
        """Note where ``array`` (or the values under ``key``) was stored this step, so that a later slot holding
        it refers to it."""
        if key is not None:
            self._stored[key] = (None, dtype, group, where)
            return
        try:
            self._stored[id(array)] = (weakref.ref(array), dtype, group, where)
        except TypeError:  # not weak-referenceable: never referred to again
            pass

    def _seal_loose_stats(self) -> None:
        """Turn the statistics tuples of the rows added by `add_op` since the last block into a block."""
        rows = self._tensor_rows
        if self._loose_from < len(rows):
            loose = rows[self._loose_from:]
            values = np.fromiter(itertools.chain.from_iterable(row[4] for row in loose), np.float64,
                                 count=len(loose) * 9)
            self._stats_blocks.append(values.reshape(-1, 9))
            self._loose_from = len(rows)

    def _op_table(self) -> np.ndarray:
        """The step's ``op_index`` table (`index_tables.op_table`: the previous step's, where the rows are)."""
        rows = self._op_rows
        table = op_table(rows, self._previous_op_table)
        self._previous_op_table = (rows, table)
        return table

    def _tensor_table(self) -> np.ndarray:
        """The step's ``index`` table: what describes the tensors, then their statistics.

        The description (op, kind, slot, dtype, shape) is built column by
        column, or copied from the previous step's when the same ops saw the
        same tensors (every step of a training loop, as a rule).
        """
        entries = self._tensor_rows
        counts = [row[6] for row in self._op_rows]
        columns = describing_columns(entries)
        previous = self._previous_index
        if previous is not None and previous[1] == counts and previous[0] == columns:
            table = copy_table(previous[2])
            self._long_shapes.update(previous[3])
        else:
            table, long_shapes = describe_tensors(columns, counts)
            self._long_shapes.update(long_shapes)
            self._previous_index = (columns, counts, copy_table(table), dict(self._long_shapes))
        if not entries:
            return table
        self._seal_loose_stats()
        blocks = self._stats_blocks
        values = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        for column, field in enumerate(layout.STATS_FIELDS):
            table[field] = values[:, column]
        table["has_data"][self._with_data] = 1
        self._packs.fill_columns(table)
        return table

    def _op_group(self, exec_index, direction, name, op_type, compute_dtype, overflow, fusion):
        h5 = self._h5
        if self._ops_group is None:
            self._ops_group = h5.group(self._step_group, layout.OPS)
        gid = h5.group(self._ops_group, layout.op_group_name(exec_index, name))
        op_group_attrs(h5, gid, exec_index, direction, op_type, compute_dtype, overflow, fusion)
        return gid

    def _write_tensor(self, group, slot: str, dtype: str, array, stored: np.ndarray, stats: tuple, key=None) -> None:
        dataset = self._h5.dataset(group, slot, stored)
        self._remember(array, dtype, group, slot.encode(), key)
        # a float64[9] in STATS_FIELDS order: a compound attribute costs five times as much to write
        self._h5.attr(dataset, layout.STATS_ATTR, np.array(stats, dtype=np.float64))
        if dtype == "bfloat16":
            self._h5.attr(dataset, layout.DTYPE_ATTR, "bfloat16")

    # -- closing ------------------------------------------------------------

    def close(self, complete: bool = True) -> None:
        """Mark the dump complete (or not) and close it; a step left open stays uncommitted."""
        if self.closed:
            return
        self.closed = True
        complete = bool(complete and self._io.failure is None)
        try:
            self._h5.set_attr(self._root, "complete", complete)
            self._h5.replace_attr(self._root, "finished",
                                  _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        finally:
            self._file.close()  # after a failed write every write is dropped: the file stays as it was
            self._io.commit()
            # renamed onto its name: over a previous dump only complete, or (without keep_previous) holding a step
            # at least; else it stays NAME.partial, or without keep_previous, holding nothing, goes
            if not complete and not self._keep_previous and not self.steps_complete and os.path.lexists(self.path):
                self._target.abandon()  # (a run that failed before committing a step: the previous dump stays)
            elif not self._target.finish(complete or (not self._keep_previous and self.steps_complete > 0)):
                self.path = self._target.partial
        self._check_io()

    def _check_io(self) -> None:
        """Raise what went wrong inside HDF5's writes: a KeyboardInterrupt, or the first failed write."""
        where = f"stopped at step {self._step}" if self._step is not None else "stopped"
        self._io.raise_problems(self.path, f"{where}; the {self.steps_complete} steps committed before stay "
                                           "readable, the dump is marked incomplete")

    @property
    def size_bytes(self) -> int:
        for path in (self.path, self._target.partial):
            if os.path.exists(path):
                return os.path.getsize(path)
        return 0

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)


_DIRECTION_CODES = layout.DIRECTION_CODES
REPEAT = object()  # `add_op`'s array of a tensor whose key the writer `holds`: it refers to the values stored

