"""The verdicts on departures (`departures.DepartureFinder`): integers changed before an op, a narrowing cast, a
step golden runs and the target skips, ops only the target runs, ops each run computes a value in, and a loop op
reading gradients still multiplied by the loss scale."""

from __future__ import annotations

import math

from precision_tool.analysis.departures import _LISTED, Departure
from precision_tool.analysis.results import Attribution, Verdict
from precision_tool.analysis.structure import is_copy, module_path
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FORMATS


def integer_verdict(record: OpRecord, a: Attribution, d: Departure) -> Verdict:
    """The op that read changed integers: where the change first shows; the integers were made before it."""
    source = (f"{d.producer.name}, which wrote them in golden, wrote golden's values" if d.producer is not None
              else "no recorded op wrote them (ops on integers alone are not recorded)")
    mask = record.tensor(d.slot).dtype == "bool"
    evidence = (f"{record.name} ({record.type}) reads {'boolean' if mask else 'integer'} {d.slot} that differs from "
                f"golden's in {d.differing} of {d.size} element(s), while its float inputs are within "
                f"{a.inherited:.3g} of golden",
                f"its output is {a.observed:.3g} from golden; {source}",
                "the mask was made otherwise just before it, in the target only (a padding or attention mask left "
                "out, a causal mask shifted), or the runs read different data" if mask else
                "the integers were changed just before it, in the target only (an index offset, a shifted "
                "vocabulary, a clamp), or the runs read different data")
    action = (f"check how the mask {d.slot} of {record.type} is built in the target (which positions it hides: "
              "padding, causality) against golden, and that both runs read the same batch" if mask else
              f"check how {d.slot} of {record.type} is computed in the target (an off-by-one, a vocabulary "
              "mapping, a tokenizer) against golden, and that both runs read the same batch")
    return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence, action,
                   module=module_path(record.name))


def narrowing_cast(d: Departure, between: list[OpRecord]) -> OpRecord | None:
    """The cast that rounds the value to a narrower float format than golden holds it in, when the ops only
    the target runs are all casts or copies; else None."""
    golden = FORMATS.get(d.golden_dtype)
    if golden is None or not between or not all(is_copy(r.type) for r in between):
        return None
    for record in between:
        read = max((FORMATS[t.dtype].unit_roundoff for t in record.inputs if t.dtype in FORMATS), default=0.0)
        narrower = [FORMATS[t.dtype].unit_roundoff for t in record.outputs if t.dtype in FORMATS
                    and FORMATS[t.dtype].unit_roundoff > max(golden.unit_roundoff, read)]
        # a copy within one format rounds nothing (a bf16 layout copy); a departure far beyond the format's
        # rounding is no cast's doing (heads merged in another order: 1.12 in a bf16 run)
        if narrower and not (math.isfinite(d.error) and d.error > _CAST_ROUNDING * max(narrower)):
            return record
    return None


_CAST_ROUNDING = 16  # units of a format's roundoff a cast's departure stays within (inf: an overflow it made)


def cast_verdict(record: OpRecord, d: Departure, cast: OpRecord) -> Verdict:
    """A cast only the target runs rounds a value golden keeps wider: precision lost by that cast, not a kernel."""
    dtype = next(t.dtype for t in cast.outputs if t.dtype in FORMATS
                 and FORMATS[t.dtype].unit_roundoff > FORMATS[d.golden_dtype].unit_roundoff)
    where = module_path(cast.name) or cast.name
    evidence = (f"{cast.name} ({cast.type}), a cast golden does not run, rounds the value to {dtype}; golden "
                f"keeps it in {d.golden_dtype}",
                f"{record.name} ({record.type}) reads it {d.error:.3g} from golden, while {d.producer.name}, which "
                f"wrote it in golden, matches golden within {d.producer_error:.3g}" if d.producer is not None else
                f"{record.name} ({record.type}) reads it {d.error:.3g} from golden, where golden's step reads it as "
                "none of its ops wrote it (a state carried from the step before, a parameter)")
    action = (f"keep {where} in {d.golden_dtype}: remove the cast to {dtype} there (a stray .half() or "
              f".to({dtype}), an autocast region), or compute it in {d.golden_dtype} on purpose")
    return Verdict(cast.name, "precision_loss", cast.step, cast.direction, cast.type, evidence, action,
                   module=module_path(cast.name))


