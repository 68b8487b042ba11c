"""Boost-aware verdicts: a divergence that starts where a boost algorithm changed the run is not a kernel fault.

A boosted run records what each algorithm changed (dump metadata
``boost.changes``, `precision_tool.session.boost`): ops it removed or
replaced (names golden still runs), the name prefix of the ops it adds
(``boost/<algorithm>/``), and for grad_freeze the steps whose update leaves
parameter groups out. When golden and target differ in boost, every change
is placed on the target's execution order (step, then exec index; a removed
op sits just before the next golden op the target also runs), and the
earliest is where the runs start to differ by construction. Unless the scan
found a culprit before it, the verdict is **boost**, naming that algorithm
and the op; the other changes follow as evidence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from precision_tool.analysis.results import Verdict

_PHASES = {"forward": 0, "backward": 1, "optimizer": 2}


@dataclass(frozen=True)
class BoostChange:
    """One algorithm's change to a run, as its dump records it."""

    algorithm: str
    kind: str  # removed, replaced, added or frozen
    what: str
    ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    prefix: str = ""
    sequence: tuple[int, ...] = ()  # grad_freeze: the freeze index of each step
    groups: tuple[int, ...] = ()  # grad_freeze: parameters trained at each index


@dataclass(frozen=True)
class Placed:
    """A change placed on the target's execution order: where it first takes effect."""

    change: BoostChange
    step: int
    position: float  # the target's exec index (a removed op: just before the next op both runs have)
    op: str
    op_type: str
    direction: str


def boost_changes(dump) -> list[BoostChange]:
    """The changes recorded in ``dump``'s metadata (none for a run without boost)."""
    boost = dump.metadata.get("boost")
    if not isinstance(boost, dict):
        return []
    changes = []
    for c in boost.get("changes") or ():
        if isinstance(c, dict):
            changes.append(BoostChange(str(c.get("algorithm")), str(c.get("kind")), str(c.get("what", "")),
                                       tuple(c.get("ops", ())), tuple(c.get("modules", ())), str(c.get("prefix", "")),
                                       tuple(c.get("sequence", ())), tuple(c.get("groups", ()))))
    return changes


def _setting(dump) -> str:
    meta = dump.metadata
    return json.dumps([meta.get("boost_level"), meta.get("boost")], sort_keys=True, default=str)


def _describe(dump) -> str:
    boost = dump.metadata.get("boost")
    if not isinstance(boost, dict):
        return "no boost"
    active = ", ".join(boost.get("active") or ()) or "nothing"
    return f"boost {dump.metadata.get('boost_level') or 'O0'} (active: {active})"


def place_changes(golden, target, step: int) -> list[Placed]:
    """Every change of ``target`` (or, for a boosted golden, of golden) placed from ``step`` on, earliest first."""
    changes = boost_changes(target) or boost_changes(golden)
    golden_ops, target_ops = golden.ops(step=step), target.ops(step=step)
    where = {}
    for record in target_ops:
        for name in (record.name, *record.original_names):
            where.setdefault((record.direction, name), record.exec_index)
    placed = []
    for change in changes:
        found = _place(change, step, golden_ops, target_ops, where, target)
        if found is not None:
            placed.append(found)
    return sorted(placed, key=lambda p: (p.step, p.position))


def _place(change, step, golden_ops, target_ops, where, target) -> Placed | None:
    if change.kind in ("removed", "replaced"):
        for i, record in enumerate(golden_ops):
            if record.name in change.ops:
                later = (where.get((r.direction, r.name)) for r in golden_ops[i + 1:])
                position = next((p for p in later if p is not None), len(target_ops)) - 0.5
                return Placed(change, step, position, record.name, record.type, record.direction)
        return None
    if change.kind == "frozen":
        total = change.groups[0] if change.groups else 0
        first = next((s for s, index in enumerate(change.sequence) if s >= step and index > 0
                      and (not change.groups or change.groups[index] < total)), None)
        if first is None:
            return None
        records = [r for r in target.ops(step=first) if r.name.startswith(change.prefix)]
        position = records[0].exec_index if records else float("inf")
        return Placed(change, first, position, records[0].name if records else change.prefix.rstrip("/"),
                      records[0].type if records else "", "optimizer")
    if change.prefix:
        added = [r for r in target_ops if r.name.startswith(change.prefix)]
        if added:
            return Placed(change, step, added[0].exec_index, added[0].name, added[0].type, added[0].direction)
    return None


