"""Judging a module call of a module-level dump (module calls only, no op record), as `scan` does.

A call records its float inputs and outputs (with values, or statistics only); a parent's record covers its
own, its children's records theirs. Between them runs the parent's own code (an attention's scaling and
softmax between its q/k/v Linears and its output Linear, a layer scale), which nothing records. So a call is
judged twice, in its first step only (a call does not record the parameters it reads, which differ by rounding
after the first update; `module_updates` judges the update of float32 runs agreeing to the last bit):

* **its output**: the call's output departs from golden's by SIGNIFICANT_ERROR and beyond its dtype's noise
  (REWRITE_FLOOR for a float32 tensor of a run that computes in float32: `_significant`), more than
  INTRODUCED_EXCESS times its inputs' error and its children's outputs' (error they already carried), as
  `statsjudge` judges an op; the innermost call that departs is met first, since a call is recorded when it returns;
* **its own code between its children**: what a child reads was computed by the parent's code from the parent's
  inputs and the outputs of the children that returned before it. A child whose input departs that much beyond all
  of those reads error the parent's own code introduced; the parent is named. That child is the reader the error
  reaches, so it is harmful when the child's output departs too. In backward (float32 runs whose forward calls are
  golden's to the last bit) the same holds of the gradients a child reads (`_judge_own_backward`).

A call's error is harmful, as an op's is, when a module call that reads its output diverges (a sibling:
`judge_module` cannot see the ops between), or holds NaN or inf where golden's is finite, or, without one, the
call it runs in diverges.

On inputs golden's to the last bit (the first call that departs in a float32 run), two right float32 kernels part
by under 300 units of float32; a float32 call departing over 1,024 (EXACT_INPUTS_FLOOR) counts there, and is
precision_loss where its tensor lies on float16's or bfloat16's grid, or departs under REWRITE_FLOOR: the size of
float16's rounding (a Linear, a softmax computed in float16 and cast back: `_narrower_inside`).

From statistics in a float32 run, a call whose inputs (or earlier children's outputs) already depart
beyond float32's noise is not judged: their lower bound does not size their error (`_unsized`).

A call records no float status, but its step does: a 16-bit call that departs beyond what rounding can
explain, in a step whose float status the target raised and golden's did not (no loss scale), is classed
**overflow** (an op inside it overflowed), not kernel_bug.
"""

from __future__ import annotations

import math
from dataclasses import replace

from precision_tool.analysis.attribution import GoldenView, pair_errors
from precision_tool.analysis.errors import noise_floor, stats_only
from precision_tool.analysis.gradient_scale import judge_gradient_scale
from precision_tool.analysis.grid import extremes_grid_of, grid_of
from precision_tool.analysis.module_updates import judge_update
from precision_tool.analysis.omissions import declares_float32, narrower_than_declared
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.randomness import judge_draw
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.rewrites import REWRITE_FLOOR, _fmt, output_dtype
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.analysis.statsjudge import (_changed_integers, _diverging, _integer_verdict, _unreduced_error,
                                                output_scale, statistics_departure, statistics_verdict)
from precision_tool.analysis.structure import fingerprint
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord


EXACT_INPUTS_FLOOR = 2.0 ** -14  # a float32 call's departure that counts on inputs golden's to the last bit (1,024
# units of float32): `_narrower_inside`


