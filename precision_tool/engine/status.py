"""The float-status flag: one sticky, global overflow bit, as on the NPU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpRef:
    """Where an op executed: enough to find it again in a dump."""

    step: int
    name: str
    type: str
    direction: str
    exec_index: int


class FloatStatus:
    """A sticky overflow flag that remembers which op raised it first.

    Any op whose IEEE result would have been non-finite raises it, also when
    saturation hid the inf or NaN. It stays raised until `clear` is called,
    the way ``NPUClearFloatStatus`` resets the register.
    """

    __slots__ = ("raised", "first", "count")

    def __init__(self) -> None:
        self.raised = False
        self.first: OpRef | None = None
        self.count = 0  # op executions that raised it since the last clear

    def raise_(self, op: OpRef | None) -> None:
        """Record an overflow by ``op``; the first one since `clear` is kept."""
        if not self.raised:
            self.raised = True
            self.first = op
        self.count += 1

    def clear(self) -> None:
        """Reset the flag, as NPUClearFloatStatus does."""
        self.raised = False
        self.first = None
        self.count = 0

    def __bool__(self) -> bool:
        return self.raised

    def __repr__(self) -> str:
        where = f", first={self.first.name!r}" if self.first else ""
        return f"FloatStatus(raised={self.raised}{where})"