def _culprit_position(target, verdict: Verdict) -> tuple[int, float] | None:
    if verdict is None or verdict.cls == "none" or verdict.op is None or verdict.step is None:
        return None
    try:
        return verdict.step, target.op(verdict.step, verdict.op, verdict.direction or "forward").exec_index
    except KeyError:
        return verdict.step, float("inf")


def _evidence(placed: Placed) -> str:
    c = placed.change
    if c.kind == "removed":
        return (f"{c.algorithm} removed {', '.join(c.ops)} ({c.what}): golden runs them, the target does not, "
                f"from step {placed.step}")
    if c.kind == "replaced":
        return (f"{c.algorithm}: {c.what}; golden's {', '.join(c.ops)} became {c.prefix}... "
                f"from step {placed.step}")
    if c.kind == "frozen":
        index = c.sequence[placed.step] if placed.step < len(c.sequence) else None
        trained = c.groups[index] if index is not None and index < len(c.groups) else None
        total = c.groups[0] if c.groups else None
        share = f"only {trained} of {total} parameters updated" if trained is not None and total else "groups frozen"
        return f"grad_freeze froze parameter groups at step {placed.step} (freeze index {index}: {share}): {c.what}"
    return f"{c.algorithm} adds {placed.op} at step {placed.step}: {c.what}"


def _first_common_step(golden, target) -> int | None:
    golden_steps = {s.step for s in golden.steps()}
    return min((s.step for s in target.steps() if s.step in golden_steps), default=None)


def boost_start(golden, target) -> int | None:
    """The step where the first boost change takes effect, when the runs differ in boost; else None."""
    if _setting(golden) == _setting(target):
        return None
    first = _first_common_step(golden, target)
    placed = place_changes(golden, target, first) if first is not None else []
    return placed[0].step if placed else None


def explain_boost(golden, target, verdict: Verdict, first_flagged: str | None) -> tuple[Verdict, list[str]]:
    """The verdict, replaced by a **boost** one when the runs' divergence starts at a boost change."""
    if _setting(golden) == _setting(target):
        return verdict, []
    first_step = _first_common_step(golden, target)
    if first_step is None:
        return verdict, []
    placed = place_changes(golden, target, first_step)
    sides = f"golden runs {_describe(golden)}, the target {_describe(target)}"
    if not placed:
        return verdict, [f"{sides}; no recorded boost change takes effect in the compared steps"]
    first = placed[0]
    culprit = _culprit_position(target, verdict)
    # an op a boost change added (named under its prefix) is that change at work, not a culprit before it
    added = verdict.op is not None and any(p.change.prefix and verdict.op.startswith(p.change.prefix) for p in placed)
    if culprit is not None and not added and culprit < (first.step, first.position):
        return verdict, [f"{sides}; the culprit comes before the first boost change ({first.change.algorithm} "
                         f"at {first.op}, step {first.step})"]
    if first_flagged is None and verdict.cls == "none":
        return verdict, [f"{sides}; the outputs stay within the cosine threshold despite the boost changes"]
    notes = []
    if verdict.cls != "none":
        notes.append(f"the scan's {verdict.cls} at {verdict.op} (step {verdict.step}) comes after the boost change "
                     f"{first.change.algorithm} at {first.op}: judge it against a golden run with the same boost "
                     "config")
    evidence = (f"{sides}",
                f"the runs first differ where {first.change.algorithm} changed the run: {_evidence(first)}",
                *(f"then {_evidence(p)}" for p in placed[1:]),
                *((f"first op at or below the cosine threshold: {first_flagged}",) if first_flagged else ()))
    action = (f"expected from boost, not a kernel fault: compare against a golden run with the same boost config "
              f"to judge the numerics, or switch {first.change.algorithm} off (boost mode manual) to measure its "
              "effect")
    module = first.change.modules[0] if first.change.modules else first.change.prefix.rstrip("/") or None
    return Verdict(first.op, "boost", first.step, first.direction, first.op_type, evidence, action,
                   module=module), notes
