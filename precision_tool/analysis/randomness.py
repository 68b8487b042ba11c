"""Random draws: an op whose values come from the random number generator (dropout's mask, an initialiser).

Two runs compare value by value only while they draw the same random numbers. A target seeded otherwise, or
on a device whose generator is not the CPU's (an accelerator's, with the same seed), draws other dropout masks:
from the first such op on, every op differs from golden's, though none computes anything wrong. The scan then
stops at that op with this verdict, instead of blaming the first op whose other checks the difference trips.

An op is taken for a random draw by its type (`RANDOM_DRAWS`). Its outputs differ from golden's while its
inputs agree (or are not read: ``bernoulli_`` overwrites its input). What tells other draws from a wrong
kernel is the distribution: other draws of the same distribution agree with golden's in mean and standard
deviation within what sampling explains (`same_distribution`); a kernel drawing from another distribution
(another probability, another range) does not, and is named as a kernel_bug.
"""

from __future__ import annotations

import math
import re

from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import Verdict
from precision_tool.analysis.structure import fingerprint, module_path
from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord
from precision_tool.engine.formats import FORMATS

# aten ops (torch dumps: "aten.bernoulli_"), and the engine's own Dropout, whose values are random draws
RANDOM_DRAWS = frozenset("""
bernoulli bernoulli_ uniform_ normal normal_ random_ exponential_ geometric_ cauchy_ log_normal_ rand rand_like
randn randn_like randint randint_like randperm multinomial poisson binomial native_dropout _fused_dropout
rrelu_with_noise rrelu_with_noise_ _standard_gamma _sample_dirichlet Dropout
""".split())

_DROPOUT_MODULE = re.compile(r"(Feature)?(Alpha)?Dropout([123]d)?")  # torch.nn's dropout modules

SAMPLING_SIGMAS = 6.0  # other draws of one distribution: their means (standard deviations) within this many
# standard errors of each other
FORMAT_SLACK = 1e-2  # and within this fraction of the values' scale: a 16-bit target rounds what it draws


def is_random_draw(op_type: str) -> bool:
    """Whether ``op_type`` ("aten.bernoulli_", "aten.native_dropout.default", "Dropout", a module's
    "module.Dropout2d") draws random values."""
    parts = op_type.split(".")
    if parts[0] == "module":
        return _DROPOUT_MODULE.fullmatch(op_type[len("module."):]) is not None
    return any(part in RANDOM_DRAWS for part in parts[1:3] if parts[0] == "aten") or op_type in RANDOM_DRAWS


def same_distribution(golden, target) -> bool:
    """Whether two tensors' statistics (`TensorStats`) are what two draws of one distribution give."""
    n = min(golden.count, target.count)
    if n <= 0 or not (golden.finite and target.finite):
        return False
    scale = max(golden.std, target.std, 0.0)
    slack = FORMAT_SLACK * (scale + abs(golden.mean))
    mean_error = SAMPLING_SIGMAS * scale / math.sqrt(n) + slack
    std_error = SAMPLING_SIGMAS * scale / math.sqrt(2 * n) + slack
    return abs(golden.mean - target.mean) <= mean_error and abs(golden.std - target.std) <= std_error


