"""Result dataclasses of the analyses: overflow, fusion, attribution, diagnosis.

CONTRACT for the front ends (shell, `diagnose`, `demo`): the functions in
`precision_tool.analysis` return exactly these; renderers decide how they look.

    overflow_report(dump, limit=None) -> OverflowReport
    fusion_report(target, golden=None, fusion_off=None) -> FusionReport
    attribute(golden, target, op, step=None, direction="forward", device=None) -> Attribution
    diagnose(golden, target, overflow=None, fusion_off=None) -> Diagnosis

``dump``, ``golden``, ``target``, ``overflow`` and ``fusion_off`` are open
dumps (`precision_tool.dump.reader.open_dump`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from precision_tool.defaults import SIGNIFICANT_ERROR

VERDICT_CLASSES = ("overflow", "invalid_operation", "fusion", "precision_loss", "kernel_bug", "boost", "none")
UPDATE_TYPE = "update"  # a verdict's type where the update before its step differs (`module_updates`): the op it
# names is where that shows, in the step after


@dataclass(frozen=True)
class Range:
    """Min and max of a tensor, from its statistics."""

    min: float
    max: float


@dataclass(frozen=True)
class OverflowEntry:
    """One op execution that raised the float status."""

    step: int
    exec_index: int
    name: str
    type: str
    direction: str
    compute_dtype: str
    inherited: bool  # its inputs already held inf/NaN: it propagated an earlier overflow
    saturated: int  # output values at the format's max (saturation mode)
    inf: int
    nan: int
    input_ranges: tuple[Range, ...]
    output_ranges: tuple[Range, ...]
    hint: str
    invalid: bool = False  # it makes NaN from finite inputs, written as numbers by a saturation mode
    in_golden: bool = False  # golden's op raised it too, as many inf (or saturated) and NaN: the model's (a mask)
    asked: bool = False  # an infinite constant the model asked for (scalar_tensor(-inf): a mask), or values that
    # carry only such constants (the mask added to the scores): the model's own, whatever golden does

    @property
    def models_own(self) -> bool:
        """Whether the inf/NaN are the model's own values (`in_golden` or `asked`), not an overflow of the run."""
        return self.in_golden or self.asked


@dataclass
class OverflowReport:
    """Overflowing ops in execution order, the first (not inherited) first."""

    entries: list[OverflowEntry]
    total: int  # op executions that raised the status, before any limit
    steps: list[int]  # steps with at least one overflow
    skipped_steps: list[int]  # steps whose optimizer update was skipped
    loss_scale: list[float]
    source: str = ""  # the dump it was read from
    as_in_golden: int = 0  # op executions (of ``total``) whose golden op raised it too: `OverflowEntry.in_golden`
    asked: int = 0  # op executions (of ``total``, not as golden) of infinite constants asked for: `OverflowEntry.asked`

    @property
    def first(self) -> OverflowEntry | None:
        """The first entry that neither inherits its inf/NaN nor holds the model's own (`models_own`: what golden's
        op makes too, a constant asked for as infinite); else the first not the model's own; None when they all
        are."""
        ours = [entry for entry in self.entries if not entry.models_own]
        return next((entry for entry in ours if not entry.inherited), ours[0] if ours else None)

    @property
    def models_own(self) -> int:
        """How many of the op executions hold the model's own inf/NaN (`OverflowEntry.models_own`)."""
        return self.as_in_golden + self.asked

    def cut(self, limit: int | None) -> list[OverflowEntry]:
        """At most ``limit`` entries (None or 0: all, as ``-l 0`` says) in execution order, those holding the model's
        own inf/NaN (`OverflowEntry.models_own`) only where room is left: a run's every step repeats its attention
        mask's -inf before an overflow of its own shows."""
        return self.entries if not limit or limit < 0 else preferring_ours(self.entries, lambda e: e.models_own,
                                                                           limit)


