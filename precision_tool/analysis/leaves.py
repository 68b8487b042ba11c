"""Parameters, buffers and data a run's first step reads otherwise than golden's: no op of the step wrote them.

Both runs start from the same weights and data, so at the first step a value no op wrote (`omissions.changed_leaf`)
must be golden's. Two ways it is not:

* **changed**: SIGNIFICANT_ERROR from golden's, beyond what rounding golden's value to the target's dtype explains
  (a layer scale of 1e-6 is subnormal in float16, 1 % off): kernel_bug where it is read (`omissions.changed_leaf`);
* **rounded**: in a run that declares float32 throughout, every value lies on float16's or bfloat16's grid while
  golden's mostly fall between its points (`grid.narrower_grid`; from statistics, its smallest and largest value:
  `grid.extremes_grid`): a weight rounded to 16 bits before training (a checkpoint saved in half precision, a
  ``.half().float()`` round trip on load). Its departure is one rounding, 2e-4 in float16, far under
  SIGNIFICANT_ERROR: precision_loss where it is first read. A value golden's step wrote as part of a larger tensor (a
  slice, read through a view no op records) is no leaf: the cast only the target runs, whose value the slice holds, is
  named (a module's output cast to float16 and back, read one time step at a time).

At a later step a value no op of the step wrote (a parameter) is what the update before wrote. One the target
reads the same to the last bit as at the step before, where golden's optimizer wrote it in that update, by an
op the target's ran too, changing it by more than the target's format rounds away, is **stale** (`stale_leaf`):
the update did not reach what the model reads (a copy from float32 master weights skipped, a parameter reset or
reloaded after the step, an optimizer holding other tensors than the model's): kernel_bug where it is read. A value
the target's optimizer wrote in place in that update, to the last bit as it was, is not: its update reached it and
moved nothing (a gradient of zeros).
"""

from __future__ import annotations

import math

from precision_tool.analysis.attribution import GoldenView, pair_errors
from precision_tool.analysis.errors import noise_floor, rounding_error, stats_split
from precision_tool.analysis.grid import extremes_grid, narrower_grid
from precision_tool.analysis.omissions import changed_leaf, written_part_of
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.structure import fingerprint, is_copy, module_path
from precision_tool.compare.judged import NEAR_ZERO_RATIO, input_scale
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord


def leaf_verdict(scan, record: OpRecord) -> Verdict | None:
    """The verdict on a forward op of the first step that reads a parameter, buffer or data unlike golden's, or
    None; ``scan`` is the running `Scanner`. In a region's dump, ops in modules only (not a loop's: a loss)."""
    partner = scan._golden_of(record)
    if partner is None or partner.type != record.type or record.direction != "forward" or all(
            scan.consumers["any"].producer(partner, t.slot) is not None for t in partner.inputs if is_float(t.dtype)):
        return None  # (every value it reads, an op wrote: no leaf; its tensors are not read again)
    readers = scan.departures.writers()[1]
    if any(d[0].exec_index < record.exec_index and d[0].tensor(d[1]).dtype != "uint8" and any(
            r.direction == "forward" and r.exec_index <= record.exec_index for r in readers.of(d[0], [d[1]]))
           for d in scan.departures.decisions()):
        return None  # a decision flipped before it that forward reads on (a router's topk; a kernel's uint8
        # workspace is none, nor a max pooling's indices, read by its backward only): it may read other data
    view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
    measured = pair_errors(scan.golden, scan.target, record, view, "input")
    if scan._float32:
        verdict = rounded_leaf(scan, record, partner, view, [s for s, e in measured if e.error >= noise_floor(
            "float32")])
        if verdict is not None:
            return verdict
    errors = [(slot, e.error) for slot, e in measured
              if e.error > INTRODUCED_EXCESS * rounding_error(view.get(slot), record.tensor(slot).dtype)]
    exact = frozenset(slot for slot, e in measured if e.error > 0.0 and _unlike_golden(scan, record, view, slot))
    return changed_leaf(record, partner, scan.consumers["any"], errors, scan.golden, exact)