def judge_module(scan, record: OpRecord) -> Verdict | None:
    """The verdict on a module call of a module-level dump, or None; ``scan`` is the running `Scanner`."""
    if record.step == scan._first_step and record.direction == "backward" and not _runs_float32(scan):
        return _judge_loss_code(scan, record) or (  # (the gradient a loss hands back: its own rounding only)
            judge_gradient_scale(scan, record, _forward_error(scan, record), _descendants(scan, record),
                                 lambda r, least: _harmful(scan, r, least))
            if _own_input_gradients(scan, record) else None)  # (a scale rounding cannot make)
    if record.step != scan._first_step or record.direction not in ("forward", "backward"):  # after the first
        # update, parameters (not a call's inputs) differ by rounding too, but for float32 runs agreeing to the
        # last bit so far (`module_updates`); a 16-bit backward reads forward values rounding moved (a ReLU's mask
        # flips where its input is near 0: 7 % on its input gradient in a clean bf16 ResNet), unreplayed here
        return judge_update(scan, record) if record.step != scan._first_step and _runs_float32(scan) else None
    a = scan._attribute(record, replay=False)
    scan.result.judged.add((record.step, record.name, record.direction))
    declared = "float32" if _runs_float32(scan) else scan._declared if scan._declared != "float32" else None
    verdict = narrower_than_declared(record, scan._golden_of(record), a.observed, declared) if declared else None
    if verdict is not None:  # (a module .half()ed in a float32 run: its calls read and write float16)
        scan.result.attributions.append(a)
        return verdict
    verdict = judge_draw(scan, record, a) if record.direction == "forward" else None  # a Dropout's other masks
    if verdict is not None:
        return verdict
    verdict = _judge_output(scan, record)
    if verdict is None and record.direction == "forward" and not (a.overflowed or a.new_nan):
        verdict = _judge_own_code(scan, record, _children(scan, record))
    if verdict is None and record.direction == "forward" and "/" not in record.name:
        verdict = _judge_loop_code(scan, record)
    if verdict is None and record.direction == "backward":  # (a float32 run's first step, from here on)
        verdict = _judge_loss_code(scan, record) or _judge_own_backward(scan, record)
    return _as_overflow(scan, record, verdict)


def _judge_own_backward(scan, record: OpRecord) -> Verdict | None:
    """`_judge_own_code` of a backward call (a custom autograd Function or a hook changing the gradient between it
    and a child). What it passes back need not show it: to an input also read elsewhere (a residual stream) it
    records the whole gradient, its own share a small part (`modules`)."""
    a = scan._attribute(record, replay=False)
    if a.inherited > noise_floor("float32") or _forward_error(scan, record) > 0.0:
        return None
    sources = a.inherited
    for child in _children(scan, record):
        departed = _departed_input(scan, child, sources, 0) if _forward_error(scan, child) == 0.0 else None
        if departed is not None:
            scan.result.attributions.append(a := replace(a, observed=departed[1], inherited=sources))
            return _own_code_verdict(record, child, departed[0], a)
        sources = max(sources, scan._attribute(child, replay=False).observed)
    return None


def _judge_loss_code(scan, record: OpRecord) -> Verdict | None:
    """The step's first backward call, whose output's gradient departs beyond every forward call's output, while
    the step's loss departs too: what computed the loss from those outputs computes otherwise than golden's (a
    label smoothing, another reduction), in the root module's own code (a wrapper returning the loss in no tensor
    a module call records) or the training loop's. The gradient a loss hands back is exact in any format's
    rounding of its inputs, so a departure INTRODUCED_EXCESS times theirs is the loss's own."""
    if _first_backward(scan) is not record:
        return None
    forward = [scan._attribute(r, replay=False) for r in scan.step_records if r.is_module and r.direction == "forward"]
    losses = [{s.step: s.loss for s in dump.steps()}.get(record.step, math.nan) for dump in (scan.golden, scan.target)]
    if not forward or not abs(losses[1] - losses[0]) > noise_floor("float32") * abs(losses[0]):
        return None  # (NaN, a step without a loss: no)
    sources = max(max(b.observed, b.inherited) for b in forward)
    if _unsized(scan, record, sources):
        return None
    view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
    ratio = loss_scale_ratios(scan.golden, scan.target).get(record.step, 1.0)
    errors: dict[str, float] = {}  # (a scale recorded after the scaler halved or doubled it, a module-level
    for scale in (ratio, 2.0 * ratio, 0.5 * ratio):  # dump holding no op to infer it from: the seed's is off by 2)
        for slot, e in pair_errors(scan.golden, scan.target, record, view, "input", scale):  # (non-finite: judged
            finite = math.isfinite(e.error) and not (e.overflowed or e.new_nan)  # as an overflow, not here)
            errors[slot] = min(errors.get(slot, math.inf), e.error) if finite else -1.0
    departed = [(slot, error) for slot, error in errors.items() if error > INTRODUCED_EXCESS * sources
                and error >= _significant(scan, record.tensor(slot).dtype)]
    if not departed:
        return None
    slot, error = departed[0]
    a = replace(scan._attribute(record, replay=False), observed=error, inherited=sources)
    scan.result.attributions.append(a)
    roots = {r.name.split("/", 1)[0] for r in scan.step_records if r.is_module and r.direction == "forward"}
    root = next(iter(roots)) if len(roots) == 1 and not any(
        r.is_module and "/" not in r.name for r in scan.step_records) else None  # recorded: the loop's code
    where = f"{root}'s own code (its forward computes the loss; no call records it)" if root else \
        "the training loop's code after the model's last call"
    seen = "its statistics show" if stats_only(record) else "measured"
    evidence = (f"a module-level dump: the gradient reaching {record.name}'s {slot.replace('input', 'output')} at "
                f"step {record.step} is {_fmt(error)} from golden's ({seen}), while every forward call's output is "
                f"within {_fmt(sources)}, and the step's loss departs from golden's",
                f"the loss is computed otherwise than golden's in {where}: its gradient, not the model, differs")
    return Verdict(root or record.name, "kernel_bug", record.step, "forward" if root else "backward",
                   "loss", evidence, "compare the loss function and its arguments (label smoothing, reduction, "
                   "weights, ignore_index) with golden's", module=root)


