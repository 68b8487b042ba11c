"""Introduced versus inherited error: replay an op on the golden run's inputs.

For a target op, three relative L2 errors against the golden output say
where its error comes from:

``inherited``
    how far its inputs already were from golden (the largest input error);
``introduced``
    the op replayed on the *golden* inputs with the target's numerics: the
    error this op adds by itself;
``expected``
    the op computed exactly on the golden inputs rounded to its compute
    dtype, output rounded to its output dtype: what that dtype alone
    explains, for this op on these values (a bound that includes the op's
    own conditioning, never one fixed threshold).

An op whose introduced error is many times its expected error computes worse
than its dtype allows (a fused kernel keeping intermediates in fp16, a
kernel bug); one whose introduced error is large *and* expected is
ill-conditioned in its dtype (precision loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from precision_tool.analysis.errors import format_limit, repeated_stats, split_error, stats_split
from precision_tool.analysis.replay import NotReplayable, Numerics, ideal_forward, is_float, replay_forward
from precision_tool.analysis.results import Attribution
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.compare.judged import (NEAR_ZERO_RATIO, NEAR_ZERO_TOLERANCE, NEAR_ZERO_UNITS, gradient_scale,
                                            input_scale)
from precision_tool.compare.matching import TensorPair, match_ops
from precision_tool.compare.metrics import compare_arrays
from precision_tool.defaults import SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FLOAT32, FORMATS, get_format


def relative_error(x: np.ndarray, golden: np.ndarray) -> float:
    """||x - g|| / ||g|| in float64; inf when ``x`` has inf/NaN where golden is finite."""
    x, golden = np.asarray(x), np.asarray(golden)
    if x.size != golden.size:
        return math.inf
    metrics = compare_arrays(x, golden)
    if metrics.target_only_nonfinite:
        return math.inf
    return metrics.rel_euclidean


class GoldenView:
    """The golden tensors that pair with one target op's slots (loaded on first use)."""

    def __init__(self, golden_dump, pairs):
        self._dump = golden_dump
        self._pairs = {p.target.slot: p for p in pairs if p.golden.has_data}
        self._stats = {p.target.slot: p.golden for p in pairs if not p.golden.has_data}  # stats-mode partners
        self._cache: dict[str, np.ndarray] = {}

    def get(self, slot: str) -> np.ndarray | None:
        if slot not in self._cache:
            pair = self._pairs.get(slot)
            if pair is None:
                return None
            self._cache[slot] = self._dump.tensor(pair.golden_op.step, pair.golden_op.exec_index,
                                                  pair.golden.slot)
        return self._cache[slot]

    def record(self, slot: str):
        """The golden TensorRecord paired with ``slot``, or None."""
        pair = self._pairs.get(slot)
        return None if pair is None else pair.golden

    def statistics(self, slot: str):
        """The golden TensorRecord paired with ``slot`` when it holds statistics only, or None."""
        return self._stats.get(slot)

    def input_list(self, record: OpRecord) -> list[np.ndarray] | None:
        """Golden arrays for every input slot of ``record``, or None if one is missing."""
        arrays = [self.get(t.slot) for t in record.inputs]
        return None if any(a is None for a in arrays) else arrays


def golden_views(golden_dump, records: list[OpRecord]) -> dict[int, GoldenView]:
    """A GoldenView per target record (keyed by ``id(record)``), matching each step once."""
    by_step: dict[tuple[int, str], list[OpRecord]] = {}
    for record in records:
        by_step.setdefault((record.step, record.direction), []).append(record)
    views = {}
    for (step, direction), group in by_step.items():
        match = match_ops(golden_dump.ops(step=step, direction=direction), group)
        pairs: dict[int, list] = {}
        for pair in match.pairs:
            pairs.setdefault(id(pair.target_op), []).append(pair)
        for record in group:
            found = pairs.get(id(record), [])
            views[id(record)] = GoldenView(golden_dump, _outputs_by_shape(record, found) if record.is_module
                                           else found)
    return views


