"""The overflow report: which ops raised the float status, first one first, and what to do."""

from __future__ import annotations

from precision_tool.analysis.errors import asks_for_infinity
from precision_tool.analysis.results import OverflowEntry, OverflowReport, Range, preferring_ours
from precision_tool.analysis.structure import fingerprint, is_copy
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FORMATS

# Op types whose overflow has a better cure than "keep it in float32".
_EXP_LIKE = {"Exp", "Pow", "Square"}
_SOFTMAX_LIKE = {"Softmax", "ScaledMaskedSoftmax", "LogSoftmax", "RealDiv", "ReduceSum"}


def overflow_hint(record: OpRecord, loss_scale: float | None, invalid: bool = False,
                  golden_largest: float | None = None) -> str:
    """One sentence on how to stop this op overflowing (``invalid``: it makes NaN from finite inputs, which a
    saturation mode wrote as numbers: `attribution.makes_nan_hidden`; ``golden_largest``: the largest magnitude
    of golden's outputs of the op, where known)."""
    if record.inherited_nonfinite:
        return "propagates an earlier overflow: fix the first one"
    if invalid:
        return (f"{record.type} makes NaN from these finite inputs (an invalid operation: the square root or log "
                "of a negative value, 0/0), which the saturation mode wrote as numbers: check its inputs' range")
    keep_fp32 = (f'keep {record.type} in float32 through the mix list '
                 f'({{"black-list": {{"to-add": ["{record.type}"]}}}})')
    fmt = FORMATS.get(record.compute_dtype)
    if record.direction == "backward" and golden_largest is not None and fmt is not None and golden_largest > fmt.max:
        return (f"golden's values there reach {golden_largest:.3g}, beyond the {record.compute_dtype} range at any "
                "loss scale (they do not scale with the loss): compute it in float32 (its module's input upcast, out "
                f"of the 16-bit region), or {keep_fp32}")
    if record.direction == "backward" and loss_scale and loss_scale > 1.0:
        return (f"gradient overflow (loss scale {loss_scale:g}): lower the loss scale or use a dynamic "
                "loss-scale manager, which skips such steps and shrinks the scale")
    if record.direction == "optimizer" and record.compute_dtype in ("float16", "bfloat16"):
        return (f"the optimizer updates in {record.compute_dtype}: keep the parameters it updates and its states in "
                "float32 (the model in float32 under torch.autocast, or a float32 master copy for the optimizer)"
                + (", where Adam's eps (1e-8) and small second moments do not round to 0"
                   if record.compute_dtype == "float16" and "Adam" in record.name else ""))
    if record.pass_name:
        return (f"a fused kernel ({record.pass_name}) overflows: compare with a fusion-off run, and switch "
                "the pass off if the unfused ops stay in range")
    outputs = [t for t in record.outputs if t.stats.count]
    if outputs and all(t.stats.finite and not t.stats.saturated for t in outputs):
        return (f"an intermediate of {record.type} overflowed although its outputs are in range: "
                f"{keep_fp32}, or rescale its inputs")
    if record.direction == "backward":
        return f"gradients exceed the {record.compute_dtype} range without loss scaling: {keep_fp32}, " \
               "or lower the learning rate"
    if record.type in _EXP_LIKE:
        return f"exp of large inputs overflows {record.compute_dtype}: subtract the max before exp " \
               f"(use a Softmax kernel) or {keep_fp32}"
    if record.type in _SOFTMAX_LIKE:
        return f"a hand-written softmax overflows: subtract the max before exp, or {keep_fp32}"
    if record.compute_dtype in ("float16", "bfloat16"):
        return f"result exceeds the {record.compute_dtype} range: {keep_fp32}, or rescale its inputs"
    narrowed = next((t.dtype for t in outputs if t.dtype in ("float16", "bfloat16")), None)
    if narrowed is not None and is_copy(record.type):  # (a cast computes in its input's format)
        return (f"a cast to {narrowed} overflows: values beyond its range become inf; keep this value in float32 "
                "(the module or the op reading it out of the 16-bit region), or rescale it")
    return "result is not finite in float32: check the inputs and the learning rate"


_DIVISIONS = frozenset("div div_ addcdiv addcdiv_ reciprocal reciprocal_ rsqrt rsqrt_ _foreach_div_ _foreach_addcdiv_"
                       .split())


