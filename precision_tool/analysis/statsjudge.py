"""Judging an op from statistics alone: what `scan` does with an op of a stats-mode dump, or a module call.

A stats-mode dump keeps each tensor's count, min, max, mean, std and norm,
not its values, so nothing can be replayed. What the statistics do give is
a lower bound of each tensor's relative error (`errors.stats_split`): a
shift, a scale or a bias shows at its full size, rounding noise hardly at
all. That is enough for the culprit's two signatures:

* an **overflow** (inf, NaN or the format's extreme where golden holds a
  finite value) that starts here and harms a reader, judged as for full
  dumps;
* an op whose output's statistics depart from golden's by
  SIGNIFICANT_ERROR and beyond its dtype's noise, while its inputs' depart
  by less than 1/INTRODUCED_EXCESS of that: the error starts here.
  Computing in float32 or wider, or departing INTRODUCED_EXCESS times what
  its compute dtype's noise floor allows, it is a **kernel_bug**; otherwise
  **precision_loss**, with that doubt in the evidence, once the step's loss
  departs by SIGNIFICANT_ERROR too (as for full dumps: else a note). Outputs
  that are golden's times one factor (`errors.uniform_scale`) are a
  **kernel_bug** in any dtype: rounding scales nothing (a module call's,
  judged from SIGNIFICANT_ERROR on, below a 16-bit dtype's noise floor).

Before the second: integer inputs that differ from golden's are explained
by a decision rounding flipped earlier in the step (noted), else the op
reading them is the culprit; an argument called differently is judged as
for full dumps, an optimizer op's too (its lr, eps, betas). In any
direction, an input changed between the op that wrote it in golden and its
reader (`departures`: a write only the target makes, a division it skips)
is judged as for full dumps. Backward ops are judged for no more: in clean
low-precision runs their statistics depart from golden's by up to 100 %
while their inputs' agree (a key's gradient cancels to near zero; float16
attention backward 6 % from inputs at 1e-4), which nothing here can tell
from a fault. A backward group whose ops differ from golden's is judged at
its boundary (`rewrites`).

A module-level dump (module calls only, `level="module"`) is judged the
same way module by module (`modulejudge`), from tensors where it has them.

The verdict says it was reached from statistics, and its action names the
full-tensor collection of that op's step and module that confirms it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from precision_tool.analysis.arguments import called_differently, writes_dtype_constant
from precision_tool.analysis.attribution import GoldenView, pair_errors
from precision_tool.analysis.departure_verdicts import skipped_verdict, target_only_verdict
from precision_tool.analysis.errors import noise_floor, repeated_stats, stats_only, stats_split, uniform_scale
from precision_tool.analysis.omissions import narrower_than_declared, stray_cast
from precision_tool.analysis.leaves import carried_state, stale_leaf
from precision_tool.analysis.randomness import judge_draw
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Attribution, Verdict
from precision_tool.analysis.rewrites import _fmt, output_dtype
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.analysis.structure import module_path, owning_module
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord

_WIDE = frozenset({"float32", "float64"})
LEAF_IN_16_BITS = 0.25  # a value no op wrote, departing this much at the first step of a 16-bit run, was changed


def judge_statistics(scan, record: OpRecord) -> Verdict | None:
    """The verdict on ``record`` from its statistics, or None; ``scan`` is the running `Scanner`."""
    if writes_dtype_constant(record):  # a mask value in the run's own format (finfo(float16).min), not a fault
        return None
    a = scan._attribute(record, replay=False)
    if "no float output with a golden partner holding data" not in a.notes:
        scan.result.judged.add((record.step, record.name, record.direction))
    if (a.overflowed or a.new_nan) and not scan._inherits_overflow(record, a) and a.inherited < SIGNIFICANT_ERROR:
        return scan._judge_overflow(record, a, _diverging)
    if scan._declared:  # a 16-bit op in a float32 run (or a bfloat16 op in a float16 autocast run), as for full
        # dumps; a cast to one in a float32 run (no values to judge it by)
        verdict = narrower_than_declared(record, scan._golden_of(record), a.observed, scan._declared) or \
            (stray_cast(record, scan._golden_of(record), loss_departs(scan)) if scan._float32 else None)
        if verdict is not None:
            scan.result.attributions.append(a)
            return verdict
    if record.direction == "optimizer":  # a gradient changed after its op wrote it (a hook); its lr, eps, betas
        # and weight decay are call arguments, read as for full dumps once its output departs at all: the
        # arguments, not the statistics, are the evidence
        verdict = _written_between(scan, record, a, update=True)
        if verdict is not None:
            return verdict
        return scan._called_differently(record, a) if a.observed >= noise_floor(output_dtype(record)) else None
    verdict = _written_between(scan, record, a)
    if verdict is not None:
        return verdict
    if record.direction == "backward":  # the numbers of a custom Function's backward written by hand, as for full
        # dumps, where the op departs beyond its inputs
        departs = a.observed >= noise_floor(output_dtype(record)) and a.observed > INTRODUCED_EXCESS * a.inherited
        return scan._called_differently(record, a) if departs else None
    if record.direction != "forward":
        return None
    verdict = judge_draw(scan, record, a)  # other random draws than golden's: nothing after compares
    if verdict is not None:
        return verdict
    if record.step == scan._first_step and min(a.inherited, a.observed) >= (noise_floor("float32") if scan._float32
                                                                            else LEAF_IN_16_BITS) \
            and (module_path(record.name) or not scan._region):  # a parameter or buffer changed before any op (a
        verdict = scan._changed_leaf(record)  # weight scaled, a rotary base), as for full dumps; changed by 1 % in
        # a float32 run, where no rounding moves a slice's statistics that far (no values to tell a slice by), or
        # rounded to a 16-bit grid (`leaves`); in a 16-bit one, beyond what its first step's rounding moves a slice
        if verdict is not None:
            scan.result.attributions.append(a)
            return verdict
    verdict = stale_leaf(scan, record) or carried_state(scan, record) if record.step != scan._first_step and \
        a.inherited > 0.0 else None
    if verdict is not None:  # a parameter the update did not reach, a state carried over
        scan.result.attributions.append(a)
        return verdict
    if a.observed < noise_floor(output_dtype(record)) and record.step == scan._first_step \
            and module_path(record.name):  # constants that act elsewhere (a BatchNorm's momentum), as for full dumps
        verdict = called_differently(record, scan._golden_of(record), a, agrees=True)
        if verdict is not None:
            scan.result.attributions.append(a)
            return verdict
    inherited = a.inherited * _cancellation(record)  # what a sum's cancellation makes of its inputs' error
    if a.observed < noise_floor(output_dtype(record)) or a.observed <= INTRODUCED_EXCESS * inherited:
        return None
    changed = _changed_integers(scan, record)
    if changed:
        return _integer_verdict(scan, record, a, changed)
    verdict = scan._called_differently(record, a)  # an argument changed (a scale, an eps) may move it by little
    if verdict is not None:
        return verdict
    floor = max(noise_floor(output_dtype(record)), SIGNIFICANT_ERROR)
    if a.observed < floor:
        return None
    observed = _unreduced_error(scan, record, a.inherited)
    if observed < floor or observed <= INTRODUCED_EXCESS * inherited:
        return None
    a = replace(a, observed=observed)
    if not scan._harmful(record, _diverging):
        note = f"{record.name}: statistics {_fmt(observed)} from golden's, absorbed by the ops that read it"
        if note not in scan.result.notes:
            scan.result.notes.append(note)
        return None
    verdict = statistics_verdict(record, a)
    if verdict.cls == "precision_loss" and not scan._outcome_diverges(record.step):
        # as for full dumps (`scan._precision_loss`): rounding an ill-conditioned op's inputs may move it this
        # far, and blamed only when the step's loss departs too (a clean float16 BERT's relative-position
        # product: 3 % from inputs at 0.29 %, its loss within 4e-4)
        note = (f"{record.name}: statistics {_fmt(observed)} from golden's, within what {record.compute_dtype} "
                f"can lose in an ill-conditioned op; the step's loss stays within {SIGNIFICANT_ERROR:g} of golden's")
        if note not in scan.result.notes:
            scan.result.notes.append(note)
        return None
    scan.result.attributions.append(a)
    return verdict


def _written_between(scan, record: OpRecord, a: Attribution, update: bool = False) -> Verdict | None:
    """An input of an op whose output departs, the input by SIGNIFICANT_ERROR (and its dtype's noise) beyond what
    its golden writer's partner wrote, as for full dumps (`departures.floating`): an op only the target runs wrote
    it in between (a hook, a write through .data), or the target skips the op that wrote it in golden (a
    division). Both sides of that comparison are one value's statistics: a cast between them rounds it, and
    rounding shows in statistics at the second order. ``update``: an optimizer's op, whose output (a parameter
    a small step moves) departs by less than the gradient it reads: asked whatever its output does."""
    floor = max(noise_floor(output_dtype(record)), SIGNIFICANT_ERROR) if not scan._float32 else \
        noise_floor("float32")  # (no rounding in a float32 run to hide a change: noise added to a gradient)
    if a.observed < floor and not update or a.inherited < floor:  # as for full dumps, an op whose output departs
        return None  # (a loss scaled by the target alone departs; the ones_like that reads it writes golden's seed)
    found = scan.departures.floating(record, scan.views.get(id(record)) or GoldenView(scan.golden, []), floor)
    if found is None:
        return None
    scan.result.attributions.append(a)
    if found.skipped is not None:
        return skipped_verdict(record, found)
    return target_only_verdict(record, found, scan.departures.target_only_between(found, record))


def _same(a, b, exact: bool = True) -> bool:
    """Equal statistics; not ``exact``, one side repeated (`repeated_stats`): its norm within a few ulp."""
    if a.count == b.count == 0:
        return True
    norms = a.norm == b.norm or (not exact and math.isclose(a.norm, b.norm, rel_tol=1e-12))
    return norms and (a.count, a.min, a.max, a.mean, a.nan, a.inf) == (b.count, b.min, b.max, b.mean, b.nan, b.inf)


def loss_departs(scan) -> bool:
    """A step's loss departs from golden's beyond float32's noise (16 units): what a value rounded in one step
    does shows in the next one's loss, once an update read it."""
    golden = {s.step: s.loss for s in scan.golden.steps()}
    return any(math.isfinite(s.loss) and math.isfinite(golden.get(s.step, math.nan)) and
               abs(s.loss - golden[s.step]) > noise_floor("float32") * max(abs(golden[s.step]), 1e-30)
               for s in scan.target.steps())