def _outputs_by_shape(record: OpRecord, pairs: list) -> list:
    """A module call's pairs, its outputs paired by shape where golden's call returns another tuple (a model
    given labels returns (loss, logits) in golden, logits alone in a target that computes its loss in the
    training loop): output_0 against golden's output_0 compares a loss with logits. Each output whose partner by
    name has another shape pairs with golden's one output of its shape and dtype (a module call without recorded
    inputs is judged against inputs "within 0": an autocast output against golden's float32 would count its
    rounding as the module's); with none or several, it pairs with none."""
    if not pairs or all(tuple(p.target.shape) == tuple(p.golden.shape) for p in pairs if p.target.kind == "output"):
        return pairs
    golden_op = pairs[0].golden_op
    kept = [p for p in pairs if p.target.kind != "output" or tuple(p.target.shape) == tuple(p.golden.shape)]
    for tensor in record.outputs:
        if any(p.target.slot == tensor.slot for p in kept):
            continue
        same = [g for g in golden_op.outputs if tuple(g.shape) == tuple(tensor.shape) and g.dtype == tensor.dtype]
        if len(same) == 1:
            kept.append(TensorPair(record, tensor, golden_op, same[0]))
    return kept


def pair_errors(golden_dump, target_dump, record: OpRecord, view: GoldenView, kind: str, ratio: float = 1.0):
    """(slot, ErrorSplit) per float tensor of ``kind`` with a golden partner holding data; ``ratio`` is the
    target's loss scale over golden's, divided out of the tensors that carry it (`gradient_scale`). A pair that
    holds statistics only (stats-mode dumps) is measured from them (`stats_split`: a lower bound)."""
    found = []
    for tensor in record.tensors:
        if tensor.kind != kind or not is_float(tensor.dtype):
            continue
        if not tensor.has_data or view.statistics(tensor.slot) is not None:
            partner = view.statistics(tensor.slot) or view.record(tensor.slot)
            if partner is not None and tensor.stats.count:
                scale = gradient_scale(tensor, partner, ratio) if record.direction == "backward" else 1.0
                ours, theirs = repeated_stats(tensor.shape, tensor.stats, partner.shape, partner.stats)
                error = stats_split(ours, theirs, tensor.dtype, scale)
                copied = ours is not tensor.stats or theirs is not partner.stats
                if copied and record.direction == "backward" and error.error >= SIGNIFICANT_ERROR:
                    continue  # (a gradient of copies is their gradients summed: statistics cannot tell)
                found.append((tensor.slot, error))
            continue
        golden = view.get(tensor.slot)
        if golden is None:
            continue
        target = target_dump.tensor(record.step, record.exec_index, tensor.slot)
        scale = gradient_scale(tensor, view.record(tensor.slot), ratio) if record.direction == "backward" else 1.0
        found.append((tensor.slot, split_error(target, golden, tensor.dtype, scale, record.direction == "backward")))
    return found


def attribute_record(golden_dump, target_dump, record: OpRecord, device: str = "npu",
                     view: GoldenView | None = None, replay: bool = True) -> Attribution:
    """Attribute the error of one target op record; see the module docstring.

    Errors leave out what the target's format could not hold (`split_error`);
    backward tensors of a loss-scaled run are compared with the scale
    divided out. ``replay=False`` measures observed and inherited error only.
    """
    if view is None:
        view = golden_views(golden_dump, [record])[id(record)]
    notes = []
    ratio = loss_scale_ratios(golden_dump, target_dump).get(record.step, 1.0) if record.direction == "backward" \
        else 1.0
    outputs = pair_errors(golden_dump, target_dump, record, view, "output", ratio)
    inputs = pair_errors(golden_dump, target_dump, record, view, "input", ratio)
    if not outputs:
        notes.append("no float output with a golden partner holding data")
    observed = max((e.error for _, e in outputs), default=0.0)
    inherited = max((e.error for _, e in inputs), default=0.0)
    overflowed = sum(e.overflowed for _, e in outputs)
    new_nan = sum(e.new_nan for _, e in outputs)
    inputs_off = tuple(slot for slot, e in inputs if e.overflowed or e.new_nan)
    errors = replay_errors(golden_dump, target_dump, record, view, device, notes) \
        if replay and not record.is_module else []
    introduced = max((e.introduced for e in errors), default=None)
    expected = max((e.expected for e in errors), default=None)
    return Attribution(record.step, record.name, record.type, record.direction, record.compute_dtype,
                       observed, inherited, introduced, expected, device, tuple(notes), overflowed, new_nan,
                       inputs_off, significant_slots(errors))