def starts_here(record: OpRecord, golden: OpRecord | None, inherited: float) -> tuple[str, ...]:
    """The evidence that an overflow or NaN starts at ``record`` (its golden op ``golden``), whose inputs depart
    from golden's by ``inherited``: SIGNIFICANT_ERROR or more only by rounding (`errors.overflows_here`); an
    input holding zeros where golden's holds none (an eps float16 rounds to 0) is named."""
    from precision_tool.defaults import SIGNIFICANT_ERROR

    evidence = [f"its inputs are within {inherited:.3g} of golden: the problem starts here" if inherited <
                SIGNIFICANT_ERROR else f"its inputs are finite, {inherited:.3g} from golden's by rounding alone (no "
                "op before it overflowed): the problem starts here",
                "golden holds finite values there; the ops reading it diverge"]
    theirs = {t.slot: t.stats for t in golden.inputs} if golden is not None else {}
    for tensor in record.inputs:
        mine, gold = tensor.stats, theirs.get(tensor.slot)
        fmt = FORMATS.get(tensor.dtype)
        if gold is not None and fmt is not None and mine.count and gold.count and mine.min == 0.0 and gold.min > 0:
            divides = "it divides by " if record.type.removeprefix("aten.").split(".")[0] in _DIVISIONS else ""
            evidence.append(f"its {tensor.slot} holds zeros where golden's smallest value is {gold.min:.3g}: "
                            f"{divides}zeros {tensor.dtype}'s range made (values below its smallest, "
                            f"{fmt.smallest_subnormal:.3g}, round to 0)")
            break
    return tuple(evidence)


def _range(tensor) -> Range:
    return Range(tensor.stats.min, tensor.stats.max)


def overflow_entry(record: OpRecord, loss_scale: float | None, invalid: bool = False,
                   in_golden: bool = False, asked: bool = False, golden_largest: float | None = None) -> OverflowEntry:
    """The report entry of one overflowing op record (``invalid``, ``golden_largest``: see `overflow_hint`;
    ``in_golden``: golden's op makes the same inf and NaN; ``asked``: an infinite constant the model asked for, or
    carried from one)."""
    outputs = [t for t in record.outputs if t.stats.count]
    saturated = sum(t.stats.saturated for t in outputs)
    nan = sum(t.stats.nan for t in outputs)
    hint = AS_IN_GOLDEN_NAN if in_golden and nan else AS_IN_GOLDEN_SATURATED if in_golden and saturated else \
        AS_IN_GOLDEN if in_golden else \
        (CARRIES_CONSTANT if record.inherited_nonfinite else ASKED_CONSTANT) if asked else \
        overflow_hint(record, loss_scale, invalid, golden_largest)
    return OverflowEntry(
        step=record.step, exec_index=record.exec_index, name=record.name, type=record.type,
        direction=record.direction, compute_dtype=record.compute_dtype,
        inherited=record.inherited_nonfinite,
        saturated=saturated,
        inf=sum(t.stats.inf for t in outputs),
        nan=nan,
        input_ranges=tuple(_range(t) for t in record.inputs if t.stats.count),
        output_ranges=tuple(_range(t) for t in outputs),
        hint=hint,
        invalid=invalid and not record.inherited_nonfinite,
        in_golden=in_golden,
        asked=asked and not in_golden,
    )


_MODELS_OWN = "the model's own values (an attention mask's -inf), not an overflow of this run"
AS_IN_GOLDEN = f"golden's op makes as many inf/NaN: {_MODELS_OWN}"
AS_IN_GOLDEN_SATURATED = ("golden's op makes as many inf/NaN (written as the format's largest value here): "
                          f"{_MODELS_OWN}")
AS_IN_GOLDEN_NAN = ("golden's op makes as many inf/NaN: golden overflows there too, so this is no overflow of the "
                    "port (the model overflows in golden's precision)")
ASKED_CONSTANT = "asked for as an infinite constant (an attention mask's -inf): the model's own value, not an overflow"
CARRIES_CONSTANT = ("carries only infinite constants the model asked for (an attention mask's -inf): the model's own "
                    "values, not an overflow")


def _nonfinite(record: OpRecord) -> tuple[int, int]:
    """(inf or saturated, NaN) values among ``record``'s outputs: a saturation mode writes an inf (a mask's
    -inf) as the format's largest value."""
    outputs = [t.stats for t in record.outputs if t.stats.count]
    return sum(s.inf + s.saturated for s in outputs), sum(s.nan for s in outputs)


def as_in_golden(golden, records: list[OpRecord]) -> set[tuple[int, int]]:
    """(step, exec index) of the ``records`` whose golden op (same step, name and direction) raised the float
    status too, its outputs holding as many inf (saturated values, in a saturation mode) and as many NaN: values
    the model makes by design."""
    if golden is None or not records:
        return set()
    flagged = {(r.step, r.name, r.direction): r for step in sorted({r.step for r in records})
               for r in golden.ops(step=step) if r.overflow}  # (only the steps where the target overflowed)
    shared = set()
    for record in records:
        twin = flagged.get((record.step, record.name, record.direction))
        if twin is not None and _nonfinite(twin) == _nonfinite(record) != (0, 0):
            shared.add((record.step, record.exec_index))
    return shared


