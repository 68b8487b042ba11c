"""Which steps and ops a collection records: ``--dump-steps``, ``--ops``, ``--op-types``, ``--no-backward``."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from precision_tool.engine.hooks import BACKWARD, OpEvent
from precision_tool.errors import ConfigError

STEPS_FORM = "step numbers and ranges, e.g. 0,5-7"


def parse_steps(spec) -> frozenset[int] | None:
    """``"0,5-7"`` -> {0, 5, 6, 7}; None, "" and "all" -> None (every step). ConfigError when malformed."""
    if spec is None:
        return None
    if not isinstance(spec, str):
        try:
            steps = frozenset(int(s) for s in spec)
        except (TypeError, ValueError):
            raise ConfigError(f"bad step selection {spec!r}; expected {STEPS_FORM}") from None
        if any(s < 0 for s in steps):
            raise ConfigError(f"bad step selection {sorted(steps)}: steps are numbered from 0")
        return steps
    text = spec.strip()
    if text in ("", "all"):
        return None
    steps: set[int] = set()
    for part in text.split(","):
        steps.update(_parse_part(part.strip(), spec))
    return frozenset(steps)


def _parse_part(part: str, spec: str) -> range:
    first, dash, last = part.partition("-")
    try:
        start = int(first)
        stop = int(last) if dash else start
    except ValueError:
        raise ConfigError(f"bad step selection {spec!r}: {part!r} is not a step or a range; "
                          f"expected {STEPS_FORM}") from None
    if start < 0 or stop < start:
        raise ConfigError(f"bad step selection {spec!r}: {part!r} is not an increasing range of steps >= 0")
    return range(start, stop + 1)


def parse_op_types(spec) -> frozenset[str] | None:
    """``"MatMul,Softmax"`` (or a list) -> a set of op types; None or "" -> every type."""
    if spec is None:
        return None
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    types = frozenset(str(t).strip() for t in items if str(t).strip())
    return types or None


@dataclass(frozen=True)
class Selection:
    """The steps and ops to record; None means all."""

    steps: frozenset[int] | None = None
    ops: tuple[str, ...] = ()  # fnmatch patterns on op names (a fused op's original names match too)
    op_types: frozenset[str] | None = None  # a fused op matches through its original types too
    backward: bool = True

    @classmethod
    def build(cls, steps=None, ops=None, op_types=None, backward: bool = True) -> "Selection":
        """A Selection from user values: step specs, one pattern or several, a type list."""
        patterns = (ops,) if isinstance(ops, str) else tuple(ops or ())
        return cls(parse_steps(steps), tuple(p for p in patterns if p), parse_op_types(op_types), bool(backward))

    @property
    def everything(self) -> bool:
        return self.steps is None and not self.ops and self.op_types is None and self.backward

    def wants_step(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    def wants_op(self, event: OpEvent) -> bool:
        """Whether ``event``'s op is selected (step aside)."""
        if not self.backward and event.direction == BACKWARD:
            return False
        fusion = event.fusion
        if self.op_types is not None:
            types = (event.type, *fusion.original_types) if fusion else (event.type,)
            if not any(t in self.op_types for t in types):
                return False
        if self.ops:
            names = (event.name, *fusion.original_names) if fusion else (event.name,)
            if not any(fnmatch.fnmatchcase(n, p) for n in names for p in self.ops):
                return False
        return True

    def describe(self) -> dict:
        """Plain metadata for the dump."""
        return {"steps": sorted(self.steps) if self.steps is not None else None, "ops": list(self.ops),
                "op_types": sorted(self.op_types) if self.op_types is not None else None,
                "backward": self.backward}
