"""What a comparison returns: rows per tensor pair, grouped per op, in execution order.

Flagging depends on a cosine threshold that each view chooses (``compare -c``,
the shell's ``vcs -c``), so it is computed on demand from the stored metrics:
`row_flags`, `OpComparison.flagged`, `select_flagged`, `CompareReport.summary`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from precision_tool.compare.matching import FusionCover, Unmatched
from precision_tool.compare.metrics import ONE_SIDE_ZERO, TensorMetrics
from precision_tool.compare.stats import StatsDelta, ValueCounts
from precision_tool.defaults import COSINE_THRESHOLD, LIST_LIMIT
from precision_tool.dump.records import MODULE_TYPE_PREFIX

SHAPE_MISMATCH = "shape mismatch"


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class TensorRow:
    """One compared tensor pair: target op and slot, its golden partner, metrics or stats deltas."""

    step: int
    exec_index: int
    op: str
    type: str
    direction: str
    tensor: str  # slot: input_0, output_0, ...
    golden_op: str
    golden_tensor: str
    target_dtype: str
    golden_dtype: str
    shape: tuple[int, ...]
    golden_shape: tuple[int, ...]
    metrics: TensorMetrics | None = None  # None for stats-only pairs and shape mismatches
    stats: StatsDelta | None = None  # set when either side has statistics only
    target_counts: ValueCounts = ValueCounts()
    golden_counts: ValueCounts = ValueCounts()
    extra_nonfinite: int = 0  # NaN/inf in the target where the golden tensor is finite
    pass_name: str = ""
    problem: str = ""  # SHAPE_MISMATCH, or why nothing could be computed
    skip: str = ""  # why this pair is shown but not judged (compare.judged)
    loss_scale: float = 1.0  # divided out of the target tensor before scoring (a loss-scaled gradient)

    @property
    def kind(self) -> str:
        return "output" if self.tensor.startswith("output_") else self.tensor.split("_", 1)[0]

    @property
    def cosine(self) -> float | None:
        """None when unavailable (stats only, shape mismatch); NaN when undefined."""
        return None if self.metrics is None else self.metrics.cosine

    @property
    def max_abs_err(self) -> float | None:
        return None if self.metrics is None else self.metrics.max_abs_err


def row_flags(row: TensorRow, cosine_threshold: float) -> list[str]:
    """Why ``row`` is flagged at this threshold (empty when it is not, or when it is not judged)."""
    reasons = []
    if row.skip:
        return reasons
    if row.problem:
        reasons.append(row.problem)
    metrics = row.metrics
    if metrics is not None:
        if math.isnan(metrics.cosine):
            if metrics.note == ONE_SIDE_ZERO:
                reasons.append(ONE_SIDE_ZERO)
        elif metrics.cosine <= cosine_threshold:
            reasons.append(f"cosine {metrics.cosine:.6f} <= {cosine_threshold:g}")
    if row.stats is not None and row.stats.rel_norm_diff > 1.0 - cosine_threshold:
        reasons.append(f"relative norm difference {row.stats.rel_norm_diff:.3g} > {1.0 - cosine_threshold:.3g}")
    if row.extra_nonfinite:
        reasons.append(f"target has {row.extra_nonfinite} NaN/inf the golden tensor lacks")
    return reasons


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class OpComparison:
    """The compared tensors of one target op execution."""

    step: int
    exec_index: int
    name: str
    type: str
    direction: str
    rows: tuple[TensorRow, ...]
    pass_name: str = ""
    original_names: tuple[str, ...] = ()
    _outputs: tuple | None = field(default=None, init=False, repr=False, compare=False)  # `outputs`, once asked

    @property
    def outputs(self) -> tuple[TensorRow, ...]:
        """The output rows: what flags an op (views ask for them several times an op)."""
        outputs = self._outputs
        if outputs is None:
            outputs = self._outputs = tuple(r for r in self.rows if r.kind == "output")
        return outputs

    def flagged(self, cosine_threshold: float = COSINE_THRESHOLD) -> bool:
        """True when any output is flagged (inputs are shown, never judged: the vcs rule)."""
        return any(row_flags(r, cosine_threshold) for r in self.outputs)

    def flag_reasons(self, cosine_threshold: float = COSINE_THRESHOLD) -> list[str]:
        return [f"{r.tensor}: {why}" for r in self.outputs for why in row_flags(r, cosine_threshold)]

    @property
    def worst_output_cosine(self) -> float | None:
        """The lowest judged output cosine; NaN if one is undefined; None when none is available. An output the
        comparison does not judge (``TensorRow.skip``: rounding noise around a zero the terms cancel to) is left
        out: its cosine says nothing of the op, and drawn it would fill a clean run's chart with 1 - cosine ~ 1."""
        cosines = [r.cosine for r in self.outputs if r.cosine is not None and not r.skip]
        if not cosines:
            return None
        if any(math.isnan(c) for c in cosines):
            return math.nan
        return min(cosines)

    @property
    def max_output_abs_err(self) -> float | None:
        errors = [r.max_abs_err for r in self.outputs
                  if r.max_abs_err is not None and not math.isnan(r.max_abs_err) and not r.skip]
        return max(errors) if errors else None