def _first_backward(scan) -> OpRecord | None:
    """The step's first backward module call, found once a step (`_judge_loss_code` asks for every one)."""
    known = getattr(scan, "_first_backward", None)
    if known is None or known[0] is not scan.step_records:
        known = scan._first_backward = (scan.step_records, next(
            (r for r in scan.step_records if r.is_module and r.direction == "backward"), None))
    return known[1]


def _judge_loop_code(scan, record: OpRecord) -> Verdict | None:
    """A call outside every module (a head the script calls on the model's output) that reads an input departing
    beyond the outputs of every outermost call before it in the step, its own output departing too: the script's
    code between them (a pooling written by hand: the mean of all tokens where golden takes the first) introduced
    the error. The first outermost call reads the data, which `Scanner.leaf_mismatch` compares."""
    earlier = [r for r in scan.step_records if r.exec_index < record.exec_index and r.is_module
               and r.direction == "forward" and "/" not in r.name]
    if not earlier:
        return None
    sources = max(scan._attribute(r, replay=False).observed for r in earlier)
    b = scan._attribute(record, replay=False)
    departed = _departed_input(scan, record, sources, 0)
    if departed is None or _unsized(scan, record, sources) or b.observed < _significant(scan, output_dtype(record)):
        return None
    slot, error = departed
    a = replace(b, observed=error, inherited=sources)
    scan.result.attributions.append(a)
    verdict = statistics_verdict(record, a, measured=not stats_only(record))
    seen = "its statistics show" if stats_only(record) else "measured"
    evidence = (f"a module-level dump: {record.name}, called outside every module, reads {slot} {_fmt(error)} from "
                f"golden ({seen}), while the calls before it ({', '.join(r.name for r in earlier[-3:])}) write "
                f"outputs within {_fmt(sources)}",
                "the error starts in the script's own code between those calls, outside every module (a pooling, "
                "a slice or a reshape written otherwise than golden's)")
    action = (f"check the code that computes {record.name}'s {slot} from {earlier[-1].name}'s output against "
              "golden's (which tokens or positions it takes, how it reduces them)")
    return replace(verdict, evidence=evidence, action=action, module=None)


def _as_overflow(scan, record: OpRecord, verdict: Verdict | None) -> Verdict | None:
    """A module call that departs far beyond what its 16-bit dtype's rounding can move it (`statistics_verdict`'s
    kernel_bug), in a step whose float status the target raised and golden's did not, with no loss scale to
    explain it: an overflow inside the call (a module call records no float status of its own)."""
    if verdict is None or verdict.cls != "kernel_bug" or (record.compute_dtype or output_dtype(record)) not in (
            "float16", "bfloat16") or output_scale(scan, record) is not None:  # (an overflow scales nothing)
        return verdict
    target = {s.step: s for s in scan.target.steps()}.get(record.step)
    golden = {s.step: s for s in scan.golden.steps()}.get(record.step)
    if target is None or not target.overflow or (golden is not None and golden.overflow) or \
            target.loss_scale not in (0.0, 1.0):
        return verdict
    evidence = verdict.evidence[:2] + (
        f"the target raised the float status at step {record.step} and golden did not, with no loss scale: an "
        f"overflow inside this call, beyond {record.compute_dtype or output_dtype(record)}, explains a departure "
        "that rounding cannot",)
    action = (f"find the op that overflows: collect step {record.step} of {record.name} again at op level "
              f"(ptt.dump(path, mode=\"dump\", steps=[{record.step}], modules=[{record.name!r}])) or run "
              "`precision-tool zoom`; then keep that op in float32 or scale its inputs down")
    return replace(verdict, cls="overflow", evidence=evidence, action=action)


