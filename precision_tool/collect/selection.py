"""Which steps and ops a collection records: ``--dump-steps``, ``--ops``, ``--modules``, ``--op-types``,
``--no-backward``; the same `Selection` filters `precision_tool.torch.dump`.

An op is picked by name when it matches an ``--ops`` glob or lies in a module matching a ``--modules`` glob
(either one: they add up); ``--op-types``, ``--no-backward`` and the steps then narrow what was picked.
"""

from __future__ import annotations

import fnmatch
import numbers
from dataclasses import dataclass

from precision_tool.engine.hooks import BACKWARD, OpEvent
from precision_tool.errors import ConfigError

STEPS_FORM = "step numbers and ranges, e.g. 0,5-7"
MAX_SELECTED_STEPS = 1_000_000  # a selection is a set of step numbers: "0-100000000000" asked for 800 GB


def parse_steps(spec) -> frozenset[int] | None:
    """``"0,5-7"`` -> {0, 5, 6, 7}; None, "" and "all" -> None (every step); a whole number or an iterable of them
    (``3``, ``[0, 5]``, ``range(4)``) -> those steps. ConfigError when malformed (``1.5``, ``True``)."""
    if spec is None:
        return None
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):  # one step
        spec = (spec,)
    if not isinstance(spec, str):
        try:
            items = list(spec)
        except TypeError:
            items = None
        if items is None or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in items):
            raise ConfigError(f"bad step selection {spec!r}; expected whole step numbers, or {STEPS_FORM}")
        steps = frozenset(int(s) for s in items)
        if any(s < 0 for s in steps):
            raise ConfigError(f"bad step selection {sorted(steps)}: steps are numbered from 0")
        return steps
    text = spec.strip()
    if text in ("", "all"):
        return None
    steps: set[int] = set()
    for part in text.split(","):
        steps.update(_parse_part(part.strip(), spec, MAX_SELECTED_STEPS - len(steps)))
    return frozenset(steps)


def _parse_part(part: str, spec: str, room: int) -> range:
    first, dash, last = part.partition("-")
    try:
        start = int(first)
        stop = int(last) if dash else start
    except ValueError:
        raise ConfigError(f"bad step selection {spec!r}: {part!r} is not a step or a range; "
                          f"expected {STEPS_FORM}") from None
    if start < 0 or stop < start:
        raise ConfigError(f"bad step selection {spec!r}: {part!r} is not an increasing range of steps >= 0")
    if stop - start + 1 > room:
        raise ConfigError(f"bad step selection {spec[:60]!r}: names more than {MAX_SELECTED_STEPS:,} steps; "
                          "leave the option out to take every step")
    return range(start, stop + 1)


def parse_op_types(spec) -> frozenset[str] | None:
    """``"MatMul,Softmax"`` (or a list) -> a set of op types; None or "" -> every type."""
    if spec is None:
        return None
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    types = frozenset(str(t).strip() for t in items if str(t).strip())
    return types or None


def module_paths(name: str) -> list[str]:
    """The module paths an op name lies in: ``block1/conv1/Conv2D`` -> ``block1``, ``block1/conv1``."""
    parts = name.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def in_modules(names, patterns) -> bool:
    """Whether one of ``names`` (an op's name, and a fused op's original names) lies in a module matching one
    of ``patterns``, or is itself such a module (a module record)."""
    return any(fnmatch.fnmatchcase(path, p) for n in names for path in (*module_paths(n), n) for p in patterns)


@dataclass(frozen=True)
class Selection:
    """The steps and ops to record; None means all."""

    steps: frozenset[int] | None = None
    ops: tuple[str, ...] = ()  # fnmatch patterns on op names (a fused op's original names match too)
    modules: tuple[str, ...] = ()  # fnmatch patterns on the module paths an op lies in (see `module_paths`)
    op_types: frozenset[str] | None = None  # a fused op matches through its original types too
    backward: bool = True

    @classmethod
    def build(cls, steps=None, ops=None, op_types=None, backward: bool = True, modules=None) -> "Selection":
        """A Selection from user values: step specs, one pattern or several, a type list."""
        return cls(steps=parse_steps(steps), ops=_patterns(ops), modules=_patterns(modules),
                   op_types=parse_op_types(op_types), backward=bool(backward))

    @property
    def everything(self) -> bool:
        return self.steps is None and self.every_op

    @property
    def every_op(self) -> bool:
        """No op filter: every op of a selected step is recorded."""
        return not self.ops and not self.modules and self.op_types is None and self.backward

    def wants_step(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    def wants_op(self, event: OpEvent) -> bool:
        """Whether ``event``'s op is selected (step aside)."""
        fusion = event.fusion
        return self.wants(event.name, event.type, event.direction,
                          fusion.original_names if fusion else (), fusion.original_types if fusion else ())

    def wants(self, name: str, op_type: str, direction: str, original_names=(), original_types=()) -> bool:
        """Whether the op ``name`` of ``op_type`` is selected (step aside); a fused op also by what it replaced."""
        if not self.backward and direction == BACKWARD:
            return False
        if self.op_types is not None and not any(t in self.op_types for t in (op_type, *original_types)):
            return False
        if not (self.ops or self.modules):
            return True
        names = (name, *original_names)
        return any(fnmatch.fnmatchcase(n, p) for n in names for p in self.ops) or \
            bool(self.modules) and in_modules(names, self.modules)

    def describe(self) -> dict:
        """Plain metadata for the dump."""
        return {"steps": sorted(self.steps) if self.steps is not None else None, "ops": list(self.ops),
                "modules": list(self.modules),
                "op_types": sorted(self.op_types) if self.op_types is not None else None,
                "backward": self.backward}


def narrows_ops(metadata: dict) -> bool:
    """Whether a dump with this metadata records only some ops of its steps (``ops``, ``modules`` or
    ``op_types`` given: a zoom region): an op it lacks may have run, and written what a recorded op reads."""
    selection = metadata.get("selection")
    return isinstance(selection, dict) and bool(selection.get("ops") or selection.get("modules")
                                                or selection.get("op_types") is not None)


def starts_late(metadata: dict) -> bool:
    """Whether a dump with this metadata records from a later step than its run's first (a zoom region's steps):
    the runs trained before it, and its first step's parameters are no longer the same in both."""
    steps = metadata.get("steps_filter")
    return isinstance(steps, list) and bool(steps) and min(steps) > 0


def _patterns(value) -> tuple[str, ...]:
    patterns = (value,) if isinstance(value, str) else tuple(value or ())
    return tuple(p for p in patterns if p)
