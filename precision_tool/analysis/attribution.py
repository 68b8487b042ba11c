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

import numpy as np

from precision_tool.analysis.replay import NotReplayable, Numerics, ideal_forward, is_float, replay_forward
from precision_tool.analysis.results import Attribution
from precision_tool.compare.matching import match_ops
from precision_tool.compare.metrics import compare_arrays
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FLOAT32, get_format


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
        self._cache: dict[str, np.ndarray] = {}

    def get(self, slot: str) -> np.ndarray | None:
        if slot not in self._cache:
            pair = self._pairs.get(slot)
            if pair is None:
                return None
            self._cache[slot] = self._dump.tensor(pair.golden_op.step, pair.golden_op.exec_index,
                                                  pair.golden.slot)
        return self._cache[slot]

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
            views[id(record)] = GoldenView(golden_dump, pairs.get(id(record), []))
    return views


def attribute_record(golden_dump, target_dump, record: OpRecord, device: str = "npu",
                     view: GoldenView | None = None) -> Attribution:
    """Attribute the error of one target op record; see the module docstring."""
    if view is None:
        view = golden_views(golden_dump, [record])[id(record)]
    notes = []
    observed = 0.0
    for tensor in record.outputs:
        golden_out = view.get(tensor.slot)
        if golden_out is None or not tensor.has_data:
            notes.append(f"{tensor.slot}: no golden partner with data")
            continue
        target_out = target_dump.tensor(record.step, record.exec_index, tensor.slot)
        observed = max(observed, relative_error(target_out, golden_out))
    inherited = 0.0
    for tensor in record.inputs:
        golden_in = view.get(tensor.slot)
        if golden_in is None or not tensor.has_data or tensor.dtype not in ("float16", "bfloat16", "float32", "float64"):
            continue
        target_in = target_dump.tensor(record.step, record.exec_index, tensor.slot)
        inherited = max(inherited, relative_error(target_in, golden_in))
    introduced = expected = None
    inputs = view.input_list(record)
    golden_outputs = [view.get(t.slot) for t in record.outputs]
    if inputs is None or any(g is None for g in golden_outputs):
        notes.append("golden inputs or outputs unavailable: cannot replay")
    elif not is_float(record.compute_dtype):
        notes.append(f"computes in {record.compute_dtype}: nothing to replay")
    else:
        try:
            replayed, ideal = _replays(record, inputs, target_dump, device)
            introduced = max(relative_error(r, g) for r, g in zip(replayed, golden_outputs))
            expected = max(relative_error(e, g) for e, g in zip(ideal, golden_outputs))
        except NotReplayable as exc:
            notes.append(str(exc))
    return Attribution(record.step, record.name, record.type, record.direction, record.compute_dtype,
                       observed, inherited, introduced, expected, device, tuple(notes))


def _replays(record: OpRecord, inputs: list[np.ndarray], target_dump, device: str):
    """(the op replayed with the target's numerics, the op as its dtype alone explains it)."""
    numerics = _numerics(record, target_dump, device)
    if target_dump.metadata.get("framework") == "torch":
        return _torch_replays(record, inputs, target_dump, numerics, device)
    seed = int(target_dump.metadata.get("seed", 0) or 0)
    return replay_forward(record, inputs, numerics, seed)[0], ideal_forward(record, inputs, numerics, seed)


def _torch_replays(record: OpRecord, inputs: list[np.ndarray], target_dump, numerics: Numerics, device: str):
    """Torch dumps replay through PyTorch: as recorded, and in float32 on dtype-rounded inputs."""
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
        rounded = [numerics.compute.round(np.asarray(a, np.float32), numerics.overflow_mode)[0]
                   if np.asarray(a).dtype.kind == "f" else a for a in inputs]
        ideal = [numerics.output.round(np.asarray(y, np.float32), numerics.overflow_mode)[0]
                 for y in replay(record, rounded, device="golden")]
    except TorchNotReplayable as exc:
        raise NotReplayable(str(exc)) from None
    return replayed, ideal


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