def _unlike_golden(scan, record: OpRecord, view: GoldenView, slot: str) -> bool:
    """From statistics, in a float32 run: whether ``record``'s input ``slot``, float32 in both runs, holds other
    values than golden's (another smallest or largest value, or a sum or norm apart beyond what summing the same
    values in another order moves) while every op of the step before it wrote golden's values to the last bit:
    nothing rounded upstream that a slice of a written tensor could carry (one row of a word embedding drawn
    otherwise moves its statistics 1e-3, under what counts where values are compared)."""
    tensor, golden = record.tensor(slot), view.statistics(slot)
    if not scan._float32 or tensor.has_data or golden is None or tensor.dtype != "float32" or \
            golden.dtype != "float32" or tensor.stats.count != golden.stats.count or not _exact_before(scan, record):
        return False
    a, b = tensor.stats, golden.stats
    if a.min != b.min or a.max != b.max:
        return True
    apart = 1e-10 * max(a.norm, b.norm) * math.sqrt(max(a.count, 1))
    return abs(a.mean * a.count - b.mean * b.count) > apart or abs(a.norm - b.norm) > 1e-10 * max(a.norm, b.norm)


def _exact_before(scan, record: OpRecord) -> bool:
    """Whether every op of ``record``'s step before it has a golden partner whose outputs' statistics are its own
    to the last bit (computed once a step)."""
    cached = scan.__dict__.setdefault("_first_inexact", {})
    if record.step not in cached:
        first = None
        for other in scan.step_records:
            if other.is_module or other.direction != "forward":
                continue
            partner = scan._golden_of(other)
            theirs = {t.slot: fingerprint(t) for t in partner.outputs} if partner is not None else {}
            if partner is None or any(theirs.get(t.slot) != fingerprint(t) for t in other.outputs if t.stats.count):
                first = other.exec_index
                break
        cached[record.step] = first
    first = cached[record.step]
    return first is None or first >= record.exec_index


def rounded_leaf(scan, record: OpRecord, partner: OpRecord, view: GoldenView, slots: list[str]) \
        -> Verdict | None:
    """precision_loss where ``record`` reads, in one of ``slots`` (float32 inputs that depart from golden's), a
    value no op of the step wrote in golden's run, lying wholly on a 16-bit grid where golden's does not."""
    writers = scan.consumers["any"]
    for slot in slots:
        tensor = record.tensor(slot)
        if tensor.dtype != "float32" or writers.producer(partner, slot) is not None:
            continue
        if tensor.has_data and view.get(slot) is not None:
            fmt = narrower_grid(scan.target.tensor(record.step, record.exec_index, slot), view.get(slot))
        else:
            golden = view.statistics(slot) or view.record(slot)
            fmt = extremes_grid(tensor.stats, golden.stats) if golden is not None else None
        if fmt is None:
            continue
        if tensor.has_data and written_part_of(partner, slot, writers, scan.golden) is not None:
            # golden's value is a slice of what an earlier op wrote (no leaf): a cast only the target runs, earlier
            # in the step, rounded what the target reads (a module's output cast to float16 and back)
            verdict = _sliced_after_a_cast(scan, record, slot, fmt)
            if verdict is not None:
                return verdict
            continue
        evidence = (f"{record.name} ({record.type}) reads {slot}, a value no op of step {record.step} wrote (a "
                    f"parameter, buffer or the data), whose every value {fmt} holds"
                    + (" (its smallest and largest: the dumps keep statistics only)" if not tensor.has_data else "")
                    + f", while golden's mostly fall between {fmt}'s points",
                    f"the target declares float32 throughout: the value was rounded to {fmt} before the step (a "
                    f"checkpoint saved in {fmt}, a .to({fmt}) round trip on load)")
        return Verdict(record.name, "precision_loss", record.step, "forward", record.type, evidence,
                       f"load or initialise what {record.type} reads as {slot} in float32 (look for a {fmt} copy of "
                       "it)", module=module_path(record.name))
    return None


