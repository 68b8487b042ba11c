"""Judging at a boundary: module calls and backward groups whose op sequences differ between the runs, and
modules whose backward golden runs and the target does not run at all.

Mixed into `scan.Scanner` (it reads the scan's step records, partner lookups and cached attributions):

* A **rewritten** module call or backward group (`structure.rewritten_modules`, `rewritten_backward`) is the
  culprit when its output diverges beyond its inputs and its dtype's noise, or run again on golden's inputs
  still departs (`updates.module_on_golden_inputs`, `backward_departs`): **precision_loss** at the first op
  inside that is ill-conditioned in its dtype or writes values its dtype cannot hold (below its normal range), an
  overflow or invalid operation at the first op inside that makes one, else **kernel_bug**. A backward group
  that computes fewer gradients than golden's (parameters frozen in the target) is a **kernel_bug** there.
* A **missing backward** (`structure.missing_backward`): golden's backward runs ops in a module and the
  target's runs none there (an output detached). The first such module in golden's order is a **kernel_bug** in
  backward where golden's gradients are not all zero; a group lacking only what golden hands it is passed.

From a stats-mode dump the errors are `errors.stats_split`'s lower bounds. A rewritten backward group is then
judged as a forward op is from statistics: SIGNIFICANT_ERROR at least, on the gradients it computes that hold as
many values as the gradient it reads (a reduced one can lose to cancellation what that gradient's noise carries
unseen); in a 16-bit run from GROUP_FLOOR_16. A call whose input changed on its way in (a forward pre-hook) is
named from statistics too (`changed_on_entry`); one under its dtype's floor becomes a suspect (`unjudged_rewrite`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from precision_tool.analysis.actions import INVALID_ACTION as _INVALID_ACTION
from precision_tool.analysis.actions import keep_fp32 as _keep_fp32
from precision_tool.analysis.actions import listing_short as _listing_short
from precision_tool.analysis.attribution import input_sensitivity, makes_nan_hidden, output_rounding
from precision_tool.analysis.errors import (coarsest_compute, noise_floor, split_error, starts_nonfinite,
                                           stats_only, stats_sensitivity, stats_split)
from precision_tool.analysis.missing import MissingJudge
from precision_tool.analysis.inserted import scaled_gradient
from precision_tool.analysis.omissions import fewer_updates, module_narrower_than_declared
from precision_tool.analysis.overflow import overflow_entry
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.randomness import unequal_draws
from precision_tool.analysis.reductions import amplification, incoming_size
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.analysis.implementations import REWRITE_FLOOR, unjudged_rewrite, unjudged_update
from precision_tool.analysis.updates import (backward_departs, introduced_by_group, module_on_golden_inputs,
                                             permuted, relaid)
from precision_tool.analysis.structure import (Consumers, Rewritten, fingerprint, forward_writers, group_results,
                                              is_copy, module_path)
from precision_tool.compare.judged import gradient_scale
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord

EXACT_FLOOR = 4e-6  # in a float32 run, what a module's ops replayed in float64 on golden's inputs depart from its
# outputs by (and half what they depart by) to compute another function: 64 units of float32, beyond golden's own
# rounding (1e-7 to 1e-6)
GROUP_FLOOR_16 = 0.05  # a backward group of a 16-bit run judged from statistics: beyond what rounding surfaces


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def output_dtype(record: OpRecord) -> str:
    """The dtype of the record's first float output (its compute dtype when it has none)."""
    floats = [t.dtype for t in record.outputs if is_float(t.dtype)]
    return floats[0] if floats else record.compute_dtype


def with_module(verdict: Verdict, module: str) -> Verdict:
    return replace(verdict, module=verdict.module or module)


