"""Precision modes and AMP lists: which format every op computes in on the npu.

The rules follow ``../shared/reference/NUMERICS.md`` sections 1.3-1.5. Our ops
all have float16, bfloat16 and float32 kernels, so the "no kernel for this
dtype" fallbacks of the real modes never trigger.

======================================  ===========================  ================
mode (``precision_mode`` / ``_v2``)      matrix ops (MatMul, Conv2D)  vector ops
======================================  ===========================  ================
force_fp16 / fp16                        fp16                         fp16
allow_fp32_to_fp16                       fp16                         origin (fp32)
must_keep_origin_dtype / origin          origin                       origin
force_fp32, cube_fp16in_fp32out          fp16 in, fp32 out            fp32
allow_mix_precision(_fp16) /             mixed lists, fp16            mixed lists
mixed_float16
allow_mix_precision_bf16 /               mixed lists, bf16            mixed lists
mixed_bfloat16
allow_fp32_to_bf16                       bf16                         origin (fp32)
======================================  ===========================  ================

In the mixed modes a white-list op runs in the low format, a black-list op in
float32, and a gray-list op follows its input: low precision when any of its
activation inputs (outputs of other ops) is low precision, else float32.
Parameters and constants do not pull a gray op either way. The built-in lists
of CANN are not public (UNCONFIRMED in the reference); ours follow the
PyTorch/torch_npu autocast lists and MindSpore's O2 black list: matrix ops are
white; exp, log, pow, rsqrt, softmax, log-softmax, the norms, the losses and
the sum/mean reductions are black; everything else is gray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from precision_tool.engine.formats import BFLOAT16, FLOAT16, FLOAT32, Format
from precision_tool.errors import ConfigError, InputError, choice_error
from precision_tool.inputs import read_json

PRECISION_MODES = (
    "force_fp16",
    "allow_fp32_to_fp16",
    "must_keep_origin_dtype",
    "allow_mix_precision",
    "allow_mix_precision_fp16",
    "allow_mix_precision_bf16",
    "allow_fp32_to_bf16",
    "force_fp32",
    "cube_fp16in_fp32out",
)
PRECISION_MODES_V2 = ("fp16", "origin", "cube_fp16in_fp32out", "mixed_float16", "mixed_bfloat16")


@dataclass(frozen=True)
class Policy:
    """How a precision mode lowers ops: one of four families and a low format."""

    family: str  # "all_low", "matrix_low", "origin", "cube_fp32_out", "mixed"
    low: Format = FLOAT16


_POLICIES = {
    "force_fp16": Policy("all_low"),
    "fp16": Policy("all_low"),
    "allow_fp32_to_fp16": Policy("matrix_low"),
    "must_keep_origin_dtype": Policy("origin"),
    "origin": Policy("origin"),
    "force_fp32": Policy("cube_fp32_out"),
    "cube_fp16in_fp32out": Policy("cube_fp32_out"),
    "allow_mix_precision": Policy("mixed"),
    "allow_mix_precision_fp16": Policy("mixed"),
    "mixed_float16": Policy("mixed"),
    "allow_mix_precision_bf16": Policy("mixed", BFLOAT16),
    "mixed_bfloat16": Policy("mixed", BFLOAT16),
    "allow_fp32_to_bf16": Policy("matrix_low", BFLOAT16),
}


def policy_for(precision_mode: str | None, precision_mode_v2: str | None) -> Policy:
    """The lowering policy of a precision mode; checks the value and the pairing."""
    if precision_mode and precision_mode_v2:
        raise ConfigError("set precision_mode or precision_mode_v2, not both")
    if precision_mode_v2:
        if precision_mode_v2 not in PRECISION_MODES_V2:
            raise choice_error("precision_mode_v2", precision_mode_v2, PRECISION_MODES_V2)
        return _POLICIES[precision_mode_v2]
    if precision_mode:
        if precision_mode not in PRECISION_MODES:
            raise choice_error("precision_mode", precision_mode, PRECISION_MODES)
        return _POLICIES[precision_mode]
    return _POLICIES["allow_fp32_to_fp16"]


@dataclass(frozen=True)
class MixLists:
    """Black/white/gray membership by op type, after the user's modifications."""

    white: frozenset[str] = field(default_factory=frozenset)
    black: frozenset[str] = field(default_factory=frozenset)
    gray: frozenset[str] = field(default_factory=frozenset)

    def membership(self, op_type: str, default: str) -> str:
        for name in ("white", "black", "gray"):
            if op_type in getattr(self, name):
                return name
        return default


