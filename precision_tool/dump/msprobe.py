"""msprobe dumps as input: a read-only adapter with the reader's interface (`precision_tool.dump.reader`).

`open_dump` hands a directory, or a ``.json`` file, to `open_msprobe`. What
it accepts (``../shared/reference/MSPROBE.md`` 3.2 has msprobe's layout):

* a dump directory holding ``step<N>/`` directories, each holding one rank
  directory (``rank<R>`` or ``proc<PID>``) with a ``dump.json``: every step;
* a ``step<N>`` directory: that step;
* a rank directory, or its ``dump.json``: that step (``step<N>`` from the
  parent directory's name, else step 0).

One adapter reads one rank; a path holding several is refused with the list
of its ranks (compare rank by rank). Every ``dump.json`` is parsed when the
dump is opened (`msprobe_json`), and every tensor file it names must exist;
values are read on demand: ``.npy`` with numpy, ``.pt`` with PyTorch, which is
imported only then. Nothing is ever written.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from precision_tool.dump.msprobe_json import EntryParser, ParsedStep, TensorFile
from precision_tool.dump.records import DumpSummary, OpRecord, StepRecord
from precision_tool.errors import InputError, NotFoundError

DUMP_JSON = "dump.json"
CONSTRUCT_JSON = "construct.json"
TENSOR_DIR = "dump_tensor_data"
CACHED_TENSORS = 16  # tensors kept after reading: the diagnosis reads an op's tensors several times
_STEP = re.compile(r"step(\d+)$")
_RANK = re.compile(r"(rank|proc)(\d*)$")
_MODES = {"tensor": "dump", "statistics": "stats"}


def is_msprobe_path(path) -> bool:
    """Whether ``path`` names something `open_msprobe` reads (a directory, or a .json file)."""
    text = os.fspath(path)
    return os.path.isdir(text) or (text.endswith(".json") and os.path.isfile(text))


def open_msprobe(path) -> "MsprobeDump":
    """Open an msprobe dump read-only; InputError names the file and what is wrong with it."""
    return MsprobeDump(path)


@dataclass(frozen=True)
class RankDir:
    """One step of one rank: the directory holding its dump.json."""

    step: int
    rank: str  # rank0, proc4500, or "" when the directory has another name
    path: str


def find_rank_dirs(path: str) -> list[RankDir]:
    """The rank directories ``path`` stands for, steps in order; InputError when it is none of the layouts."""
    if os.path.isfile(path):
        folder = os.path.dirname(os.path.abspath(path))
        return [RankDir(_step_of(os.path.dirname(folder)), _rank_of(folder), path)]
    if os.path.isfile(os.path.join(path, DUMP_JSON)):
        return [RankDir(_step_of(os.path.dirname(os.path.abspath(path))), _rank_of(path), path)]
    ranks = _ranks_in(path, _step_of(path))
    if ranks:
        return ranks
    steps = sorted((int(m.group(1)), entry) for entry in _listdir(path)
                   if (m := _STEP.match(entry)) and os.path.isdir(os.path.join(path, entry)))
    found = [rank for number, entry in steps for rank in _ranks_in(os.path.join(path, entry), number)]
    if found:
        return found
    if steps:
        raise InputError(path, f"an msprobe dump without data: no {DUMP_JSON} in its step directories")
    raise InputError(path, f"is a directory, neither a precision-tool dump file nor an msprobe dump "
                           f"(no {DUMP_JSON}, rank*/ or step*/ in it)")


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        raise InputError(path, f"cannot list the directory ({exc.strerror or exc})") from None


def _ranks_in(path: str, step: int) -> list[RankDir]:
    return [RankDir(step, entry, os.path.join(path, entry)) for entry in _listdir(path)
            if _RANK.match(entry) and os.path.isfile(os.path.join(path, entry, DUMP_JSON))]


def _step_of(path: str) -> int:
    match = _STEP.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else 0


def _rank_of(path: str) -> str:
    name = os.path.basename(os.path.normpath(os.path.abspath(path)))
    return name if _RANK.match(name) else ""


def one_rank(path: str, found: list[RankDir]) -> list[RankDir]:
    """``found`` when it is one rank; InputError listing the ranks otherwise."""
    ranks = sorted({r.rank for r in found})
    numbered = {r.rank for r in found if r.rank.startswith("rank")}
    if len(numbered) > 1 or (len(ranks) > 1 and numbered):
        example = next(r.path for r in found if r.rank == ranks[1])
        raise InputError(path, f"holds {len(ranks)} ranks ({', '.join(ranks[:8])}{', ...' if len(ranks) > 8 else ''}); "
                               f"give one rank's directory, e.g. {example}")
    steps = [r.step for r in found]
    if len(set(steps)) != len(steps):
        raise InputError(path, f"holds several process directories for one step ({', '.join(ranks[:8])}): "
                               "give one of them")
    return found


def load_json(path: str):
    """A JSON file, NaN and Infinity allowed (msprobe writes them bare); InputError when it is not JSON."""
    try:
        _regular(path)
        with open(path, "rb") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except UnicodeDecodeError:
        raise InputError(path, "not JSON: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # a number of thousands of digits
        raise InputError(path, f"malformed JSON: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise InputError(path, "malformed JSON: nested too deeply") from None


def _dump_json(rank: RankDir) -> str:
    return rank.path if os.path.isfile(rank.path) else os.path.join(rank.path, DUMP_JSON)


class MsprobeDump:
    """An msprobe dump opened read-only, with `precision_tool.dump.reader.Dump`'s interface."""

    schema_version = 0  # not a precision-tool dump: inspect shows the format instead
    complete = True  # msprobe writes dump.json whole; a dump cut short is one step less
    being_written = False
    being_replaced = False
    role = ""  # msprobe does not say which run is the reference: give it with --golden / --target

    def __init__(self, path):
        self.path = os.fspath(path)
        self._ranks = one_rank(self.path, find_rank_dirs(self.path))
        self._steps: dict[int, ParsedStep] = {}
        headers = []
        for rank in self._ranks:
            parsed, header = self._parse(rank)
            self._steps[rank.step] = parsed
            headers.append(header)
        self.metadata = self._metadata(headers)
        self.steps_complete = len(self._steps)
        self._cache: OrderedDict[tuple[int, int, str], np.ndarray] = OrderedDict()

    def _parse(self, rank: RankDir) -> tuple[ParsedStep, dict]:
        source = _dump_json(rank)
        document = load_json(source)
        if not isinstance(document, dict) or not isinstance(document.get("data"), dict):
            raise InputError(source, "not an msprobe dump.json (no \"data\" object of entries)")
        folder = os.path.dirname(os.path.abspath(source))
        summary_mode = document.get("summary_mode")
        if isinstance(summary_mode, str) and summary_mode in ("md5", "xor"):
            raise InputError(source, f"an msprobe {summary_mode} dump holds checksums, neither tensors nor "
                                     "statistics: precision-tool cannot compare it")
        data_dir = os.path.join(folder, TENSOR_DIR)
        present = set(os.listdir(data_dir)) if os.path.isdir(data_dir) else None
        parents = self._parents(folder)
        try:
            parsed = EntryParser(source, rank.step, data_dir, present, parents).parse(document["data"])
        except RecursionError:
            raise InputError(source, "an entry's arguments are nested too deeply") from None
        header = {key: document.get(key) for key in ("task", "level", "framework")}
        header["rank"] = rank.rank
        if any(f.path.endswith(".pt") for f in parsed.files.values()):
            _require_torch(source)
        if parsed.files:
            self._exact_nonfinite_stats(parsed)
        return parsed, header

    @staticmethod
    def _parents(folder: str) -> dict:
        path = os.path.join(folder, CONSTRUCT_JSON)
        if not os.path.isfile(path):
            return {}
        value = load_json(path)
        return value if isinstance(value, dict) else {}

    def _exact_nonfinite_stats(self, parsed: ParsedStep) -> None:
        """msprobe's statistics of a tensor holding NaN or inf are NaN or inf: count them in its values."""
        from dataclasses import replace

        from precision_tool.dump.stats import tensor_stats

        for position, record in enumerate(parsed.records):
            if all(t.stats.finite for t in record.tensors):
                continue
            tensors = []
            for tensor in record.tensors:
                location = parsed.files.get((record.exec_index, tensor.slot))
                if not tensor.stats.finite and location is not None:
                    tensor = replace(tensor, stats=tensor_stats(self._read(location), tensor.dtype))
                tensors.append(tensor)
            overflow = any(not t.stats.finite for t in tensors if t.kind == "output")
            inherited = overflow and any(not t.stats.finite for t in tensors if t.kind == "input")
            parsed.records[position] = replace(record, tensors=tuple(tensors), overflow=overflow,
                                               inherited_nonfinite=inherited)

    def _metadata(self, headers: list[dict]) -> dict:
        first = headers[0]
        task = first.get("task") or "statistics"
        return {
            "format": "msprobe", "framework": "msprobe", "msprobe_framework": first.get("framework") or "",
            "msprobe_task": task, "msprobe_level": first.get("level") or "", "rank": first.get("rank") or "",
            "mode": _MODES.get(str(task), "stats"), "steps": len(headers), "complete": True,
        }

    # -- the reader's interface ---------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self.metadata["mode"]

    @property
    def modes(self) -> list[str]:
        return [self.mode]

    def step_numbers(self) -> list[int]:
        return sorted(self._steps)

    def step_attrs(self, step: int) -> dict:
        self._step(step)
        return {}

    def steps(self) -> list[StepRecord]:
        """One record per step: msprobe records no loss, so it is NaN; overflow when an op's output is not finite."""
        return [StepRecord(step, math.nan, 1.0, any(r.overflow for r in self._steps[step].records),
                           ops_recorded=len(self._steps[step].records))
                for step in self.step_numbers()]

    def ops(self, step: int | None = None, direction: str | None = None) -> list[OpRecord]:
        steps = self.step_numbers() if step is None else [step] if step in self._steps else []
        return [r for s in steps for r in self._steps[s].records if direction is None or r.direction == direction]

    def op(self, step: int, name: str, direction: str = "forward") -> OpRecord:
        for record in self.ops(step=step, direction=direction):
            if record.name == name:
                return record
        raise NotFoundError(f"no {direction} op {name!r} recorded in step {step}")

    def tensor(self, step: int, exec_index: int, slot: str) -> np.ndarray:
        """The values of one tensor: float32 (float64 for float64 tensors), ints as stored."""
        key = (step, exec_index, slot)
        values = self._cache.get(key)
        if values is None:
            values = self._read(self._location(step, exec_index, slot))
            self._cache[key] = values
            if len(self._cache) > CACHED_TENSORS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return values

    def tensor_chunks(self, step: int, exec_index: int, slot: str, max_elements: int = 1 << 22,
                      mapped: bool = False) -> Iterator[np.ndarray]:
        """The tensor's values flattened in C order, in chunks of at most ``max_elements``."""
        flat = self.tensor(step, exec_index, slot).reshape(-1)
        limit = max(1, int(max_elements))
        for start in range(0, flat.size, limit):
            yield flat[start:start + limit]

    def summary(self, first_overflows: int = 5) -> DumpSummary:
        records = self.ops()
        overflows = [r for r in records if r.overflow]
        steps = self.steps()
        return DumpSummary(
            path=self.path, schema_version=self.schema_version, complete=True, steps_complete=len(steps),
            metadata=dict(self.metadata), ops=len(records), tensors=sum(len(r.tensors) for r in records),
            overflow_ops=len(overflows), overflow_steps=[s.step for s in steps if s.overflow],
            loss=[s.loss for s in steps], loss_scale=[s.loss_scale for s in steps], accelerate_switch_step=None,
            size_bytes=self.size_bytes, first_overflows=overflows[:first_overflows],
            step_numbers=[s.step for s in steps])

    @property
    def size_bytes(self) -> int:
        """dump.json and the tensor files it names."""
        paths = {_dump_json(rank) for rank in self._ranks}
        paths |= {f.path for s in self._steps.values() for f in s.files.values()}
        return sum(os.path.getsize(p) for p in paths if os.path.exists(p))

    def close(self) -> None:
        self._cache.clear()

    def __enter__(self) -> "MsprobeDump":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MsprobeDump({self.path!r}, {self.mode}, {len(self._steps)} steps)"

    # -- tensors ----------------------------------------------------------------------------------

    def _step(self, step: int) -> ParsedStep:
        try:
            return self._steps[step]
        except KeyError:
            raise NotFoundError(f"step {step} is not a step of {self.path}") from None

    def _location(self, step: int, exec_index: int, slot: str) -> TensorFile:
        parsed = self._step(step)
        location = parsed.files.get((exec_index, slot))
        if location is None:
            if not any(r.exec_index == exec_index for r in parsed.records):
                raise NotFoundError(f"step {step}: no op with execution index {exec_index} recorded")
            raise NotFoundError(f"step {step} op {exec_index} {slot}: no tensor data (statistics only)")
        return location

    def _read(self, location: TensorFile) -> np.ndarray:
        values, stored = read_tensor_file(location.path)
        if tuple(values.shape) != location.shape:
            raise InputError(location.path, f"holds a tensor of shape {tuple(values.shape)}; dump.json says "
                                            f"{location.shape}")
        if values.dtype.kind == "f" and values.dtype.itemsize < 4:
            values = values.astype(np.float32)
        return values


