"""What the shell's own commands return: plain data, rendered elsewhere.

`of`, `fu`, `rerun` and `ac` return the analysis dataclasses
(`precision_tool.analysis.results`) and `vcs` the comparator's selection;
the commands that only look at dumps (`ls`, `ni`, `pt`, `cp`, `help`) return
these. `precision_tool.render.shell_views` turns each into a rich renderable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



@dataclass(frozen=True)
class TypeCount:
    """How many ops of one type a step ran (`ls` with no filter)."""

    type: str
    count: int


@dataclass
class OpListing:
    """`ls`: the ops of one step that match the filters, or counts per type."""

    source: str  # "target: run.h5"
    step: int | None
    filters: dict[str, str]
    ops: list = field(default_factory=list)  # OpRecord, in execution order
    counts: list[TypeCount] = field(default_factory=list)  # filled when no filter is given


@dataclass(frozen=True)
class Candidates:
    """An op name matched more than one op: the user picks one."""

    query: str
    names: tuple[str, ...]
    total: int  # matches before truncation


@dataclass(frozen=True)
class TensorMetric:
    """One tensor of an op scored against its golden counterpart."""

    slot: str
    golden: str  # "golden_op:output_0", the counterpart it was scored against
    cosine: float | None
    relative_error: float | None  # ||x - g|| / ||g||
    max_abs_error: float | None
    note: str = ""  # why a metric is missing


@dataclass
class SlotView:
    """One tensor slot of an op as each loaded side recorded it, with its metric."""

    slot: str
    records: dict[str, Any]  # role -> TensorRecord of the counterpart on that side
    counterparts: dict[str, str]  # role -> "op:slot" it was matched to, where it differs
    metric: TensorMetric | None = None


@dataclass
class OpInfo:
    """`ni`: one op on every loaded side, with its metrics against golden."""

    role: str  # the side the op was looked up on
    op: Any  # OpRecord
    sides: dict[str, Any]  # role -> OpRecord of the same (or original) op and step on that side
    slots: list[SlotView] = field(default_factory=list)
    metrics_source: str = ""  # "comparison" when taken from the loaded CompareReport, else "tensors"
    arguments: dict[str, Any] = field(default_factory=dict)  # path -> number, string or flag the op was called with
    argument_changes: list[str] | None = None  # those that differ from golden's call (None: no golden call)


@dataclass
class TensorView:
    """`pt`: a tensor's statistics and its first values."""

    label: str  # "target:fc1/MatMul:output_0@0"
    dtype: str
    shape: tuple[int, ...]
    stats: Any  # TensorStats
    values: Any  # np.ndarray of the first values (flat); None in stats-only dumps
    shown: int
    total: int


@dataclass(frozen=True)
class Mismatch:
    """One element where the two sides of `cp` are not close."""

    index: tuple[int, ...]
    left: float
    right: float
    diff: float  # left - right


@dataclass
class TensorComparison:
    """`cp`: two tensors compared element by element (right is the reference)."""

    left: str
    right: str
    left_shape: tuple[int, ...]
    right_shape: tuple[int, ...]
    atol: float
    rtol: float
    count: int = 0
    allclose: bool | None = None
    cosine: float | None = None
    error_ratio: float | None = None  # mismatching elements / count
    mismatched: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)  # the first `-p`
    notes: list[str] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return self.allclose is not None


@dataclass
class AutoCheck:
    """`ac`: the diagnosis plus, when a comparison is loaded, its flagged ops."""

    diagnosis: Any  # Diagnosis
    flagged: Comparison | None  # ac -c: the flagged ops, as vcs lists them
    overflow_limit: int | None
    show_all: bool = False  # every attribution row, not only those up to the culprit
    full: Any = None  # the Diagnosis before its overflow entries were cut to -l (its JSON is of this one)


@dataclass(frozen=True)
class CommandHelp:
    """One row of `help`."""

    name: str
    summary: str


@dataclass
class HelpIndex:
    """`help` with no argument: every command and the line grammar."""

    commands: list[CommandHelp]
    notes: list[str]


