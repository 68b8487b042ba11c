"""The culprit scan: every op in execution order, judged against golden, first one that qualifies.

For each step, first step first, the target's records are visited in
execution order (forward, backward, optimizer). Module calls and backward
groups whose op sequences differ from golden's (`structure`) are judged at
their boundary; every other op by its own tensors:

1. **Overflow**: golden's value fits, the target's format could not hold it
   (`errors.split_error`), and the op's inputs are close to golden, or finite
   where golden's are (`errors.overflows_here`): the overflow starts here. A
   NaN from finite inputs is an **invalid operation**. Either is the culprit
   only when *harmful*: an op that reads it diverges, or a loss holds it. A
   mask saturated to -65504 is absorbed by the softmax and only noted.
2. Ops whose observed error stays under their dtype's noise floor are passed,
   unless a computation only the target runs rewrote one of their inputs by
   more than REWRITE_UNITS units of its format (a 2 % scale under bfloat16,
   whose floor is 6 %): that op is the culprit (`departures.rewritten`).
   An op that reads an input changed after the op that wrote it in golden
   (`departures`) points past itself: integers changed by unrecorded integer
   ops (**kernel_bug** at the op reading them), or a value rewritten by ops
   only the target runs, a gradient hook say (**kernel_bug** at that op).
3. The rest are replayed on golden inputs (`attribution`): an op introducing significant error, over
   INTRODUCED_EXCESS times what its dtype explains, is a **kernel_bug** (**fusion** for a fused op).
4. An op whose observed error is far beyond what it inherits and introduces
   is replayed on its *own* recorded inputs: when its recorded output does not
   follow from them, the kernel computes something else (**kernel_bug**);
   when it does, the op only amplified its inputs' error (LayerNorm, Adam's
   update) and is passed. A random draw (dropout's mask) unlike golden's ends
   the scan: nothing after it compares (`randomness`).
5. A forward op that introduces significant error that its dtype explains is
   ill-conditioned there: **precision_loss**, when harmful. In backward, or
   absorbed, it becomes a note: expected dtype loss.

A rewritten module is the culprit when its output diverges beyond its
inputs and its dtype's noise: **precision_loss** at the first op inside that
is ill-conditioned in its dtype (its rounding of its own inputs alone moves
its output by SIGNIFICANT_ERROR), else **kernel_bug**. Those boundary
judgements, and modules whose backward golden runs and the target does not
(no gradient reaches them), are in `rewrites`; a module-level step's
parameter gradients, last, in `param_grads`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from precision_tool.analysis.actions import INVALID_ACTION as _INVALID_ACTION, keep_fp32 as _keep_fp32
from precision_tool.analysis.arguments import called_differently, writes_dtype_constant
from precision_tool.analysis.attribution import (GoldenView, attribute_record, golden_views, pair_errors,
                                                 replay_errors, significant_slots)
from precision_tool.analysis.departure_verdicts import integer_verdict, skipped_verdict, target_only_verdict
from precision_tool.analysis.departures import REWRITE_UNITS, DepartureFinder
from precision_tool.analysis.errors import harm_depth, noise_floor, overflows_here, stats_only
from precision_tool.analysis.fusion import switch_off_action
from precision_tool.analysis.leaves import carried_state, infinities_differ, leaf_verdict, stale_leaf
from precision_tool.analysis.omissions import (declared_format, fewer_gradients, narrower_than_declared,
                                               stray_cast)
from precision_tool.analysis.overflow import overflow_entry, starts_here
from precision_tool.analysis.param_grads import judge_parameter_gradients
from precision_tool.analysis.pairing import align_layout_copies, align_loop_ops
from precision_tool.analysis.randomness import judge_draw
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.reshaped import another_part
from precision_tool.analysis.proportional import unexplained_verdict
from precision_tool.analysis.results import Attribution, OverflowReport, Verdict
from precision_tool.analysis.modulejudge import judge_module
from precision_tool.analysis.statsjudge import judge_statistics, loss_departs
from precision_tool.analysis.rewrites import RewriteJudge, _fmt, output_dtype, with_module
from precision_tool.engine.formats import FORMATS
from precision_tool.analysis.structure import (Consumers, enclosing_module, fingerprint, is_a_loss, missing_backward,
                                               module_path, occurrence_keys as _occurrence_keys, owning_module,
                                               rewritten_backward, rewritten_modules, rewritten_optimizer)
from precision_tool.collect.selection import narrows_ops, starts_late
from precision_tool.compare.cancel import raise_if_interrupted
from precision_tool.compare.matching import TensorPair
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord

MAX_REPLAYS = 5000  # bound on ops replayed by one diagnosis
_HARM_FANOUT = 8


@dataclass
class ScanResult:
    verdict: Verdict | None = None
    attributions: list[Attribution] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    first_module: str | None = None  # the first module whose output diverges beyond its inputs
    judged: set = field(default_factory=set)  # (step, name, direction) of stats-only ops judged against golden's
    suspect: Verdict | None = None  # a none naming a module statistics cannot judge (`unjudged_rewrite`)


class Scanner(RewriteJudge):
    """One scan over a golden/target pair; `run` returns the first culprit and what was seen on the way."""

    def __init__(self, golden, target, report: OverflowReport, fusion_off=None, handled: set[str] = frozenset(),
                 overflow_verdict=None, until_step: int | None = None):
        self.golden, self.target, self.dumps = golden, target, (golden, target)
        self.report, self.fusion_off, self.handled = report, fusion_off, handled
        self.overflow_verdict = overflow_verdict  # (entry, record, extra evidence) -> Verdict
        self.until_step = until_step  # the last step scanned (a boost change makes later steps differ anyway)
        self.result, self.replays = ScanResult(), 0
        self._absorbed, self._dtype_notes = set(), set()  # (names)
        self._declared = declared_format(target)  # float32, an autocast format, or None
        self._float32 = self._declared == "float32"
        self._region = narrows_ops(getattr(target, "metadata", None) or {})  # a zoom region's ops alone

    # -- the scan --------------------------------------------------------------------------------

    def run(self) -> ScanResult:
        golden_steps = {s.step for s in self.golden.steps()}
        steps = [s.step for s in self.target.steps() if s.step in golden_steps
                 and (self.until_step is None or s.step <= self.until_step)]
        if steps and not self._region:  # (in a region's dump the first ops may read what ops left out wrote)
            mismatch = self.leaf_mismatch(steps[0])
            if mismatch is not None:
                self.result.notes.insert(0, mismatch)
                self.result.verdict = Verdict(None, "none", steps[0], evidence=(mismatch,), action=(
                    "collect both runs from the same model, weights, data and seed; then diagnose again"))
                return self.result
        self._first_step = steps[0] if steps and not starts_late(getattr(self.target, "metadata", None) or {}) else None
        for step in steps:
            verdict = self._scan_step(step)
            if verdict is not None:
                self.result.verdict = verdict
                break
            if self.replays >= MAX_REPLAYS:
                self.result.notes.append(f"scan stopped after {MAX_REPLAYS} replays")
                break
        return self.result

    def _scan_step(self, step: int) -> Verdict | None:
        target = [r for r in self.target.ops(step=step) if r.tensors]
        golden = self.golden.ops(step=step)
        self.step_records, self.golden_records = target, golden
        self._loop_partners = align_loop_ops(golden, target) | align_layout_copies(golden, target)
        rewrites = rewritten_modules(golden, target) + rewritten_backward(golden, target) + \
            rewritten_optimizer(golden, target)
        inside = {name for r in rewrites for name in r.members}
        by_record = {id(r.target_record): r for r in rewrites}
        self.views = golden_views(self.golden, target)
        self._measured: dict[int, Attribution] = {}
        self.consumers = {d: Consumers([r for r in golden if r.direction == d]) for d in ("forward", "backward")}
        self.consumers["any"] = Consumers(golden)  # every direction (the loop's ops read a clipping norm of gradients)
        self.forward_writers = Consumers([r for r in target if r.direction == "forward"])  # (the target's)
        self.golden_key = _occurrence_keys(golden)
        self.golden_by_key = {self.golden_key[id(r)]: r for r in golden}
        self.target_key = _occurrence_keys(target)
        self._realign(golden, target)
        self.target_by_key = {self.target_key[id(r)]: r for r in target}
        cut = any(s.step == step and s.cut_short for s in self.target.steps())  # the run failed in it: the rest
        self.missing = [] if cut else missing_backward(golden, target)  # is missing by no op's doing
        self.pending_missing = list(self.missing)
        self.pending_extra = {} if cut else self._extra_backward(golden, target)  # (trained in the target only)
        self.departures = DepartureFinder(self.golden, self.target, golden, target, self._golden_of, self._target_of,
                                          lambda r: self._attribute(r, replay=False))
        modules_only = all(r.is_module for r in target)  # a module-level dump: its modules are judged
        for record in target:
            raise_if_interrupted()  # Ctrl-C stops the scan between two ops even if a finaliser ate it
            verdict = self._judge_missing_before(record) if (self.pending_missing or self.pending_extra) and \
                record.is_module == modules_only and record.direction != "forward" else None
            if verdict is not None:
                return verdict
            if id(record) in by_record:
                verdict = self._judge_rewrite(by_record[id(record)])
            elif record.is_module:
                self._note_module(record)
                if not modules_only:
                    continue
                verdict = judge_module(self, record)
            elif (record.direction, record.name) in inside or record.name in self.handled:  # (from statistics, a
                verdict = carried_state(self, record) if stats_only(record) else None  # rewrite is not replayed)
            else:
                verdict = self._judge_op(record)
            if verdict is not None:
                return verdict
        return self._judge_missing_before(None) or (judge_parameter_gradients(self, step) if modules_only else None)

    def _realign(self, golden: list[OpRecord], target: list[OpRecord]) -> None:
        """Re-pair the ops that pairing by name pairs wrongly (`pairing.align_loop_ops`, `align_layout_copies`)."""
        for record in target:
            if id(record) not in self._loop_partners:
                continue
            partner = self._loop_partners[id(record)]
            self.target_key[id(record)] = self.golden_key[id(partner)] if partner is not None else \
                ("unpaired", record.step, record.direction, record.name)
            self.views[id(record)] = GoldenView(self.golden, [] if partner is None else [
                TensorPair(record, t, partner, partner.tensor(t.slot)) for t in record.tensors
                if t.slot in {g.slot for g in partner.tensors}])

    def leaf_mismatch(self, step: int) -> str | None:
        """Where the two runs already differ before any op: the step's first forward ops, those before the
        first that reads another op's result, read only data and weights; one of them SIGNIFICANT_ERROR
        from golden means different data, weights or seed, unless another (not constant) is golden's exactly
        (a value an op only the target runs wrote is no leaf there). None when they match."""
        golden = self.golden.ops(step=step, direction="forward")
        producers = Consumers(golden)
        golden_key = _occurrence_keys(golden)
        by_key = {golden_key[id(r)]: r for r in golden}
        target = [r for r in self.target.ops(step=step, direction="forward") if r.tensors and not r.is_module]
        target_key = _occurrence_keys(target)
        first = []
        for record in target:
            partner = by_key.get(target_key[id(record)])
            if partner is None:  # an op only the target ran (its model built inside the dump, say)
                continue
            if any(producers.producer(partner, t.slot) is not None for t in partner.inputs):
                break
            first.append(record)
        views = golden_views(self.golden, first)
        written, differ, agree = Consumers(target), None, False  # (written by a max_norm's renorm, say)
        for record in first:
            for slot, error in pair_errors(self.golden, self.target, record, views[id(record)], "input"):
                if error.error >= SIGNIFICANT_ERROR and differ is None and written.rewriter(record, slot) is None:
                    differ = (f"the runs differ before any op: {record.name} reads {slot} {error.error:.3g} away "
                              "from golden, data or weights no op produced: different seed, data or model?")
                stats = record.tensor(slot).stats
                agree = agree or (error.error == 0.0 and stats.max > stats.min)
        # another seed or other data changes every random tensor the first ops read; where one of them (not a
        # constant: a norm's ones read alike under any seed) is golden's exactly, both runs drew the same and the
        # tensor that differs was changed on its own (a parameter initialised or loaded otherwise): the scan names
        # the op that reads it (`omissions.changed_leaf`)
        return None if agree else differ

    def _attribute(self, record: OpRecord, replay: bool) -> Attribution:
        """The record's attribution; its measured errors are read once per scan and kept (readers are
        measured again by every harm check), the replay added on demand."""
        view = self.views.get(id(record)) or GoldenView(self.golden, [])
        measured = self._measured.get(id(record))
        if measured is None:
            measured = self._measured[id(record)] = attribute_record(self.golden, self.target, record, view=view,
                                                                     replay=False)
        if not replay or record.is_module:
            return measured
        self.replays += 1
        notes = list(measured.notes)
        errors = replay_errors(self.golden, self.target, record, view, "npu", notes)
        return replace(measured, introduced=max((e.introduced for e in errors), default=None),
                       expected=max((e.expected for e in errors), default=None), notes=tuple(notes),
                       introduced_at=significant_slots(errors))

    def _judge_op(self, record: OpRecord) -> Verdict | None:
        partner = self._golden_of(record)  # (then: an input that is another part of an output agreeing)
        verdict = fewer_gradients(record, partner, self.step_records, self.golden_records, self.consumers["backward"]) \
            or another_part(record, partner, self.forward_writers, self.consumers, self._golden_of, self.dumps)
        if verdict is not None:
            return verdict
        if not any(t.has_data and is_float(t.dtype) for t in record.outputs) or writes_dtype_constant(record):
            return judge_statistics(self, record) if stats_only(record) else None  # (finfo(float16).min: a mask)
        a = self._attribute(record, replay=False)
        if overflows_here(record, a) and not self._inherits_overflow(record, a):  # a changed mask it reads first
            return self._departed(record, a, math.nan) or self._judge_overflow(record, a)  # (nan: integers only)
        if self._declared:
            verdict = narrower_than_declared(record, self._golden_of(record), a.observed, self._declared) or (
                stray_cast(record, self._golden_of(record), loss_departs(self), self.departures.writers()[1])
                if self._float32 else None)
            if verdict is not None:  # (a round trip whose value a later step reads: an LSTM's carried state)
                self.result.attributions.append(a)
                return verdict
        floor = noise_floor(output_dtype(record))
        if a.observed < floor and record.direction == "forward" and record.step == self._first_step \
                and module_path(record.name):
            # a module's op called with other constants than golden's, its output alike: the constant acts
            # elsewhere (a BatchNorm's momentum on its running statistics); read on the first step only, where
            # both runs start alike
            verdict = called_differently(record, self._golden_of(record), a, agrees=True)
            if verdict is not None:
                self.result.attributions.append(a)
                return verdict
        if a.observed < floor and infinities_differ(record, self._golden_of(record)):  # a mask unlike golden's
            return self._departed(record, replace(a, overflowed=1), floor)  # (its -inf elsewhere, unscored)
        if a.observed < floor or self.replays >= MAX_REPLAYS:
            return self._rewritten(record, a) if a.observed < floor else None
        verdict = self._departed(record, a, floor)
        if verdict is not None:
            return verdict
        if record.step == self._first_step and a.inherited >= (floor if self._float32 else SIGNIFICANT_ERROR) \
                and (module_path(record.name) or not self._region):  # (float32: a weight rounded to 16 bits)
            verdict = self._changed_leaf(record)
            if verdict is not None:
                return verdict
        verdict = stale_leaf(self, record) if record.step != self._first_step and a.inherited >= floor else None
        if verdict is not None:  # (a parameter the update did not reach)
            return verdict
        # once the op departs beyond its inputs; a backward op's numbers only (a custom Function's backward
        # written by hand: its constants are the user's), its strings (its node, the forward op named after it)
        # are how autograd ran it. An update adds a small step to a large parameter: its output departs by less
        # than the gradient it reads when that carries low-precision noise, so the optimizer's arguments (lr,
        # eps, betas, weight decay) are read once its output departs at all
        if record.direction == "optimizer" or a.observed > INTRODUCED_EXCESS * max(a.inherited, 1e-12):
            verdict = self._called_differently(record, a)
            if verdict is not None:
                return verdict
        verdict = judge_draw(self, record, a)  # other random draws than golden's: nothing after compares
        if verdict is not None:
            return verdict
        a = self._attribute(record, replay=True)
        self.result.attributions.append(a)
        if a.introduced is not None and a.introduced >= max(SIGNIFICANT_ERROR, floor) \
                and a.introduced > INTRODUCED_EXCESS * max(a.expected or 0.0, 1e-12) and not a.ill_conditioned:
            return self._kernel_verdict(record, a, f"computes {a.excess:.3g}x worse than {a.compute_dtype} allows")
        unexplained = a.observed >= max(floor, INTRODUCED_EXCESS * max(a.inherited, a.introduced or 0.0))
        verdict = unexplained_verdict(self, record, a, floor) if unexplained else None
        if verdict is not None:  # a kernel that does not compute its op; an op not proportional to the loss scale
            return verdict
        if a.introduced is not None and a.introduced >= SIGNIFICANT_ERROR:
            return self._precision_loss(record, a)
        return None

    def _rewritten(self, record: OpRecord, a: Attribution) -> Verdict | None:
        """Under the noise floor, an op whose output and inputs depart by REWRITE_UNITS of its format: an input a
        computation only the target runs rewrote (`departures.rewritten`) is the culprit there."""
        bound = REWRITE_UNITS * getattr(FORMATS.get(output_dtype(record)), "unit_roundoff", 0.0)
        if record.is_module or min(a.observed, a.inherited) < max(bound, 1e-12):
            return None
        found = self.departures.rewritten(record, self.views.get(id(record)) or GoldenView(self.golden, []))
        if found is None:
            return None
        self.result.attributions.append(a)
        return target_only_verdict(record, found, self.departures.target_only_between(found, record))

    def _departed(self, record: OpRecord, a: Attribution, floor: float) -> Verdict | None:
        """An input changed after the op that wrote it in golden (`departures`): integers changed before this
        op, or a value rewritten by ops only the target runs; the change, not this op, is the culprit."""
        view = self.views.get(id(record)) or GoldenView(self.golden, [])
        found = self.departures.integer(record, view, a)
        self.result.notes.extend(n for n in self.departures.flips if n not in self.result.notes)
        if found is not None:
            self.result.attributions.append(a)
            return integer_verdict(record, a, found)
        found = self.departures.floating(record, view, floor) if a.inherited >= floor else None
        if found is not None:
            self.result.attributions.append(a)
            if found.skipped is not None:
                return skipped_verdict(record, found)
            return target_only_verdict(record, found, self.departures.target_only_between(found, record))
        return None

    def _changed_leaf(self, record: OpRecord) -> Verdict | None:
        """`leaves.leaf_verdict`: a parameter or data the first step reads unlike golden's, changed or rounded."""
        return leaf_verdict(self, record)

    def _called_differently(self, record: OpRecord, a: Attribution) -> Verdict | None:
        # a number computed from the data carries its inputs' error, or at least one rounding of a 16-bit run's
        # (statistics show the inputs' error only as a lower bound)
        fmt = FORMATS.get(self._declared) if self._declared not in (None, "float32") else None
        carried = max(a.inherited if math.isfinite(a.inherited) else 0.0, fmt.unit_roundoff if fmt else 0.0)
        verdict = called_differently(record, self._golden_of(record), a, numbers_only=record.direction == "backward",
                                     carried=carried)
        if verdict is not None:
            self.result.attributions.append(a)
        return verdict

    def _judge_overflow(self, record: OpRecord, a: Attribution, threshold=noise_floor, harmful=None) -> Verdict | None:
        """overflow or invalid_operation at ``record`` if what reads it diverges (``harmful``), else a note."""
        invalid = not a.overflowed
        what = "NaN from finite inputs" if invalid else f"{a.overflowed} value(s) beyond {output_dtype(record)}"
        if not (harmful(record) if harmful is not None else self._harmful(record, threshold)):
            if record.name not in self._absorbed:
                self._absorbed.add(record.name)
                self.result.notes.append(f"{record.name}: {what}, absorbed by the ops that read it "
                                         "(their outputs match golden): harmless")
            return None
        self.result.attributions.append(a)
        extra = starts_here(record, self._golden_of(record), a.inherited)
        if invalid:
            return Verdict(record.name, "invalid_operation", record.step, record.direction, record.type,
                           (f"{record.name} ({record.type}, computing in {record.compute_dtype}) turns finite "
                            f"inputs into {a.new_nan} NaN value(s) at step {record.step}",) + extra,
                           _INVALID_ACTION.format(type=record.type), module=owning_module(record))
        scale = {s.step: s.loss_scale for s in self.target.steps()}.get(record.step)
        entry = next((e for e in self.report.entries if (e.step, e.exec_index) == (record.step, record.exec_index)),
                     None) or overflow_entry(record, scale)
        verdict = self.overflow_verdict(entry, record, extra)
        return with_module(verdict, owning_module(record))

    def _kernel_verdict(self, record: OpRecord, a: Attribution, why: str, recorded: bool = False) -> Verdict:
        """fusion or kernel_bug; ``recorded``: the recorded kernel does not compute what its inputs imply."""
        evidence = [f"observed error {_fmt(a.observed)}, inherited from its inputs {_fmt(a.inherited)}",
                    f"replayed on golden inputs in {a.compute_dtype}: introduces {_fmt(a.introduced)}; "
                    f"its dtype explains {_fmt(a.expected)}"]
        if recorded:
            evidence.append(f"the recorded kernel {why}")
            action = f"the recorded {record.type} kernel does not compute what its inputs imply: check that kernel"
            if record.fused:
                action += f" (a fused op: {switch_off_action(record.pass_name)})"
            return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, tuple(evidence),
                           action, module=owning_module(record))
        if record.fused:
            evidence.append(f"a fused kernel ({record.pass_name}) {why}")
            return Verdict(record.name, "fusion", record.step, record.direction, record.type, tuple(evidence),
                           switch_off_action(record.pass_name), module=owning_module(record))
        evidence.append(f"the kernel {why}")
        return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, tuple(evidence),
                       f"check the {record.type} kernel; replay it with `rerun {record.name}` against golden inputs",
                       module=owning_module(record))

    def _precision_loss(self, record: OpRecord, a: Attribution) -> Verdict | None:
        harmful = record.direction == "forward" and self._harmful(record, lambda _: SIGNIFICANT_ERROR,
                                                                  slots=a.introduced_at or None)
        outcome = harmful and self._outcome_diverges(record.step)
        if not outcome:
            if a.type not in self._dtype_notes:
                self._dtype_notes.add(a.type)
                where = (f"in {record.direction}" if record.direction != "forward" else
                         "absorbed downstream" if not harmful else
                         f"the step's loss and outputs stay within {SIGNIFICANT_ERROR:g} of golden")
                self.result.notes.append(
                    f"expected {a.compute_dtype} loss at {record.name}: introduces {_fmt(a.introduced)}, "
                    f"as its dtype explains ({_fmt(a.expected)}); {where}")
            return None
        evidence = (f"observed error {_fmt(a.observed)}, inherited from its inputs {_fmt(a.inherited)}",
                    f"replayed on golden inputs in {a.compute_dtype}: introduces {_fmt(a.introduced)}; "
                    f"its dtype explains {_fmt(a.expected)}",
                    f"{a.type} is ill-conditioned on these values in {a.compute_dtype}, and the ops reading it "
                    "diverge")
        return Verdict(record.name, "precision_loss", record.step, record.direction, record.type, evidence,
                       _keep_fp32(a.type), module=owning_module(record))

    # -- harm: does anything that reads the result diverge? ----------------------------------------

    def _harmful(self, record: OpRecord, threshold, depth: int = 0, slots=None) -> bool:
        """Whether a reader of ``record``'s outputs (those in ``slots``, default all) diverges by
        ``threshold(dtype)`` and, when the threshold is the noise floor (an overflow), beyond what its inputs'
        unaffected values explain."""
        readers = self.consumers[record.direction].of(self._golden_of(record), slots) \
            if record.direction in self.consumers and self._golden_of(record) is not None else []
        targets = [t for t in (self._target_of(g) for g in readers[:_HARM_FANOUT]) if t is not None and (
            record.direction == "forward" or any(is_float(o.dtype) for o in t.outputs))]  # (anomaly mode's isnan)
        if not targets:  # in backward the gradient goes on to readers unrecorded (a run stopped by the NaN)
            return record.direction != "forward" or bool(self._returned(record, slots) and
                                                          self._module_diverges(record, threshold))
        for reader in targets:
            a = self._attribute(reader, replay=False)
            floor = threshold(output_dtype(reader))
            if a.observed >= floor and (threshold is not noise_floor or a.observed > 4 * a.inherited):
                return True
            if (a.overflowed or a.new_nan) and (is_a_loss(reader) or depth < harm_depth(  # a loss it ruins
                    self.golden, self.target, reader.step) and self._harmful(reader, threshold, depth + 1)):
                return True
        return False

    def _outcome_diverges(self, step: int) -> bool:
        """The step's loss (or, without one, its outermost module's outputs) is SIGNIFICANT_ERROR from golden."""
        losses = [{s.step: s.loss for s in dump.steps()}.get(step, math.nan) for dump in (self.golden, self.target)]
        if all(math.isfinite(x) for x in losses):
            return abs(losses[1] - losses[0]) >= SIGNIFICANT_ERROR * max(abs(losses[0]), 1e-30)
        roots = [r for r in self.step_records if r.is_module and "/" not in r.name]
        if not roots:
            return True
        return self._attribute(roots[-1], replay=False).observed >= SIGNIFICANT_ERROR

    def _inherits_overflow(self, record: OpRecord, a: Attribution) -> bool:
        """Some input already held the overflow when its producer wrote it (not when this op cast it)."""
        golden = self._golden_of(record)
        for slot in a.inputs_off:
            producer = self.consumers[record.direction].producer(golden, slot) \
                if golden is not None and record.direction in self.consumers else None
            source = self._target_of(producer) if producer is not None else None
            if source is None:  # data, a parameter; in a region's dump also an op left out: the record tells
                return not self._region or record.inherited_nonfinite
            b = self._attribute(source, replay=False)
            if b.overflowed or b.new_nan:
                return True
        return False

    def _returned(self, record: OpRecord, slots) -> bool:
        """Whether one of ``record``'s outputs in ``slots`` (default all) is what its enclosing module returns
        (or there is no module to tell). An output that no op reads and no module returns (a batch norm's saved
        mean, read only in backward) reaches nothing in forward."""
        if slots is None:
            return True
        module = enclosing_module(record, self.step_records)
        if module is None:
            return True
        returned = {fingerprint(t) for t in module.outputs}
        return any(fingerprint(t) in returned for t in record.outputs if t.slot in slots)

    def _module_diverges(self, record: OpRecord, threshold) -> bool:
        module = enclosing_module(record, self.step_records)
        if module is None:
            return True
        a = self._attribute(module, replay=False)  # (NaN or inf where golden is finite is not scored: it diverges)
        return a.observed >= threshold(output_dtype(module)) or bool(a.new_nan or a.overflowed)

    def _golden_of(self, record: OpRecord) -> OpRecord | None:
        return self.golden_by_key.get(self.target_key.get(id(record)))

    def _target_of(self, golden_record: OpRecord) -> OpRecord | None:
        return self.target_by_key.get(self.golden_key.get(id(golden_record)))

    def _note_module(self, record: OpRecord) -> None:
        if self.result.first_module is not None or record.direction != "forward" or "/" not in record.name:
            return
        a = self._attribute(record, replay=False)
        if a.observed >= max(noise_floor(output_dtype(record)), SIGNIFICANT_ERROR) \
                and a.observed > INTRODUCED_EXCESS * a.inherited:
            self.result.first_module = record.name

