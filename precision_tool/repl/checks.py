"""`of`, `fu`, `rerun`, `ac` and `vcs`: the analyses and the comparison, over the session's dumps."""

from __future__ import annotations

import dataclasses

from precision_tool import defaults
from precision_tool.commands.results import AutoCheck, Candidates
from precision_tool.repl.ops import find_op, pick_direction


def overflow(session, limit: int | None):
    """`of`: the overflow report of the overflow dump, else of the target dump."""
    from precision_tool.analysis import overflow_report

    role = "overflow" if session.has("overflow") else "target"
    return overflow_report(session.dump(role, "of"), limit=limit or None)  # 0: all, as compare -l 0


def fusion(session):
    """`fu`: the fusion passes of the target run and its fused-op suspects."""
    from precision_tool.analysis import fusion_report

    target = session.dump("target", "fu")
    return fusion_report(target, golden=session.dumps.get("golden"), fusion_off=session.dumps.get("fusion-off"))


def rerun(session, query: str, device: str, step: int | None, direction: str | None):
    """`rerun`: replay one op on the golden inputs; the error it introduces against what it inherits."""
    from precision_tool.analysis import attribute

    golden, target = session.dump("golden", "rerun"), session.dump("target", "rerun")
    name = find_op(session, "target", query)
    if isinstance(name, Candidates):
        return name
    direction = pick_direction(session, "target", name, direction)
    return attribute(golden, target, name, step=step, direction=direction, device=device)


def flagged(session, threshold: float | None, limit: int | None):
    """`vcs`: ops whose output cosine is at or below ``threshold``, in execution order, at most ``limit`` (0: all)."""
    from precision_tool.compare.report import Flagged

    threshold = defaults.COSINE_THRESHOLD if threshold is None else threshold
    limit = defaults.LIST_LIMIT if limit is None else limit
    report = session.compare()
    every = session.flagged_ops(threshold)  # the comparator's select_flagged, memoised per threshold
    return Flagged(report, every[:limit] if limit > 0 else list(every), threshold, limit, len(every))


def auto_check(session, compare_first: bool, limit: int | None, show_all: bool = False) -> AutoCheck:
    """`ac`: the diagnosis over the session's (cached) comparison; overflow entries cut to ``limit``.

    The verdict always needs the comparison, so it is made once and cached
    either way; ``-c`` also lists the flagged ops, as `vcs` does.
    """
    from precision_tool.analysis import diagnose

    golden, target = session.dump("golden", "ac"), session.dump("target", "ac")
    diagnosis = diagnose(golden, target, overflow=session.dumps.get("overflow"),
                         fusion_off=session.dumps.get("fusion-off"), comparison=session.compare())
    if limit and diagnosis.overflow is not None:
        cut = dataclasses.replace(diagnosis.overflow, entries=diagnosis.overflow.entries[:limit])
        diagnosis = dataclasses.replace(diagnosis, overflow=cut)
    return AutoCheck(diagnosis, flagged(session, None, None) if compare_first else None, limit, show_all)


def check(session, min_cosine: float | None, max_abs_err: float | None, judge_inputs: bool):
    """`check`: the CI gate's judgement of the session's (cached) comparison."""
    from precision_tool.compare.check import CheckCriteria, check_report

    criteria = CheckCriteria(min_cosine=defaults.CHECK_MIN_COSINE if min_cosine is None else min_cosine,
                             max_abs_err=max_abs_err, judge_inputs=judge_inputs)
    return check_report(session.compare(), criteria)
