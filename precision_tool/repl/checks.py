"""`of`, `fu` and `rerun`: the analyses, over the session's dumps (`ac`, `vcs` and `check` share their batch
twins' handlers: `precision_tool.commands.handlers`)."""

from __future__ import annotations

from precision_tool.commands.handlers import check_extra_dump
from precision_tool.commands.results import Candidates
from precision_tool.repl.ops import find_op, pick_direction


def overflow(session, limit: int | None):
    """`of`: the overflow report of the overflow dump, else of the target dump."""
    from precision_tool.analysis import overflow_report

    role = "overflow" if session.has("overflow") else "target"
    dump = session.dump(role, "of")
    if role == "overflow":  # (the golden or target dump given again, or a golden run: refused, as `ac` does)
        check_extra_dump("--overflow", dump, session.dumps.get("golden"), session.dumps.get("target"))
    return overflow_report(dump, limit=limit or None,  # 0: all, as compare -l 0
                           golden=session.dumps.get("golden"))


def fusion(session):
    """`fu`: the fusion passes of the target run and its fused-op suspects."""
    from precision_tool.analysis import fusion_report

    target = session.dump("target", "fu")
    fusion_off = session.dumps.get("fusion-off")
    check_extra_dump("--fusion-off", fusion_off, session.dumps.get("golden"), target)
    return fusion_report(target, golden=session.dumps.get("golden"), fusion_off=fusion_off)


def rerun(session, query: str, device: str, step: int | None, direction: str | None):
    """`rerun`: replay one op on the golden inputs; the error it introduces against what it inherits."""
    from precision_tool.analysis import attribute

    golden, target = session.dump("golden", "rerun"), session.dump("target", "rerun")
    name = find_op(session, "target", query)
    if isinstance(name, Candidates):
        return name
    direction = pick_direction(session, "target", name, direction)
    return attribute(golden, target, name, step=step, direction=direction, device=device)