def significant_slots(errors: list[OutputError]) -> tuple[str, ...]:
    """The output slots that introduce SIGNIFICANT_ERROR or more: those a precision loss is about."""
    return tuple(e.slot for e in errors if e.introduced >= SIGNIFICANT_ERROR)


def replay_introduced(golden_dump, target_dump, record: OpRecord, view: GoldenView, device: str, notes: list):
    """(introduced, expected) of ``record`` replayed on golden inputs; (None, None) when it cannot be."""
    errors = replay_errors(golden_dump, target_dump, record, view, device, notes)
    if not errors:
        return None, None
    return max(e.introduced for e in errors), max(e.expected for e in errors)


@dataclass(frozen=True)
class OutputError:
    """One float output of a replayed op: the error it introduces and what its dtype explains."""

    slot: str
    introduced: float
    expected: float


def replay_errors(golden_dump, target_dump, record: OpRecord, view: GoldenView, device: str,
                  notes: list) -> list[OutputError]:
    """`replay_introduced` per float output slot; empty when the op cannot be replayed."""
    inputs = view.input_list(record)
    golden_outputs = [view.get(t.slot) for t in record.outputs]
    if inputs is None or any(g is None for g in golden_outputs):
        notes.append("golden inputs or outputs unavailable: cannot replay")
        return []
    if not is_float(record.compute_dtype):
        notes.append(f"computes in {record.compute_dtype}: nothing to replay")
        return []
    try:
        replayed, ideal = _replays(record, inputs, target_dump, device)
    except NotReplayable as exc:
        notes.append(str(exc))
        return []
    compute = _numerics(record, target_dump, device).compute
    return [OutputError(t.slot, split_error(r, g, t.dtype).error,
                        split_error(i, g, t.dtype).error * _accumulation(record, t, compute))
            for r, i, g, t in zip(replayed, ideal, golden_outputs, record.outputs) if is_float(t.dtype)]


def _accumulation(record: OpRecord, output, compute) -> float:
    """How many times the input rounding bound a kernel computing in ``compute`` may lose on ``output`` by
    holding its partial sums in that format: sqrt(n) for an output that sums n input elements, in a format
    narrower than float32 (1 otherwise).

    The expected bound computes exactly on inputs rounded to the compute
    dtype: for a sum of n terms that is about u ||x||_2 / |sum x|. A kernel
    accumulating in a 16-bit format adds rounding of its partial sums, about
    sqrt(n) u ||x||_1 / |sum x| (the probabilistic bound), which is at most
    sqrt(n) times the former. Sums of many terms that cancel (a LayerNorm's
    bias gradient over batch and tokens in bfloat16) lose that much in a
    clean run; n is read off the shapes: the largest input's elements per
    output element.
    """
    if compute.bits >= 32:
        return 1.0
    size = math.prod(output.shape) if output.shape else 1
    largest = max((math.prod(t.shape) if t.shape else 1 for t in record.inputs), default=1)
    return math.sqrt(max(largest / max(size, 1), 1.0))


