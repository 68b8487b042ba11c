"""What the target leaves out or passes differently where golden's op sequence is the same: a paired op that
computes fewer gradients, an optimizer that updates fewer tensors, an op given another parameter than golden's.

Each is invisible to a judgement of values alone: the ops the target does run agree with golden's.

* **Fewer gradients.** A backward op computes a gradient golden's (same type) computes and the target's does not
  (a LayerNorm called without its weight and bias computes no gradient for them). When the forward op it belongs
  to is called with fewer tensors than golden's, the forward call is the culprit (the parameters are left out of
  it); else the backward (parameters that golden trains are not trained).
* **Fewer updates.** The optimizer updates fewer tensors of some size than golden's (a parameter left out of
  the optimizer's groups): the optimizer is the culprit, however close the updates it does make are.
* **Another parameter.** At the first step both runs start from the same weights and data: a forward op that
  reads a value no op of the step wrote (a parameter, buffer or the data) SIGNIFICANT_ERROR from golden's, while
  the step's first ops agree (`scan.Scanner.leaf_mismatch`), is called with another tensor than golden's (its
  weight and bias swapped) or with a parameter initialised differently: the call is the culprit.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.structure import Consumers, fingerprint, group_results, module_path
from precision_tool.defaults import SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord


def _float_slots(tensors) -> dict[str, object]:
    return {t.slot: t for t in tensors if is_float(t.dtype) and t.stats.count}


def fewer_gradients(record: OpRecord, partner: OpRecord | None, target_records: list[OpRecord],
                    golden_records: list[OpRecord], golden_backward: Consumers) -> Verdict | None:
    """kernel_bug where the backward ``record`` computes none of a gradient (not all zero) that its golden
    ``partner`` computes and that golden's backward reads no further (a parameter's gradient: an input's gradient
    the target does not compute because nothing before needs one is judged where its backward goes missing); at
    the forward op it belongs to when that one is called with fewer tensors. Outputs are matched by size: a
    capture numbers the gradients an op does compute, so slots shift where one is left out."""
    if partner is None or partner.type != record.type or record.direction != "backward":
        return None
    deficit = Counter(t.stats.count for t in _float_slots(partner.outputs).values())
    deficit.subtract(t.stats.count for t in _float_slots(record.outputs).values())
    lacking = []
    for t in _float_slots(partner.outputs).values():
        if deficit[t.stats.count] > 0 and t.stats.norm > 0 and not golden_backward.of(partner, {t.slot}):
            deficit[t.stats.count] -= 1
            lacking.append(t)
    if not lacking:
        return None
    shown = ", ".join(f"{t.slot} {t.shape}" for t in lacking[:4])
    evidence = [f"{record.name} ({record.type}) computes {len(lacking)} gradient(s) fewer than golden's: {shown}"]
    forward_name = record.name.rsplit("/", 1)[0]
    forward = next((r for r in target_records if r.direction == "forward" and r.name == forward_name), None)
    golden_forward = next((r for r in golden_records if r.direction == "forward" and r.name == forward_name), None)
    if forward is not None and golden_forward is not None and forward.type == golden_forward.type:
        left_out = sorted(set(_float_slots(golden_forward.inputs)) - set(_float_slots(forward.inputs)))
        if left_out:
            evidence.append(f"its forward op {forward.name} is called without {', '.join(left_out)}, which golden "
                            "passes: the parameters there are left out of the call and get no gradient")
            return Verdict(forward.name, "kernel_bug", forward.step, "forward", forward.type, tuple(evidence),
                           f"pass {forward.type} the tensors golden passes ({', '.join(left_out)}): an affine "
                           "weight or bias dropped from the call, say", module=module_path(forward.name))
    evidence.append("parameters that golden trains get no gradient there in the target")
    return Verdict(record.name, "kernel_bug", record.step, "backward", record.type, tuple(evidence),
                   "check that the parameters read there require grad in the target as in golden",
                   module=module_path(record.name))


def fewer_updates(name: str, golden_group: list[OpRecord], target_group: list[OpRecord]) -> Verdict | None:
    """kernel_bug where the optimizer ``name`` of one step updates fewer tensors of some size than golden's."""
    def sizes(records):
        return Counter(t.stats.count for _, t in group_results(records))

    golden, target = sizes(golden_group), sizes(target_group)
    # single values are the optimizer's step counters, which a fused kernel updates inside (read by it: no result)
    lacking = {size: n - target.get(size, 0) for size, n in golden.items() if n > target.get(size, 0) and size > 1}
    if not lacking or not target_group:
        return None
    last = target_group[-1]
    shown = ", ".join(f"{n} of {size} element(s)" for size, n in sorted(lacking.items())[:4])
    evidence = (f"{name} writes fewer tensors than golden's: {shown} fewer "
                f"({sum(golden.values())} in golden, {sum(target.values())} in the target)",
                "parameters that golden updates are not updated in the target")
    return Verdict(name, "kernel_bug", last.step, "optimizer", last.type, evidence,
                   f"check that every parameter golden's {name} updates is in the target optimizer's param groups",
                   module=name)


