"""One msprobe ``dump.json`` turned into `OpRecord`s: names, directions, tensor slots and statistics.

An entry's name says what it is (``../shared/reference/MSPROBE.md`` 3.2):

=====================================  ==========================  =========================================
msprobe name                           record                      tensors
=====================================  ==========================  =========================================
``Functional.gelu.1.forward``          forward op, type            inputs: ``input_args`` then ``input_kwargs``;
                                       ``Functional.gelu``         outputs: ``output``
``Tensor.add.0.backward``              backward op                 inputs: ``input`` (incoming gradients);
                                                                   outputs: ``output`` (gradients of the
                                                                   forward inputs)
``Module.fc1.Linear.forward.0``        module record, type         as an op, the module's ``parameters``
                                       ``module.Linear``           after its arguments
``Module.fc1.Linear.parameters_grad.0`` backward record, type      outputs: the parameters' gradients
                                       ``parameters_grad``
=====================================  ==========================  =========================================

The record keeps the msprobe name whole, so names read as in msprobe's own
output and match across runs exactly as msprobe matches them. A slot's
number is the position of its value among the entry's arguments (non-tensor
arguments count but get no slot), as in msprobe's file names
(``...forward.input.2.pt`` is ``input_2``). Entries whose parent in
``construct.json`` is ``optimizer`` are optimizer ops. Statistics are
msprobe's Max, Min, Mean and Norm; the standard deviation follows from the
norm and the mean; a NaN Max or Min means the tensor holds NaN, an infinite
one that it holds inf (counted as one: msprobe records no count; a tensor
dump's values give the exact counts, `precision_tool.dump.msprobe`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from precision_tool.dump.records import MODULE_TYPE_PREFIX, OpRecord, TensorRecord, TensorStats
from precision_tool.errors import InputError

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
MODULE_PREFIXES = ("Module", "Cell")  # PyTorch modules, MindSpore cells
PARAMETERS_GRAD = "parameters_grad"
_DIRECTIONS = (FORWARD, BACKWARD)


@dataclass(frozen=True)
class TensorFile:
    """Where one slot's values are, and what dump.json says they are."""

    path: str
    dtype: str
    shape: tuple[int, ...]


@dataclass
class ParsedStep:
    """One rank directory's records, and the tensor files behind their slots."""

    records: list[OpRecord]
    files: dict[tuple[int, str], TensorFile]  # (exec_index, slot) -> file


def name_parts(name: str) -> tuple[str, str, bool]:
    """(type, direction, is_module) of an msprobe entry name; unknown shapes are forward ops named as typed."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[0] in MODULE_PREFIXES and parts[-1].isdigit():
        if parts[-2] in _DIRECTIONS:
            return MODULE_TYPE_PREFIX + parts[-3], parts[-2], True
        if parts[-2] == PARAMETERS_GRAD:
            return PARAMETERS_GRAD, BACKWARD, False
    if len(parts) >= 3 and parts[-1] in _DIRECTIONS and parts[-2].isdigit():
        return ".".join(parts[:-2]), parts[-1], False
    return name, FORWARD, False


def torch_dtype_name(text) -> str:
    """``torch.bfloat16`` / ``BFloat16`` / ``float32`` -> the project's dtype names (``bfloat16``)."""
    text = str(text)
    for prefix in ("torch.", "mindspore.", "ms.", "numpy.", "np."):
        text = text.removeprefix(prefix)
    return {"half": "float16", "float": "float32", "double": "float64", "long": "int64", "int": "int32",
            "bool_": "bool"}.get(text.lower(), text.lower())


def is_tensor_spec(value) -> bool:
    """A leaf that describes a tensor (as opposed to ``{"type": "int", "value": 3}`` or null)."""
    return isinstance(value, dict) and "shape" in value and "dtype" in value and "value" not in value