def skipped_verdict(record: OpRecord, d: Departure) -> Verdict:
    """The golden op the target does not run, which wrote what ``record`` reads in golden."""
    op = d.skipped
    evidence = (f"{record.name} ({record.type}) reads {d.slot} {d.error:.3g} from golden: in golden {op.name} "
                f"({op.type}) wrote it; in the target {d.producer.name}, which matches golden within "
                f"{d.producer_error:.3g}, did",
                f"the target does not run {op.name}: the value goes on without it")
    action = (f"golden runs {op.type} at {op.name} and the target does not: check the target's code there (a "
              "division by the accumulation steps, a scale or a normalisation left out)")
    return Verdict(op.name, "kernel_bug", record.step, op.direction, op.type, evidence, action,
                   module=module_path(op.name))


def target_only_verdict(record: OpRecord, d: Departure, between: list[OpRecord]) -> Verdict:
    """The target-only op that wrote what ``record`` read: an extra computation golden does not run; a cast
    to a narrower format than golden's when those ops only cast (`narrowing_cast`)."""
    if d.unpaired is not None:
        return unpaired_verdict(record, d)
    if d.scaled:
        return still_scaled_verdict(record, d)
    cast = narrowing_cast(d, between)
    if cast is not None:
        return cast_verdict(record, d, cast)
    writer = d.writer
    if d.producer is None:  # (`DepartureFinder._rewritten_leaf`)
        where = module_path(writer.name) or "the training loop"
        return Verdict(writer.name, "kernel_bug", writer.step, writer.direction, writer.type, (
            f"{record.name} ({record.type}) reads {d.slot} {d.error:.3g} from golden, where golden's step reads it "
            "as none of its ops wrote it (a parameter as the last update left it, a buffer, the data)",
            f"{writer.name} ({writer.type}), an op golden does not run, wrote it in the target's step"),
            f"the target changes what {record.name} reads as {d.slot} outside golden's ops (a second update by "
            f"hand, a write after optimizer.step()): check {where}", module=module_path(writer.name))
    shown = ", ".join(r.name for r in between[:_LISTED]) + (" ..." if len(between) > _LISTED else "")
    evidence = (f"{record.name} ({record.type}) reads {d.slot} {d.error:.3g} from golden, while "
                f"{d.producer.name}, which wrote that value in golden, matches golden within {d.producer_error:.3g}",
                f"{writer.name} ({writer.type}), an op golden does not run, wrote the value it read",
                f"ops only the target runs between them: {shown}")
    action = (f"the target runs ops golden does not between {d.producer.name} and {record.name} (a tensor or "
              f"gradient hook, a hand-written step): check {module_path(writer.name) or writer.name}")
    return Verdict(writer.name, "kernel_bug", writer.step, writer.direction, writer.type, evidence, action,
                   module=module_path(writer.name))


def unpaired_verdict(record: OpRecord, d: Departure) -> Verdict:
    """The target-only op that wrote what ``record`` read, where golden computed that value in ops of its own."""
    writer, theirs = d.writer, d.unpaired
    evidence = (f"{record.name} ({record.type}) reads {d.slot} {d.error:.3g} from golden: in golden {theirs.name} "
                f"({theirs.type}) wrote it, in the target {writer.name} ({writer.type}); neither has a partner in "
                "the other run",
                f"the values the target's ops there read from paired ops match golden within {d.producer_error:.3g}: "
                "they compute another value than golden's own ops from the same inputs")
    where = module_path(writer.name) or "the training loop"
    action = (f"the target computes {d.slot} of {record.name} in other ops than golden ({where}, golden in "
              f"{module_path(theirs.name) or 'the training loop'}): check that code")
    return Verdict(writer.name, "kernel_bug", writer.step, writer.direction, writer.type, evidence, action,
                   module=module_path(writer.name))


def still_scaled_verdict(record: OpRecord, d: Departure) -> Verdict:
    """``record``, an op of the training loop, reads a gradient still multiplied by the loss scale."""
    evidence = (f"{record.name} ({record.type}) reads {d.slot} {d.error:.3g} from golden; golden's value times the "
                f"step's loss scale, {d.scaled:g}, matches it within {d.producer_error:.3g}",
                f"it reads gradients still multiplied by the loss scale, where golden's {record.type} reads them "
                "unscaled: the target runs it before the gradients are unscaled")
    action = (f"unscale the gradients before {record.type} reads them: scaler.unscale_(optimizer) before clipping "
              "or any code that reads .grad, and scaler.step(optimizer) rather than optimizer.step()")
    return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence, action,
                   module=module_path(record.name))