def changed_leaf(record: OpRecord, partner: OpRecord | None, golden_writers: Consumers, slot_errors,
                 golden_dump=None, exact: frozenset = frozenset()) -> Verdict | None:
    """kernel_bug where the forward ``record`` reads, in a slot golden's ``partner`` reads a value no op of the
    step wrote, a value SIGNIFICANT_ERROR from golden's. ``slot_errors``: (slot, error) of the record's inputs;
    ``golden_writers``: golden's ops of the step in every direction (the training loop's ops after backward read
    gradients a backward op wrote). Only meaningful at the first step, where both runs start from the same
    parameters and data. A value no statistics match may still be part of one an op wrote (a slice of the
    logits, of a query's heads): with ``golden_dump``'s values such a slice is told (`_part_of_written`).
    ``exact``: slots whose statistics show other values than golden's where nothing upstream rounded
    (`leaves._unlike_golden`), changed whatever their lower bound."""
    if partner is None or partner.type != record.type or record.direction != "forward":
        return None
    golden_inputs = _float_slots(partner.inputs)
    changed = [(slot, error) for slot, error in slot_errors if slot in golden_inputs
               and (error >= SIGNIFICANT_ERROR or slot in exact)
               and golden_writers.producer(partner, slot) is None
               and not _part_of_written(partner, slot, golden_writers, golden_dump)
               and not _returned_by_a_call(partner, slot, golden_dump)]
    if not changed:
        return None
    slot, error = changed[0]
    evidence = [f"{record.name} ({record.type}) reads {slot}, a value no op of step {record.step} wrote (a "
                f"parameter, buffer or the data), {error:.3g} from golden's, while the step's first ops read the "
                "same weights and data as golden's" if error >= SIGNIFICANT_ERROR else
                f"{record.name} ({record.type}) reads {slot}, a value no op of step {record.step} wrote (a "
                f"parameter, buffer or the data), at least {error:.3g} from golden's: its statistics are not "
                "golden's, while every op before it in the step wrote golden's values to the last bit"]
    try:
        mine = fingerprint(record.tensor(slot))
    except KeyError:
        mine = None
    same_as = [s for s, t in golden_inputs.items() if s != slot and fingerprint(t) == mine]
    if same_as:
        evidence.append(f"the target's {slot} is golden's {same_as[0]}: the op is given its arguments in another "
                        "order")
    return Verdict(record.name, "kernel_bug", record.step, "forward", record.type, tuple(evidence),
                   f"check what the target passes {record.type} as {slot}: another tensor than golden's, or a "
                   "parameter initialised or loaded differently", module=module_path(record.name))


def _returned_by_a_call(record: OpRecord, slot: str, dump) -> bool:
    """Whether an earlier module call of ``record``'s step returned golden's input ``slot``: in a region's dump
    (`zoom`) the ops inside that call may be left out, and what it computed is no parameter or data."""
    if dump is None:
        return False
    key = fingerprint(record.tensor(slot))

    def computed(call: OpRecord) -> bool:  # (a call handing its input back, a Dropout of 0, computed nothing)
        return any(fingerprint(t) == key for t in call.outputs if t.stats.count) and \
            not any(fingerprint(t) == key for t in call.inputs if t.stats.count)
    return any(r.is_module and r.exec_index < record.exec_index and computed(r)
               for r in dump.ops(step=record.step, direction=record.direction))