def self_consistency(target_dump, record: OpRecord, device: str = "npu") -> tuple[float, float] | None:
    """(error of the recorded output against the op replayed on its *own* recorded inputs, what its dtype explains).

    A kernel whose recorded output does not follow from its recorded inputs
    computes something else than its op: the first number is large, the
    second small. None when the op cannot be replayed.
    """
    if record.is_module or not is_float(record.compute_dtype) or not all(t.has_data for t in record.tensors):
        return None
    inputs = [target_dump.tensor(record.step, record.exec_index, t.slot) for t in record.inputs]
    outputs = [target_dump.tensor(record.step, record.exec_index, t.slot) for t in record.outputs]
    try:
        replayed, ideal = _replays(record, inputs, target_dump, device)
    except NotReplayable:
        return None
    scale = input_scale(record)
    pairs = [(r, i, o, t.dtype) for r, i, o, t in zip(replayed, ideal, outputs, record.outputs)
             if is_float(t.dtype) and not _cancels_alike(r, o, t, scale)]
    if not pairs:
        return None
    return (max(split_error(o, r, dtype).error for r, _, o, dtype in pairs),
            max(split_error(i, r, dtype).error for r, i, _, dtype in pairs))


def _cancels_alike(replayed, recorded, tensor, scale: float) -> bool:
    """Whether an output whose terms cancel to near zero against its op's inputs (a batch norm's saved mean of
    values a thousand times larger) agrees with its replay to a small share of that scale: its relative error is
    the summation order's (a channels-last kernel's), not the kernel's (`compare.judged.near_zero`)."""
    norm = tensor.stats.norm
    if not (scale > 0.0 and math.isfinite(norm) and norm < NEAR_ZERO_RATIO * scale):
        return False
    fmt = FORMATS.get(tensor.dtype)
    error = float(np.linalg.norm(np.asarray(recorded, np.float64) - np.asarray(replayed, np.float64)))
    return error / scale < max(NEAR_ZERO_TOLERANCE, NEAR_ZERO_UNITS * fmt.unit_roundoff if fmt else 0.0)


def makes_nan_hidden(target_dump, record: OpRecord) -> bool:
    """Whether ``record`` raised the float status with no NaN, inf or saturated value in its outputs and, run again
    on its own recorded inputs in golden's numerics (NaN and inf kept), makes NaN from finite inputs: an invalid
    operation (the square root of negative values, 0/0) whose NaN a saturation mode wrote as numbers (0)."""
    if record.is_module or not record.overflow or not record.tensors or \
            any(t.stats.nan or t.stats.inf or t.stats.saturated for t in record.tensors):
        return False
    if not any(t.has_data for t in record.inputs):  # statistics: nothing it reads or writes reaches its formats'
        return _nothing_overflowed(target_dump, record)  # limits, so what raised the status was NaN
    if not all(t.has_data for t in record.inputs):
        return False
    inputs = [target_dump.tensor(record.step, record.exec_index, t.slot) for t in record.inputs]
    try:
        replayed, _ = _replays(record, inputs, target_dump, "golden")
    except NotReplayable:
        return False
    with np.errstate(invalid="ignore"):
        return any(np.isnan(np.asarray(r, dtype=np.float64)).any()
                   for r, t in zip(replayed, record.outputs) if is_float(t.dtype))


def _nothing_overflowed(target_dump, record: OpRecord) -> bool:
    """From statistics, for a record that raised the float status with no NaN, inf or saturated value: whether
    the run saturates (NaN written as 0) and every value the op reads or writes lies inside both its own dtype's
    range and its compute dtype's (an input a float16 kernel's cast saturated raises the status too)."""
    if (target_dump.metadata or {}).get("overflow_mode") != "saturation":
        return False
    compute = format_limit(record.compute_dtype)
    return all(max(abs(t.stats.min), abs(t.stats.max)) < min(compute, format_limit(t.dtype))
               for t in record.tensors if t.stats.count and is_float(t.dtype))