def _differing(tensors, golden: OpRecord | None) -> list[str]:
    """Slots of ``tensors`` whose statistics differ from golden's tensor of the same slot (no tolerance: the
    same integers give the same sums); those without a golden partner are left out, and so are those whose
    partner holds floats (another op, paired by a name that an extra op shifted: a float16 cast of a module's
    first call renumbers the casts of its second)."""
    if golden is None:
        return []
    slots = {t.slot: t for t in golden.tensors}
    return [t.slot for t in tensors if t.slot in slots and is_float(slots[t.slot].dtype) == is_float(t.dtype)
            and not _same(*repeated_stats(t.shape, t.stats, slots[t.slot].shape, slots[t.slot].stats),
                          exact=tuple(t.shape) == tuple(slots[t.slot].shape))]


def _changed_integers(scan, record: OpRecord) -> list[str]:
    """Slots of ``record``'s integer inputs whose statistics differ from golden's partner's."""
    integers = [t for t in record.inputs if not is_float(t.dtype) and t.dtype != "bool" and t.stats.count]
    return _differing(integers, scan._golden_of(record)) if integers else []


def _flipped_decision(scan, record: OpRecord) -> OpRecord | None:
    """The last op before ``record`` in its step that reads floats and writes integers or booleans (topk's
    indices, an argmax, a comparison) unlike golden's partner: a decision that rounding took otherwise."""
    found = None
    for other in scan.step_records:
        if other is record:
            break
        if other.is_module or not any(is_float(t.dtype) for t in other.inputs):
            continue
        chosen = [t for t in other.outputs if not is_float(t.dtype) and t.stats.count]
        if chosen and _differing(chosen, scan._golden_of(other)):
            found = other
    return found