def _sliced_after_a_cast(scan, record: OpRecord, slot: str, fmt: str) -> Verdict | None:
    """precision_loss at the cast to ``fmt`` golden does not run whose value ``record`` reads a slice of (through
    copies back to float32), or None: the target's op whose output holds the values read, then its writers back
    through casts and copies."""
    writers = scan.departures.writers()[1]
    writer = written_part_of(record, slot, writers, scan.target)
    for _ in range(8):
        if writer is None or not is_copy(writer.type):
            return None
        if any(t.dtype == fmt for t in writer.outputs) and any(t.dtype == "float32" for t in writer.inputs):
            partner = scan._golden_of(writer)
            if partner is not None and any(t.dtype == fmt for t in partner.outputs):
                return None  # (golden rounds there too)
            evidence = (f"{writer.name} ({writer.type}), a cast golden does not run, rounds a float32 value to {fmt}; "
                        "golden keeps it in float32",
                        f"{record.name} ({record.type}) reads a slice of it ({slot}), whose every value {fmt} holds, "
                        f"while golden's mostly fall between {fmt}'s points")
            where = module_path(writer.name) or writer.name
            return Verdict(writer.name, "precision_loss", writer.step, writer.direction, writer.type, evidence,
                           f"keep {where} in float32: remove the cast to {fmt} there (a stray .half() or .to({fmt}))",
                           module=module_path(writer.name))
        source = next((t.slot for t in writer.inputs if is_float(t.dtype)), None)
        writer = writers.producer(writer, source) if source is not None else None
    return None


def infinities_differ(record: OpRecord, partner: OpRecord | None) -> bool:
    """Whether ``record``, reading integers or booleans (a mask), writes infinities in other numbers than golden's
    ``partner``: positions set to -inf that golden does not set (a causal mask off by one). Those are unscored
    where an op asks for infinity (`masked_fill(mask, -inf)`), and the finite rest agrees."""
    if partner is None or all(is_float(t.dtype) for t in record.inputs):
        return False
    theirs = {t.slot: t.stats.inf for t in partner.outputs}
    return any(t.slot in theirs and t.stats.inf != theirs[t.slot] for t in record.outputs if is_float(t.dtype))


_UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # what a 16-bit parameter loses of an update


def stale_leaf(scan, record: OpRecord) -> Verdict | None:
    """kernel_bug where a forward op after the first step reads a value no op of the step wrote in golden's run
    (a parameter), the same to the last bit as at the step before in the target, while golden's changed."""
    partner = scan._golden_of(record)
    if partner is None or record.direction != "forward" or partner.type != record.type:
        return None
    updated = _updates_before(scan, scan.target, record.step)
    skipped = scan.__dict__.get("_skipped_steps")
    if skipped is None:
        skipped = scan._skipped_steps = {s.step for s in scan.target.steps() if s.skipped}
    before = _at_step_before(scan, scan.target, record) if updated and record.step - 1 not in skipped else None
    golden_before = _at_step_before(scan, scan.golden, partner) if before is not None else None
    if golden_before is None:
        return None
    written_by = set(updated.values())
    for tensor in record.inputs:  # (an activation differs from the step before's: the cheap test first)
        slot = tensor.slot
        old = before.tensor(slot)
        if old is None or not tensor.stats.count or not is_float(tensor.dtype) or tensor.shape != old.shape or \
                stats_row(tensor.stats) != stats_row(old.stats) or \
                scan.consumers["any"].producer(partner, slot) is not None:
            continue
        golden_now, golden_old = partner.tensor(slot), golden_before.tensor(slot)
        if golden_now is None or golden_old is None:
            continue
        writer = _updates_before(scan, scan.golden, record.step).get(stats_row(golden_now.stats))
        if writer is None or writer not in written_by:
            continue  # (golden's value is no update's: a BatchNorm's running mean; the target ran no such update:
            # its loss scaler skipped the step, or it updates through other ops, fused)
        if golden_now.stats.norm < NEAR_ZERO_RATIO * input_scale(partner):
            continue  # (rounding noise on a value negligible where read: an attention key bias, whose gradient is
            # zero in exact arithmetic, moved by noise in golden and not at all in a 16-bit target)
        moved = stats_split(golden_now.stats, golden_old.stats, golden_now.dtype).error
        if not moved > max(_UNIT_ROUNDOFF.get(tensor.dtype, 0.0), noise_floor("float32")):
            continue  # (golden's update, rounded to the target's 16 bits, changes nothing: a pure-bfloat16 run)
        if stats_row(tensor.stats) in _written_in_place(scan, record.step):
            continue  # (the target's update wrote these values where they lie and left them as they were: a
            # gradient of zeros, as 16 bits make of a classifier bias's where golden's is rounding noise that Adam
            # turns into a full step)
        evidence = (f"{record.name} ({record.type}) reads {slot}, a value no op of step {record.step} wrote (a "
                    f"parameter or buffer), the same to the last bit as it read at step {record.step - 1}, while "
                    f"golden's moved {_moved(moved, golden_now.stats)} in step {record.step - 1}'s update",
                    "the update did not reach what the target's model reads: a copy from float32 master weights "
                    "skipped, a parameter reset or reloaded after the step, or an optimizer holding other tensors "
                    "than the model's")
        return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, evidence,
                       f"check that the target's model reads, at step {record.step}, the parameters its optimizer "
                       "updated (master-weight copies, reloads after each step, parameters made again after the "
                       "optimizer was built)", module=module_path(record.name))
    return None