@dataclass(frozen=True)
class HelpText:
    """`help CMD`: the usage text generated from the command's option spec."""

    name: str
    text: str


@dataclass(frozen=True)
class InspectResult:
    """`inspect` in the shell: one loaded dump's summary (its JSON form is a `JsonDocument`)."""

    role: str
    summary: Any  # DumpSummary


@dataclass
class Comparison:
    """`compare` / `vcs`: the comparison and the ops it lists (flagged ones, or every one with --all)."""

    report: Any  # CompareReport
    rows: list  # the listed OpComparisons, in execution order
    threshold: float
    limit: int | None
    total: int = 0  # ops flagged at this threshold, before the limit
    show_all: bool = False
    zoom: Any = None  # a ZoomRegion when a side holds statistics only and an op diverges (analysis.zoom)


@dataclass(frozen=True)
class BaselineSaved:
    """`baseline`: the baseline file written."""

    tensors: int
    ops: int
    output: str


@dataclass(frozen=True)
class TextDocument:
    """A command's result as the text its batch twin prints (``--format json`` or ``csv``): lines printed whole."""

    text: str


@dataclass(frozen=True)
class Delivered:
    """What a command's delivery left to show: text (JSON, CSV), a result or a line to draw, and the files written."""

    shown: Any = None  # a TextDocument, a result drawn by its type, or None
    wrote: tuple[str, ...] = ()  # files written (-o, --plot, --junit), in order


@dataclass(frozen=True)
class JsonDocument:
    """A command's result as the JSON its batch twin prints (``--format json``)."""

    document: dict


# -- runs of several ranks (a directory of rank dumps for golden and for target) ---------------------------------
@dataclass(frozen=True)
class RankRow:
    """One rank of a run pair: what its comparison (or check) found."""

    rank: int
    target: str  # the rank's target dump
    ops: int  # ops compared (check: tensors judged)
    flagged: int  # ops flagged (check: tensors failing)
    first_step: int | None = None  # the first flagged op (check: failing), in execution order
    first_exec_index: int | None = None
    first_op: str = ""
    first_direction: str = ""
    min_cosine: float | None = None  # the lowest output cosine of the rank (NaN ignored)

    @property
    def diverges(self) -> bool:
        return self.flagged > 0


@dataclass
class RunComparison:
    """`compare GOLDEN_RUN TARGET_RUN`: every rank paired with its golden rank, and which diverges first."""

    golden: str
    target: str
    world_size: int
    threshold: float
    ranks: list  # RankRow, rank order
    first_rank: int | None  # the rank whose first flagged op comes earliest (step, exec index); None: no rank
    detail: Any = None  # the `Comparison` of ``first_rank`` (rank 0 when none diverges)
    detail_rank: int = 0


@dataclass
class RunCheck:
    """`check GOLDEN_RUN TARGET_RUN`: the CI gate per rank; falsy when a tensor of any rank fails."""

    golden: str
    target: str
    world_size: int
    ranks: list  # RankRow, rank order (flagged = failing tensors)
    first_rank: int | None
    results: list  # CheckResult per rank

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    def __bool__(self) -> bool:
        return self.passed

    def raise_if_failed(self) -> None:
        """RegressionFound (exit status 1) naming the rank that fails first, when a tensor of any rank failed."""
        if self.first_rank is not None:
            from precision_tool.compare.check import RegressionFound

            row = self.ranks[self.first_rank]
            failing = sum(1 for r in self.ranks if r.flagged)
            raise RegressionFound(
                f"check failed on {failing} of {self.world_size} ranks; rank {row.rank} fails first: step "
                f"{row.first_step} #{row.first_exec_index} {row.first_op} ({row.first_direction})")


@dataclass
class RunDiagnosis:
    """`diagnose GOLDEN_RUN TARGET_RUN`: the per-rank comparison, and the diagnosis of the rank diverging first."""

    golden: str
    target: str
    world_size: int
    threshold: float
    ranks: list  # RankRow
    first_rank: int | None
    diagnosed_rank: int
    check: Any  # AutoCheck of ``diagnosed_rank``
