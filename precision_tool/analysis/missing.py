"""Backward that the target does not run where golden does (`structure.missing_backward`), and backward groups
that compute fewer gradients than golden's: the boundary judgements `rewrites.RewriteJudge` makes of what is
missing. Mixed into `scan.Scanner` through it (it reads the scan's records, consumers and pending missing
modules)."""

from __future__ import annotations

import math

from precision_tool.analysis.actions import listing_short as _listing_short
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.structure import (MissingBackward, Rewritten, group_results, missing_backward,
                                               module_path, under)
from precision_tool.dump.records import OpRecord


class MissingJudge:
    """What is missing from the target's backward; see the module docstring."""

    pending_extra: dict | None = None  # the step's modules whose backward the target runs only (`_extra_backward`)

    def _feeds_missing(self, rewrite: Rewritten, lacking: list) -> bool:
        """Whether every gradient golden's group computes and the target's does not is read only by modules
        whose backward the target does not run: the group lost it because no gradient flows there."""
        for record, tensor in lacking:
            readers = [r for r in self.consumers["backward"].of(record, {tensor.slot})
                       if module_path(r.name) != rewrite.name]
            if not readers or not all(any(under(module_path(r.name), m.name) for m in self.missing)
                                      for r in readers):
                return False
        return True

    def _lacking_results(self, rewrite: Rewritten) -> list:
        """Golden's gradients of a backward group (results no later op of the group reads, not all zero, read by
        some op after it: `_discarded`) that the target's group computes nothing of the size of."""
        target = self._members(rewrite)
        sizes = {t.stats.count for _, t in group_results(target)}
        return [(record, tensor) for record, tensor in group_results(self._golden_group(rewrite))
                if tensor.stats.count not in sizes and tensor.stats.norm > 0 and not self._discarded(record, tensor)]

    def _discarded(self, record: OpRecord, tensor) -> bool:
        """Whether golden's gradient ``tensor`` is one no op of its step reads, in a step whose optimizer golden
        recorded: no parameter's (the optimizer reads those) but one autograd computes and drops (oneDNN's LSTM
        computes the gradients of the zero initial states it was given; a decomposed LSTM computes none)."""
        if not any(r.direction == "optimizer" for r in self.golden_records):
            return False
        return not self.consumers["any"].of(record, {tensor.slot})

    def _lacking_verdict(self, rewrite: Rewritten, lacking: list) -> Verdict:
        record = rewrite.target_record
        shown = ", ".join(f"{r.type.removeprefix('aten.')} -> {t.shape}" for r, t in lacking[:4])
        evidence = (f"in backward of {rewrite.name}, {rewrite.describe()}",
                    f"golden's backward computes {len(lacking)} gradient(s) there that the target's does not "
                    f"compute at all ({shown}): parameters that golden trains get no gradient in the target")
        action = (f"check that the parameters of {rewrite.name} require grad in the target as in golden (frozen, "
                  "requires_grad_(False), or computed under no_grad or from .detach()ed tensors)")
        return Verdict(rewrite.name, "kernel_bug", record.step, "backward", record.type, evidence, action,
                       module=rewrite.name)

    def _judge_missing_before(self, record: OpRecord) -> Verdict | None:
        """The verdict on the modules whose backward is missing and that golden ran before ``record``'s partner
        (all of them when ``record`` is None: the step's end)."""
        extra = self.pending_extra.pop(id(record), None) if record is not None and self.pending_extra else None
        if extra is not None:
            verdict = self._judge_extra(extra)
            if verdict is not None:
                return verdict
        if record is not None:
            partner = self._golden_of(record)
            if partner is None and record.direction != "optimizer":
                return None
            position = math.inf if partner is None or record.direction == "optimizer" else partner.exec_index
        else:
            position = math.inf
        while self.pending_missing and self.pending_missing[0].golden_records[0].exec_index < position:
            verdict = self._judge_missing(self.pending_missing.pop(0))
            if verdict is not None:
                return verdict
        return None

    def _judge_missing(self, missing: MissingBackward) -> Verdict | None:
        results = group_results(list(missing.golden_records))
        if not any(t.stats.norm > 0 for _, t in results):
            return None  # golden's gradients there are all zero: nothing is lost
        first = missing.golden_records[0]
        after = [m.name for m in self.missing if m is not missing and m.golden_records[0].exec_index > first.exec_index]
        what = "module call(s)" if first.is_module else "op(s)"
        evidence = (f"golden's backward runs {len(missing.golden_records)} {what} in {missing.name} "
                    f"[{_listing_short(missing.golden_ops)}]; the target's runs none there, though both run its "
                    "forward",
                    f"no gradient reaches {missing.name} in the target: {len(results)} gradient(s) golden computes "
                    "there are missing, and its parameters (if any) are not trained")
        if after:
            evidence += (f"nor does it reach {len(after)} module(s) golden's backward runs after it: "
                         + ", ".join(after[:4]) + (" ..." if len(after) > 4 else ""),)
        action = (f"find where the gradient to {missing.name} is cut in the target: a .detach(), torch.no_grad(), "
                  "requires_grad_(False) or a value taken through .data or .item() at its output")
        return Verdict(missing.name, "kernel_bug", first.step, "backward", first.type, evidence, action,
                       module=missing.name)

    def _extra_backward(self, golden: list[OpRecord], target: list[OpRecord]) -> dict:
        """The modules whose backward the target runs and golden's does not run at all (both run their forward),
        by the target's first record there, in a step whose optimizer runs more ops in the target than in golden:
        parameters the target trains and golden does not (`missing_backward` with the runs' roles swapped)."""
        extra = sum(1 for r in target if r.direction == "optimizer") - \
            sum(1 for r in golden if r.direction == "optimizer")
        if extra <= 0 or not any(r.direction == "optimizer" for r in golden):
            return {}
        self._extra_optimizer_ops = extra
        return {id(m.golden_records[0]): m for m in missing_backward(target, golden)}

    def _judge_extra(self, extra: MissingBackward) -> Verdict | None:
        results = group_results(list(extra.golden_records))  # (the target's records: the roles are swapped)
        if not any(t.stats.norm > 0 for _, t in results):
            return None
        first = extra.golden_records[0]
        evidence = (f"the target's backward runs {len(extra.golden_records)} op(s) in {extra.name} "
                    f"[{_listing_short(extra.golden_ops)}]; golden's runs none there, though both run its forward",
                    f"the target computes {len(results)} gradient(s) there that golden does not, and its optimizer "
                    f"runs {self._extra_optimizer_ops} op(s) more than golden's: parameters the target trains and "
                    "golden does not")
        action = (f"check that the parameters of {extra.name} require grad in both runs alike: golden's are frozen "
                  "(requires_grad_(False)), or computed under no_grad or from .detach()ed tensors, and the "
                  "target's are not")
        return Verdict(extra.name, "kernel_bug", first.step, "backward", first.type, evidence, action,
                       module=extra.name)
