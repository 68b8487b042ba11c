"""An update that differs from golden's, where a module-level dump first shows it.

Module records hold no parameter, no parameter gradient and no optimizer op
(the first step's parameter gradients are a table of their own: `param_grads`),
so a learning rate, a weight decay or a clipping set otherwise, a parameter
frozen or tied in one run only, or a hook changing a parameter's gradient
shows first in the step after the update, as a call whose output departs on
the inputs golden's call read. `modulejudge` judges a call only in its first
step, where the parameters it reads are golden's: after an update, 16-bit
rounding of the gradients moves them too. Two float32 runs of the same code
compute the same values to the last bit, though. So where every module call
of the steps so far matches golden's to the last bit, forward and backward
(the same data, weights and boundary gradients), the first call of the next
step departing beyond float32 rounding (`FLOAT32_DEPARTURE`) on inputs
golden's to the last bit reads parameters the update changed.

Which update: a forward record says how many parameters of its own the call
trains (``attrs["trains"]``, `precision_tool.torch.modules.trained`). Where
the call is the step's first to read trained parameters, the parameters read
first already differ: the optimizer's step (direction ``optimizer``). Where
calls before it read trained parameters that agree, the update left those
alone: this call's parameters, their gradients (a hook, a tie, a freeze) or
their group's settings (direction ``backward``). A call training another
number of parameters than golden's has a parameter frozen in one run only. A
call training no parameter of its own is not changed by an update: it
computes otherwise from that step on (direction ``forward``, at that step).
"""

from __future__ import annotations

import math

from precision_tool.analysis.leaves import stats_row
from precision_tool.analysis.results import UPDATE_TYPE, Verdict
from precision_tool.analysis.rewrites import _fmt
from precision_tool.analysis.zoom import FLOAT32_DEPARTURE
from precision_tool.dump.records import OpRecord


def judge_update(scan, record: OpRecord) -> Verdict | None:
    """The verdict on a forward call after the first step of a float32 module-level pair, or None."""
    if record.direction != "forward" or scan._first_step is None or record.step <= scan._first_step:
        return None
    first = _first_departure(scan)
    if first is None or first[0] is not record:
        return None
    _, partner, earlier = first
    calls = _agreeing_calls(scan, record.step)
    if calls is None:
        return None
    error = scan._attribute(record, replay=False).observed
    trains, golden_trains = (_trains(r) for r in (record, partner))
    frozen = trains is not None and golden_trains is not None and trains != golden_trains
    if not error >= FLOAT32_DEPARTURE and not frozen:
        return None  # (the update differs by rounding: another optimizer implementation, say; statistics bound
        # a frozen layer's departure far lower: 4.8e-7 for 1.25e-5 after one Adam step)
    previous = record.step - 1
    steps = f"steps {scan._first_step} to {previous}" if previous > scan._first_step else f"step {previous}"
    both = " both runs record" if calls[1] else ""
    evidence = [f"every module call of {steps}{both} matches golden's to the last bit, forward and backward "
                f"({calls[0]} calls): the same data, weights and boundary gradients"]
    if calls[1]:
        evidence[0] += f" ({calls[1]} backward call(s) one run records only: their inputs need no gradient there)"
    reads = "reads its inputs as golden's to the last bit" if record.inputs else \
        "reads no float input (a call's integer inputs are not recorded at module level)"
    departs = f"at step {record.step}, {record.name} {reads} and its output departs by {_fmt(error)}"
    if trains == 0 and golden_trains == 0:  # no update explains it: the call computes otherwise from this step on
        evidence += [departs, f"{record.name} trains no parameter of its own: no update explains it; it computes "
                     f"otherwise than golden's from step {record.step} on (or reads a buffer that changed)"]
        return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, tuple(evidence), (
            f"collect step {record.step} of {record.name} again at op level (ptt.dump(path, mode=\"dump\", "
            f"steps=[{record.step}], modules=[{record.name!r}])) or run precision-tool zoom"), module=record.name)
    evidence.append(f"{departs}: the parameters it reads differ after step {previous}'s update")
    agreeing = [r for r in earlier if _trains(r)] if trains is not None else earlier
    if frozen:
        direction = "backward"
        evidence.append(f"{record.name} trains {golden_trains} parameter(s) of its own in golden and {trains} in the "
                        "target: a parameter frozen (requires_grad) or removed in one run only")
    elif agreeing:
        direction = "backward"
        evidence.append(f"the {len(agreeing)} call(s) before it in step {record.step} read trained parameters "
                        "that match golden's: the update changed these parameters only: their gradients (a hook "
                        "on them, a weight tied or frozen in one run only) or their parameter group's settings")
    else:
        direction = "optimizer"
        evidence.append("it is the step's first call to read trained parameters: the update differs from the first "
                        "parameter on: the optimizer's settings (learning rate, weight decay, momentum, eps), its "
                        "schedule, gradient clipping, or every gradient it reads")
    action = (f"module records hold no parameter or update: collect step {previous} again at op level, "
              f"ptt.dump(path, mode=\"stats\", steps=[{previous}, {record.step}]), to see the optimizer's ops and the "
              "parameter gradients; or run precision-tool zoom")
    return Verdict(record.name, "kernel_bug", previous, direction, UPDATE_TYPE, tuple(evidence), action,
                   module=record.name)


