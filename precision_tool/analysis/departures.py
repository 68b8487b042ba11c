"""Inputs that change between the op that writes them and the op that reads them, where no paired op is to blame.

The scan judges each target op against its golden partner. Two kinds of change happen *between* paired ops and so
escape it:

* **Ops only the target runs.** A tensor hook on a gradient, a hand-written step between two library calls: their
  records have no golden partner, so nothing compares them, and the op reading their result only inherits the error.
  Seen from that reader, one of its float inputs departs from golden although the op that wrote the value in golden
  (found by its statistics, across directions: a weight gradient written in backward is read by the optimizer) wrote
  it in the target too, and matching golden. The change lies between them: in the target-only op that wrote what the
  reader read. When those ops only cast, and one rounds the value to a narrower format than golden holds it in (a
  stray ``.half()``), the verdict is **precision_loss** at that cast, not a kernel fault.
* **Integers.** Ops that compute only in integers (``ids + 1``, a remainder, a clamp of indices) are not recorded,
  and error is measured on floats. An op whose integer input (embedding indices, gather indices, labels) differs
  from golden, element for element, while no recorded op explains it (none wrote those integers, or the one that did
  wrote golden's values), read integers changed before it: its float output departs for that reason alone. Unless a
  *decision* flipped before it: an earlier op of the step that chose from floats (topk's indices, an argmax, a
  comparison) chose differently from golden, and what is read after it is chosen from that (a mixture of experts
  routing tokens by topk, through integer ops that are not recorded). Rounding moves a near tie either way; the ops
  that follow compute on other data, not wrongly, and the flip is only noted.

A departure counts only when it is beyond what the input's dtype explains (`noise_floor`) and INTRODUCED_EXCESS
times the error of its writer: the casts autocast inserts round a value, they never move it that far. Or, for a
target-only op that computes, when the change it made, in quadrature beyond its writer's error, exceeds
REWRITE_UNITS units of the coarser of the value's format and its writer's (one rounding adds one unit): a hook's 1 %
noise on a float16 gradient that already carries 0.18 %. In a run with loss scaling, ops only the target runs that
only scale a value by a power of two (a GradScaler unscaling gradients) are walked past to the op that changed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from precision_tool.analysis.attribution import GoldenView, pair_errors
from precision_tool.analysis.errors import differing_count as _differing, exact_cast, noise_floor, split_error, \
    stats_split
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Attribution, Verdict
from precision_tool.analysis.structure import PLACED, Consumers, fingerprint, is_copy, module_path
from precision_tool.analysis.scaling import loss_scale_ratios
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FORMATS

_LISTED = 6  # target-only ops named in the evidence
_REGION = 64  # target-only ops walked back from an unpaired writer (`DepartureFinder._unpaired`)
_SCALINGS = 6  # power-of-two scalings (and exact casts) walked past (`DepartureFinder._changer`)
_AMP_UNSCALE = "aten._amp_foreach_non_finite_check_and_unscale_"  # a GradScaler's unscaling
# A value a computation only the target runs rewrote, judged where its op's error stays under the output's noise
# floor (16 units of bfloat16's last place are 6 %): the change, in quadrature beyond the error of the op that
# wrote it, exceeds this many units of the value's format. One rounding adds at most one unit, and the casts
# autocast inserts are never counted here (they only round).
REWRITE_UNITS = 4.0


@dataclass(frozen=True)
class Departure:
    """One input of a paired op that changed after the op that wrote it in golden."""

    slot: str
    error: float  # float input: relative error against golden; integer input: share of differing elements
    differing: int  # integer input: elements that differ from golden (0 for a float input)
    size: int
    producer: OpRecord | None  # the target partner of the op that wrote the value in golden
    producer_error: float
    writer: OpRecord | None  # the target-only op that wrote what the reader read (float inputs)
    golden_dtype: str = ""  # the dtype golden held the value in (float inputs)
    skipped: OpRecord | None = None  # golden's op that wrote the value and that the target does not run
    unpaired: OpRecord | None = None  # golden's writer, when neither run's writer has a partner (`_unpaired`)
    scaled: float = 0.0  # the loss scale the value read still carries, where golden's reader reads it unscaled


class DepartureFinder:
    """Finds departing inputs of one step's target ops; built once per step, its writer indexes on first use."""

    def __init__(self, golden_dump, target_dump, golden_records: list[OpRecord], target_records: list[OpRecord],
                 golden_of, target_of, measure):
        self.golden_dump, self.target_dump = golden_dump, target_dump
        self._golden_records, self._target_records = golden_records, target_records
        self.golden_of, self.target_of = golden_of, target_of  # partner lookups of the scan
        self.measure = measure  # record -> Attribution (measured errors, cached by the scan)
        self._writers: tuple[Consumers, Consumers] | None = None
        self._decisions: list[tuple[OpRecord, str, int, int]] | None = None
        self.flips: list[str] = []  # notes: decisions that rounding flipped, which explained an integer departure

    def writers(self) -> tuple[Consumers, Consumers]:
        """(golden, target) writer indexes over every direction of the step: a value may cross directions."""
        if self._writers is None:
            self._writers = (Consumers(self._golden_records), Consumers(self._target_records))
        return self._writers

    def integer(self, record: OpRecord, view: GoldenView, a: Attribution) -> Departure | None:
        """The first integer input of ``record`` that differs from golden with no recorded op to explain it,
        when its float output departs beyond its float inputs; else None."""
        if a.observed <= INTRODUCED_EXCESS * a.inherited and not a.overflowed:  # (or -inf set elsewhere)
            return None
        for tensor in record.inputs:  # (a boolean mask too: a padding mask left out, an off-by-one causal mask)
            if is_float(tensor.dtype) or not tensor.has_data:
                continue
            golden = view.get(tensor.slot)
            if golden is None:
                continue
            differing, size = _differing(self.target_dump.tensor(record.step, record.exec_index, tensor.slot), golden)
            if not differing:
                continue
            producer, explained = self._integer_producer(record, view, tensor.slot)
            if not explained and producer is None and self._flipped_before(record, tensor.slot, differing, size):
                continue
            if not explained:
                return Departure(tensor.slot, differing / max(size, 1), differing, size, producer, 0.0, None)
        return None

    def _flipped_before(self, record: OpRecord, slot: str, differing: int, size: int) -> bool:
        """Whether a decision of the step before ``record`` (`decisions`) flipped: integers no recorded op wrote
        may be chosen from it. Notes the flip once."""
        flipped = [d for d in self.decisions() if d[0].exec_index < record.exec_index]
        if not flipped:
            return False
        decision, decision_slot, changed, total = flipped[-1]
        note = (f"{decision.name} ({decision.type}) chose differently from golden ({decision_slot}: {changed} of "
                f"{total} element(s)) on inputs that differ by rounding; {record.name} reads integers chosen from "
                f"it ({slot}: {differing} of {size} differ): the ops after it compute on other data, compared only "
                "loosely")
        if note.split(" chose")[0] not in " ".join(self.flips):
            self.flips.append(note)
        return True

    def decisions(self) -> list[tuple[OpRecord, str, int, int]]:
        """(op, slot, differing, size) of the step's ops that read floats and write integers or booleans (topk's
        indices, an argmax, a comparison) that differ from golden's partner: decisions taken otherwise."""
        if self._decisions is None:
            self._decisions = []
            for record in self._target_records:
                if record.is_module or not any(is_float(t.dtype) for t in record.inputs):
                    continue
                chosen = [t for t in record.outputs if not is_float(t.dtype) and t.has_data and t.stats.count]
                partner = self.golden_of(record) if chosen else None
                if partner is None:
                    continue
                for tensor in chosen:
                    try:
                        partner.tensor(tensor.slot)
                    except KeyError:
                        continue
                    differing, size = _differing(self.target_dump.tensor(record.step, record.exec_index, tensor.slot),
                                                 self.golden_dump.tensor(partner.step, partner.exec_index,
                                                                         tensor.slot))
                    if differing:
                        self._decisions.append((record, tensor.slot, differing, size))
                        break
        return self._decisions

    def _integer_producer(self, record: OpRecord, view: GoldenView, slot: str) -> tuple[OpRecord | None, bool]:
        """(the target op that wrote the integers in golden, whether its own output already differs or it
        cannot be told): a recorded op whose integer output differs (argmax of values a low precision
        reordered) is judged by its float inputs, not here. Where the target's op read a recorded op's result
        other than that one (a cast autocast inserted renumbers the casts after it, so ``_to_copy_1`` pairs
        with another cast), the pair says nothing."""
        golden_record, golden_tensor = self.golden_of(record), view.record(slot)
        if golden_record is None or golden_tensor is None:
            return None, True
        written = self._golden_writer(golden_record, golden_tensor)
        if written is None:
            return None, False
        golden_writer, golden_slot = written
        producer = self.target_of(golden_writer)
        if producer is None:
            return None, True
        try:
            producer.tensor(golden_slot)
        except KeyError:
            return producer, True
        read_from = self.writers()[1].producer(record, slot)
        if read_from is not None and read_from is not producer:
            return producer, True  # the target reads another op's integers: paired by a name whose numbering moved
        ours = self.target_dump.tensor(producer.step, producer.exec_index, golden_slot)
        theirs = self.golden_dump.tensor(golden_writer.step, golden_writer.exec_index, golden_slot)
        return producer, bool(_differing(ours, theirs)[0])

    def floating(self, record: OpRecord, view: GoldenView, floor: float) -> Departure | None:
        """The first float input of ``record`` beyond ``floor`` and its dtype's noise from golden while the op
        that wrote it in golden wrote it in the target within 1/INTRODUCED_EXCESS of that, and a target-only op
        wrote what ``record`` read; else None."""
        golden_record = self.golden_of(record)
        if golden_record is None:
            return None
        scale = loss_scale_ratios(self.golden_dump, self.target_dump).get(record.step, 1.0)
        ratio = scale if record.direction == "backward" else 1.0
        for slot, error in pair_errors(self.golden_dump, self.target_dump, record, view, "input", ratio):
            if error.error < max(floor, noise_floor(record.tensor(slot).dtype)) or error.overflowed:
                continue
            golden_tensor = view.record(slot) or view.statistics(slot)  # a stats-mode partner: its statistics
            if scale != 1.0 and ratio == 1.0 and golden_tensor is not None:
                still = self._still_scaled(record, view, slot, scale, error.error, golden_tensor)
                if still is not None and not still[1]:
                    continue  # (the value still scaled is read, and nothing it computes is used)
                if still is not None:
                    return Departure(slot, error.error, 0, 0, None, still[0], None, golden_tensor.dtype, scaled=scale)
            written = self._golden_writer(golden_record, golden_tensor) if golden_tensor is not None else None
            producer = self.target_of(written[0]) if written is not None else None
            if producer is None:
                leaf = self._rewritten_leaf(record, slot, error.error, golden_record, golden_tensor) if written \
                    is None and golden_tensor is not None else None  # (golden's step reads what none of its ops wrote)
                if leaf is not None:
                    return leaf
                skipped = self._skipped(record, slot, error.error, written[0]) if written is not None else None
                if skipped is not None:
                    return replace(skipped, golden_dtype=golden_tensor.dtype)
                unpaired = self._unpaired(record, slot, error.error, written[0]) if written is not None else None
                if unpaired is not None:
                    return replace(unpaired, golden_dtype=golden_tensor.dtype)
                continue
            producer_error = self.measure(producer).observed
            writer = self._changer(record, slot)
            if writer is None or writer.exec_index <= producer.exec_index or self._paired(writer, golden_record):
                continue
            if error.error > INTRODUCED_EXCESS * producer_error or (not is_copy(writer.type) and _beyond(
                    error.error, producer_error, record.tensor(slot).dtype, *(t.dtype for t in producer.outputs))):
                return Departure(slot, error.error, 0, 0, producer, producer_error, writer, golden_tensor.dtype)
        return None

    def _rewritten_leaf(self, record: OpRecord, slot: str, error: float, golden_record, golden) -> Departure | None:
        """Where golden's step reads as no op of it wrote (a parameter as the update left it) a value an op only the
        target runs (no cast) wrote in the step from one INTRODUCED_EXCESS times closer to golden's (a second
        update by hand; not the drift of training, which the value carried in already); else None."""
        writer = self.writers()[1].producer(record, slot)
        before = next((t for t in writer.inputs if is_float(t.dtype) and t.stats.count == golden.stats.count), None) \
            if writer is not None and self.golden_of(writer) is None and not is_copy(writer.type) else None
        if before is None:
            return None
        carried = split_error(self.target_dump.tensor(writer.step, writer.exec_index, before.slot),
                              self.golden_dump.tensor(golden_record.step, golden_record.exec_index, slot),
                              before.dtype).error if before.has_data and golden.has_data else \
            stats_split(before.stats, golden.stats, before.dtype).error
        if error <= INTRODUCED_EXCESS * carried or not _beyond(error, carried, record.tensor(slot).dtype, golden.dtype):
            return None
        return Departure(slot, error, 0, 0, None, carried, writer, golden.dtype)

    def _paired(self, writer: OpRecord, golden_reader: OpRecord) -> bool:
        """Whether ``writer`` has a golden partner that could have written what ``golden_reader`` reads: one that
        runs before it. A partner by name that runs after it pairs an op only the target runs (a forward pre-hook's
        scaling, counted first in its module) with golden's op of that name and number."""
        partner = self.golden_of(writer)
        return partner is not None and not (partner.direction == golden_reader.direction and
                                            partner.exec_index > golden_reader.exec_index)

    def _still_scaled(self, record: OpRecord, view: GoldenView, slot: str, scale: float, error: float,
                      golden_tensor) -> tuple[float, bool] | None:
        """Where the loop's op ``record`` (clipping, the optimizer) reads ``slot`` as golden's value times the
        step's loss ``scale``, within its dtype's noise and far closer than unscaled: (that error, whether it does
        harm); else None. Golden's
        reads gradients unscaled (a clip before ``scaler.unscale_``, ``optimizer.step()`` past the scaler)."""
        writer = self.writers()[1].producer(record, slot)
        if record.direction != "optimizer" and (writer is None or writer.direction != "backward"):
            return None  # (a value of the forward pass: no loss scale on it)
        tensor = record.tensor(slot)
        partner = view.statistics(slot) or (view.record(slot) if not tensor.has_data else None)
        if partner is not None:
            scaled = stats_split(tensor.stats, partner.stats, tensor.dtype, scale) if tensor.stats.count else None
        else:
            golden = view.get(slot)
            scaled = None if golden is None else split_error(
                self.target_dump.tensor(record.step, record.exec_index, slot), golden, tensor.dtype, scale)
        # as close to golden's times the scale as what wrote it in golden's partner is (a key bias's gradient is
        # noise) or what wrote it here (through the casts autocast adds)
        written = self._golden_writer(self.golden_of(record), golden_tensor)
        producer = self.target_of(written[0]) if written is not None else None
        carried = max([self.measure(w).observed for w in (writer, producer)
                       if w is not None and w.direction == "backward" and self.golden_of(w) is not None] + [0.0])
        if scaled is None or scaled.overflowed or scaled.error * INTRODUCED_EXCESS >= error or scaled.error >= \
                max(noise_floor(record.tensor(slot).dtype), SIGNIFICANT_ERROR, INTRODUCED_EXCESS * carried):
            return None
        # harmful where what it computes reaches an update or a module (a clip's norm scales the gradients the
        # update reads); a norm taken for a log reaches neither. Named only where it reads golden's values times
        # the scale within their dtype's noise (noise read as it was written, a hook's, is no such value)
        harmful = record.direction == "optimizer" or self._reaches_training(record)
        if harmful and scaled.error >= max(noise_floor(record.tensor(slot).dtype), SIGNIFICANT_ERROR):
            return None
        return scaled.error, harmful

    def _reaches_training(self, record: OpRecord, limit: int = 256) -> bool:
        """Whether what ``record`` writes reaches, through the ops that read it in turn, an optimizer's op or an
        op inside a module (a clip's norm scales the gradients the update reads; a norm printed reaches none)."""
        readers, seen = self.writers()[1], set()
        todo = list(readers.of(record))
        while todo and len(seen) < limit:
            op = todo.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            if op.direction == "optimizer" or module_path(op.name):
                return True
            todo.extend(readers.of(op))
        return len(seen) >= limit

    def _changer(self, record: OpRecord, slot: str) -> OpRecord | None:
        """The op that wrote ``record``'s input ``slot``, walking back, in a run with loss scaling, past ops only
        the target runs that only scale it by a power of two (a GradScaler unscaling gradients: exact, the error
        they carry unchanged; a scale by 1.05 through ``.data`` is a change). Scalings that together are not the
        step's loss scale undone once (gradients unscaled twice: by hand, then by the scaler) stop at the one
        nearest the reader."""
        writers = self.writers()[1]
        writer = writers.producer(record, slot)
        if not any(s.loss_scale not in (None, 1.0) for s in self.target_dump.steps()) and \
                not loss_scale_ratios(self.golden_dump, self.target_dump):  # (a scale by hand, undeclared: inferred)
            return writer
        nearest, factor, scalings = writer, 1.0, []
        for _ in range(_SCALINGS):
            if writer is None or self.golden_of(writer) is not None:
                break
            key = fingerprint(record.tensor(slot))
            written = next((t.slot for t in writer.outputs if t.stats.count and fingerprint(t) == key), None)
            found = self._scaled_from(writer, written) if written is not None else None
            earlier = writers.producer(writer, found[0]) if found is not None else None
            if earlier is None:
                break
            factor *= found[1]
            scalings += [writer] if found[1] != 1.0 else []
            record, slot, writer = writer, found[0], earlier
        ratio = loss_scale_ratios(self.golden_dump, self.target_dump).get(record.step, 1.0)
        own = next((s.loss_scale for s in self.target_dump.steps() if s.step == record.step and s.loss_scale), 1.0)
        if factor in (1.0, 1.0 / ratio, 1.0 / own):  # (golden's own scaler: 1 / own)
            return writer  # else the extra one, not the scaler's own unscaling (the one expected) where another is
        return next((w for w in scalings if w.type != _AMP_UNSCALE), nearest)

    def _scaled_from(self, writer: OpRecord, slot: str) -> tuple[str, float] | None:
        """(the input slot of ``writer`` whose values its output ``slot`` holds times one power of two, that power),
        else None (the input of the same index first: a foreach op's in-place lists). A cast to a format at least
        as wide holds them times one (float32 master gradients copied from float16 ones: exact)."""
        out = writer.tensor(slot)
        index = slot.rsplit("_", 1)[-1]
        candidates = sorted((t for t in writer.inputs if t.has_data and is_float(t.dtype) and t.shape == out.shape),
                            key=lambda t: t.slot != f"input_{index}")[:2]
        if not out.has_data or not candidates:
            return None
        if is_copy(writer.type):
            widened = [t for t in candidates if exact_cast(t.dtype, out.dtype)]
            return (widened[0].slot, 1.0) if widened else None
        y = np.asarray(self.target_dump.tensor(writer.step, writer.exec_index, slot), dtype=np.float64).ravel()
        for tensor in candidates:
            x = np.asarray(self.target_dump.tensor(writer.step, writer.exec_index, tensor.slot), np.float64).ravel()
            norm = float(x @ x)
            scale = float(y @ x) / norm if norm > 0.0 and np.isfinite(norm) else 0.0
            if scale and np.isfinite(scale):
                scale = math.ldexp(1.0, round(math.log2(abs(scale)))) * np.sign(scale)  # the nearest power of two
                if scale != 1.0 and np.allclose(y, scale * x, rtol=1e-6, atol=0.0):
                    return tensor.slot, float(scale)
        return None

    def rewritten(self, record: OpRecord, view: GoldenView) -> Departure | None:
        """The first float input of ``record`` that an op only the target runs, and that computes (not a cast or a
        copy), rewrote after the partner of its golden writer wrote it, by more than REWRITE_UNITS units of the
        input's format beyond that writer's own error (in quadrature: the rewrite and the error it carried are
        independent): the local form of `floating` for errors under the noise floor (a 2 % scale under bfloat16;
        a 5 % gradient scale under bfloat16's backward). None otherwise."""
        golden_record = self.golden_of(record)
        if golden_record is None:
            return None
        ratio = loss_scale_ratios(self.golden_dump, self.target_dump).get(record.step, 1.0) \
            if record.direction == "backward" else 1.0
        for slot, error in pair_errors(self.golden_dump, self.target_dump, record, view, "input", ratio):
            fmt = FORMATS.get(record.tensor(slot).dtype)
            if fmt is None or error.overflowed or error.error < REWRITE_UNITS * fmt.unit_roundoff:
                continue
            writer = self._changer(record, slot)
            if writer is None or is_copy(writer.type) or self.golden_of(writer) is not None:
                continue
            golden_tensor = view.record(slot)
            written = self._golden_writer(golden_record, golden_tensor) if golden_tensor is not None else None
            producer = self.target_of(written[0]) if written is not None else None
            if producer is None or writer.exec_index <= producer.exec_index:
                continue
            producer_error = self.measure(producer).observed
            # in backward and the optimizer, in units of the coarser of the value's format and its writer's
            # outputs' (a bf16 gradient read in float32 carries bf16's rounding)
            if _beyond(error.error, producer_error, fmt.name, *(
                    t.dtype for t in producer.outputs if record.direction != "forward")):
                return Departure(slot, error.error, 0, 0, producer, producer_error, writer, golden_tensor.dtype)
        return None

    def _skipped(self, record: OpRecord, slot: str, error: float, golden_writer: OpRecord) -> Departure | None:
        """Golden's writer of ``slot`` computes and has no target partner, while the target's value comes from an
        op paired with an earlier golden op, maybe through casts of the target's own: the target skips a step golden
        takes (a loss not divided by the micro-batches it accumulates over, say). None otherwise."""
        writer = None if is_copy(golden_writer.type) or golden_writer.direction == "backward" and golden_writer.type \
            in PLACED else self.writers()[1].producer(record, slot)  # (a gradient sum moves with the graph)
        while writer is not None and is_copy(writer.type) and writer.inputs and self.golden_of(writer) is None:
            writer = self.writers()[1].producer(writer, writer.inputs[0].slot)
        partner = self.golden_of(writer) if writer is not None else None
        if partner is None or partner.exec_index >= golden_writer.exec_index:
            return None
        writer_error = self.measure(writer).observed
        if error <= INTRODUCED_EXCESS * writer_error:
            return None
        return Departure(slot, error, 0, 0, writer, writer_error, None, skipped=golden_writer)

    def _unpaired(self, record: OpRecord, slot: str, error: float, golden_writer: OpRecord) -> Departure | None:
        """Neither golden's writer of ``slot`` nor the target's has a partner: each run computes the value in ops
        of its own (a loss computed in the training loop by one and inside a module by the other). When every
        value those target-only ops read from paired ops matches golden within 1/INTRODUCED_EXCESS of the
        departure, the ops only the target runs computed another value than golden's own: the departure is
        theirs. None otherwise (among them, a departure the inputs of that computation already carry)."""
        writer = self.writers()[1].producer(record, slot)
        if writer is None or self.golden_of(writer) is not None or is_copy(golden_writer.type) \
                or error < SIGNIFICANT_ERROR:
            return None
        region, boundary = self._unpaired_region(writer)
        if region is None or boundary is None or any(r.pass_name for r in region):
            return None  # a fused op pairs with golden's through its original ops, judged as a fusion
        computing = [r for r in region if not is_copy(r.type)]
        if not computing:
            return None
        writer = max(computing, key=lambda r: r.exec_index)  # the last that computes (autocast casts after it)
        if module_path(writer.name) == module_path(golden_writer.name):
            return None  # both in one module: another implementation of it, judged whole (`rewrites`)
        boundary_error = max(self.measure(p).observed for p in boundary)
        if error <= INTRODUCED_EXCESS * boundary_error:
            return None
        return Departure(slot, error, 0, 0, None, boundary_error, writer, unpaired=golden_writer)

    def _unpaired_region(self, writer: OpRecord) -> tuple[list[OpRecord] | None, list[OpRecord] | None]:
        """(the target-only ops ``writer``'s value was computed through, the paired ops they read from), walking
        the target's writers back from ``writer``; (None, None) past _REGION ops."""
        writers = self.writers()[1]
        region, boundary, todo, seen = [], [], [writer], {id(writer)}
        while todo:
            op = todo.pop()
            region.append(op)
            if len(region) > _REGION:
                return None, None
            for tensor in op.inputs:
                if not is_float(tensor.dtype):
                    continue
                producer = writers.producer(op, tensor.slot)
                if producer is None or id(producer) in seen or producer.is_module:
                    continue
                seen.add(id(producer))
                (todo if self.golden_of(producer) is None else boundary).append(producer)
        return region, boundary or None

    def changed_on_entry(self, record: OpRecord, view: GoldenView | None) -> Verdict | None:
        """kernel_bug at the module call ``record`` (its ops not golden's) whose float input departs from golden's
        by SIGNIFICANT_ERROR, INTRODUCED_EXCESS times more than the op that wrote it departs from its own partner:
        the value changed on its way into the call (a forward pre-hook scaling it, which runs in the call's
        scope). From statistics, where nothing replays the call."""
        golden_record = self.golden_of(record)
        if golden_record is None or view is None:
            return None
        for slot, error in pair_errors(self.golden_dump, self.target_dump, record, view, "input"):
            golden_tensor = next((t for t in golden_record.inputs if t.slot == slot), None)
            if error.error < SIGNIFICANT_ERROR or error.overflowed or golden_tensor is None:
                continue
            written = self._golden_writer(golden_record, golden_tensor)
            producer = self.target_of(written[0]) if written is not None else None
            if producer is None or producer.exec_index >= record.exec_index:
                continue
            producer_error = self.measure(producer).observed
            changer = self.writers()[1].producer(record, slot)  # (a pre-hook's ops run in the call's scope; an
            # input written outside it is another argument, in a list of other length: SDPA's mask left out)
            if error.error <= INTRODUCED_EXCESS * producer_error or changer is None or \
                    not changer.name.startswith(record.name + "/"):
                continue
            evidence = (f"{record.name} ({record.type}) is called with {slot} {error.error:.3g} from golden's, "
                        f"while {producer.name}, which wrote it, matches golden within {producer_error:.3g}",
                        "the value changed on its way into the call: code that runs in its scope before its "
                        "forward (a forward pre-hook) changed it")
            action = (f"check what changes the input of {record.name} before its forward runs: a forward pre-hook "
                      "(register_forward_pre_hook), or code at the top of its forward")
            return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, evidence, action,
                           module=record.name)
        return None

    def _golden_writer(self, golden_record: OpRecord, golden_tensor) -> tuple[OpRecord, str] | None:
        """(the golden op that last wrote ``golden_tensor`` before ``golden_record`` read it, its output slot)."""
        writer = self.writers()[0].producer(golden_record, golden_tensor.slot)
        if writer is None:
            return None
        key = fingerprint(golden_tensor)
        slot = next((t.slot for t in writer.outputs if t.stats.count and fingerprint(t) == key), None)
        return (writer, slot) if slot is not None else None

    def target_only_between(self, d: Departure, reader: OpRecord) -> list[OpRecord]:
        """The target's ops without a golden partner that ran between ``d``'s producer and ``reader``, in its
        writer's module path: the hand-written step that changed the value."""
        if d.writer is None:  # (a value still carrying the loss scale)
            return []
        start = d.producer.exec_index if d.producer is not None else -1  # (none: a value golden reads as a leaf)
        where = module_path(d.writer.name)
        return [r for r in self._target_records if start < r.exec_index < reader.exec_index
                and not r.is_module and module_path(r.name) == where and self.golden_of(r) is None]


def _beyond(error: float, writer_error: float, *dtypes: str) -> bool:
    """Whether a value ``error`` from golden, written from one ``writer_error`` from golden, changed by more than
    REWRITE_UNITS units of the coarsest of ``dtypes`` (the value's and its writer's outputs'), in quadrature."""
    units = [FORMATS[d].unit_roundoff for d in dtypes if d in FORMATS]
    return bool(units) and math.sqrt(max(error ** 2 - writer_error ** 2, 0.0)) >= REWRITE_UNITS * max(units)