class RewriteJudge(MissingJudge):
    """The boundary judgements of `scan.Scanner`; see the module docstring."""

    def _judge_rewrite(self, rewrite: Rewritten) -> Verdict | None:
        record = rewrite.target_record
        verdict = unequal_draws(rewrite) or scaled_gradient(  # dropout on in one run only; a gradient scaled
            rewrite, self._members(rewrite), lambda: loss_scale_ratios(self.golden, self.target))  # inserted
        if verdict is not None:
            return verdict
        if rewrite.direction == "backward":
            lacking = self._lacking_results(rewrite)
            if lacking and self._feeds_missing(rewrite, lacking):
                return None
            if lacking:
                return self._lacking_verdict(rewrite, lacking)
        if rewrite.direction == "optimizer":
            members = self._members(rewrite)
            verdict = fewer_updates(rewrite.name, self._golden_group(rewrite), members)
            if verdict is not None:
                return verdict
            unjudged = unjudged_update(rewrite, members, self._golden_group(rewrite), self.target, stats_only(record))
            if rewrite.name in self._reproduced_updates() or unjudged:  # (the same implementation computed
                self._note(unjudged)  # golden's update on golden's inputs at an earlier step)
                return None
        observed, inherited, dtype = self._rewrite_errors(rewrite)
        if self._float32 and rewrite.direction == "forward":  # (a .half()ed LSTM runs no oneDNN kernel: other ops)
            verdict = module_narrower_than_declared(rewrite, self._members(rewrite), observed)
            if verdict is not None:
                return verdict
        # A module that runs other ops than golden's is judged against what it inherits: INTRODUCED_EXCESS times its
        # inputs' error is the margin for rounding. bfloat16's floor (16 units of its last place, 6 %) would pass a
        # module that scales its output by 3 % while its inputs carry 0.3 %: above SIGNIFICANT_ERROR, the excess over
        # its inputs decides (float16's and float32's floors are below it already). float32's floor (16 units, 1e-6) is
        # below what two right algorithms differ by (the math attention against a flash kernel's reductions: 1.5e-5 from
        # inputs within 1e-7): another implementation is judged from REWRITE_FLOOR, where values are compared. From
        # statistics, which show such differences at the second order only, 16 units stand while the parameters are
        # golden's; once an update left training's rounding on them, the parameters a module reads carry error its
        # inputs' does not count (a oneDNN LSTM in a mixed-precision target: 2.5e-5 at least from statistics, 1.5e-4
        # from values, its inputs within 1.2e-6): REWRITE_FLOOR; in a 16-bit run, not judged from statistics.
        exact, forward_stats = stats_only(record) and self._parameters_as_golden(record.step), \
            rewrite.direction == "forward" and stats_only(record)  # (its input changed on entry: a pre-hook)
        entered = self.departures.changed_on_entry(record, self.views.get(id(record))) if forward_stats and \
            record.is_module and inherited >= SIGNIFICANT_ERROR else None
        if entered is not None or forward_stats and not exact and not self._float32:
            return entered  # (SDPA's math backend on bf16 scores 64x larger: 1.7 % from inputs at 6e-5)
        floor = noise_floor(dtype) if rewrite.direction == "optimizer" else \
            min(max(noise_floor(dtype), 0.0 if exact else REWRITE_FLOOR), SIGNIFICANT_ERROR)
        if rewrite.direction == "backward" and stats_only(record):
            # from statistics, as a forward op is judged (`statsjudge`): SIGNIFICANT_ERROR at least, and only in a
            # run that computes in float32, whose rounding noise no gradient's statistics show; a low-precision
            # run's noise, hidden in the incoming gradient's statistics, can surface in what a group computes:
            # there, from GROUP_FLOOR_16 (a loss smoothed by the target alone: 10 %, its inputs within 1e-5)
            floor = max(noise_floor(dtype), SIGNIFICANT_ERROR if self._float32 else GROUP_FLOOR_16)
        introduced = None
        if rewrite.direction == "optimizer" and observed >= floor:  # another implementation (foreach, fused):
            replayed = introduced_by_group(members, self._golden_group(rewrite), self.step_records,  # `updates`
                                           self._golden_of, self.target, self.golden, self.golden_records)
            if replayed is not None and replayed[0] < SIGNIFICANT_ERROR:  # it computes golden's update
                self._reproduced_updates().add(rewrite.name)
                return None
            if replayed is not None and replayed[1]:  # on golden's inputs throughout: it computes another one
                introduced = replayed[0]
        computes, departs, note = self._computes_golden(rewrite, floor) if rewrite.direction == "forward" and \
            observed >= floor and not stats_only(record) else (None, None, None)
        in_float64 = False
        if rewrite.direction == "forward" and REWRITE_FLOOR <= observed and REWRITE_FLOOR < floor and \
                (observed < floor or computes == "inherited") and not stats_only(record):
            # under a 16-bit run's floor, or within it on golden's inputs, another function stands out in exact
            # arithmetic (a hand-written GELU under bf16: 0.9 %, 2.3 units of bfloat16; run again on golden's
            # inputs in float64, still 0.9 %), judged from REWRITE_FLOOR as in a float32 target; a replay
            # departing far beyond the recorded output is no faithful one (a kernel whose float64 form differs)
            departs = self._on_golden_inputs(rewrite, True, exact=True)
            if departs is None or not REWRITE_FLOOR <= departs <= 2.0 * observed:
                self._note(note)
                return None
            computes, note, floor, in_float64 = None, None, REWRITE_FLOOR, True
        elif rewrite.direction == "forward" and self._float32 and EXACT_FLOOR <= observed < floor and \
                observed > INTRODUCED_EXCESS * inherited and not stats_only(record):
            # under REWRITE_FLOOR in a float32 run, where two right implementations part by their rounding (the
            # math attention and a flash kernel, 1.5e-5), float64 takes the rounding away and leaves the function:
            # erf's GELU for GPT-2's tanh one, 1.2e-4, still 1.2e-4 on golden's inputs in float64
            exact = self._on_golden_inputs(rewrite, True, exact=True)
            if exact is not None and max(EXACT_FLOOR, 0.5 * observed) <= exact <= 2.0 * observed:
                departs, computes, note, floor, in_float64 = exact, None, None, EXACT_FLOOR, True
        self._note(note)
        if computes == "inherited":
            return None
        introduced = departs if departs is not None else introduced  # another function, whatever its inputs carry
        if rewrite.direction == "backward" and introduced is None and floor <= observed <= INTRODUCED_EXCESS * \
                inherited and not stats_only(record):  # a change under the incoming gradient's noise: on golden's
            departs = introduced = backward_departs(  # gradient it stands alone
                self._members(rewrite),
                self._golden_group(rewrite), self.step_records, self._golden_of, self.target, self.golden,
                self.golden_records, floor)
        if observed < floor or (introduced is None and observed <= INTRODUCED_EXCESS * inherited):
            if forward_stats and exact and not self._float32 and self.result.suspect is None:  # (16-bit, from
                self.result.suspect = unjudged_rewrite(rewrite, record, observed, inherited, floor, dtype)  # stats)
            return None
        where = {"forward": "module", "backward": "backward of"}.get(rewrite.direction, "the update of")
        shown = ("at least ", " as far as their statistics show") if stats_only(record) else ("", "")
        evidence = [f"in {where} {rewrite.name or 'the ops outside every module'}, {rewrite.describe()}",
                    f"its output is {shown[0]}{_fmt(observed)} from golden while its inputs are within "
                    f"{_fmt(inherited)}{shown[1]}"
                    if rewrite.direction != "optimizer" else
                    f"the parameters and state it writes are {_fmt(observed)} from golden while the gradients it "
                    f"reads are within {_fmt(inherited)}"]
        if introduced is not None:
            precision = "float64" if in_float64 else "golden's precision"
            evidence.append(f"run again on golden's gradients, it still writes results {_fmt(introduced)} from "
                            "golden's: it computes another update" if rewrite.direction == "optimizer" else
                            f"run again on golden's inputs in {precision} (its casts to narrower dtypes left out), "
                            f"it writes outputs {_fmt(introduced)} from golden's: it computes another function")
        found = self._first_inside(rewrite)
        if found is not None and found[1] not in ("ill-conditioned", "underflow"):
            op, kind, _ = found
            if kind == "invalid":
                return Verdict(op.name, "invalid_operation", op.step, op.direction, op.type,
                               tuple(evidence) + (f"{op.name} ({op.type}) turns finite inputs into NaN",),
                               _INVALID_ACTION.format(type=op.type), module=rewrite.name)
            scale = {s.step: s.loss_scale for s in self.target.steps()}.get(op.step)
            verdict = self.overflow_verdict(overflow_entry(op, scale), op, tuple(evidence))
            return with_module(verdict, rewrite.name)
        if found is not None and (departs is None or departs * INTRODUCED_EXCESS < observed):  # (departing as far
            # in golden's precision, it is not the precision: a LayerNorm's variance summed, not averaged)
            op, kind, sensitivity = found[0], found[1], found[2]
            evidence.append(f"{op.name} ({op.type}, in {op.compute_dtype}) is ill-conditioned: rounding its own "
                            f"inputs to {op.compute_dtype} moves its output by {sensitivity:.3g}"
                            if kind == "ill-conditioned" else
                            f"{op.name} ({op.type}, in {op.compute_dtype}) writes values {op.compute_dtype} cannot "
                            f"hold: its exact output on its own inputs, rounded to its output dtype, loses "
                            f"{sensitivity:.3g} (values below the format's normal range)")
            return Verdict(op.name, "precision_loss", op.step, op.direction, op.type, tuple(evidence),
                           _keep_fp32(op.type) + f", or go back to golden's {_listing_short(rewrite.golden_ops)}",
                           module=rewrite.name)
        if computes == "precision":
            if not self._outcome_diverges(record.step):
                return None  # an expected loss, noted by `_computes_golden`: the step's loss stays golden's
            evidence.append("run again on golden's inputs with its casts to narrower dtypes left out, it writes "
                            "golden's outputs: it computes golden's function, and its precision loses this much")
            return Verdict(rewrite.name, "precision_loss", record.step, rewrite.direction, record.type,
                           tuple(evidence), f"compute {rewrite.name} in float32 (no casts to narrower dtypes inside "
                           f"it), or go back to golden's {_listing_short(rewrite.golden_ops)}", module=rewrite.name)
        action = (f"the target's {rewrite.name or 'code outside every module'} computes differently from golden's: "
                  f"check that implementation against golden's {_listing_short(rewrite.golden_ops)}")
        if rewrite.direction == "optimizer":
            action = (f"the target's {rewrite.name} updates differently from golden's: check that its state (momentum "
                      "or moment buffers) is kept across steps, not reset or re-created, and that both runs use the "
                      "same optimizer and options")
        added = self._added_forward(rewrite) if rewrite.direction == "backward" else None
        if added is not None:  # the gradient of an op only the target's forward runs (a forward under a 16-bit
            # run's noise, where a 2 % scale stands out against 8 times its inputs' error only in backward)
            where = module_path(added.name) or "code outside every module"
            return Verdict(added.name, "kernel_bug", added.step, "forward", added.type, (
                f"the target's forward runs {added.name} ({added.type}), which golden's {where} does not run; its "
                "backward shows what it changes", *evidence),
                f"the target's {where} runs {added.type} where golden's does not: check that code against golden's",
                module=module_path(added.name) or None)
        # ops outside any module (a loss computed in the training loop) have no module path: name the op
        return Verdict(rewrite.name or record.name, "kernel_bug", record.step, rewrite.direction,
                       record.type, tuple(evidence), action, module=rewrite.name or None)

    def _added_forward(self, rewrite: Rewritten) -> OpRecord | None:
        """The first forward op, of a type golden's module never runs there, that only the target runs and whose
        autograd node ran ops of this rewritten backward group: where the difference the group shows began."""
        forward_ops = {m.attrs.get("forward_op") for m in self._members(rewrite) if isinstance(m.attrs, dict)}
        for record in self.step_records:
            if record.direction != "forward" or record.name not in forward_ops or record.is_module \
                    or is_copy(record.type) or self._golden_of(record) is not None:
                continue
            scope = module_path(record.name)
            if not any(g.type == record.type and g.direction == "forward" and module_path(g.name) == scope
                       for g in self.golden_records if g.step == record.step):
                return record
        return None

    def _members(self, rewrite: Rewritten) -> list[OpRecord]:
        """The target's ops of a rewritten group, in order."""
        return [r for r in self.step_records if (r.direction, r.name) in rewrite.members and not r.is_module]

    def _note(self, note: str | None) -> None:
        if note is not None and note not in self.result.notes:
            self.result.notes.append(note)

    def _computes_golden(self, rewrite: Rewritten, floor: float) -> tuple[str | None, float | None, str | None]:
        """What the target's ops of a rewritten module call write when run again on golden's inputs
        (`updates.module_on_golden_inputs`): ("inherited", None) when golden's outputs within ``floor`` (its
        inputs' rounding, amplified by the function golden computes too, as for a paired op); ("precision", None)
        when only with its casts to narrower dtypes left out (golden's function in another precision: SDPA's math
        backend on bf16 queries and keys of large scores); (None, error) when even so they depart by ``error``
        (another function: a 2 % scale under bf16 autocast, its inputs at 1.5 %); (None, None) unknown. Third,
        the note a verdict of none leaves (`_note`), or None."""
        error = None
        for kind, widened in (("inherited", False), ("precision", True)):
            error = self._on_golden_inputs(rewrite, widened)
            if error is not None and error < floor:
                how = "" if not widened else ", its casts to narrower dtypes left out,"
                return kind, None, (f"{rewrite.name}: runs other ops than golden's and departs beyond its inputs, "
                                    f"but run again on golden's inputs{how} it writes golden's outputs within "
                                    f"{_fmt(error)}")
        return None, error, None

    def _on_golden_inputs(self, rewrite: Rewritten, widened: bool, exact: bool = False) -> float | None:
        """What a rewritten module call's ops write, run again on golden's inputs (``widened``: their casts to
        narrower dtypes left out; ``exact``: in float64), departs from golden's outputs by, or None
        (`updates.module_on_golden_inputs`)."""
        members = self._members(rewrite)
        if rewrite.golden_record is None or not members:
            return None
        return module_on_golden_inputs(members, rewrite.target_record, rewrite.golden_record, self.step_records,
                                       self._golden_of, self.target, self.golden, self.golden_records, widened,
                                       exact)

    def _parameters_as_golden(self, step: int) -> bool:
        """Whether the target starts ``step`` from golden's parameters: the first step, or every step before
        wrote, in its optimizer, tensors of the same statistics as golden's (equal values give equal ones)."""
        known = getattr(self, "_as_golden", None)
        if known is None:
            known = self._as_golden = {}
        if step not in known:
            earlier = [s.step for s in self.target.steps() if s.step < step]
            if step == self._first_step or not earlier:
                known[step] = True
            else:
                last = earlier[-1]

                def written(dump):
                    return sorted(fingerprint(t) for _, t in group_results(
                        [r for r in dump.ops(step=last, direction="optimizer") if not r.is_module]))

                known[step] = self._parameters_as_golden(last) and written(self.target) == written(self.golden)
        return known[step]

    def _reproduced_updates(self) -> set:
        """Names of the optimizer rewrites whose replay on golden's inputs gave golden's update."""
        found = getattr(self, "_updates_reproduced", None)
        if found is None:
            found = self._updates_reproduced = set()
        return found

    def _rewrite_errors(self, rewrite: Rewritten) -> tuple[float, float, str]:
        record = rewrite.target_record
        if rewrite.direction == "forward":
            a = self._attribute(record, replay=False)
            if (a.overflowed or a.new_nan) and stats_only(record):  # statistics cannot score around them
                return math.inf, a.inherited, output_dtype(record)
            return a.observed, a.inherited, output_dtype(record) if self._float32 else \
                coarsest_compute(self._members(rewrite), output_dtype(record))  # (a 16-bit run: its ops' rounding)
        golden_last = rewrite.golden_record
        inherited = self._incoming_error(rewrite) if rewrite.direction == "backward" else 0.0
        observed = self._results_error(rewrite, inherited if self._float32 and stats_only(record) else None)
        if observed is None and not stats_only(record):
            observed = self._slot_error(record, golden_last, "output_0")
        if observed is None:
            return 0.0, 0.0, output_dtype(record)  # statistics of reduced gradients only: nothing to judge
        if rewrite.direction == "optimizer":
            return observed, self._handed_in_error(rewrite), output_dtype(record)
        saved = [self._attribute(w, replay=False).observed for w in forward_writers(self._members(rewrite),
                                                                                   self.step_records)]
        return observed, max([inherited, *saved]), output_dtype(record)  # (what forward saved)

    def _incoming_error(self, rewrite: Rewritten) -> float:
        """The error of the gradient a rewritten backward group reads, against golden's. Where the two are laid out
        differently (the target's group reads it before a view golden's reads it after: a transpose between a
        batch-first module and its time-major kernel), element-wise errors mean nothing: it is measured where
        golden's op that wrote it and that op's target partner wrote it."""
        first, golden_first = rewrite.target_first, rewrite.golden_first
        measured = self._slot_error(first, golden_first, rewrite.target_slot, rewrite.golden_slot)
        try:
            tensor, golden = first.tensor(rewrite.target_slot), golden_first.tensor(rewrite.golden_slot)
        except KeyError:
            return measured
        if tuple(tensor.shape) == tuple(golden.shape):
            return measured
        writer = self.consumers["backward"].producer(golden_first, rewrite.golden_slot)
        partner = self._target_of(writer) if writer is not None else None
        key = fingerprint(golden)
        slot = next((t.slot for t in writer.outputs if t.stats.count and fingerprint(t) == key), None) \
            if partner is not None else None
        return measured if slot is None else self._slot_error(partner, writer, slot)

    def _results_error(self, rewrite: Rewritten, reduced: float | None = None) -> float | None:
        """The largest error among the gradients a rewritten backward group produces: each result no later op of
        the group reads, against golden's result of the same size (the closest, where several are). A group
        computes a gradient per input (activation, weight, bias), not only its last op's; None when no result
        has a golden partner of its size. Where every result golden's group hands on is read by a paired op
        outside it, the errors are measured there instead (`_consumed_error`). From statistics, a reduced
        result (fewer values than the incoming gradient) counts only given ``reduced``, the incoming gradient's
        error, and where it departs beyond what that error can make of it (`reductions.amplification`)."""
        target = self._members(rewrite)
        golden = [r for r in self.golden_records if r.direction == rewrite.direction and not r.is_module
                  and module_path(r.name) == rewrite.name]
        candidates = group_results(golden)
        consumed = self._consumed_error(rewrite, candidates)
        if consumed is not None:
            return consumed
        smallest = incoming_size(rewrite)
        mine = [(record, tensor) for record, tensor in group_results(target)
                if tensor.has_data or tensor.stats.count >= smallest or reduced is not None]  # from statistics, a
        # reduced gradient (a weight's, a bias's) can lose to cancellation what the incoming gradient carries
        errors = []
        for count in {tensor.stats.count for _, tensor in mine}:
            ours = [(r, t) for r, t in mine if t.stats.count == count]
            theirs = [(g, t) for g, t in candidates if t.stats.count == count]
            if not theirs:
                continue
            # where one side hands on more results of a size than the other, the extra ones are intermediates
            # that side's own ops read through views (a per-time-step kernel's slices of a sequence's gradient):
            # each result of the side with fewer is matched to its closest on the other
            pairs = [[self._result_error(r, g, t.slot, u.slot) for g, u in theirs] for r, t in ours]
            if not ours[0][1].has_data and count < smallest:  # (``reduced`` given: beyond its bound, or none)
                pairs = [[e if e > INTRODUCED_EXCESS * reduced * amplification(rewrite, target, t, u.stats.norm)
                          else 0.0 for e, (_, u) in zip(row, theirs)] for row, (_, t) in zip(pairs, ours)]
            if len(ours) <= len(theirs):
                errors.extend(min(row) for row in pairs)
            else:
                errors.extend(min(column) for column in zip(*pairs))
        return max(errors, default=None)

    def _result_error(self, record: OpRecord, golden_record: OpRecord, slot: str, golden_slot: str) -> float:
        """`_slot_error` of two results of a backward group, in the layout that matches them best where their
        shapes differ: one implementation hands a sequence's gradient on batch-first and flattened, another
        time-major (`same_values_in_layout`)."""
        measured = self._slot_error(record, golden_record, slot, golden_slot)
        tensor, golden = record.tensor(slot), golden_record.tensor(golden_slot)
        if measured < SIGNIFICANT_ERROR or not (tensor.has_data and golden.has_data) or \
                _squeezed(tensor.shape) == _squeezed(golden.shape):
            return measured
        t = self.target.tensor(record.step, record.exec_index, slot)
        g = self.golden.tensor(golden_record.step, golden_record.exec_index, golden_slot)
        scale = gradient_scale(tensor, golden, loss_scale_ratios(self.golden, self.target).get(record.step, 1.0))
        # the target's values in another order of golden's axes, or golden's in another order of the target's
        # (an SDPA kernel hands a query's gradient on as (batch, heads, seq, dim), the eager attention's views
        # as (batch, seq, heads * dim): no order of golden's three axes lays out the target's four)
        laid = itertools.chain(relaid(t, _squeezed(golden.shape)),
                               (values.reshape(g.shape) for values in permuted(t, _squeezed(tensor.shape))))
        return min([measured] + [split_error(values, g, tensor.dtype, scale).error for values in laid])

    def _consumed_error(self, rewrite: Rewritten, golden_results: list) -> float | None:
        """The largest error of what a rewritten backward group hands on, measured where golden's results are read:
        at the target partner of the op outside the group that reads each, in the slot it reads it. Two
        implementations of one kernel's backward can hand the same gradient on in other layouts (the math
        attention's key gradient transposed, the flash kernel's not), which element-wise comparisons of the
        results cannot match; the op that reads it reads it alike in both runs. None unless every result is read
        by such a pair."""
        if rewrite.direction != "backward" or not golden_results:
            return None
        errors = []
        for record, tensor in golden_results:
            if not tensor.has_data:  # statistics: judged by size below, gradients reduced by cancellation left out
                return None
            key = fingerprint(tensor)
            measured = None
            for reader in self.consumers["backward"].of(record, {tensor.slot}):
                partner = self._target_of(reader)
                if module_path(reader.name) == rewrite.name or partner is None or partner.type != reader.type:
                    continue
                slot = next((t.slot for t in reader.inputs if t.stats.count and fingerprint(t) == key), None)
                if slot is not None:
                    measured = self._slot_error(partner, reader, slot)
                    break
            if measured is None:
                return None
            errors.append(measured)
        return max(errors)

    def _handed_in_error(self, rewrite: Rewritten) -> float:
        """The largest measured error of the ops outside ``rewrite`` (paired with golden's) that wrote what its ops
        read: the gradients an optimizer reads, as backward left them. 0 when none is found."""
        members = self._members(rewrite)
        inside = {id(r) for r in members}
        writers = Consumers([r for r in self.step_records if not r.is_module])
        errors = [0.0]
        for record in members:
            for tensor in record.inputs:
                writer = writers.producer(record, tensor.slot) if is_float(tensor.dtype) else None
                if writer is not None and id(writer) not in inside and self._golden_of(writer) is not None:
                    errors.append(self._attribute(writer, replay=False).observed)
        return max(errors)

    def _slot_error(self, record: OpRecord, golden_record: OpRecord, slot: str, golden_slot: str | None = None) \
            -> float:
        try:
            tensor, golden = record.tensor(slot), golden_record.tensor(golden_slot or slot)
        except KeyError:
            return math.inf
        scale = gradient_scale(tensor, golden, loss_scale_ratios(self.golden, self.target).get(record.step, 1.0))
        if not (tensor.has_data and golden.has_data):  # a stats-mode dump: a lower bound (`stats_split`)
            return stats_split(tensor.stats, golden.stats, tensor.dtype, scale).error if tensor.stats.count \
                else math.inf
        t = self.target.tensor(record.step, record.exec_index, slot)
        g = self.golden.tensor(golden_record.step, golden_record.exec_index, golden.slot)
        return split_error(t, g, tensor.dtype, scale).error

    def _first_inside(self, rewrite: Rewritten):
        """The first op inside ``rewrite``, in execution order, that overflows (its outputs reach +-max or inf
        where its inputs do not), makes NaN from finite inputs, or is ill-conditioned in its low-precision
        dtype (rounding its own inputs to it moves its exact output by SIGNIFICANT_ERROR) and not an op golden's
        sequence runs too: (op, kind, value).
        An op whose golden partner does the same (a mask filled with the format's lowest value) computes what
        golden computes."""
        for record in self.step_records:
            if (record.direction, record.name) not in rewrite.members:
                continue
            started = starts_nonfinite(record)
            if started is None and record.overflow and makes_nan_hidden(self.target, record):  # (saturated NaN)
                started = True
            partner = self._golden_of(record)
            if started is not None and (partner is None or starts_nonfinite(partner) != started):
                return record, "invalid" if started else "overflow", None
            # an op golden's sequence runs too (paired by name and type) rounds there as it would in any
            # low-precision run of golden's module: it does not explain why this module's sequence diverges
            if record.compute_dtype in ("float16", "bfloat16") and (partner is None or partner.type != record.type):
                sensitivity = input_sensitivity(self.target, record) if not stats_only(record) else \
                    stats_sensitivity(record)
                if sensitivity is not None and sensitivity >= SIGNIFICANT_ERROR:
                    return record, "ill-conditioned", sensitivity
                lost = output_rounding(self.target, record) if not stats_only(record) else None
                if lost is not None and lost >= SIGNIFICANT_ERROR:
                    return record, "underflow", lost
        return None

    def _golden_group(self, rewrite: Rewritten) -> list[OpRecord]:
        return [r for r in self.golden_records if r.direction == rewrite.direction and not r.is_module
                and module_path(r.name) == rewrite.name]


def _squeezed(shape) -> tuple:
    return tuple(n for n in shape if n != 1)