def _first_departure(scan):
    """(the step's first forward call whose outputs differ from golden's at all, its golden partner, the forward
    calls before it), where it reads golden's inputs to the last bit; None where it does not, or where a call
    has no partner. Found once a step."""
    known = getattr(scan, "_update_departure", None)
    if known is not None and known[0] is scan.step_records:
        return known[1]
    found, earlier = None, []
    for record in scan.step_records:
        if not record.is_module or record.direction != "forward":
            continue
        partner = scan._golden_of(record)
        if partner is None:
            break
        if _same_tensors(record.outputs, partner.outputs):
            earlier.append(record)
            continue
        if _same_tensors(record.inputs, partner.inputs):
            found = (record, partner, earlier)
        break
    scan._update_departure = (scan.step_records, found)
    return found


def _agreeing_calls(scan, step: int) -> tuple[int, int] | None:
    """(how many module calls the steps before ``step`` (from the first) pair, how many backward calls one run
    records only), where every pair matches golden's to the last bit; else None."""
    known = getattr(scan, "_agreeing", None)
    if known is None:
        known = scan._agreeing = {}
    paired = one_sided = 0
    for earlier in range(scan._first_step, step):
        if earlier not in known:
            known[earlier] = _same_step(scan.golden, scan.target, earlier)
        if known[earlier] is None:
            return None
        paired, one_sided = paired + known[earlier][0], one_sided + known[earlier][1]
    return paired, one_sided


def _same_step(golden, target, step: int) -> tuple[int, int] | None:
    """(the number of the step's records paired, of those one run records only), where every pair holds the same
    tensors (dtype, shape and statistics to the last bit) and both dumps hold the same forward calls; else None.
    A backward call one run
    records and the other does not is left out: its inputs need no gradient in that run (a layer frozen before
    it), which the scan judged at that step (`missing`), and which the update then shows."""
    pairs = {}
    for role, dump in enumerate((golden, target)):
        seen: dict = {}
        for record in dump.ops(step=step):
            if record.tensors:
                key = (record.name, record.direction)
                seen[key] = seen.get(key, -1) + 1
                pairs.setdefault((*key, seen[key]), [None, None])[role] = record
    if not pairs:
        return None
    for (name, direction, _), (g, t) in pairs.items():
        if (g is None or t is None) and direction != "backward" or \
                g is not None and t is not None and not _same_tensors(g.tensors, t.tensors):
            return None
    paired = sum(1 for g, t in pairs.values() if g is not None and t is not None)
    return paired, len(pairs) - paired


def _same_tensors(ours, theirs) -> bool:
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        if a.slot != b.slot or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            return False
        if any(x != y and not (math.isnan(x) and math.isnan(y))
               for x, y in zip(stats_row(a.stats), stats_row(b.stats))):
            return False
    return True


def _trains(record: OpRecord) -> int | None:
    """How many parameters of its own the call trains (None: a dump that does not say)."""
    value = (record.attrs or {}).get("trains") if isinstance(record.attrs, dict) else None
    return value if isinstance(value, int) else None