def _integer_verdict(scan, record: OpRecord, a: Attribution, changed: list[str]) -> Verdict | None:
    """``record`` departs and reads integers unlike golden's: a decision rounding flipped before it explains
    them (noted), else they changed where no recorded op computes them, and this op is where it shows."""
    decision = _flipped_decision(scan, record)
    if decision is not None:
        note = (f"{decision.name} ({decision.type}) chose differently from golden (its integer outputs' statistics "
                f"differ) on inputs that differ by rounding; {record.name} reads integers chosen from it")
        if not any(n.startswith(decision.name) for n in scan.result.notes):
            scan.result.notes.append(note)
        return None
    scan.result.attributions.append(a)
    evidence = (f"from statistics only (the dumps keep no values): its outputs are at least {_fmt(a.observed)} "
                f"from golden, its float inputs within {_fmt(a.inherited)}",
                f"it reads integers that differ from golden's ({', '.join(changed)}: their statistics differ) and "
                "no recorded op that reads floats chose them otherwise: they changed before this op")
    return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence,
                   f"find where the integers {record.name} reads ({', '.join(changed)}) are computed or changed "
                   "(ids, indices, masks) and compare them with golden's", module=owning_module(record))


# The relative error a float32 input may carry unseen in its statistics (rounding spread over its values shows at
# second order): a network's accumulated float32 rounding, with a margin (`_reducible`)
REDUCED_NOISE = 1e-4


