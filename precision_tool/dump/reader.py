"""Reading dumps: open read-only, list ops from the index, load tensors on demand.

CONTRACT (implemented by the dump workstream; consumers rely on exactly this):

    with open_dump(path) as dump:              # InputError on missing/non-HDF5/truncated/unknown schema
        dump.path, dump.schema_version         # str, int
        dump.metadata                          # dict of run metadata (root attributes, JSON-decoded)
        dump.role                              # "golden" | "target" | "overflow" | "fusion-off" (from metadata)
        dump.mode                              # "dump" | "stats" | "overflow" | "fusion-off"
        dump.complete, dump.steps_complete     # bool, int
        dump.being_written                     # bool: another process holds the file's write lock
        dump.being_replaced                    # bool: a run is being written to PATH.partial, to replace it
        dump.steps()                           # list[StepRecord], complete steps only, in order
        dump.ops(step=None, direction=None)    # list[OpRecord] in (step, exec_index) order, from the index
        dump.op(step, name, direction="forward")  # OpRecord; KeyError if absent
        dump.tensor(step, exec_index, slot)    # np.ndarray: float32 (float64 for float64 dumps) holding
                                               # the exact values; int arrays as stored; KeyError if no data
        dump.tensor_chunks(step, exec_index, slot, max_elements)  # iterator of flat array chunks
        dump.summary()                         # DumpSummary

Also: ``dump.modes`` (every mode of a combined collection, e.g. ["overflow",
"stats"]), ``dump.step_attrs(step)`` (all attributes of a step group) and
``dump.close()``. Only the first ``steps_complete`` step groups are trusted:
a step being written when the writer died is ignored. The file is opened
with h5py mode "r" and never modified.

What the reader relies on is checked as it is read, with cheap tests on what
it reads anyway (attribute types, the index tables' columns and the ranges of
the references in them, a tensor's dataset against its index row): a dump
that fails one raises InputError naming the file and the HDF5 path that is
wrong, never an internal error and never a silently shorter dump.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Iterator

import numpy as np

from precision_tool.dump import layout
from precision_tool.dump.attributes import (check_evaluations, check_modes, check_schema, check_seed, count,
                                           decode_attrs, flag)
from precision_tool.dump.integrity import check_read
from precision_tool.dump.links import member
from precision_tool.dump.records import DumpSummary, OpRecord, StepRecord
from precision_tool.dump.mapping import (changed_since, chunk_selections, file_state, mapped_chunks, raw_offset,
                                         read_dataset, watch_file)
from precision_tool.dump.steps import DamagedDump, StepIndex, TensorLocation
from precision_tool.dump.opening import locked_partial, open_h5
from precision_tool.dump.storage import from_storage, stored_dtype
from precision_tool.errors import InputError, NotFoundError

CHUNK_ELEMENTS = 1 << 22  # default chunk of `tensor_chunks`: 4 Mi values
OPEN_PACKS = 4  # packs kept mapped per dump: memory stays a few segments however many ops are read


def open_dump(path) -> "Dump":
    """Open a dump read-only; InputError names the file and what is wrong with it.

    A directory or a ``.json`` file is read as an msprobe dump (`precision_tool.dump.msprobe`), through an
    adapter with this reader's interface.
    """
    from precision_tool.dump.msprobe import is_msprobe_path, open_msprobe
    from precision_tool.dump.runs import is_run_dir

    if is_run_dir(path):
        raise InputError(path, "is a run of several ranks (a directory of rank dumps): give one rank's dump "
                               "(RUN/rank0.h5); compare, check, diagnose and ranks take whole runs")
    if is_msprobe_path(path):
        return open_msprobe(path)
    return Dump(path)


class Dump:
    """A dump file opened read-only; see the module docstring for the API."""

    def __init__(self, path):
        self.path = str(path)
        self._file, self.being_written = open_h5(self.path)
        self._opened = file_state(self._file)
        watch_file(self)  # a file cut short while it is read is an error after any command (`check_cut_short`)
        self.being_replaced = locked_partial(self.path)
        try:
            self.metadata = decode_attrs(self._file.attrs)
            self.schema_version = check_schema(self.path, self.metadata)
            if layout.STEPS not in self._file:
                raise InputError(self.path, "not a precision-tool dump (no /steps group)")
            self.complete = flag(self.path, self.metadata, "complete")
            self.steps_complete = count(self.path, self.metadata, "steps_complete")
            check_modes(self.path, self.metadata)
            check_seed(self.path, self.metadata)
            check_evaluations(self.path, self.metadata)
            # index rows describe the stored values: compare checks one against the other (`dump.integrity`)
            self.stats_match_data = flag(self.path, self.metadata, layout.STATS_MATCH_DATA)
            self._read_checked: set[tuple[int, int]] = set()  # (step, index row) `tensor` has checked
            names = self._committed_step_names()
        except InputError:
            self._file.close()
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
            self._file.close()
            raise InputError(self.path, f"unreadable dump: {exc}") from None
        self._step_names = {int(name): name for name in names}
        self._indexes: dict[int, StepIndex] = {}
        self._step_records: list[StepRecord] | None = None
        self._packs: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def _committed_step_names(self) -> list[str]:
        """The names of the first ``steps_complete`` step groups; a dump that claims more is damaged."""
        import h5py

        steps = member(self._file, layout.STEPS, self._refused)
        if not isinstance(steps, h5py.Group):
            raise InputError(self.path, f"/{layout.STEPS}: not a group")
        names = sorted((n for n in steps.keys() if n.isdigit()), key=int)
        if len(names) < self.steps_complete:
            raise InputError(self.path, f"/ attribute steps_complete: says {self.steps_complete} steps were "
                                        f"committed, but /{layout.STEPS} holds {len(names)}")
        return names[: self.steps_complete]

    # -- metadata -----------------------------------------------------------

    @property
    def role(self) -> str:
        return str(self.metadata.get("role", "target"))

    @property
    def mode(self) -> str:
        return str(self.metadata.get("mode", "dump"))

    @property
    def modes(self) -> list[str]:
        return list(self.metadata.get("modes") or [self.mode])

    # -- steps --------------------------------------------------------------

    def step_numbers(self) -> list[int]:
        """The complete steps, in order."""
        return list(self._step_names)

    def step_attrs(self, step: int) -> dict:
        """Every attribute of a complete step's group, decoded."""
        try:
            return decode_attrs(self._step_group(step).attrs)
        except (KeyError, OSError, ValueError, TypeError, RuntimeError) as exc:  # h5py: a damaged attribute header
            raise InputError(self.path, f"/{layout.STEPS}/{self._step_names[step]}: unreadable attributes ({exc})") from None

    def step_table(self, step: int, name: str) -> np.ndarray | None:
        """A table of a complete step's group besides its index (`layout.PARAMETER_GRADIENTS`), or None where the
        step has none."""
        import h5py

        group = self._step_group(step)
        try:
            if name not in group:
                return None
            table = group[name]
            if not isinstance(table, h5py.Dataset):
                raise InputError(self.path, f"/{layout.STEPS}/{self._step_names[step]}/{name}: a group, not a table")
            return np.asarray(table[()])
        except (KeyError, OSError, ValueError, TypeError, RuntimeError) as exc:
            raise InputError(self.path, f"/{layout.STEPS}/{self._step_names[step]}/{name}: unreadable ({exc})") \
                from None

    def steps(self) -> list[StepRecord]:
        """What every complete step reported, in order."""
        if self._step_records is None:
            records = []
            for step in self._step_names:
                a = self.step_attrs(step)
                try:
                    loss, loss_scale = float(a.get("loss", np.nan)), float(a.get("loss_scale", 1.0))
                except (TypeError, ValueError):
                    where = f"/{layout.STEPS}/{self._step_names[step]}"
                    raise InputError(self.path, f"{where}: its loss or loss_scale attribute is not a number "
                                                f"({a.get('loss')!r}, {a.get('loss_scale')!r})") from None
                records.append(StepRecord(step, loss, loss_scale,
                                          bool(a.get("overflow", False)), bool(a.get("skipped", False)),
                                          str(a.get("precision_mode", "")), self._opscount(step),
                                          bool(a.get("cut_short", False))))
            self._step_records = records
        return list(self._step_records)

    def _opscount(self, step: int) -> int:
        if step in self._indexes:
            return len(self._indexes[step].op_rows)
        import h5py

        group, where = self._step_group(step), f"/{layout.STEPS}/{self._step_names[step]}"
        try:
            if layout.OP_INDEX not in group:
                return 0
            table = member(group, layout.OP_INDEX, self._refused)
        except (KeyError, OSError, RuntimeError) as exc:  # h5py: a damaged object header or link message
            raise InputError(self.path, f"{where}: unreadable step ({exc})") from None
        if not isinstance(table, h5py.Dataset) or table.ndim != 1:  # a named datatype, a scalar
            raise InputError(self.path, f"{where}/{layout.OP_INDEX}: not a table of one row per op")
        return table.shape[0]

    # -- ops ----------------------------------------------------------------

    def ops(self, step: int | None = None, direction: str | None = None) -> list[OpRecord]:
        """Recorded op executions in (step, exec_index) order, built from the index."""
        steps = self._step_names if step is None else [step]
        result = []
        for s in steps:
            if s not in self._step_names:
                if step is not None:
                    return []
                continue
            records = self._records(s)
            result.extend(records if direction is None else [r for r in records if r.direction == direction])
        return result

    def op(self, step: int, name: str, direction: str = "forward") -> OpRecord:
        """The op ``name`` of ``step`` in ``direction``; KeyError when it was not recorded."""
        if step in self._step_names:
            for record in self._records(step):
                if record.name == name and record.direction == direction:
                    return record
        raise NotFoundError(f"no {direction} op {name!r} recorded in step {step}")

    # -- tensors ------------------------------------------------------------

    def tensor(self, step: int, exec_index: int, slot: str) -> np.ndarray:
        """The values of one tensor: float32 (float64 for float64 dumps), ints as stored."""
        location = self._location(step, exec_index, slot)
        if location.pack != layout.NOT_PACKED:
            raw = self._packed(step, location).reshape(location.shape)
            values = from_storage(raw, location.dtype)
            values = values.copy() if values.base is not None else values  # never a view of the mapped file
        else:
            dataset, dtype, _, _ = self._dataset(step, location, slot)
            values = from_storage(read_dataset(self.path, dataset.name, dataset), dtype)
        if self.stats_match_data:  # a marked dump: values unlike their index row are a misread, refused
            index = self.step_index(step)
            row = index.slot_row(exec_index, slot)
            if (step, row) not in self._read_checked:  # (the analysis reads some tensors many times)
                check_read(self, step, row, location.dtype, index.tensor_rows[row], values)
                self._read_checked.add((step, row))
        return values

    def tensor_chunks(self, step: int, exec_index: int, slot: str,
                      max_elements: int = CHUNK_ELEMENTS, mapped: bool = False) -> Iterator[np.ndarray]:
        """The tensor's values flattened in C order, in chunks of at most ``max_elements``.

        ``mapped=True``: a float32 or float64 tensor stored contiguous and
        unfiltered in its own dtype (as `DumpWriter` writes them) comes as
        read-only views of the file mapped into memory, one mapping per chunk,
        released once nothing refers to the chunk. Nothing is copied: the
        consumer reads the page cache directly, which for the comparator is
        faster than any read into a buffer. Other tensors come as copies.
        """
        location = self._location(step, exec_index, slot)
        limit = max(1, int(max_elements))
        if location.pack != layout.NOT_PACKED:
            raw = self._packed(step, location)
            for start in range(0, location.size, limit):
                chunk = from_storage(raw[start:start + limit], location.dtype)
                yield chunk if mapped or chunk.base is None else chunk.copy()
            return
        dataset, dtype, stored, size = self._dataset(step, location, slot)
        offset = raw_offset(self._file, dataset, dtype, stored, size) if mapped else None
        if offset is not None:
            yield from mapped_chunks(self._file, self.path, offset, stored, size, limit)
            return
        for selection in chunk_selections(dataset.shape, limit):
            yield from_storage(read_dataset(self.path, dataset.name, dataset, selection), dtype).reshape(-1)

    def packed_table(self, step: int, rows: np.ndarray, kinds: dict[str, int]) -> tuple[list, np.ndarray]:
        """Where tensors of one step (``rows`` of its index, `TensorRecord.index_row`) lie in its packs.

        Returns the packs involved (byte arrays, mapped where stored plainly) and an int64 table of
        (position in that list, byte offset, ``kinds[dtype]``) per row; -1 as the code where a tensor is not
        packed, has no data or another dtype, or the row is not in the index: the caller reads those one by
        one. Offsets are checked by the caller's kernel."""
        table = np.full((len(rows), 3), -1, np.int64)
        if step not in self._step_names or not len(rows):
            return [], table
        index_rows = self.step_index(step).tensor_rows
        if "pack" not in (index_rows.dtype.names or ()):  # schema 1: every tensor has a dataset
            return [], table
        found = (rows >= 0) & (rows < len(index_rows))
        picked = index_rows[np.where(found, rows, 0)]
        code = np.full(len(rows), -1, np.int64)
        for dtype, value in kinds.items():
            code[picked["dtype"] == dtype.encode()] = value
        usable = found & (picked["pack"] >= 0) & (picked["has_data"] != 0) & (code >= 0)
        numbers = np.unique(picked["pack"][usable])
        packs = [self._pack(step, int(number)) for number in numbers]
        table[usable, 0] = np.searchsorted(numbers, picked["pack"][usable])
        table[usable, 1] = picked["offset"][usable]
        table[usable, 2] = code[usable]
        return packs, table

    def stored_where(self, step: int, row: int) -> str:
        """Where row ``row`` of a step's index puts a tensor's values: its pack and byte offset, or its dataset,
        and the index row (the step's own row number, in a window of it too)."""
        index = self.step_index(step)
        rows, step_name = index.tensor_rows, self._step_names[step]
        where = f"(row {index.source_row(row)} of /{layout.STEPS}/{step_name}/{layout.INDEX})"
        if "pack" in (rows.dtype.names or ()) and rows["pack"][row] != layout.NOT_PACKED:
            return f"{self._pack_path(step, int(rows['pack'][row]))} at byte {int(rows['offset'][row])} {where}"
        op = index.op_rows[int(rows["op"][row])]
        group = layout.op_group_name(int(op["exec_index"]), op["name"].decode("utf-8", "replace"))
        slot = layout.slot_name(int(rows["kind"][row]), int(rows["slot"][row]))
        return f"/{layout.STEPS}/{step_name}/{layout.OPS}/{group}/{slot} {where}"

    def _location(self, step: int, exec_index: int, slot: str) -> TensorLocation:
        """Where a tensor with data is; KeyError when the step, op or tensor was not recorded, or has no data."""
        if step not in self._step_names:
            raise NotFoundError(f"step {step} is not a complete step of {self.path}")
        location = self.step_index(step).tensor_location(exec_index, slot)
        if not location.has_data:
            raise NotFoundError(f"step {step} op {exec_index} {slot}: no tensor data (statistics only)")
        return location

    def _dataset(self, step: int, location: TensorLocation, slot: str):
        group = self.step_index(step).group_name(location)
        path = f"/{layout.STEPS}/{self._step_names[step]}/{layout.OPS}/{group}/{slot}"
        try:
            dataset = member(self._file, path, self._refused)
        except KeyError:
            raise InputError(self.path, f"{path}: missing, though the index lists the tensor") from None
        except (OSError, RuntimeError) as exc:  # RuntimeError: h5py's for a link loop
            raise InputError(self.path, f"{path}: unreadable tensor ({exc})") from None
        stored = _checked_dtype(self.path, path, dataset, location.dtype, location.size)
        return dataset, location.dtype, stored, location.size

    def _packed(self, step: int, location: TensorLocation) -> np.ndarray:
        """A packed tensor's stored values, flat: a read-only view of its pack."""
        where = f"/{layout.STEPS}/{self._step_names[step]}/{layout.INDEX}"
        try:
            dtype = stored_dtype(location.dtype)
        except TypeError:
            raise InputError(self.path, f"{where}: a packed tensor of unknown dtype {location.dtype!r}") from None
        if not location.size:  # no bytes to read: dumps written before 2026-11-26 point it at a pack never written
            return np.empty(0, dtype)
        pack = self._pack(step, location.pack)
        end = location.offset + location.size * dtype.itemsize
        if end > pack.size or location.offset % dtype.itemsize:
            raise InputError(self.path, f"{self._pack_path(step, location.pack)}: holds {pack.size} bytes, "
                                        f"where {where} puts a {location.dtype} tensor at bytes "
                                        f"{location.offset}-{end}")
        return pack[location.offset:end].view(dtype)

    def _pack_path(self, step: int, number: int) -> str:
        return f"/{layout.STEPS}/{self._step_names[step]}/{layout.PACKS}/{layout.pack_name(number)}"

    def _pack(self, step: int, number: int) -> np.ndarray:
        """One ``packs/`` dataset's bytes (mapped when stored plainly, else read), the last few kept."""
        key = (step, number)
        pack = self._packs.get(key)
        if pack is not None:
            self._packs.move_to_end(key)
            return pack
        path = self._pack_path(step, number)
        try:
            dataset = member(self._file, path, self._refused)
        except KeyError:
            index = f"/{layout.STEPS}/{self._step_names[step]}/{layout.INDEX}"
            raise InputError(self.path, f"{path}: missing, though {index} lists tensors in it") from None
        except (OSError, RuntimeError) as exc:
            raise InputError(self.path, f"{path}: unreadable pack ({exc})") from None
        import h5py

        if not isinstance(dataset, h5py.Dataset) or _stored_type(self.path, path, dataset) != np.uint8 or \
                len(dataset.shape) != 1:
            raise InputError(self.path, f"{path}: not a pack (a 1-D dataset of bytes)")
        offset = raw_offset(self._file, dataset, "uint8", dataset.dtype, dataset.size)
        if offset is not None:
            pack = next(mapped_chunks(self._file, self.path, offset, dataset.dtype, dataset.size, dataset.size))
        else:
            pack = read_dataset(self.path, path, dataset)
        self._packs[key] = pack
        if len(self._packs) > OPEN_PACKS:
            self._packs.popitem(last=False)  # its mapping is released once no chunk refers to it
        return pack

    # -- internals ----------------------------------------------------------

    def _step_group(self, step: int):
        import h5py

        try:
            name = self._step_names[step]
        except KeyError:
            raise NotFoundError(f"step {step} is not a complete step of {self.path}") from None
        try:
            group = member(self._file, f"{layout.STEPS}/{name}", self._refused)
        except (KeyError, OSError, RuntimeError) as exc:
            raise InputError(self.path, f"/{layout.STEPS}/{name}: unreadable step ({exc})") from None
        if not isinstance(group, h5py.Group):
            raise InputError(self.path, f"/{layout.STEPS}/{name}: not a group")
        return group

    def _refused(self, where: str, problem: str) -> InputError:
        return InputError(self.path, f"{where}: {problem}")

    def _records(self, step: int):
        """The op records of a complete step; a damaged JSON column is an InputError."""
        try:
            return self.step_index(step).records()
        except DamagedDump as exc:
            raise InputError(self.path, str(exc)) from None

    def step_index(self, step: int) -> StepIndex:
        """The index tables of a complete step (cached)."""
        index = self._indexes.get(step)
        if index is None:
            group = self._step_group(step)
            try:
                index = StepIndex.read(step, group, self.schema_version)
            except DamagedDump as exc:
                raise InputError(self.path, str(exc)) from None
            except (KeyError, OSError, ValueError, TypeError, RuntimeError) as exc:
                where = f"/{layout.STEPS}/{self._step_names[step]}"
                raise InputError(self.path, f"{where}: unreadable index ({exc})") from None
            self._indexes[step] = index
        return index

    def summary(self, first_overflows: int = 5) -> DumpSummary:
        """What `precision-tool inspect` shows."""
        from precision_tool.dump.summary import summarize

        return summarize(self, first_overflows)

    def changed_while_read(self) -> bool:
        """Whether the file is shorter than when it was opened, or (unless being written) was modified since."""
        return changed_since(self._file, self._opened, self.being_written)

    @property
    def size_bytes(self) -> int:
        return os.path.getsize(self.path)

    def close(self) -> None:
        watch_file(self, False)
        self._packs.clear()
        self._file.close()

    def __enter__(self) -> "Dump":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "complete" if self.complete else f"incomplete, {self.steps_complete} steps"
        return f"Dump({self.path!r}, {self.mode}, {state})"


def _checked_dtype(path: str, where: str, dataset, dtype: str, size: int) -> np.dtype:
    """The dtype of a tensor's dataset, once it is checked to hold as many numbers as its index row says."""
    import h5py

    if not isinstance(dataset, h5py.Dataset):
        raise InputError(path, f"{where}: not a tensor (an HDF5 group)")
    stored = _stored_type(path, where, dataset)
    if stored.kind not in "fiub":
        raise InputError(path, f"{where}: holds {stored} values, not numbers")
    if dataset.size != size:
        raise InputError(path, f"{where}: holds {dataset.size} values where the index says {size} ({dtype})")
    return stored


def _stored_type(path: str, where: str, dataset) -> np.dtype:
    """A dataset's numpy dtype; InputError when its datatype message is damaged (h5py: "Insufficient precision
    in available types to represent ...", "unusually large # of unused bits")."""
    try:
        return dataset.dtype
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        raise InputError(path, f"{where}: unreadable datatype ({exc})") from None