def _judge_output(scan, record: OpRecord) -> Verdict | None:
    """``record``'s output departs beyond its inputs' and its children's outputs' error."""
    a = scan._attribute(record, replay=False)
    if _unsized(scan, record, a.inherited):
        return None
    forward = _forward_error(scan, record)
    if forward > 0.0:
        return None  # a backward that reads forward values rounding moved: a ReLU's mask flips near 0 (one
        # float32 unit of other kernels' rounding, 8.7e-7, moved a ResNet ReLU's input gradient by 0.8 %)
    if record.direction == "backward" and not _own_input_gradients(scan, record):
        return None
    carried = [scan._attribute(c, replay=False).observed for c in _descendants(scan, record)]
    a = replace(a, inherited=max([a.inherited, forward] + carried))
    if (a.overflowed or a.new_nan) and not a.inputs_off and a.inherited < SIGNIFICANT_ERROR:
        return scan._judge_overflow(record, a, harmful=lambda r: _harmful(scan, r))
    # golden's output times another constant counts from SIGNIFICANT_ERROR on, below a 16-bit dtype's noise too;
    # values carry their inputs' rounding in full, statistics at its second order and a scale in full
    scale = output_scale(scan, record) if record.direction == "forward" and a.observed >= SIGNIFICANT_ERROR else None
    if scale is not None and not stats_only(record) and a.observed <= INTRODUCED_EXCESS * a.inherited:
        a = replace(a, inherited=max(statistics_departure(scan, [record], "input"),
                                     statistics_departure(scan, _descendants(scan, record), "output")))
    if a.observed <= INTRODUCED_EXCESS * a.inherited or (a.observed < noise_floor(output_dtype(record)) and
                                                         scale is None):
        return None
    changed = _changed_integers(scan, record)
    if changed:
        return _integer_verdict(scan, record, a, changed)
    exact = record.direction == "forward" and a.inherited == 0.0
    floor = _significant(scan, output_dtype(record), exact)
    floor = min(floor, SIGNIFICANT_ERROR) if scale is not None else floor
    if exact and stats_only(record) and floor == EXACT_INPUTS_FLOOR and extremes_grid_of(scan, record, None):
        floor = noise_floor("float32")  # its extremes on a narrower grid: the format is the evidence, not the size
    observed = _unreduced_error(scan, record) if stats_only(record) and a.inherited > 0.0 else a.observed
    if observed < floor or observed <= INTRODUCED_EXCESS * a.inherited:
        return None
    a = replace(a, observed=observed)
    if not _harmful(scan, record, floor if exact or scale is not None else None):
        return None
    scan.result.attributions.append(a)
    verdict = statistics_verdict(record, a, measured=not stats_only(record), scale=scale)
    return _narrower_inside(scan, record, record, a, verdict)