def _diverging(dtype: str) -> float:
    """How far a reader's statistics must depart for an op's error to count as harmful: a reader's inputs'
    error is a lower bound too (an overflow's positions are not scored at all), so no ratio to it is taken."""
    return max(noise_floor(dtype), SIGNIFICANT_ERROR)


_SUMS = frozenset({"aten.add", "aten.add_", "aten.sub", "aten.sub_", "aten.rsub"})


def _cancellation(record: OpRecord) -> float:
    """How much an elementwise sum or difference can grow its inputs' relative error, from their norms: its error
    is at most the sum of theirs, ||a|| e + ||b|| e, over ||a - b||, which is large where the two nearly cancel (a
    recurrence's running maximum less the new one: 21 times in a clean bfloat16 RWKV). A broadcast input counts
    as often as it is repeated. 1 for any other op."""
    if record.type not in _SUMS:
        return 1.0
    out = max(record.outputs, key=lambda t: t.stats.count, default=None)
    floats = [t for t in record.inputs if is_float(t.dtype) and t.stats.count]
    if out is None or not floats or not out.stats.norm > 0.0:
        return 1.0
    total = sum(t.stats.norm * math.sqrt(out.stats.count / t.stats.count) for t in floats)
    return max(1.0, total / out.stats.norm) if math.isfinite(total) else 1.0


def _unreduced_error(scan, record: OpRecord, inherited: float = math.inf) -> float:
    """The largest error of ``record``'s outputs that hold as many values as its largest float input: a
    reduction's output (a row mean, a bias gradient) can lose to cancellation what its inputs' noise, invisible
    in their statistics, carries, and statistics cannot tell that from a fault. An op's smaller output counts
    too where its error is beyond what that noise can become through the reduction (`_reducible`), when its
    inputs' statistics, ``inherited`` from golden's, show no more than their formats' noise (an input whose lower
    bound is beyond it carries an error statistics cannot size)."""
    floats = [t for t in record.inputs if is_float(t.dtype) and t.stats.count]
    sized = inherited <= max((noise_floor(t.dtype) for t in floats), default=0.0)
    largest = max((t.stats.count for t in floats), default=0)
    view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
    outputs = {t.slot: t for t in record.outputs}
    ratio = loss_scale_ratios(scan.golden, scan.target).get(record.step, 1.0) if record.direction == "backward" \
        else 1.0  # gradients carry the target's loss scale over golden's, as `attribute_record` divides out
    return max((e.error for slot, e in pair_errors(scan.golden, scan.target, record, view, "output", ratio)
                if slot in outputs and (outputs[slot].stats.count >= largest or
                                        (sized and not record.is_module and
                                         e.error > _reducible(floats, outputs[slot])))),
               default=0.0)


def _reducible(inputs, output) -> float:
    """The most relative error that noise of REDUCED_NOISE (or the inputs' formats' noise floor) in an op's
    ``inputs`` becomes in its smaller ``output``, times INTRODUCED_EXCESS, from their norms: a sum of m values
    each per output grows an input's error by at most sqrt(m) ||x|| / ||y|| (Cauchy-Schwarz), a product of two
    (a matrix product: the two largest inputs) by ||a|| ||b|| / ||y||. A module call's weights are no inputs of
    its record, so this is an op's only."""
    norms = sorted((t.stats.norm for t in inputs if t.stats.count > 1), reverse=True)
    y = output.stats.norm
    if not norms or not y > 0.0 or not all(math.isfinite(n) for n in [*norms, y]):
        return math.inf
    m = max(t.stats.count for t in inputs) / max(output.stats.count, 1)
    condition = max(math.sqrt(m) * norms[0], norms[0] * norms[1] if len(norms) > 1 else 0.0) / y
    noise = max([REDUCED_NOISE] + [noise_floor(t.dtype) for t in inputs])
    return INTRODUCED_EXCESS * noise * condition


def output_scale(scan, record: OpRecord) -> float | None:
    """The factor r where every output of ``record`` that departs from golden's by SIGNIFICANT_ERROR is golden's
    times r (`errors.uniform_scale`, from statistics or values), or None."""
    view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
    found = None
    for slot, e in pair_errors(scan.golden, scan.target, record, view, "output"):
        if not e.error >= SIGNIFICANT_ERROR:
            continue
        tensor = record.tensor(slot)
        partner = view.statistics(slot) or (view.record(slot) if not tensor.has_data else None)  # (either side's)
        r = uniform_scale(tensor.stats, partner.stats, tensor.dtype) if partner is not None else uniform_scale(
            scan.target.tensor(record.step, record.exec_index, slot), view.get(slot), tensor.dtype)
        if r is None or not math.isfinite(e.error) or (found is not None and abs(r - found) > abs(found - 1.0) / 4):
            return None
        found = r if found is None else found
    return found


