"""Hooks around every op execution: forward, backward and optimizer update."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from precision_tool.engine.graph import FusionInfo
from precision_tool.engine.status import OpRef

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
DIRECTIONS = (FORWARD, BACKWARD, OPTIMIZER)


@dataclass(slots=True)  # one per op of every step while a hook listens: slots make it cheaper
class OpEvent:
    """One op execution, as a hook sees it.

    ``inputs`` are what the kernel computed from (already cast to its compute
    format); in backward they are the incoming gradients and ``outputs`` the
    gradients it returns, one per forward input (None where there is none).
    Arrays are float32 (float64 on a float64 golden device) holding values
    exact in ``input_dtypes`` / ``output_dtypes``. ``overflow`` tells whether
    this op raised the float status; ``status`` is the flag after the op.
    """

    step: int
    name: str
    type: str
    exec_index: int
    direction: str
    inputs: list[np.ndarray | None]
    input_dtypes: list[str]
    compute_dtype: str
    fusion: FusionInfo | None = None
    attrs: dict[str, Any] = field(default_factory=dict)  # the op's attributes, for replay
    outputs: list[np.ndarray | None] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    overflow: bool = False
    status: bool = False
    status_first: OpRef | None = None

    @property
    def ref(self) -> OpRef:
        return OpRef(self.step, self.name, self.type, self.direction, self.exec_index)


@dataclass
class StepResult:
    """What a training step reports when it ends."""

    step: int
    loss: float
    overflow: bool
    loss_scale: float
    skipped: bool = False  # the optimizer update was skipped (overflow)
    precision_mode: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Hook(Protocol):
    """Anything with some of these methods can be registered; all are optional.

    A hook that sets ``only_overflowing_ops = True`` (and has no ``before_op``)
    is shown only the ops that raise the float status; while all hooks that
    look at ops are such, the other ops build no event at all.
    """

    def on_run_begin(self, metadata: dict) -> None: ...
    def on_step_begin(self, step: int) -> None: ...
    def before_op(self, event: OpEvent) -> None: ...
    def after_op(self, event: OpEvent) -> None: ...
    def on_step_end(self, result: StepResult) -> None: ...
    def on_run_end(self, summary: dict) -> None: ...


class Interruptible:
    """How deep the session is in work that a Ctrl-C (or SIGTERM) may stop at once: an evaluation on held-out
    batches writes nothing and reaches no step boundary, where collect's handler otherwise waits (`--eval-steps`
    of two billion batches never came to one)."""

    depth = 0

    def __enter__(self) -> None:
        Interruptible.depth += 1

    def __exit__(self, *exc) -> None:
        Interruptible.depth -= 1


_METHODS = ("on_run_begin", "on_step_begin", "before_op", "after_op", "on_step_end", "on_run_end")


class HookList:
    """The registered hooks; falsy when empty, so callers can skip building events."""

    def __init__(self, hooks=()):
        self._hooks: list = []
        self.every_op = False  # whether some hook sees every op (else only overflowing ones are built)
        self._before_op: list = []
        self._after_op: list = []
        self._calls: dict[str, list] = {name: [] for name in _METHODS}
        for hook in hooks:
            self.add(hook)

    def add(self, hook) -> None:
        self._hooks.append(hook)
        self._rebuild()

    def remove(self, hook) -> None:
        self._hooks.remove(hook)
        self._rebuild()

    def _rebuild(self) -> None:
        for name in _METHODS:
            self._calls[name] = [getattr(h, name) for h in self._hooks if hasattr(h, name)]
        self._before_op, self._after_op = self._calls["before_op"], self._calls["after_op"]  # every op: no lookup
        # A hook whose ``only_overflowing_ops`` is true sees only the ops that raise the float status:
        # while every hook that sees ops is such, the executor builds events for those ops alone.
        self.every_op = any(hasattr(h, "before_op") or (hasattr(h, "after_op")
                                                          and not getattr(h, "only_overflowing_ops", False))
                            for h in self._hooks)

    @property
    def sees_before_op(self) -> bool:
        """Whether some hook has ``before_op``."""
        return bool(self._before_op)

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def __len__(self) -> int:
        return len(self._hooks)

    def on_run_begin(self, metadata: dict) -> None:
        for call in self._calls["on_run_begin"]:
            call(metadata)

    def on_step_begin(self, step: int) -> None:
        for call in self._calls["on_step_begin"]:
            call(step)

    def before_op(self, event: OpEvent) -> None:
        for call in self._before_op:
            call(event)

    def after_op(self, event: OpEvent) -> None:
        for call in self._after_op:
            call(event)

    def on_step_end(self, result: StepResult) -> None:
        for call in self._calls["on_step_end"]:
            call(result)

    def on_run_end(self, summary: dict) -> None:
        for call in self._calls["on_run_end"]:
            call(summary)