def random_draw_verdict(record: OpRecord, partner: OpRecord | None, golden_seed, target_seed) -> Verdict | None:
    """The verdict at a random draw ``record`` whose outputs differ from golden's ``partner``'s while its inputs
    agree: none (other draws of the same distribution: the runs are not comparable from here on) or kernel_bug
    (another distribution). None when ``record`` is no random draw."""
    if partner is None or partner.type != record.type or not is_random_draw(record.type):
        return None
    golden_outputs = {t.slot: t for t in partner.outputs if is_float(t.dtype) and t.stats.count}
    pairs = [(golden_outputs[t.slot], t) for t in record.outputs if t.slot in golden_outputs and t.stats.count]
    if not pairs:
        return None
    module = module_path(record.name)
    off = [(g, t) for g, t in pairs if not same_distribution(g.stats, t.stats)]
    if off:
        g, t = off[0]
        evidence = (f"{record.name} ({record.type}) draws random values, and its {t.slot} differs from golden's "
                    "while its inputs agree",
                    f"not as two draws of one distribution differ: mean {t.stats.mean:.6g} against golden's "
                    f"{g.stats.mean:.6g}, standard deviation {t.stats.std:.6g} against {g.stats.std:.6g}")
        return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence,
                       f"check what the target's {record.type} draws from: its probability or range, and the "
                       "kernel", module=module)
    seeds = (f"the runs are seeded differently (golden {golden_seed}, target {target_seed})"
             if golden_seed is not None and target_seed is not None and golden_seed != target_seed else
             "both runs record the same seed: the target's generator draws another stream (an accelerator's "
             "generator is not the CPU's), or the run consumed random numbers in another order before")
    g, t = pairs[0]
    seen = "" if any(x.has_data for x in record.outputs) else " (as its statistics show: the dumps keep no values)"
    evidence = (f"{record.name} ({record.type}) draws random values: its {t.slot} is not golden's{seen}, though "
                "its inputs agree",
                f"the same distribution (mean {t.stats.mean:.6g} against golden's {g.stats.mean:.6g}), other draws: "
                + seeds,
                "every op after it differs from golden's for this reason alone, so the comparison cannot judge "
                "them; no op before it introduces an error")
    return Verdict(record.name, "none", record.step, record.direction, record.type, evidence,
                   "collect both runs drawing the same random numbers: dropout off (p=0, or the forward in eval "
                   "mode) or the same seed on the same generator; then diagnose again", module=module)


def drawn_apart(golden, target, dtype: str) -> bool:
    """Whether two draws' statistics (`TensorStats`) show other values, beyond what rounding to the target's
    ``dtype`` moves: a mask's zeros and ones round to themselves, so any difference counts there."""
    if (golden.min, golden.max) == (target.min, target.max) and {golden.min, golden.max} <= {0.0, 1.0}:
        return golden.mean != target.mean
    fmt = FORMATS.get(dtype)
    unit = fmt.unit_roundoff if fmt is not None else 0.0
    return abs(golden.mean - target.mean) > unit * (abs(golden.mean) + golden.std) or \
        abs(golden.std - target.std) > unit * golden.std


def judge_draw(scan, record: OpRecord, attribution) -> Verdict | None:
    """`random_draw_verdict` at ``record`` in a scan (`scan.Scanner`), where its inputs agree with golden's and
    its output departs by SIGNIFICANT_ERROR (statistics only: its statistics are other values', `drawn_apart`,
    by more than INTRODUCED_EXCESS times its inputs' departure); the attribution joins the scan's on a
    verdict. Also for a module call (a Dropout module's)."""
    from precision_tool.analysis.notes import meta

    if not attribution.inherited < SIGNIFICANT_ERROR or attribution.inputs_off or not is_random_draw(record.type):
        return None  # (inputs holding inf or NaN where golden's are finite agree in no way: they are not scored)
    partner = scan._golden_of(record)
    if any(t.has_data for t in record.outputs):
        if attribution.observed < SIGNIFICANT_ERROR:
            return None
    elif attribution.inherited and attribution.observed <= INTRODUCED_EXCESS * attribution.inherited or \
            partner is None or not any(drawn_apart(g.stats, t.stats, t.dtype) for g in partner.outputs
                                    for t in record.outputs if g.slot == t.slot and t.stats.count and
                                    g.stats.count and is_float(t.dtype)):
        return None
    if record.is_module and partner is not None and _passes_through(partner) != _passes_through(record):
        verdict = _one_side_draws(record, not _passes_through(record), f"({record.type}, which records no ops: "
                                  "its output equals its input in one run and not in the other)")
    else:
        verdict = _redrawn(scan, record) or \
            random_draw_verdict(record, partner, meta(scan.golden, "seed"), meta(scan.target, "seed"))
    if verdict is not None:
        scan.result.attributions.append(attribution)
    return verdict


