"""An optimizer group or a module call that runs other ops than golden's, which statistics cannot judge.

From values, such a group is run again on golden's gradients (`updates.introduced_by_group`). From statistics it
cannot be: its results pair with golden's by size only, and Adam's normalised step turns a gradient that is
rounding noise into a step of full size. Two such differences are PyTorch's own and are noted, not judged:
another implementation of the optimizer (`unreplayable_update`), and ops on the step counters only (a GradScaler
hands a fused optimizer ``found_inf``, and its step takes back the count of a step it skipped: ``_foreach_sub_``
on single values, which golden's unscaled run does not run).

A forward module call that runs other ops than golden's in a 16-bit run and departs far beyond its inputs, but
within its dtype's rounding floor, is not judged from statistics either: another implementation's rounding and
another function look alike there (a hand-written GELU under float16: 0.74 % from golden, its inputs within
2.3e-5, the floor 0.78 %). Diagnosis names it as a none that points there (`unjudged_rewrite`), for `zoom` to
collect its tensors, which tell the two apart.
"""

from __future__ import annotations

from precision_tool.analysis.results import Verdict
from precision_tool.defaults import INTRODUCED_EXCESS
from precision_tool.dump.records import OpRecord

REWRITE_FLOOR = 1e-3  # relative error below which another implementation of a module is never judged


def _implementation(ops) -> str:
    return "fused" if any("_fused_" in op for op in ops) else \
        "foreach" if any("_foreach_" in op for op in ops) else "for-loop"


def unjudged_update(rewrite, members: list[OpRecord], golden_members: list[OpRecord], target_dump,
                    statistics: bool) -> str | None:
    """A note where an optimizer group that runs other ops than golden's is not judged, else None: a step whose
    update the target's loss scaler skipped (a fused optimizer runs its kernel, which leaves the parameters as
    they were), and from ``statistics``, `unreplayable_update`."""
    step = members[0].step if members else None
    if any(s.step == step and s.skipped for s in target_dump.steps()):
        return (f"{rewrite.name}: the target's loss scaler skipped the update of step {step} (inf or NaN "
                "gradients); a fused optimizer's kernel ran and left the parameters as they were")
    return unreplayable_update(rewrite, members, golden_members) if statistics else None


def unreplayable_update(rewrite, members: list[OpRecord] = (), golden_members: list[OpRecord] = ()) \
        -> str | None:
    """A note where an optimizer group of a statistics dump updates through another of PyTorch's implementations
    of an optimizer than golden's (its for-loop, ``_foreach_`` or fused form), or runs other ops than golden's on
    its step counters only (a GradScaler's fused step takes back the count of a step it skipped), else None. Such
    a group is not judged from statistics: it cannot be replayed on golden's gradients, its results (parameters,
    moments, step counters in another order) pair with golden's only by size, and Adam's normalised step turns a
    gradient that is rounding noise (a key projection's bias, zero in exact arithmetic) into a step of full size:
    a clean float32 target's fused Adam writes parameters 1.2e-5 from golden's for-loop from gradients within
    1.8e-7."""
    golden, target = _implementation(rewrite.golden_ops), _implementation(rewrite.target_ops)
    if golden != target:
        return (f"{rewrite.name}: the target updates with the {target} implementation, golden with the {golden} "
                "one; statistics cannot replay it on golden's gradients, so it is not judged (a dump mode run of "
                "the first step would)")
    counters = _on_counters_only(rewrite, members, golden_members)
    if counters:
        return (f"{rewrite.name}: the target's update runs ops golden's does not on its step counters only "
                f"({counters}: a GradScaler's fused step); the update itself runs golden's ops")
    return None


def _on_counters_only(rewrite, members, golden_members) -> str:
    """The op types one group runs more often than the other, where every such op of that group reads and writes
    single values only (step counters); "" otherwise."""
    extra = {t: rewrite.target_ops.count(t) - rewrite.golden_ops.count(t)
             for t in set(rewrite.target_ops) | set(rewrite.golden_ops)}
    differ = {t for t, n in extra.items() if n}
    if not differ:
        return ""
    for op_type in differ:
        side = members if extra[op_type] > 0 else golden_members
        if any(t.stats.count > 1 for r in side if r.type == op_type for t in r.tensors):
            return ""
    return ", ".join(sorted(t.removeprefix("aten.") for t in differ))


def unjudged_rewrite(rewrite, record: OpRecord, observed: float, inherited: float, floor: float,
                     dtype: str) -> Verdict | None:
    """A verdict of none naming a forward module call ``record`` of a statistics dump (`structure.Rewritten`:
    other ops than golden's) whose output departs at least ``observed`` from golden's, from REWRITE_FLOOR up
    and more than INTRODUCED_EXCESS times its inputs' ``inherited``, but under ``floor``, its ``dtype``'s
    rounding (as far as statistics show); else None. Its tensors, run again on golden's inputs, judge it."""
    if not REWRITE_FLOOR <= observed < floor or observed <= INTRODUCED_EXCESS * inherited:
        return None
    evidence = (f"in module {rewrite.name}, {rewrite.describe()}",
                f"its output is at least {observed:.3g} from golden while its inputs are within {inherited:.3g}, as "
                f"far as their statistics show: under the {floor:.3g} that {dtype} rounding can account for, where "
                "statistics cannot tell another implementation's rounding from another function")
    return Verdict(rewrite.name, "none", record.step, "forward", record.type, evidence,
                   f"collect step {record.step} with tensors (`precision-tool zoom`, or ptt.dump(..., mode=\"dump\", "
                   f"steps=[{record.step}])): run again on golden's inputs, its ops tell which", module=rewrite.name)
