"""Pairing target tensors with golden tensors: by step, op name, direction and slot.

An op that runs several times in one step is matched occurrence by
occurrence (the k-th run on one side with the k-th on the other).

A fused target op (``pass_name`` set) whose name the golden dump lacks is
matched through the ops it replaced, in the same step:

* forward output i  -> golden forward op ``output_origins[i][0]``, slot ``output_{output_origins[i][1]}``
* forward input i   -> golden forward op ``input_origins[i][0]``, slot ``input_{input_origins[i][1]}``
* backward output i (the gradient for fused input i)
                    -> golden backward op ``input_origins[i][0]``, slot ``output_{input_origins[i][1]}``
* backward input i (the gradient arriving at fused output i)
                    -> golden backward op ``output_origins[i][0]``, slot ``input_{output_origins[i][1]}``

Golden ops named in a fused op's ``original_names`` are *covered by fusion*:
counted apart, never reported unmatched. Every other op or tensor without a
partner is listed in ``unmatched_golden`` / ``unmatched_target``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from precision_tool.dump.records import OpRecord, TensorRecord

GOLDEN = "golden"
TARGET = "target"


@dataclass(slots=True)  # one per compared tensor pair: plain slots are the cheapest to build
class TensorPair:
    """One target tensor and the golden tensor it is compared with."""

    target_op: OpRecord
    target: TensorRecord
    golden_op: OpRecord
    golden: TensorRecord

    @property
    def via_fusion(self) -> bool:
        return self.target_op.name != self.golden_op.name


@dataclass(frozen=True)
class Unmatched:
    """An op (``slot`` empty) or one tensor of an op, with no partner on the other side."""

    side: str  # "golden" or "target": where the op is
    step: int
    exec_index: int
    name: str
    type: str
    direction: str
    slot: str = ""
    reason: str = ""


@dataclass(frozen=True)
class FusionCover:
    """A golden op that a fused target op replaced."""

    step: int
    direction: str
    name: str
    type: str
    fused_into: str
    pass_name: str


@dataclass
class MatchResult:
    """Pairs in target execution order, and everything left over."""

    pairs: list[TensorPair] = field(default_factory=list)
    unmatched_golden: list[Unmatched] = field(default_factory=list)
    unmatched_target: list[Unmatched] = field(default_factory=list)
    covered_by_fusion: list[FusionCover] = field(default_factory=list)


def _key(record: OpRecord) -> tuple[int, str, str]:
    return record.step, record.direction, record.name


def _unmatched(side: str, record: OpRecord, slot: str = "", reason: str = "") -> Unmatched:
    return Unmatched(side, record.step, record.exec_index, record.name, record.type, record.direction, slot, reason)


def _slot_map(record: OpRecord) -> dict[str, TensorRecord]:
    return {tensor.slot: tensor for tensor in record.tensors}


class _Matcher:
    def __init__(self, golden: list[OpRecord]):
        self.golden_ops = golden
        self.index: dict[tuple[int, str, str], list[OpRecord]] = defaultdict(list)
        for record in golden:
            self.index[_key(record)].append(record)
        self.seen: dict[tuple[int, str, str], int] = defaultdict(int)
        self.direct: set[int] = set()  # id() of golden ops matched by their own name
        self.covered: dict[int, FusionCover] = {}
        self.result = MatchResult()

    def golden_op(self, step: int, direction: str, name: str, occurrence: int) -> OpRecord | None:
        runs = self.index.get((step, direction, name), [])
        return runs[occurrence] if occurrence < len(runs) else None

    def add(self, record: OpRecord) -> None:
        key = _key(record)
        occurrence = self.seen[key]
        self.seen[key] = occurrence + 1
        runs = self.index.get(key)
        partner = runs[occurrence] if runs is not None and occurrence < len(runs) else None
        if partner is not None:
            self.pair_direct(record, partner)
        elif record.fused:
            self.pair_fused(record, occurrence)
        else:
            self.result.unmatched_target.append(_unmatched(TARGET, record, reason="no golden op of this name"))

    def pair_direct(self, record: OpRecord, partner: OpRecord) -> None:
        self.direct.add(id(partner))
        targets, goldens = record.tensors, partner.tensors
        if len(targets) == len(goldens) and all(t.slot == g.slot for t, g in zip(targets, goldens)):
            self.result.pairs.extend([TensorPair(record, t, partner, g) for t, g in zip(targets, goldens)])
            return  # the usual case: the same slots in the same order
        golden_slots = _slot_map(partner)
        for tensor in record.tensors:
            golden = golden_slots.pop(tensor.slot, None)
            if golden is None:
                self.result.unmatched_target.append(
                    _unmatched(TARGET, record, tensor.slot, "the golden op has no such tensor"))
            else:
                self.result.pairs.append(TensorPair(record, tensor, partner, golden))
        for slot in golden_slots:
            self.result.unmatched_golden.append(
                _unmatched(GOLDEN, partner, slot, "the target op has no such tensor"))

    def pair_fused(self, record: OpRecord, occurrence: int) -> None:
        for name, op_type in zip(record.original_names, record.original_types):
            original = self.golden_op(record.step, record.direction, name, occurrence)
            if original is not None and id(original) not in self.covered:
                self.covered[id(original)] = FusionCover(record.step, record.direction, name, op_type,
                                                         record.name, record.pass_name)
        for tensor in record.tensors:
            origin = fused_origin(record, tensor)
            partner = None
            if origin is not None:
                golden_op = self.golden_op(record.step, record.direction, origin[0], occurrence)
                if golden_op is not None:
                    partner = (golden_op, _slot_map(golden_op).get(origin[1]))
            if partner is None or partner[1] is None:
                where = f"{origin[0]}:{origin[1]}" if origin else "no origin recorded"
                self.result.unmatched_target.append(
                    _unmatched(TARGET, record, tensor.slot, f"fused origin {where} is not in the golden dump"))
            else:
                self.result.pairs.append(TensorPair(record, tensor, partner[0], partner[1]))

    def finish(self) -> MatchResult:
        for record in self.golden_ops:
            if id(record) in self.covered:
                self.result.covered_by_fusion.append(self.covered[id(record)])
            elif id(record) not in self.direct:
                self.result.unmatched_golden.append(_unmatched(GOLDEN, record, reason="no target op of this name"))
        for leftovers in (self.result.unmatched_golden, self.result.unmatched_target):
            leftovers.sort(key=lambda u: (u.step, u.exec_index, u.slot))
        return self.result


def fused_origin(record: OpRecord, tensor: TensorRecord) -> tuple[str, str] | None:
    """(golden op name, golden slot) a fused op's tensor stands for, per the table above."""
    index = tensor.index
    forward = record.direction != "backward"
    if tensor.kind == "output":
        origins, kind = (record.output_origins, "output") if forward else (record.input_origins, "output")
    else:
        origins, kind = (record.input_origins, "input") if forward else (record.output_origins, "input")
    if index >= len(origins):
        return None
    name, slot_index = origins[index]
    return name, f"{kind}_{slot_index}"


_fused_origin = fused_origin  # the shell imported it under this name first


def match_ops(golden: list[OpRecord], target: list[OpRecord]) -> MatchResult:
    """Pair every target tensor with its golden tensor; list what is left on each side."""
    matcher = _Matcher(golden)
    for record in target:
        matcher.add(record)
    return matcher.finish()