def read_tensor_file(path: str) -> tuple[np.ndarray, str]:
    """(values, stored dtype) of one ``.npy`` or ``.pt`` file; 16-bit floats come as float32."""
    if path.endswith(".pt"):
        _require_torch(path)
        try:
            from precision_tool.torch.files import load_pt
        except ImportError:
            raise InputError(path, _NO_TORCH) from None
        return load_pt(path)
    try:
        _regular(path)
        values = np.load(path, allow_pickle=False)
    except MemoryError:
        raise InputError(path, "unreadable .npy file (its header asks for more memory than there is)") from None
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(path, f"unreadable .npy file ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiub":
        raise InputError(path, f"holds {getattr(values, 'dtype', type(values).__name__)} values, not numbers")
    return values, str(values.dtype)


def _regular(path: str) -> None:
    """InputError unless ``path`` is a regular file: reading a FIFO would wait for a writer, a device never end."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise InputError(path, "not a regular file")


_NO_TORCH = "a PyTorch .pt tensor file: reading it needs PyTorch (pip install 'precision-tool[torch]')"


def _require_torch(path: str) -> None:
    """InputError when PyTorch cannot be imported; checked without importing it."""
    import importlib.util
    import sys

    try:
        missing = sys.modules.get("torch", 0) is None or importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):
        missing = True
    if missing:
        raise InputError(path, "refers to PyTorch .pt tensor files: reading them needs PyTorch "
                               "(pip install 'precision-tool[torch]')")