_LIST_KEYS = {"white-list": "white", "black-list": "black", "gray-list": "gray"}


def load_mixlist(path: str | Path | dict, known_types) -> MixLists:
    """Read a ``modify_mixlist`` JSON: ``{"black-list": {"to-add": [...], "to-remove": [...]}, ...}``; or take
    that object as a dict (`simulate_npu(modify_mixlist={...})`, where errors name it ``modify_mixlist``).

    ``to-add`` moves an op type into that list; ``to-remove`` takes it out of
    it, back to its built-in default (or gray, if the default was that list).
    """
    if isinstance(path, dict):
        spec, path = path, Path("modify_mixlist")
    else:
        path = Path(path)
        spec = read_json(path, expect_object="expected a JSON object with black-list/white-list/gray-list keys")
    lists = {"white": set(), "black": set(), "gray": set()}
    removed: set[str] = set()
    for key, body in spec.items():
        if key not in _LIST_KEYS:
            raise InputError(path, f"unknown key {key!r}; valid: {', '.join(_LIST_KEYS)}")
        if not isinstance(body, dict) or set(body) - {"to-add", "to-remove"}:
            raise InputError(path, f"{key} must be an object with 'to-add' and/or 'to-remove' lists")
        for action, op_types in body.items():
            if not isinstance(op_types, list) or not all(isinstance(t, str) for t in op_types):
                raise InputError(path, f"{key}.{action} must be a list of op type names, got {op_types!r:.60}")
            for op_type in op_types:
                if op_type not in known_types:
                    raise InputError(path, f"unknown op type {op_type!r} in {key}.{action}")
                if action == "to-add":
                    for members in lists.values():
                        members.discard(op_type)
                    lists[_LIST_KEYS[key]].add(op_type)
                else:
                    removed.add(op_type)
                    lists[_LIST_KEYS[key]].discard(op_type)
    # a removed type with no new home goes to gray
    for op_type in removed:
        if not any(op_type in members for members in lists.values()):
            lists["gray"].add(op_type)
    return MixLists(*(frozenset(lists[k]) for k in ("white", "black", "gray")))


@dataclass(frozen=True)
class NodePrecision:
    """The formats one node computes and outputs in."""

    compute: Format
    output: Format


def decide(category: str, membership: str, policy: Policy | None, origin: Format,
           activation_inputs: list[Format], cast_to: Format | None = None) -> NodePrecision:
    """The precision of one node from its category, list membership and inputs.

    ``policy`` None means the golden device: everything in ``origin``.
    ``activation_inputs`` are the formats of inputs produced by other ops.
    """
    if category == "cast":
        return NodePrecision(cast_to, cast_to)
    if category == "movement":
        fmt = _narrowest(activation_inputs) if activation_inputs else origin
        return NodePrecision(fmt, fmt)
    if policy is None or policy.family == "origin":
        return NodePrecision(origin, origin)
    low = policy.low
    matrix = category == "matrix"
    if policy.family == "all_low":
        return NodePrecision(low, low)
    if policy.family == "matrix_low":
        return NodePrecision(low, low) if matrix else NodePrecision(origin, origin)
    if policy.family == "cube_fp32_out":
        return NodePrecision(low, FLOAT32) if matrix else NodePrecision(FLOAT32, FLOAT32)
    # mixed
    if membership == "white":
        return NodePrecision(low, low)
    if membership == "black":
        return NodePrecision(FLOAT32, FLOAT32)
    if any(fmt.bits < 32 for fmt in activation_inputs):
        fmt = _narrowest(activation_inputs)
        return NodePrecision(fmt, fmt)
    return NodePrecision(origin, origin)


def _narrowest(formats: list[Format]) -> Format:
    return min(formats, key=lambda f: (f.bits, f.name != "bfloat16"))