def _replays(record: OpRecord, inputs: list[np.ndarray], target_dump, device: str):
    """(the op replayed with the target's numerics, the op as its dtype alone explains it)."""
    numerics = _numerics(record, target_dump, device)
    if target_dump.metadata.get("framework") == "torch":
        return _torch_replays(record, inputs, target_dump, numerics, device)
    if target_dump.metadata.get("framework") == "msprobe":
        return _msprobe_replays(record, inputs, numerics)
    seed = int(target_dump.metadata.get("seed", 0) or 0)
    return replay_forward(record, inputs, numerics, seed)[0], ideal_forward(record, inputs, numerics, seed)


def _torch_replays(record: OpRecord, inputs: list[np.ndarray], target_dump, numerics: Numerics, device: str):
    """Torch dumps replay through PyTorch: as recorded, and exactly (float64) on inputs rounded as the target
    held them (each to its recorded dtype, then to the compute dtype), the outputs rounded once."""
    try:
        from precision_tool.torch import NotReplayable as TorchNotReplayable
        from precision_tool.torch import replay, replay_as_recorded
    except ImportError:
        raise NotReplayable(f"{record.name}: replaying a torch op needs PyTorch "
                            "(pip install 'precision-tool[torch]')") from None
    try:
        if device == "golden":
            replayed = replay(record, inputs, device="golden")
        else:
            replayed, _ = replay_as_recorded(record, inputs, target_dump.metadata)
        rounded = [_as_held(a, tensor.dtype, numerics) for a, tensor in zip(inputs, record.inputs)]
        ideal = [numerics.output.round(np.asarray(y, np.float32), numerics.overflow_mode)[0]
                 if np.asarray(y).dtype.kind == "f" else y
                 for y in replay(record, rounded, device="golden", exact=True)]
    except TorchNotReplayable as exc:
        raise NotReplayable(str(exc)) from None
    return replayed, ideal


def _msprobe_replays(record: OpRecord, inputs: list[np.ndarray], numerics: Numerics):
    """msprobe dumps replay the PyTorch API a record names: in its recorded dtypes, and exactly (float64) on
    inputs rounded as the target held them, the outputs rounded once (as `_torch_replays`)."""
    try:
        from precision_tool.torch.msprobe_replay import replay_msprobe
        from precision_tool.torch.replay import NotReplayable as TorchNotReplayable
    except ImportError:
        raise NotReplayable(f"{record.name}: replaying an msprobe API call needs PyTorch "
                            "(pip install 'precision-tool[torch]')") from None
    try:
        replayed = replay_msprobe(record, inputs)
        rounded = [_as_held(a, tensor.dtype, numerics) for a, tensor in zip(inputs, record.inputs)]
        ideal = [numerics.output.round(np.asarray(y, np.float32), numerics.overflow_mode)[0]
                 if np.asarray(y).dtype.kind == "f" else y
                 for y in replay_msprobe(record, rounded, exact=True)]
    except TorchNotReplayable as exc:
        raise NotReplayable(str(exc)) from None
    return replayed, ideal


def _as_held(array, dtype: str, numerics: Numerics):
    """A golden input rounded as the target's kernel held it: to its recorded dtype and the compute dtype."""
    array = np.asarray(array)
    if array.dtype.kind != "f":
        return array
    array = np.asarray(array, np.float32)
    if is_float(dtype) and get_format(dtype).bits < numerics.compute.bits:
        array = get_format(dtype).round(array, numerics.overflow_mode)[0]
    return numerics.compute.round(array, numerics.overflow_mode)[0]


def _numerics(record: OpRecord, target_dump, device: str) -> Numerics:
    if device == "golden":
        origin = get_format(golden_origin(target_dump))
        return Numerics(origin, origin, "inf_nan")
    return Numerics.of(record, str(target_dump.metadata.get("overflow_mode", "inf_nan")))


