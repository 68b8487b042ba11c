"""`ls` and `ni`: list the ops of a dump and show one op on every side."""

from __future__ import annotations

import difflib

import numpy as np

from precision_tool.errors import PrecisionToolError
from precision_tool.compare.matching import _fused_origin as fused_origin
from precision_tool.compare.metrics import compare_arrays as pair_metrics
from precision_tool.commands.results import Candidates, OpInfo, OpListing, SlotView, TensorMetric, TypeCount

MAX_CANDIDATES = 20
# Sides whose op names are the unfused originals: a fused target op is matched through its origins there.
UNFUSED_SIDES = ("golden", "fusion-off")


class OpNotFound(PrecisionToolError):
    """No op of the dump matches the name the user typed."""


def find_op(session, role: str, query: str) -> str | Candidates:
    """The exact name, else the one op whose name holds ``query``; else the candidates."""
    index = session.index(role)
    if index.has(query):
        return query
    hits = [n for n in index.names if query in n] or [n for n in index.names if query.lower() in n.lower()]
    if len(hits) == 1:
        return hits[0]
    if hits:
        return Candidates(query, tuple(hits[:MAX_CANDIDATES]), len(hits))
    close = difflib.get_close_matches(query, index.names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(n) for n in close)}?" if close else ""
    raise OpNotFound(f"no op in the {role} dump matches {query!r}{hint}")


def pick_direction(session, role: str, name: str, direction: str | None) -> str:
    """``direction``, else forward, else the first direction ``name`` was recorded in."""
    if direction is not None:
        return direction
    recorded = session.index(role).steps
    for candidate in ("forward", "backward", "optimizer"):
        if (name, candidate) in recorded:
            return candidate
    return "forward"


def pick_step(session, role: str, name: str, direction: str, step: int | None) -> int:
    """``step``, or the first step that recorded ``name`` in ``direction``."""
    index = session.index(role)
    steps = index.steps.get((name, direction), [])
    if not steps:
        directions = sorted(d for (n, d) in index.steps if n == name)
        raise OpNotFound(f"{name!r} has no {direction} record in the {role} dump"
                         + (f"; it has {', '.join(directions)}" if directions else ""))
    if step is None:
        return steps[0]
    if step not in steps:
        raise OpNotFound(f"{name!r} ({direction}) was not recorded at step {step} in the {role} dump; "
                         f"steps: {_short_list(steps)}")
    return step


def list_ops(session, name: str | None, type_: str | None, pass_: str | None, step: int | None) -> OpListing:
    """The ops of one step matching every given substring filter; with none, counts per type."""
    role = session.primary_role
    dump = session.dump(role or "target", "ls")
    index = session.index(role)
    if step is not None:
        recorded = sorted({s for steps in index.steps.values() for s in steps})
        if step not in recorded:  # an empty listing would read as a step without ops
            raise OpNotFound(f"the {role} dump recorded no op at step {step}; steps: {_short_list(recorded)}"
                             if recorded else f"the {role} dump recorded no op")
    step = index.first_step if step is None else step
    ops = dump.ops(step=step) if step is not None else []
    filters = {k: v for k, v in (("name", name), ("type", type_), ("pass", pass_)) if v}
    listing = OpListing(source=f"{role}: {_file_name(dump)}", step=step, filters=filters)
    if not filters:
        counts: dict[str, int] = {}
        for op in ops:
            counts[op.type] = counts.get(op.type, 0) + 1
        listing.counts = [TypeCount(t, c) for t, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        return listing
    listing.ops = [op for op in ops if (not name or name in op.name) and (not type_ or type_ in op.type)
                   and (not pass_ or pass_ in op.pass_name)]
    return listing


def node_info(session, query: str, step: int | None, direction: str | None) -> OpInfo | Candidates:
    """One op: its record on every loaded side, each tensor slot side by side, metrics against golden."""
    role = session.primary_role
    session.dump(role or "target", "ni")
    name = find_op(session, role, query)
    if isinstance(name, Candidates):
        return name
    direction = pick_direction(session, role, name, direction)
    step = pick_step(session, role, name, direction, step)
    op = session.dump(role).op(step, name, direction)
    info = OpInfo(role=role, op=op, sides={role: op}, metrics_source="tensors")
    for slot_record in op.tensors:
        info.slots.append(SlotView(slot_record.slot, {role: slot_record}, {}))
    for other in session.dumps:
        if other != role:
            _add_side(session, info, other)
    if session.has("golden") and role != "golden":
        for view in info.slots:
            view.metric = _metric(session, info, view)
    _arguments(info)
    return info


def _arguments(info: OpInfo) -> None:
    """The numbers, strings and flags ``info.op`` was called with; how golden's call of it differs."""
    from precision_tool.analysis.arguments import argument_changes, flag_paths, scalar_arguments

    op = info.op
    info.arguments = scalar_arguments(op.attrs, flag_paths(op.type, op.attrs))
    golden = info.sides.get("golden")
    if golden is not None and info.role != "golden" and golden.type == op.type:
        info.argument_changes = argument_changes(golden.attrs, op.attrs, op.type)


def counterpart(op, slot: str, side: str) -> tuple[str, str]:
    """The (op name, slot) that stands for ``op``'s ``slot`` on ``side``.

    On the unfused sides (golden, fusion-off) a fused op is matched through
    the ops it replaced, by the comparator's own rule.
    """
    if not op.fused or side not in UNFUSED_SIDES:
        return op.name, slot
    try:
        origin = fused_origin(op, op.tensor(slot))
    except KeyError:
        origin = None
    return origin if origin is not None else (op.name, slot)


def _add_side(session, info: OpInfo, role: str) -> None:
    dump, op = session.dump(role), info.op
    for view in info.slots:
        name, slot = counterpart(op, view.slot, role)
        record = _op_or_none(dump, op.step, name, op.direction)
        if record is None:
            continue
        info.sides.setdefault(role if name == op.name else f"{role}:{name}", record)
        try:
            view.records[role] = record.tensor(slot)
        except KeyError:
            continue
        if (name, slot) != (op.name, view.slot):
            view.counterparts[role] = f"{name}:{slot}"


def _metric(session, info: OpInfo, view: SlotView) -> TensorMetric | None:
    op = info.op
    name, slot = counterpart(op, view.slot, "golden")
    label = f"{name}:{slot}"
    target_record, golden_record = view.records.get(info.role), view.records.get("golden")
    if golden_record is None:
        return TensorMetric(view.slot, label, None, None, None, "no golden counterpart")
    if not (target_record.has_data and golden_record.has_data):
        return TensorMetric(view.slot, label, None, None, None, "stats only")
    golden_op = session.dump("golden").op(op.step, name, op.direction)
    target = np.asarray(session.dump(info.role).tensor(op.step, op.exec_index, view.slot)).ravel()
    golden = np.asarray(session.dump("golden").tensor(op.step, golden_op.exec_index, slot)).ravel()
    if target.size != golden.size:
        return TensorMetric(view.slot, label, None, None, None, f"sizes differ: {target.size} vs {golden.size}")
    metrics = pair_metrics(target, golden)
    note = metrics.note or (f"{metrics.nonfinite_pairs} non-finite pairs left out" if metrics.nonfinite_pairs else "")
    return TensorMetric(view.slot, label, metrics.cosine, metrics.rel_euclidean, metrics.max_abs_err, note)


def _op_or_none(dump, step: int, name: str, direction: str):
    try:
        return dump.op(step, name, direction)
    except KeyError:
        return None


def _file_name(dump) -> str:
    return str(dump.path).rsplit("/", 1)[-1]


def _short_list(values: list, limit: int = 8) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")