def _at_step_before(scan, dump, record: OpRecord) -> OpRecord | None:
    """``record``'s op at the step before (the same direction and name), from ``dump``; found once a step."""
    cache = scan.__dict__.setdefault("_step_before", {})
    key = (id(dump), record.step - 1)
    if key not in cache:
        cache[key] = {(r.direction, r.name): r for r in dump.ops(step=record.step - 1)}
    return cache[key].get((record.direction, record.name))


def _updates_before(scan, dump, step: int) -> dict:
    """The statistics row of each float output of the optimizer's ops of the step before ``step`` in ``dump`` ->
    that op's name; found once a step."""
    cache = scan.__dict__.setdefault("_updates_before", {})
    key = (id(dump), step - 1)
    if key not in cache:
        cache[key] = {stats_row(t.stats): r.name for r in dump.ops(step=step - 1, direction="optimizer")
                      for t in r.outputs if is_float(t.dtype) and t.stats.count}
    return cache[key]


def _written_in_place(scan, step: int) -> set:
    """The statistics rows of what the target's optimizer ops of the step before ``step`` wrote in place (an
    in-place op's float outputs: the parameters it updates, its states); found once a step."""
    cache = scan.__dict__.setdefault("_written_in_place", {})
    if step not in cache:
        cache[step] = {stats_row(t.stats) for r in scan.target.ops(step=step - 1, direction="optimizer")
                       if r.type.endswith("_") for t in r.outputs if is_float(t.dtype) and t.stats.count}
    return cache[step]


def _moved(moved: float, now) -> str:
    return f"{moved:.3g}" if math.isfinite(moved) else f"from zeros to a norm of {now.norm:.3g}"


def stats_row(stats) -> tuple:
    """A tensor's statistics as one tuple, every field: equal rows, the same values to the last bit as far as
    statistics tell."""
    return (stats.count, stats.min, stats.max, stats.mean, stats.std, stats.norm, stats.nan, stats.inf)


def carried_state(scan, record: OpRecord) -> Verdict | None:
    """kernel_bug where a forward op after the first step reads a value no op of the target's step wrote, while
    golden's step writes it afresh in an op the target does not run and that reads no float (zeros, a fill), and
    the two depart by SIGNIFICANT_ERROR: a state the target carries over from step to step (a recurrent model's
    hidden state kept across batches) where golden starts it anew. The departure begins at the second step,
    which statistics of a 16-bit run are not judged at for anything that rounding moves."""
    partner = scan._golden_of(record)
    if partner is None or record.direction != "forward" or record.step == scan._first_step:
        return None
    theirs = {t.slot: t for t in partner.inputs}
    for tensor in record.inputs:
        golden = theirs.get(tensor.slot)  # (golden's op may read fewer: a stack of fewer states)
        if golden is None or not is_float(tensor.dtype) or not tensor.stats.count or \
                scan.departures.writers()[1].producer(record, tensor.slot) is not None:
            continue
        writer = scan.consumers["any"].producer(partner, tensor.slot)
        if writer is None or scan._target_of(writer) is not None or any(is_float(t.dtype) for t in writer.inputs):
            continue
        error = stats_split(tensor.stats, golden.stats, tensor.dtype).error
        if not error >= SIGNIFICANT_ERROR:
            continue
        evidence = (f"{record.name} ({record.type}) reads {tensor.slot} {error:.3g} from golden as far as statistics "
                    f"show: no op of the target's step {record.step} wrote it, while golden's step writes it afresh "
                    f"in {writer.name} ({writer.type}), which the target does not run",
                    "the target carries the value over from the step before where golden starts it anew: a state "
                    "kept across batches (a recurrent model's hidden state, detached but not reset)")
        return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, evidence,
                       f"start {tensor.slot} of {record.name} afresh each step as golden does ({writer.type}), or "
                       "carry it in golden too where the model is meant to keep its state",
                       module=module_path(record.name))
    return None
