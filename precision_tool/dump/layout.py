"""Names and row types of the HDF5 dump layout (documented in docs/dump-format.md).

::

    /                         root attributes: run metadata, complete, steps_complete
    /steps/000000/            one group per step run; attributes loss, loss_scale, ...
        op_index              one row per recorded op (execution order)
        index                 one row per recorded tensor, with its statistics
        ops/000012__blk|Softmax/   only for ops with tensor data
            input_0, output_0 ...  one dataset per tensor; attribute ``stats`` (float64[9])
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from precision_tool.engine.hooks import DIRECTIONS

STEPS = "steps"
OPS = "ops"
INDEX = "index"
OP_INDEX = "op_index"
PACKS = "packs"  # schema 2: a step's small tensors, packed into a few byte datasets
PARAMETER_GRADIENTS = "parameter_gradients"  # a module-level step's table of the gradients its optimizer read
STATS_ATTR = "stats"
DTYPE_ATTR = "dtype"
STATS_FIELDS_ATTR = "stats_fields"  # root attribute: the order of a dataset's ``stats`` values
JSON_KEYS_ATTR = "json_keys"  # root attribute: names of the attributes stored as JSON text
# root attribute, true where every index row's statistics were taken from the values stored for its tensor, so a
# reader may check one against the other (`precision_tool.dump.integrity`); absent in dumps written before
STATS_MATCH_DATA = "stats_match_data"

# Schema 2 packs every tensor of at most PACK_LIMIT stored bytes into the step's ``packs/NNNNNN`` byte
# datasets, each at most PACK_SEGMENT bytes (a larger tensor keeps a dataset of its own): reading a
# small tensor is then a slice of a mapping, not an HDF5 object lookup (~200 us). Offsets are aligned.
PACK_LIMIT = 1 << 18
PACK_SEGMENT = 1 << 23
PACK_ALIGN = 64
NOT_PACKED = -1  # ``pack`` of an index row whose tensor has a dataset of its own, or no data

MAX_RANK = 8  # shapes of higher rank are read from the dataset (or marked -1 in stats mode)
INPUT, OUTPUT = 0, 1
KINDS = ("input", "output")
DIRECTION_CODES = {name: code for code, name in enumerate(DIRECTIONS)}

_STR = np.dtype("S16")  # a dtype's name: "float8_e4m3fnuz" is 15 bytes
_VSTR = None  # filled on first use: h5py's variable-length UTF-8 string dtype

STATS_FIELDS = ("count", "min", "max", "mean", "std", "norm", "nan", "inf", "saturated")
STATS_DTYPE = np.dtype([
    ("count", "<u8"), ("min", "<f8"), ("max", "<f8"), ("mean", "<f8"), ("std", "<f8"),
    ("norm", "<f8"), ("nan", "<u8"), ("inf", "<u8"), ("saturated", "<u8"),
])


def vstr_dtype() -> np.dtype:
    """h5py's variable-length UTF-8 string dtype (imports h5py on first use)."""
    global _VSTR
    if _VSTR is None:
        import h5py

        _VSTR = h5py.string_dtype("utf-8")
    return _VSTR


@functools.lru_cache(maxsize=None)
def tensor_row_dtype(schema: int = 2) -> np.dtype:
    """One row of ``/steps/<s>/index``: a tensor slot of a recorded op (schema 1 has no pack columns)."""
    packed = [("pack", "<i4"), ("offset", "<u8")] if schema >= 2 else []
    return np.dtype([
        ("op", "<u4"),  # row of the op in op_index
        ("kind", "u1"),  # 0 input, 1 output
        ("slot", "<u2"),  # the i of input_i / output_i
        ("dtype", _STR),
        ("has_data", "u1"),
        ("ndim", "u1"),
        ("shape", "<i8", (MAX_RANK,)),
        *[(name, STATS_DTYPE[name]) for name in STATS_FIELDS],
        *packed,  # the ``packs/`` dataset holding the values (NOT_PACKED: none) and their byte offset
    ])


@functools.lru_cache(maxsize=64)
def op_row_dtype(widths: tuple[int, int, int, int] | None = None) -> np.dtype:
    """One row of ``/steps/<s>/op_index``: a recorded op execution.

    The text fields are fixed-length UTF-8 bytes as wide as the step's
    longest value (``widths`` of name, type, fusion, attrs): writing them is
    a copy, where variable-length strings cost a conversion per row.
    """
    name_w, type_w, fusion_w, attrs_w = (max(1, w) for w in (widths or (64, 64, 256, 256)))
    return np.dtype([
        ("exec_index", "<u4"),
        ("direction", "u1"),  # index into DIRECTIONS
        ("overflow", "u1"),
        ("inherited_nonfinite", "u1"),
        ("has_group", "u1"),  # an ops/<exec>__<name> group holds tensor data
        ("first_tensor", "<u4"),  # its tensors are index rows [first_tensor, first_tensor + n_tensors)
        ("n_tensors", "<u4"),
        ("name", f"S{name_w}"),
        ("type", f"S{type_w}"),
        ("compute_dtype", _STR),
        ("fusion", f"S{fusion_w}"),  # JSON of pass_name, original_names, ... ; empty when not fused
        ("attrs", f"S{attrs_w}"),  # JSON of the op's attributes; empty when none
    ])


def step_name(step: int) -> str:
    return f"{step:06d}"


def op_group_name(exec_index: int, name: str) -> str:
    """``000012__block1|attn|Softmax``: '/' separates HDF5 path parts, so it becomes '|'."""
    return f"{exec_index:06d}__{name.replace('/', '|')}"


def pack_name(number: int) -> str:
    return f"{number:06d}"


def slot_name(kind: int, index: int) -> str:
    return f"{KINDS[kind]}_{index}"


def parse_slot(slot: str) -> tuple[int, int]:
    """``output_1`` -> (OUTPUT, 1); ValueError when malformed."""
    kind, _, index = slot.partition("_")
    return KINDS.index(kind), int(index)


def json_safe(value: Any) -> Any:
    """``value`` with tuples, sets and numpy values made JSON-safe (lists, Python scalars).

    Non-finite floats stay floats: Python's json writes and reads them as
    ``NaN``/``Infinity``, so op attributes such as a ``-inf`` mask fill survive.
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [json_safe(v) for v in items]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


class JsonReady(dict):
    """A dict its maker built JSON-safe (str keys; lists, str, int, finite or non-finite floats, bools, None):
    `dumps` encodes it as it is, without `json_safe`'s walk (the torch capture's op attrs, some of which, an
    optimizer's step-dependent scalars, are encoded again every step)."""

    __slots__ = ()


def dumps(value: Any) -> str:
    """Compact JSON of ``value`` after `json_safe` (a `JsonReady` dict as it is)."""
    return json.dumps(value if type(value) is JsonReady else json_safe(value), separators=(",", ":"))