def statistics_departure(scan, records: list[OpRecord], kind: str) -> float:
    """The largest lower bound, from statistics (`errors.stats_split`), of the departure from golden's of the float
    tensors of ``kind`` of ``records`` (forward calls): what values show of rounding in full, statistics at its
    second order, a scale at its full size."""
    worst = 0.0
    for record in records:
        view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
        for t in record.tensors:
            partner = view.statistics(t.slot) or view.record(t.slot) if t.kind == kind and is_float(t.dtype) else None
            if partner is not None and t.stats.count:
                worst = max(worst, stats_split(t.stats, partner.stats, t.dtype).error)
    return worst


def statistics_verdict(record: OpRecord, a: Attribution, measured: bool = False, scale: float | None = None) \
        -> Verdict:
    """kernel_bug or precision_loss at ``record`` (an op, or a module call of a module-level dump), from its
    statistics, or with ``measured`` from a module's tensors (nothing inside it was recorded to replay); ``scale``:
    its outputs are golden's times that factor (`output_scale`)."""
    compute = record.compute_dtype or output_dtype(record)
    wide = compute in _WIDE or a.observed > INTRODUCED_EXCESS * noise_floor(compute) or scale is not None
    module = owning_module(record)
    evidence = [f"from statistics only (the dumps keep no values): its outputs are at least {_fmt(a.observed)} "
                f"from golden, its inputs within {_fmt(a.inherited)} as far as their statistics show",
                "the error starts here: its inputs' statistics match golden's and its outputs' do not"]
    if measured and record.direction == "backward":
        evidence = [f"a module-level dump: the gradients it passes back to its inputs are {_fmt(a.observed)} from "
                    f"golden, those reaching its outputs within {_fmt(a.inherited)}",
                    "the error starts in this module call's backward: no op inside it was recorded"]
    elif measured:
        evidence = [f"a module-level dump: its output is {_fmt(a.observed)} from golden, its inputs within "
                    f"{_fmt(a.inherited)}", "the error starts in this module call: no op inside it was recorded"]
    elif record.is_module and record.direction == "backward":
        evidence = [f"from statistics only (the dumps keep no values): the gradients it passes back to its inputs "
                    f"are at least {_fmt(a.observed)} from golden, those reaching its outputs within "
                    f"{_fmt(a.inherited)} as far as their statistics show",
                    "the error starts in this module call's backward: the statistics of the gradients reaching it "
                    "match golden's and those it passes back do not"]
    if not record.is_module and a.inherited < REDUCED_NOISE and max(t.stats.count for t in record.outputs) < max(
            (t.stats.count for t in record.inputs if is_float(t.dtype)), default=0):
        evidence.append("statistics do not see values moved among positions: an input whose values sit elsewhere "
                        "than golden's (a permuted or transposed weight, another layout) shows first where they "
                        "combine, here")
    if scale is not None:
        alike = "its norm, spread, extremes and mean alike" if stats_only(record) else "value by value"
        shown = "the gradients it passes back are" if record.direction == "backward" else "its output is"
        evidence.append(f"{shown} golden's times {scale:.4g} ({alike}): rounding moves values both ways and "
                        "scales none; the code multiplies by another constant")
        cls = "kernel_bug"
    elif wide:
        evidence.append(f"{compute} rounding cannot move statistics that far: the op computes something else"
                        if not record.is_module or compute in _WIDE else
                        f"{compute} rounding cannot move it that far: something inside computes otherwise, or "
                        "overflows (a module call records no float status; the ops' tensors tell)")
        cls = "kernel_bug"
    else:
        evidence.append(f"within what an ill-conditioned op can lose in {compute}; the tensors tell a wrong kernel "
                        "from precision loss")
        cls = "precision_loss"
    where = f", modules=[{module!r}]" if module else ""
    action = (f"confirm with tensors: collect step {record.step} again with ptt.dump(path, mode=\"dump\", "
              f"steps=[{record.step}]{where}) on both runs (or `precision-tool zoom`) and diagnose that pair")
    return Verdict(record.name, cls, record.step, record.direction, record.type, tuple(evidence), action,
                   module=module, departure_only=not measured)