def _narrower_inside(scan, record: OpRecord, holder: OpRecord, a, verdict: Verdict, slot: str | None = None) \
        -> Verdict:
    """``verdict`` (on ``record``, whose error ``holder``'s tensors show: its outputs, or its input ``slot``)
    made precision_loss where a float32 call of a float32 run computed in a narrower format inside: its tensor lies
    wholly on float16's or bfloat16's grid where golden's does not (`grid`), or, on inputs golden's to the last bit,
    it departs from EXACT_INPUTS_FLOOR to REWRITE_FLOOR: over 1,000 units of float32 (two right float32 kernels
    part by under 300 on such inputs, the math attention and a flash kernel's reductions at most 1.5e-5), within
    two of float16 (its rounding moves a Linear's output 2.5e-4 to 4e-4, an attention's through a float16 softmax
    2e-4; bfloat16's, 3e-3, passes REWRITE_FLOOR). From statistics neither shows: no values to lie on a grid, and
    a lower bound does not size a departure (a softmax over the wrong axis shows 1.6e-4 of its 0.6 %)."""
    if verdict.cls != "kernel_bug" or (record.compute_dtype or output_dtype(record)) != "float32" or \
            not _runs_float32(scan):
        return verdict
    fmt = extremes_grid_of(scan, holder, slot) if stats_only(holder) else grid_of(scan, holder, slot)
    if fmt is not None and stats_only(holder):
        found = (f"its {slot or 'float32 output'}'s smallest and largest values are {fmt} values (golden's are not): "
                 f"{'the code before it' if slot is not None else 'it'} computes in {fmt} and casts the result back "
                 "to float32")
    elif fmt is not None:
        shown = f"its {slot}" if slot is not None else "its float32 output"
        found = (f"{shown} holds only {fmt} values (every one on {fmt}'s grid, golden's mostly between): "
                 f"{'the code before it' if slot is not None else 'it'} computes in {fmt} and casts the result "
                 "back to float32")
    elif stats_only(holder):
        return verdict
    elif a.inherited == 0.0 and a.observed < REWRITE_FLOOR:
        found = (f"on inputs golden's to the last bit it departs {_fmt(a.observed)}: over 1,000 units of float32's "
                 "rounding, within two of float16's: something inside computes in float16 (or another function "
                 "that close to golden's)")
    else:
        return verdict
    action = (f"find the op that computes in {fmt or 'a narrower format'}: run `precision-tool zoom`, or collect "
              f"step {record.step} again at op level (ptt.dump(path, mode=\"dump\", steps=[{record.step}], "
              f"modules=[{record.name!r}])); then keep it in float32 (drop the cast, or its autocast region)")
    return replace(verdict, cls="precision_loss", evidence=verdict.evidence[:2] + (found,), action=action)


def _judge_own_code(scan, record: OpRecord, children: list[OpRecord]) -> Verdict | None:
    """The first child of ``record`` that reads error its parent's own code introduced: an input that departs
    by SIGNIFICANT_ERROR, beyond its dtype's noise, and more than INTRODUCED_EXCESS times the parent's inputs'
    error and the outputs' of the children that returned before it, where the child's output departs too (the
    reader diverges). What the parent hands on, its output, must depart beyond its inputs and by 1/INTRODUCED_EXCESS
    of that input's departure at least: a departure its own code absorbs (a layer scale of 1e-6, subnormal in
    float16, on a residual branch) harms nothing, and one far beyond its output's is not what golden's child read
    element by element (rows that a routing decision, flipped by rounding, sorted otherwise; module calls record
    no integers to tell)."""
    a = scan._attribute(record, replay=False)
    # (a reduction's output can lose to cancellation the noise its inputs' statistics do not show; inputs whose
    # statistics are golden's to the last bit hide none: a pooler's max for golden's mean, the first step)
    handed = _unreduced_error(scan, record) if stats_only(record) and a.inherited > 0.0 else a.observed
    floor = _significant(scan, output_dtype(record), a.inherited == 0.0)
    rounded = floor == EXACT_INPUTS_FLOOR and stats_only(record) and any(  # a child reads values on a 16-bit grid:
        extremes_grid_of(scan, c, t.slot) for c in children for t in c.inputs)  # the format is the evidence (a
    if handed < (noise_floor("float32") if rounded else floor) or handed <= INTRODUCED_EXCESS * a.inherited:
        return None  # residual and a norm hand on 4 % of a rounding's 2.4e-4)
    sources = a.inherited
    largest = max((t.stats.count for t in record.inputs if is_float(t.dtype)), default=0)
    for child in children:
        if _unsized(scan, child, sources):
            return None
        b = scan._attribute(child, replay=False)
        departed = _departed_input(scan, child, sources, largest if stats_only(child) and sources > 0.0 else 0)
        if departed is not None and b.observed >= _significant(scan, output_dtype(child), sources == 0.0):
            slot, error = departed
            if INTRODUCED_EXCESS * handed < error and not (rounded and extremes_grid_of(scan, child, slot)):
                return None  # absorbed, or not paired element by element
            a = replace(a, observed=error, inherited=sources)
            scan.result.attributions.append(a)
            return _narrower_inside(scan, record, child, a, _own_code_verdict(record, child, slot, a), slot)
        sources = max(sources, b.observed)
    return None