_SAMPLE = 64  # values of a tensor looked for in another's


def _part_of_written(record: OpRecord, slot: str, writers: Consumers, dump) -> bool:
    """Whether golden's input ``slot`` of ``record`` holds values an earlier op of the step wrote as part of a larger
    output (a slice, read through a view whose statistics no output shares): `written_part_of`."""
    return written_part_of(record, slot, writers, dump) is not None


def written_part_of(record: OpRecord, slot: str, writers: Consumers, dump) -> OpRecord | None:
    """The earlier op of the step (of ``writers``, over ``dump``'s values) whose larger output holds the values of
    ``record``'s input ``slot``, read through a view whose statistics no output shares (a slice): 64 of its values,
    spread over it and at least 4 distinct, all found in that output. None without values to look at."""
    tensor = record.tensor(slot)
    stats = tensor.stats
    if dump is None or not tensor.has_data or not stats.count:
        return None
    sample = None
    for writer, written in writers.written_before(record):
        held = written.stats
        if held.count <= stats.count or held.min > stats.min or held.max < stats.max or not written.has_data \
                or written.dtype != tensor.dtype:
            continue
        if sample is None:
            values = np.ravel(dump.tensor(record.step, record.exec_index, slot))
            sample = np.unique(values[np.linspace(0, values.size - 1, min(_SAMPLE, values.size)).astype(int)])
            if sample.size < 4:
                return None
        if np.isin(sample, np.ravel(dump.tensor(writer.step, writer.exec_index, written.slot))).all():
            return writer
    return None


def module_narrower_than_declared(rewrite, members: list[OpRecord], observed: float) -> Verdict | None:
    """precision_loss at a rewritten module call (`structure.Rewritten`) of a run that declares float32 throughout
    whose ops (``members``) mostly compute in a 16-bit format while golden's all compute in float32, its output
    beyond float32's noise (``observed``): the module cast down by hand, which runs other kernels in that format
    (an LSTM .half()ed on a CPU runs its cells op by op, where golden's runs oneDNN's kernel)."""
    from precision_tool.analysis.errors import noise_floor
    from precision_tool.analysis.structure import is_copy

    computed = [r.compute_dtype for r in members if not is_copy(r.type) and r.compute_dtype in _LOW + ("float32",)]
    golden = rewrite.golden_record
    low = [d for d in computed if d in _LOW]
    if not computed or len(low) * 2 <= len(computed) or golden is None or golden.compute_dtype in _LOW \
            or not observed >= noise_floor("float32"):
        return None
    dtype = max(set(low), key=low.count)
    evidence = (f"in module {rewrite.name}, {rewrite.describe()}",
                f"the target declares float32 throughout, yet {len(low)} of the {len(computed)} ops of "
                f"{rewrite.name} compute in {dtype}; golden's compute in float32",
                f"its output is {observed:.3g} from golden's: the module computes in a format the run does not "
                "declare, with the kernels that format takes")
    record = rewrite.target_record
    return Verdict(rewrite.name, "precision_loss", record.step, "forward", record.type, evidence,
                   f"keep {rewrite.name} in float32 (a .half() or .to({dtype}) on the module or on its input), or "
                   "run the whole target under autocast", module=rewrite.name)

# precision modes in which every op of a float32 model computes in float32; not force_fp32 (nor its twin
# cube_fp16in_fp32out): its Cube ops prefer float16 in, float32 out (reference/NUMERICS.md), so a clean run's
# matmuls read float16 by design
_FLOAT32_MODES = frozenset({"golden_float32"})
_LOW = ("float16", "bfloat16")


def declares_float32(dump) -> bool:
    """Whether ``dump``'s run says it computes in float32 throughout (no autocast, no mixed precision)."""
    from precision_tool.analysis.notes import meta

    mode = meta(dump, "effective_precision_mode") or meta(dump, "precision_mode")
    if mode == "must_keep_origin_dtype":
        return meta(dump, "origin_dtype") == "float32"
    return mode in _FLOAT32_MODES and not meta(dump, "autocast")