def leaves(value) -> list:
    """The argument leaves of a (nested) list or keyword dict, in order: tensor specs, other values, nulls."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in leaves(item)]
    if isinstance(value, dict) and "type" not in value and not is_tensor_spec(value):
        return [leaf for item in value.values() for leaf in leaves(item)]
    return [value]


class EntryParser:
    """Builds the records of one ``dump.json`` (``source`` is its path, for messages)."""

    def __init__(self, source: str, step: int, data_dir: str, files_present: set[str] | None,
                 parents: dict | None = None):
        self.source, self.step, self.data_dir = source, step, data_dir
        self.files_present = files_present  # None: no dump_tensor_data directory
        self.parents = parents or {}
        self.files: dict[tuple[int, str], TensorFile] = {}

    def parse(self, data: dict) -> ParsedStep:
        records = [self.record(position, name, entry) for position, (name, entry) in enumerate(data.items())]
        return ParsedStep(records, self.files)

    def record(self, exec_index: int, name: str, entry) -> OpRecord:
        if not isinstance(entry, dict):
            raise InputError(self.source, f"entry {name!r}: not a JSON object but {type(entry).__name__}")
        op_type, direction, is_module = name_parts(name)
        if self.parents.get(name) == "optimizer":
            direction = OPTIMIZER
        inputs, outputs, attrs = self._slots(name, entry, op_type, direction)
        tensors = tuple(self._tensor(name, exec_index, slot, spec) for slot, spec in inputs + outputs)
        output_records = [t for t in tensors if t.kind == "output"]
        input_records = [t for t in tensors if t.kind == "input"]
        overflow = any(not t.stats.finite for t in output_records)
        return OpRecord(step=self.step, exec_index=exec_index, name=name, type=op_type, direction=direction,
                        compute_dtype=_compute_dtype(output_records, input_records), overflow=overflow,
                        tensors=tensors, inherited_nonfinite=overflow and any(not t.stats.finite for t in input_records),
                        attrs=attrs)

    def _slots(self, name: str, entry: dict, op_type: str, direction: str):
        """([(slot, spec)] of inputs, of outputs, and the replayable argument structure)."""
        if op_type == PARAMETERS_GRAD:
            values = leaves([entry[key] for key in entry])
            return [], _numbered("output", values), {}
        if "input_args" in entry or "input_kwargs" in entry:
            args, kwargs = entry.get("input_args") or [], entry.get("input_kwargs") or {}
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise InputError(self.source, f"entry {name!r}: input_args is not a list or input_kwargs "
                                              "not an object")
            values = leaves(args) + leaves(kwargs)
            attrs = _arguments(args, kwargs)
        else:
            values, attrs = leaves(entry.get("input") or []), {}
        if entry.get("parameters"):
            values += leaves(entry["parameters"])
        return _numbered("input", values), _numbered("output", leaves(entry.get("output"))), attrs

    def _tensor(self, name: str, exec_index: int, slot: str, spec: dict) -> TensorRecord:
        where = f"entry {name!r} {slot}"
        shape = _shape(self.source, where, spec.get("shape"))
        dtype = torch_dtype_name(spec.get("dtype"))
        stats = spec_stats(spec, math.prod(shape))
        data_name = spec.get("data_name")
        has_data = isinstance(data_name, str) and data_name not in ("", "-1")
        if has_data:
            path = self._file(name, data_name)
            self.files[(exec_index, slot)] = TensorFile(path, dtype, shape)
        return TensorRecord(slot, dtype, shape, stats, has_data)

    def _file(self, name: str, data_name: str) -> str:
        if os.path.basename(data_name) != data_name or data_name in (".", ".."):
            raise InputError(self.source, f"entry {name!r}: data_name {data_name!r} is not a file name")
        path = os.path.join(self.data_dir, data_name)
        if self.files_present is None or data_name not in self.files_present:
            raise InputError(path, f"no such file (entry {name!r} of {self.source} refers to it)")
        return path


def _numbered(kind: str, values: list) -> list[tuple[str, dict]]:
    return [(f"{kind}_{i}", v) for i, v in enumerate(values) if is_tensor_spec(v)]


def _arguments(args: list, kwargs: dict) -> dict:
    """The call's arguments as the replay needs them: tensors as ``{"tensor": i}`` (i-th input tensor)."""
    counter = iter(range(1 << 30))

    def encode(value):
        if is_tensor_spec(value):
            return {"tensor": next(counter), "dtype": torch_dtype_name(value.get("dtype"))}
        if isinstance(value, list):
            return [encode(v) for v in value]
        if isinstance(value, dict) and "type" not in value:
            return {k: encode(v) for k, v in value.items()}
        return value

    return {"msprobe_args": encode(args), "msprobe_kwargs": encode(kwargs)}


def _shape(source: str, where: str, shape) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise InputError(source, f"{where}: shape {shape!r} is not a list of whole numbers")
    return tuple(shape)


def _number(value) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) < 1 << 1000 else (math.inf if value > 0 else -math.inf)  # no overflow
    if isinstance(value, str):
        try:
            return float(value)  # "nan", "inf" as some writers spell them
        except ValueError:
            return math.nan
    return math.nan


def spec_stats(spec: dict, count: int) -> TensorStats:
    """Our statistics from msprobe's Max, Min, Mean and Norm (see the module docstring)."""
    if not count:
        return TensorStats.empty()
    hi, lo, mean, norm = (_number(spec.get(key)) for key in ("Max", "Min", "Mean", "Norm"))
    if not any(key in spec for key in ("Max", "Min", "Mean", "Norm")):  # md5 or no summary: values unknown
        return TensorStats(count, math.nan, math.nan, math.nan, math.nan, math.nan)
    nan = int(math.isnan(hi) or math.isnan(lo))  # max and min propagate NaN; a mean of +inf and -inf is NaN too
    inf = int(not nan and (math.isinf(hi) or math.isinf(lo)))  # a norm overflows on finite fp16 values
    if nan or inf:
        lo, hi = (v if math.isfinite(v) else math.nan for v in (lo, hi))  # ours are over the finite values
        return TensorStats(count, lo, hi, math.nan, math.nan, math.nan, nan, inf)
    variance = max(0.0, norm * norm / count - mean * mean)
    return TensorStats(count, lo, hi, mean, math.sqrt(variance), norm)


def _compute_dtype(outputs: list[TensorRecord], inputs: list[TensorRecord]) -> str:
    for tensor in outputs + inputs:
        if tensor.dtype in ("float16", "bfloat16", "float32", "float64"):
            return tensor.dtype
    return (outputs + inputs)[0].dtype if outputs or inputs else "float32"