def _redrawn(scan, record: OpRecord) -> Verdict | None:
    """kernel_bug where ``record`` recomputes a draw of its step (activation checkpointing runs a block's forward
    again in backward, its ops named as in the first call) and draws other values than the call it recomputes,
    where golden's recomputation draws its first call's: the target's backward goes through another mask than
    its forward applied."""
    def drawn(r: OpRecord) -> list:
        return [fingerprint(t) for t in r.outputs if t.stats.count and is_float(t.dtype)]

    def calls(records) -> list[OpRecord]:
        return [r for r in records if r.name == record.name and r.direction == record.direction]

    mine, golden = calls(scan.step_records), calls(scan.golden_records)
    later = [r for r in mine if r.exec_index <= record.exec_index]
    if len(later) < 2 or len(golden) < 2 or drawn(later[0]) == drawn(record) or drawn(golden[0]) != drawn(golden[1]):
        return None
    evidence = (f"{record.name} ({record.type}) runs again in its step (activation checkpointing recomputes its "
                "block in backward) and draws other random values than its first call did",
                "golden's recomputation draws its first call's: the target's backward goes through another dropout "
                "mask than its forward applied, and its gradients are not the forward's")
    return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence,
                   "let checkpointing restore the random state for the recomputation (torch.utils.checkpoint's "
                   "preserve_rng_state=True, its default), or draw no random numbers inside the checkpointed block",
                   module=module_path(record.name))


def unequal_draws(rewrite) -> Verdict | None:
    """kernel_bug at a forward module call (`structure.Rewritten`) that draws random values in one run and not
    in the other: dropout on in one, off in the other (a module left in training mode, another probability).
    Named there as an argument called differently is, not as an implementation to check."""
    record = rewrite.target_record
    if rewrite.direction not in ("forward", "backward") or record is None:
        return None
    golden = [t for t in rewrite.golden_ops if is_random_draw(t)]
    target = [t for t in rewrite.target_ops if is_random_draw(t)]
    if bool(golden) == bool(target):
        return None
    ops = ", ".join(dict.fromkeys(t.removeprefix("aten.") for t in target or golden))
    if rewrite.direction == "backward":
        return _drawn_in_backward(rewrite, record, ops, bool(target))
    return _one_side_draws(record, bool(target), f"({ops}): {rewrite.describe()}", rewrite.name)


def _drawn_in_backward(rewrite, record: OpRecord, ops: str, target_draws: bool) -> Verdict | None:
    """kernel_bug at a module whose backward draws random values in one run only (noise a gradient hook mixes into
    the gradient), from statistics, which show noise at the second order only; full dumps compare its values."""
    if any(t.has_data for t in record.tensors) or not any(t.stats.count for t in record.tensors):
        return None
    drawing, other = ("the target's", "golden's") if target_draws else ("golden's", "the target's")
    evidence = (f"in backward of {rewrite.name}, {rewrite.describe()}",
                f"{drawing} backward draws random values ({ops}) where {other} draws none: noise mixed into the "
                "gradient (a gradient hook that adds noise, a stochastic backward written by hand)")
    return Verdict(rewrite.name, "kernel_bug", record.step, "backward", record.type, evidence,
                   f"check the hooks and custom backward of {rewrite.name} in {drawing} run: golden's gradient there "
                   "is deterministic", module=rewrite.name)


def _one_side_draws(record: OpRecord, target_draws: bool, how: str, name: str | None = None) -> Verdict:
    drawing, other = ("the target's", "golden's") if target_draws else ("golden's", "the target's")
    name = name or record.name
    evidence = (f"in {name}, {drawing} call draws random values where {other} draws none {how}",
                f"dropout is on in one run and off in the other: the module in training mode in {drawing} run and "
                f"in eval mode in {other}, or a dropout probability of 0 in {other}")
    return Verdict(name, "kernel_bug", record.step, "forward", record.type, evidence,
                   "run the module in the same mode in both runs (model.train() or model.eval()) with the same "
                   "dropout probability; to compare values, with dropout off in both", module=name)


def _passes_through(record: OpRecord) -> bool:
    """Whether a module call's first float output holds its first float input's values, by their statistics
    (a Dropout in eval mode)."""
    inputs = [t for t in record.inputs if is_float(t.dtype) and t.stats.count]
    outputs = [t for t in record.outputs if is_float(t.dtype) and t.stats.count]
    return bool(inputs and outputs) and fingerprint(inputs[0]) == fingerprint(outputs[0])