def runs_float32(dump) -> bool:
    """`declares_float32`, and most forward ops of its first step compute in float32: a model cast whole to a
    16-bit format (``model.to(torch.bfloat16)``) declares nothing, yet runs in that format by the user's
    choice; one module cast by hand is the exception among float32 ops. The ops counted are the model's, run
    inside its modules, where it has any: a loop that keeps float32 master weights for a 16-bit model
    unscales their gradients with one float32 op per parameter, outside every module (and outside the
    optimizer's step, so that they count as forward ops). Each module counts once, by what most of its own ops
    compute in."""
    from precision_tool.analysis.notes import meta
    from precision_tool.analysis.structure import is_copy

    if not declares_float32(dump):
        return False
    known = meta(dump, "runs_float32")
    if isinstance(known, bool):  # a zoom region's dump: what its whole run computes in (a region of one module
        return known  # cast to 16 bits holds 16-bit ops mostly)
    steps = dump.steps()
    if not steps:
        return True
    forward = dump.ops(step=steps[0].step, direction="forward")
    records = [r for r in forward
               if not r.is_module and not is_copy(r.type) and r.compute_dtype in _LOW + ("float32",)]
    if not any(not r.is_module for r in forward):  # a dump of module calls: the formats of their outputs
        dtypes = [t.dtype for r in forward for t in r.outputs if is_float(t.dtype) and t.stats.count]
        return sum(d in _LOW for d in dtypes) * 2 < len(dtypes)
    modules: dict[str, list[bool]] = {}
    for record in records:
        if module_path(record.name):
            modules.setdefault(module_path(record.name), []).append(record.compute_dtype in _LOW)
    # each module call counts once, as its ops mostly compute: an LSTM cast by hand runs six 16-bit ops where
    # the embedding and the head around it run one float32 op each
    low = [sum(flags) * 2 > len(flags) for flags in modules.values()] or [r.compute_dtype in _LOW for r in records]
    return sum(low) * 2 < len(low)


def declared_format(dump) -> str | None:
    """The narrowest format ``dump``'s run declares it computes in: ``float32`` for a float32 run
    (`runs_float32`), the autocast format of an autocast run, else None (a model cast whole: nothing declared)."""
    from precision_tool.analysis.notes import meta

    if runs_float32(dump):
        return "float32"
    autocast = meta(dump, "autocast")
    return autocast if autocast in _LOW else None


def _coarser(dtype: str, declared: str) -> bool:
    from precision_tool.engine.formats import FORMATS

    return dtype in FORMATS and declared in FORMATS and FORMATS[dtype].unit_roundoff > FORMATS[declared].unit_roundoff


def narrower_than_declared(record: OpRecord, partner: OpRecord | None, observed: float,
                           declared: str = "float32") -> Verdict | None:
    """precision_loss where the forward op ``record`` computes in a 16-bit format coarser than every format its run
    declares (``declared``: float32 throughout, or an autocast format: bfloat16 in a float16 autocast run) while
    golden's ``partner`` computes in float32, and its output departs from golden's beyond float32's noise
    (``observed``): a module or tensor cast down by hand (``module.half()``, ``x.to(torch.bfloat16)``). Casts only
    round (a stray round trip is judged where its value is read, `departures`); this is an op computing in it."""
    from precision_tool.analysis.errors import noise_floor
    from precision_tool.analysis.structure import is_copy

    policy = declared in _LOW and record.type in AUTOCAST_FLOAT32  # autocast computes a loss in float32
    if partner is None or record.direction != "forward" or is_copy(record.type) or record.compute_dtype not in _LOW \
            or not (policy or _coarser(record.compute_dtype, declared)) or partner.compute_dtype in _LOW \
            or observed < noise_floor("float32"):
        return None
    if policy:
        return _loss_in_16_bits(record, partner, observed, declared)
    run = "declares float32 throughout" if declared == "float32" else f"runs under {declared} autocast"
    evidence = (f"the target {run}, yet {record.name} ({record.type}) computes in "
                f"{record.compute_dtype}; golden computes it in {partner.compute_dtype}",
                f"its output is {observed:.3g} from golden's: the first {'module call' if record.is_module else 'op'} "
                "of the target that computes in a format the run does not declare")
    where = module_path(record.name) or record.name
    action = f"keep {where} in float32 (a .half() or .to(float16) on the module or on its input), or run the " \
             "whole target under autocast" if declared == "float32" else \
             f"let autocast choose {where}'s format (float32 or {declared}): remove the .to({record.compute_dtype}) " \
             "on the module or on its input"
    return Verdict(record.name, "precision_loss", record.step, "forward", record.type, evidence, action,
                   module=module_path(record.name))