def golden_origin(dump) -> str:
    """The float format a golden replay computes in (float32 unless the run was float64)."""
    origin = dump.metadata.get("origin_dtype") or dump.metadata.get("device", {})
    if isinstance(origin, dict):
        origin = origin.get("origin_dtype", "float32")
    return origin if origin in ("float32", "float64") else FLOAT32.name


def find_record(dump, op: str, step: int | None = None, direction: str = "forward") -> OpRecord:
    """The record of ``op`` (exact name, else a unique substring) at ``step`` (default: the first)."""
    records = dump.ops(step=step, direction=direction)
    exact = [r for r in records if r.name == op]
    if exact:
        return exact[0]
    partial = sorted({r.name for r in records if op in r.name})
    if len(partial) == 1:
        return next(r for r in records if r.name == partial[0])
    from precision_tool.errors import ConfigError

    if not partial:
        raise ConfigError(f"no {direction} op named {op!r} in {dump.path}")
    shown = ", ".join(partial[:5]) + (" ..." if len(partial) > 5 else "")
    raise ConfigError(f"{op!r} matches {len(partial)} ops: {shown}")


def attribute(golden, target, op: str, step: int | None = None, direction: str = "forward",
              device: str = "npu") -> Attribution:
    """`rerun OP`: replay ``op`` of ``target`` on ``golden``'s inputs; see the module docstring."""
    record = find_record(target, op, step, direction)
    return attribute_record(golden, target, record, device)


def output_rounding(dump, record: OpRecord) -> float | None:
    """How much of ``record``'s exact output (float64, on its own recorded inputs) its 16-bit output dtype cannot
    hold (relative L2): a relative rounding costs a unit roundoff, values below the format's normal range (a
    gradient of 1e-7 in float16) lose far more. None where the op cannot be replayed; overflow left out (judged
    as overflow)."""
    dtypes = [t.dtype for t in record.outputs if t.stats.count and t.dtype in ("float16", "bfloat16")]
    if not dtypes or dump.metadata.get("framework") != "torch" or not all(t.has_data for t in record.inputs):
        return None
    try:
        from precision_tool.torch import NotReplayable, replay
    except ImportError:
        return None
    inputs = [dump.tensor(record.step, record.exec_index, t.slot) for t in record.inputs]
    try:
        exact = replay(record, inputs, device="golden", exact=True)
    except NotReplayable:
        return None
    errors = []
    for tensor, value in zip([t for t in record.outputs], exact):
        if tensor.dtype not in ("float16", "bfloat16") or np.asarray(value).dtype.kind != "f":
            continue
        value = np.asarray(value, dtype=np.float64)
        rounded = get_format(tensor.dtype).round(value)[0]
        if np.all(np.isfinite(rounded)):
            errors.append(split_error(rounded, value, "float64").error)
    return max(errors, default=None)


def input_sensitivity(dump, record: OpRecord) -> float | None:
    """How far rounding ``record``'s own inputs to its compute dtype moves its exact output (relative L2)."""
    if dump.metadata.get("framework") != "torch" or not all(t.has_data for t in record.inputs):
        return None
    try:
        from precision_tool.torch import NotReplayable, replay
    except ImportError:
        return None
    inputs = [dump.tensor(record.step, record.exec_index, t.slot) for t in record.inputs]
    u = get_format(record.compute_dtype).unit_roundoff
    rng = np.random.default_rng(record.exec_index)
    nudged = [a * (1 + u * rng.choice((-1.0, 1.0), size=np.shape(a))) if np.asarray(a).dtype.kind == "f" else a
              for a in inputs]
    try:
        exact = replay(record, inputs, device="golden", exact=True)
        moved = replay(record, nudged, device="golden", exact=True)
    except NotReplayable:
        return None
    errors = [split_error(m, e, "float64").error for m, e in zip(moved, exact) if np.asarray(e).dtype.kind == "f"]
    return max(errors, default=None)
