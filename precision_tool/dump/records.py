"""The records a dump holds, as plain dataclasses shared by writer and readers.

Everything downstream (compare, analysis, the shell, the torch front end)
reads dumps through these types and `precision_tool.dump.reader.open_dump`,
never through h5py directly.

The per-op and per-tensor classes here (and compare's rows) are immutable by
convention, not ``frozen``: a frozen dataclass's ``__init__`` sets each field
through ``object.__setattr__``, five times the cost of a plain one, and a
comparison builds about ten such objects per tensor pair, tens of thousands
a dump. Nothing assigns to them after construction; `dataclasses.replace`
makes changed copies; they hash by value (``unsafe_hash``) as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from precision_tool.errors import NotFoundError

SCHEMA_VERSION = 2
MODULE_TYPE_PREFIX = "module."  # the type of a module-boundary record: module.<class name>


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class TensorStats:
    """Statistics of one tensor, computed in float64 accumulators.

    ``saturated`` counts values whose magnitude equals the largest finite
    value of the tensor's dtype (65504 for float16): the fingerprint of
    saturation-mode overflow. ``min``/``max``/``mean``/``std``/``norm`` are
    over the finite values; they are NaN when there are none.
    """

    count: int
    min: float
    max: float
    mean: float
    std: float
    norm: float
    nan: int = 0
    inf: int = 0
    saturated: int = 0

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    @classmethod
    def empty(cls) -> "TensorStats":
        nan = math.nan
        return cls(0, nan, nan, nan, nan, 0.0)


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class TensorRecord:
    """One tensor slot of one op execution.

    ``slot`` is ``input_0``, ``input_1``, ... or ``output_0``, ...; in
    backward, inputs are the incoming gradients and outputs the gradients
    with respect to the forward inputs. ``has_data`` is false in stats mode.
    """

    slot: str
    dtype: str  # float16, bfloat16, float32, float64, int64, ...
    shape: tuple[int, ...]
    stats: TensorStats
    has_data: bool = True
    # its row in the step's ``index`` table, when read from a dump file (-1 otherwise): where the reader
    # finds its values without a lookup; not part of what the record says, so not compared
    index_row: int = field(default=-1, compare=False, repr=False)

    @property
    def kind(self) -> str:
        return self.slot.split("_", 1)[0]

    @property
    def index(self) -> int:
        return int(self.slot.rsplit("_", 1)[1])


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class OpRecord:
    """One op execution in one step, with its tensors.

    For a fused op, ``pass_name`` and ``original_names``/``original_types``
    say what it replaced; ``output_origins[i]`` is the (original op name,
    output index) that output ``i`` stands for, and ``input_origins[i]`` the
    (original op name, input index) that consumed input ``i`` (in backward,
    output gradient ``i`` stands for that original op's input gradient).
    """

    step: int
    exec_index: int
    name: str
    type: str
    direction: str  # forward, backward or optimizer
    compute_dtype: str
    overflow: bool
    tensors: tuple[TensorRecord, ...] = ()
    pass_name: str = ""
    original_names: tuple[str, ...] = ()
    original_types: tuple[str, ...] = ()
    output_origins: tuple[tuple[str, int], ...] = ()
    input_origins: tuple[tuple[str, int], ...] = ()
    # the inputs already held inf/NaN: the op propagated the overflow rather than caused it
    inherited_nonfinite: bool = False
    attrs: dict = field(default_factory=dict, hash=False, compare=False)  # op attributes, for replay

    @property
    def fused(self) -> bool:
        return bool(self.pass_name)

    @property
    def is_module(self) -> bool:
        """A module boundary (its forward's inputs and outputs), not an op: the torch capture records these."""
        return self.type.startswith(MODULE_TYPE_PREFIX)

    @property
    def inputs(self) -> tuple[TensorRecord, ...]:
        return tuple(t for t in self.tensors if t.kind == "input")

    @property
    def outputs(self) -> tuple[TensorRecord, ...]:
        return tuple(t for t in self.tensors if t.kind == "output")

    def tensor(self, slot: str) -> TensorRecord:
        for record in self.tensors:
            if record.slot == slot:
                return record
        raise NotFoundError(f"{self.name} has no tensor {slot}")


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one training step reported."""

    step: int
    loss: float
    loss_scale: float
    overflow: bool
    skipped: bool = False
    precision_mode: str = ""
    ops_recorded: int = 0
    cut_short: bool = False  # the run failed inside this step: its ops up to the failure only (torch dumps)


@dataclass
class DumpSummary:
    """What `precision-tool inspect` shows; also its JSON form."""

    path: str
    schema_version: int
    complete: bool
    steps_complete: int
    metadata: dict
    ops: int
    tensors: int
    overflow_ops: int
    overflow_steps: list[int]
    loss: list[float]
    loss_scale: list[float]
    accelerate_switch_step: int | None
    size_bytes: int
    first_overflows: list[OpRecord] = field(default_factory=list)
    step_numbers: list[int] = field(default_factory=list)  # the step of each loss / loss_scale entry
    cut_short: list[int] = field(default_factory=list)  # steps the run failed inside (`StepRecord.cut_short`)