def asked_constants(records: list[OpRecord], shared: set) -> set[tuple[int, int]]:
    """(step, exec index) of the ``records`` (op executions that raised the float status, in execution order)
    that write an infinite constant the model asked for, reading no float tensor (``scalar_tensor(-inf)``,
    ``full(-inf)``: a mask value) or filling finite ones (`_FILLS`), or that inherit their inf/NaN only from
    such values or from those golden's ops make too (``shared``), followed by their statistics
    (`structure.fingerprint`): the mask added to the attention scores."""
    own_values: set = set()
    asked = set()
    for record in records:
        key = (record.step, record.exec_index)
        reads_float = any(t.stats.count and t.dtype in FORMATS for t in record.inputs)
        fills = record.type in _FILLS and not any(t.stats.inf or t.stats.nan for t in record.inputs if t.stats.count)
        if (fills or not reads_float) and asks_for_infinity(record.attrs) or _casts_float32_extreme(record):
            asked.add(key)
        elif record.inherited_nonfinite and key not in shared:
            carried = [t for t in record.inputs if t.stats.count and (t.stats.inf or t.stats.nan or t.stats.saturated)]
            if not carried or any(_values_key(t) not in own_values for t in carried):
                continue
            asked.add(key)
        elif key not in shared:
            continue
        own_values.update(_values_key(t) for t in record.outputs if t.stats.count)
    return asked


# ops that write their value argument where they write (a bool mask turned into an additive one by filling
# zeros with -inf, as nn.MultiheadAttention does): from finite inputs, the infinities they write are the one asked
_FILLS = frozenset({"aten.masked_fill", "aten.masked_fill_", "aten.fill", "aten.fill_", "aten.full_like",
                    "aten.new_full"})


def _casts_float32_extreme(record: OpRecord) -> bool:
    """A cast to a 16-bit format of a tensor holding float32's lowest or highest value (a mask filled with
    finfo(float32).min, which bfloat16 and float16 round to -inf): the model's constant, carried."""
    limit = FORMATS["float32"].max
    return is_copy(record.type) and any(t.dtype in ("float16", "bfloat16") and t.stats.inf for t in record.outputs) \
        and any(t.dtype == "float32" and t.stats.count and -limit in (t.stats.min, -t.stats.max)
                for t in record.inputs)


def _values_key(tensor) -> tuple:
    """What tells a tensor's values from another's by their statistics (`structure.fingerprint` and the inf and
    NaN counts), NaN made comparable: the statistics of values none of which is finite are NaN."""
    s = tensor.stats
    return tuple("nan" if x != x else x for x in (*fingerprint(tensor), s.inf, s.nan))


def _golden_largest(golden, record: OpRecord) -> float | None:
    """The largest magnitude among golden's outputs of a backward op that starts an overflow (None for other ops,
    or where golden lacks the op): what tells an overflow no loss scale causes from a scaled gradient's."""
    if golden is None or record.direction != "backward" or record.inherited_nonfinite:
        return None
    try:
        twin = golden.op(record.step, record.name, record.direction)
    except KeyError:
        return None
    values = [max(abs(t.stats.min), abs(t.stats.max)) for t in twin.outputs if t.stats.count]
    return max(values) if values else None


def overflow_report(dump, limit: int | None = None, golden=None) -> OverflowReport:
    """Every op execution of ``dump`` that raised the float status, in execution order; with ``golden``, those
    whose golden op makes the same inf/NaN are marked (`as_in_golden`).

    Works on any dump mode: an overflow-mode dump holds only such ops; dump
    and stats dumps carry the flag on every op.
    """
    steps = dump.steps()
    scales = {s.step: s.loss_scale for s in steps}
    if golden is not None:  # the scale the step's gradients carry: the one recorded after scaler.update() is the
        from precision_tool.analysis.scaling import loss_scale_ratios  # next step's, half of it after an overflow

        golden_scales = {s.step: s.loss_scale for s in golden.steps()}
        scales.update({step: ratio * golden_scales.get(step, 1.0)
                       for step, ratio in loss_scale_ratios(golden, dump).items()})
    records = [r for r in dump.ops() if r.overflow]
    from precision_tool.analysis.attribution import makes_nan_hidden

    shared = as_in_golden(golden, records)
    asked = asked_constants(records, shared)
    own = shared | asked
    shown = records if limit is None else preferring_ours(records, lambda r: (r.step, r.exec_index) in own, limit)
    entries = [overflow_entry(r, scales.get(r.step), makes_nan_hidden(dump, r), (r.step, r.exec_index) in shared,
                              (r.step, r.exec_index) in asked, _golden_largest(golden, r)) for r in shown]
    return OverflowReport(
        entries=entries,
        total=len(records),
        steps=sorted({r.step for r in records} | {s.step for s in steps if s.overflow}),
        skipped_steps=[s.step for s in steps if s.skipped],
        loss_scale=[s.loss_scale for s in steps],
        source=str(dump.path),
        as_in_golden=len(shared),
        asked=len(asked - shared),
    )