def _unsized(scan, record: OpRecord, inherited: float) -> bool:
    """From statistics, in a run that computes in float32: inputs whose lower bound departs beyond float32's
    noise carry an error statistics cannot size (positions looked up one off permute rows, which moves no
    statistic: 1.3 % at the lookup, 0.5 % at a later attention's input, 7 % inside it), so no ratio to it
    tells where an error starts; the module it started in was passed, or was not recorded."""
    return stats_only(record) and inherited > noise_floor("float32") and _runs_float32(scan)


def _significant(scan, dtype: str, exact: bool = False) -> float:
    """The least departure of a module call's tensor that counts (`_diverging`): SIGNIFICANT_ERROR and beyond
    ``dtype``'s noise, or in a run that computes in float32, for a float32 tensor, REWRITE_FLOOR: thousands of
    times float32's rounding, the departure at which op level judges another implementation of a module (a
    hand-written GELU departs 0.97 %, inputs exact; nothing inside a module call is recorded to replay). With
    ``exact``, where what the call read is golden's to the last bit, EXACT_INPUTS_FLOOR (`_narrower_inside`)."""
    if dtype == "float32" and _runs_float32(scan):
        return EXACT_INPUTS_FLOOR if exact else REWRITE_FLOOR
    return _diverging(dtype)


def _runs_float32(scan) -> bool:
    """`omissions.runs_float32` for a dump of module calls: it declares float32, and most of the float outputs of
    its first step's forward calls are float32."""
    known = getattr(scan, "_modules_float32", None)
    if known is None:
        dtypes = [t.dtype for r in scan.step_records if r.is_module and r.direction == "forward"
                  for t in r.outputs if is_float(t.dtype) and t.stats.count]
        known = scan._modules_float32 = declares_float32(scan.target) and \
            sum(d == "float32" for d in dtypes) * 2 > len(dtypes)
    return known


def _departed_input(scan, child: OpRecord, sources: float, smallest: int) -> tuple[str, float] | None:
    """(slot, error) of ``child``'s first float input that departs beyond ``sources``, or None. An input whose
    size differs from golden's (a routing decision that rounding flipped chose other rows) is no evidence, nor,
    from statistics, one smaller than ``smallest`` values (a reduction can lose to cancellation what its
    inputs' noise, invisible in their statistics, carries)."""
    view = scan.views.get(id(child)) or GoldenView(scan.golden, [])
    sizes = {t.slot: t.stats.count for t in child.inputs}
    for slot, e in pair_errors(scan.golden, scan.target, child, view, "input"):
        floor = _significant(scan, child.tensor(slot).dtype, sources == 0.0)
        if math.isfinite(e.error) and not (e.overflowed or e.new_nan) and sizes.get(slot, 0) >= smallest \
                and e.error >= floor and e.error > INTRODUCED_EXCESS * sources:
            return slot, e.error
    return None


def _own_code_verdict(record: OpRecord, child: OpRecord, slot: str, a) -> Verdict:
    verdict = statistics_verdict(record, a, measured=not stats_only(child))
    seen = "its statistics show" if stats_only(child) else "measured"
    evidence = (f"a module-level dump: {child.name} reads {slot} {_fmt(a.observed)} from golden ({seen}), while "
                f"{record.name}'s inputs and the outputs of its children called before are within "
                f"{_fmt(a.inherited)}",
                f"the error starts in {record.name}'s own code between its children (no op inside it was "
                "recorded)") + verdict.evidence[2:]
    return replace(verdict, evidence=evidence)


def _harmful(scan, record: OpRecord, least: float | None = None) -> bool:
    """A module call that reads ``record``'s output departs by `_significant` (golden's calls, by fingerprint), or
    ``least`` where that is lower, or holds NaN or inf where golden's is finite, or the call ``record`` runs in
    departs (`Scanner._harmful`)."""
    def threshold(dtype: str) -> float:
        return _significant(scan, dtype) if least is None else min(_significant(scan, dtype), least)
    golden = scan._golden_of(record)
    if golden is not None:
        written = {fingerprint(t) for t in golden.outputs if is_float(t.dtype) and t.stats.count}
        prefix = record.name + "/"
        for other in scan.golden_records:
            if other.exec_index <= golden.exec_index or not other.is_module or other.direction != golden.direction \
                    or record.name.startswith(other.name + "/") or other.name.startswith(prefix) \
                    or not any(fingerprint(t) in written for t in other.inputs if t.stats.count):
                continue
            reader = scan._target_of(other)
            if reader is None:
                continue
            b = scan._attribute(reader, replay=False)
            if b.observed >= threshold(output_dtype(reader)) or b.new_nan or b.overflowed:
                return True  # (values non-finite where golden's are not are not scored: they diverge too)
    return scan._harmful(record, threshold) or any(
        max(b.observed, b.inherited) >= threshold(output_dtype(later))
        for later, b in ((c, scan._attribute(c, replay=False)) for c in _later_siblings(scan, record)))