def _carried(record: OpRecord, readers) -> bool:
    """Whether no op of the step but casts and copies reads what ``record`` wrote, following them."""
    from precision_tool.analysis.structure import is_copy

    frontier, seen = [record], 0
    while frontier and seen < 16:
        current, seen = frontier.pop(), seen + 1
        for reader in readers.of(current):
            if not is_copy(reader.type):
                return False
            frontier.append(reader)
    return True


# losses autocast computes in float32 on every device (its float32 lists, CPU and CUDA): one computed in 16 bits
# in an autocast run was computed outside autocast's reach, on 16-bit values (a loss taken after the autocast
# block on its float16 logits, or with autocast disabled around it)
AUTOCAST_FLOAT32 = frozenset(f"aten.{name}" for name in """
nll_loss nll_loss_forward nll_loss2d_forward nll_loss_nd cross_entropy_loss mse_loss l1_loss smooth_l1_loss
huber_loss kl_div binary_cross_entropy binary_cross_entropy_with_logits soft_margin_loss multi_margin_loss
multilabel_margin_loss_forward poisson_nll_loss margin_ranking_loss hinge_embedding_loss cosine_embedding_loss
triplet_margin_loss""".split())


def _loss_in_16_bits(record: OpRecord, partner: OpRecord, observed: float, declared: str) -> Verdict:
    evidence = (f"{record.name} ({record.type}) computes in {record.compute_dtype}, where autocast computes a loss "
                f"in float32 (golden computes it in {partner.compute_dtype}): the target took it outside autocast, "
                f"on {record.compute_dtype} values",
                f"its output is {observed:.3g} from golden's, the loss rounded to {record.compute_dtype} with it")
    action = (f"compute the loss inside the autocast block, or on float32 values (logits.float()), as autocast "
              f"computes it under {declared} autocast")
    return Verdict(record.name, "precision_loss", record.step, "forward", record.type, evidence, action,
                   module=module_path(record.name))


def stray_cast(record: OpRecord, partner: OpRecord | None, loss_departs: bool, readers=None) -> Verdict | None:
    """In a run that declares float32 throughout: precision_loss at a forward cast that rounds a
    float32 value to a 16-bit format where golden's run holds it in float32 (no golden op pairs with it, or
    golden's writes float32), the step's loss departing from golden's (``loss_departs``). A round trip moves
    values by up to a unit of that format, which statistics hardly show; the format itself is the evidence, which
    full dumps read from the values where the step reads them (`departure_verdicts.narrowing_cast`), and from the
    format too where a later step does (an LSTM's state carried through bfloat16): with ``readers`` (the step's
    `Consumers`, for full dumps), only a cast whose value no op of the step but casts and copies reads."""
    from precision_tool.analysis.structure import is_copy

    if readers is not None and not _carried(record, readers):
        return None
    narrowed = [t.dtype for t in record.outputs if t.dtype in _LOW and t.stats.count]
    if record.direction != "forward" or not loss_departs or not is_copy(record.type) or not narrowed or \
            not any(t.dtype == "float32" and t.stats.count for t in record.inputs) or \
            (partner is not None and any(t.dtype in _LOW for t in partner.outputs)):
        return None
    evidence = (f"the target declares float32 throughout, yet {record.name} ({record.type}) casts a float32 value "
                f"to {narrowed[0]}, which golden holds in float32",
                ("from statistics only, which a round trip through a narrower format hardly moves; " if
                 not any(t.has_data for t in record.outputs) else "") + "the step's loss departs from golden's: the "
                "first op of the target that rounds to a format the run does not declare")
    return Verdict(record.name, "precision_loss", record.step, "forward", record.type, evidence,
                   f"keep {module_path(record.name) or 'this value'} in float32 (a .to({narrowed[0]}) or .half() on "
                   "it or on its module); confirm with tensors (`precision-tool zoom`)",
                   module=module_path(record.name))