def preferring_ours(items: list, in_golden, limit: int) -> list:
    """The first ``limit`` of ``items`` for which ``in_golden`` is false, then the others where room is left;
    in their order."""
    ranked = sorted(range(len(items)), key=lambda i: (bool(in_golden(items[i])), i))[:limit]
    return [items[i] for i in sorted(ranked)]


@dataclass(frozen=True)
class FusionSuspect:
    """A fused op whose error against golden is clearly larger than its unfused ops show."""

    step: int
    name: str
    type: str
    pass_name: str
    original_names: tuple[str, ...]
    fused_error: float  # relative L2 error the fused op introduces (replayed on golden inputs)
    unfused_error: float | None  # the same original op's output in the fusion-off run
    ratio: float | None
    action: str


@dataclass
class FusionReport:
    """Fusion passes applied (pass -> count) and the suspects, worst first."""

    passes: dict[str, int]
    suspects: list[FusionSuspect]
    compared: bool  # whether golden (and fusion-off) dumps were available to rank suspects


@dataclass(frozen=True)
class Attribution:
    """How much error an op introduces itself versus inherits from its inputs.

    Errors are relative L2 distances to golden (``||x - g|| / ||g||``).
    ``introduced`` replays the op on the golden inputs with the target's
    numerics; ``expected`` is what the compute dtype alone explains: the op
    computed exactly on golden inputs rounded to the compute dtype, output
    rounded to the output dtype. ``observed`` is the recorded target output.
    """

    step: int
    name: str
    type: str
    direction: str
    compute_dtype: str
    observed: float
    inherited: float  # largest input error
    introduced: float | None  # None when the op cannot be replayed
    expected: float | None
    replay_device: str = "npu"
    notes: tuple[str, ...] = ()
    overflowed: int = 0  # output values golden holds but the target's format could not
    new_nan: int = 0  # output NaN where golden is finite
    inputs_off: tuple[str, ...] = ()  # input slots holding overflowed or NaN values against golden
    introduced_at: tuple[str, ...] = ()  # output slots whose introduced error is SIGNIFICANT_ERROR or more

    @property
    def ill_conditioned(self) -> bool:
        """Whether rounding the op's golden inputs to its dtype alone moves its output by SIGNIFICANT_ERROR: there
        the expected bound (input and output rounding) says nothing of what a kernel that holds intermediates in
        that dtype loses on top, so an excess over it is no evidence of a wrong kernel; precision loss is judged."""
        return self.expected is not None and self.expected >= SIGNIFICANT_ERROR

    @property
    def excess(self) -> float | None:
        """How many times the introduced error exceeds what the dtype explains."""
        if self.introduced is None or self.expected is None:
            return None
        return self.introduced / max(self.expected, 1e-12)


@dataclass(frozen=True)
class Verdict:
    """The diagnosis: where error is first introduced, its class, evidence and action."""

    op: str | None
    cls: str  # one of VERDICT_CLASSES
    step: int | None
    direction: str | None = None
    type: str | None = None
    evidence: tuple[str, ...] = ()
    action: str = ""
    module: str | None = None  # the module path the op ran in (torch dumps), or the rewritten module
    departure_only: bool = False  # named from how far its statistics depart, for tensors to confirm (not in JSON)

    def to_dict(self) -> dict:
        return {"op": self.op, "class": self.cls, "step": self.step, "direction": self.direction,
                "type": self.type, "module": self.module, "evidence": list(self.evidence), "action": self.action}


@dataclass
class Diagnosis:
    """Everything `ac` and `diagnose` print: overflow, fusion, comparison notes, verdict."""

    verdict: Verdict
    overflow: OverflowReport | None = None
    fusion: FusionReport | None = None
    attributions: list[Attribution] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # precision-mode and cast notes
    flagged: int = 0  # ops at or below the cosine threshold
    first_flagged: str | None = None
    first_module: str | None = None  # the first module whose output diverges beyond its inputs
    precheck: Any = None  # PrecheckResult: the two runs' settings, the first section of ac
    outcome: Any = None  # Outcome: the loss and held-out metric each run ended with