def _later_siblings(scan, record: OpRecord) -> list[OpRecord]:
    """The calls its parent's own code makes after ``record`` returned, in the same call of the parent: what reads
    its output where no module call reads it whole (a residual sum the parent computes, then a LayerNorm)."""
    parent = record.name.rsplit("/", 1)[0] if "/" in record.name else None
    found, seen = [], False
    for other in scan.step_records if parent is not None else ():
        if other is record:
            seen = True
        elif seen and other.is_module and other.direction == record.direction:
            if other.name == parent:
                break
            if other.name.startswith(parent + "/") and "/" not in other.name[len(parent) + 1:]:
                found.append(other)
    return found


def _forward_calls(scan, record: OpRecord) -> list[OpRecord]:
    """For a backward module call, the forward calls of its module in the step: the values its backward reads
    (saved inputs and outputs) carry their error, which is inherited too."""
    if record.direction != "backward":
        return []
    known = getattr(scan, "_forward_calls", None)
    if known is None or known[0] is not scan.step_records:  # by name, once a step (not a pass per backward call)
        calls: dict[str, list[OpRecord]] = {}
        for r in scan.step_records:
            if r.is_module and r.direction == "forward":
                calls.setdefault(r.name, []).append(r)
        known = scan._forward_calls = (scan.step_records, calls)
    return known[1].get(record.name, [])


def _forward_error(scan, record: OpRecord) -> float:
    """The largest departure (observed or inherited) of the forward calls of a backward call's module."""
    return max((max(f.observed, f.inherited) for f in (scan._attribute(c, replay=False)
                                                       for c in _forward_calls(scan, record))), default=0.0)


def _own_input_gradients(scan, record: OpRecord) -> bool:
    """Whether the gradients a backward module call records at its inputs are its own: a gradient reaches its
    outputs, and no other module call (but those it runs in and those it makes) read its inputs in golden's
    forward. A tensor's gradient is recorded once all its readers' have added up (a rotary embedding reads the
    hidden states for their dtype only; its "input gradient" is the decoder layers')."""
    if not any(is_float(t.dtype) and t.stats.count for t in record.inputs):
        return False
    readers = _forward_readers(scan)
    name = record.name
    read = {f for f, names in readers.items() if name in names}
    return not any(other != name and not name.startswith(other + "/") and not other.startswith(name + "/")
                   for f in read for other in readers[f])


def _forward_readers(scan) -> dict[tuple, set[str]]:
    """The names of golden's forward module calls of the step that read each float tensor (by fingerprint)."""
    known = getattr(scan, "_forward_readers", None)
    if known is None or known[0] is not scan.golden_records:
        readers: dict[tuple, set[str]] = {}
        for r in scan.golden_records:
            if r.is_module and r.direction == "forward":
                for t in r.inputs:
                    if is_float(t.dtype) and t.stats.count:
                        readers.setdefault(fingerprint(t), set()).add(r.name)
        known = scan._forward_readers = (scan.golden_records, readers)
    return known[1]


def _descendants(scan, record: OpRecord) -> list[OpRecord]:
    """The module calls made inside this call of ``record`` (recorded before it, after its previous call, as
    calls are recorded when they return), in the order they returned."""
    prefix = record.name + "/"
    found = []
    for other in scan.step_records:
        if other is record:
            break
        if other.is_module and other.direction == record.direction:
            if other.name == record.name:
                found = []  # an earlier call of the same module: what ran inside it was not this call's
            elif other.name.startswith(prefix):
                found.append(other)
    return found


def _children(scan, record: OpRecord) -> list[OpRecord]:
    """`_descendants` that no other recorded descendant encloses: the calls ``record``'s own code made."""
    inside = _descendants(scan, record)
    names = {r.name for r in inside}
    return [r for r in inside if not any(r.name.startswith(n + "/") for n in names)]