def worst_output_stat(op: OpComparison, name: str) -> float | None:
    """The largest ``name`` (a `StatsDelta` field) among the op's statistics-only outputs, NaN left out."""
    values = [getattr(r.stats, name) for r in op.outputs if r.stats is not None and not r.skip]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else None


@dataclass(frozen=True)
class DumpInfo:
    """Which dump a side came from."""

    path: str
    mode: str = "dump"
    role: str = ""
    modes: tuple[str, ...] = ()  # every mode of a combined collection, e.g. ("overflow", "stats")


@dataclass(frozen=True)
class CompareSummary:
    """The counts a summary line and the JSON ``summary`` show."""

    cosine_threshold: float
    compared_tensors: int
    compared_ops: int
    flagged_ops: int
    unmatched_golden: int
    unmatched_target: int
    covered_by_fusion: int
    shape_mismatches: int
    first_flagged: OpComparison | None
    first_flagged_module: OpComparison | None = None  # the first module whose output diverges, its inputs not


@dataclass
class CompareReport:
    """Everything one comparison found, in target execution order."""

    golden: DumpInfo
    target: DumpInfo
    ops: list[OpComparison] = field(default_factory=list)
    unmatched_golden: list[Unmatched] = field(default_factory=list)
    unmatched_target: list[Unmatched] = field(default_factory=list)
    covered_by_fusion: list[FusionCover] = field(default_factory=list)
    stats_only: bool = False  # some pair had statistics only: cosine unavailable there
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[TensorRow]:
        return [row for op in self.ops for row in op.rows]

    @property
    def compared_ops(self) -> int:
        return len(self.ops)

    @property
    def compared_tensors(self) -> int:
        return sum(len(op.rows) for op in self.ops)

    @property
    def shape_mismatches(self) -> list[TensorRow]:
        return [row for row in self.rows if row.problem == SHAPE_MISMATCH]

    def summary(self, cosine_threshold: float = COSINE_THRESHOLD) -> CompareSummary:
        flagged = [op for op in self.ops if op.flagged(cosine_threshold)]
        return CompareSummary(
            cosine_threshold=cosine_threshold,
            compared_tensors=sum(len(op.rows) for op in self.ops),
            compared_ops=len(self.ops),
            flagged_ops=len(flagged),
            unmatched_golden=len(self.unmatched_golden),
            unmatched_target=len(self.unmatched_target),
            covered_by_fusion=len(self.covered_by_fusion),
            shape_mismatches=len(self.shape_mismatches),
            first_flagged=flagged[0] if flagged else None,
            first_flagged_module=_first_diverging_module(flagged, cosine_threshold),
        )


def _first_diverging_module(flagged: list[OpComparison], cosine_threshold: float) -> OpComparison | None:
    """The first flagged module call whose inputs are not flagged (its output diverges, its inputs do not);
    else the first flagged module call."""
    modules = [op for op in flagged if op.type.startswith(MODULE_TYPE_PREFIX)]
    for op in modules:
        if not any(row_flags(row, cosine_threshold) for row in op.rows if row.kind == "input"):
            return op
    return modules[0] if modules else None


def select_flagged(report: CompareReport, cosine_threshold: float = COSINE_THRESHOLD,
                   limit: int | None = LIST_LIMIT) -> list[OpComparison]:
    """The first ``limit`` flagged ops in execution order (every one when limit is None or < 1).

    This is ``compare -c C -l L`` and the shell's ``vcs -c C -l L``.
    """
    flagged = [op for op in report.ops if op.flagged(cosine_threshold)]
    return flagged if limit is None or limit < 1 else flagged[:limit]
