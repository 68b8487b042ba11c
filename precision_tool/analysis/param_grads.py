"""What a module-level step's parameter gradients show that its module records do not.

The torch capture keeps, at module level, the gradient the optimizer reads
for each trained parameter of every module called in the step
(`precision_tool.torch.param_grads`). The scan reads it for the first step
once no module call was judged there:

* A parameter whose gradient the optimizer finds in one run only, of a
  module both runs call: that run's module does not read the parameter (a
  Linear that forgets its bias). Its output moves by what the parameter adds,
  which 16-bit rounding hides at the first step; the missing gradient is
  there in any format.
* In a float32 pair whose module calls all match golden's to the last bit,
  forward and backward (the same inputs and the same gradients at every
  module's outputs), the parameters of one module whose gradients depart
  beyond float32 rounding while every other parameter's gradient is golden's
  to the last bit: that module's backward computes its parameters' gradients
  otherwise (a custom autograd Function, a hook on a parameter). Nothing else
  shows it before the update.

* A parameter that more of the called modules hold in one run than in the
  other: a weight tied in one run only (GPT-2's output embedding untied
  from its input embedding).

* In such a pair, every parameter's gradient golden's times one factor: the
  training loop's code between backward and the update scales them (gradient
  clipping with another max norm).

Otherwise parameters that several called modules hold (tied weights) are
left out: their gradient is no one module's.
"""

from __future__ import annotations

import math

from precision_tool.analysis.errors import stats_split
from precision_tool.analysis.leaves import stats_row
from precision_tool.analysis.module_updates import _same_step
from precision_tool.analysis.modulejudge import _runs_float32
from precision_tool.analysis.replay import is_float
from precision_tool.analysis.results import UPDATE_TYPE, Verdict
from precision_tool.analysis.rewrites import _fmt
from precision_tool.analysis.zoom import FLOAT32_DEPARTURE
from precision_tool.dump.layout import PARAMETER_GRADIENTS, STATS_FIELDS
from precision_tool.dump.records import TensorStats
from precision_tool.errors import InputError


def judge_parameter_gradients(scan, step: int) -> Verdict | None:
    """The verdict the first step's parameter gradients give in a module-level pair, or None."""
    if step != scan._first_step:
        return None
    golden, target = (_rows(dump, step) for dump in (scan.golden, scan.target))
    if not golden or not target:
        return None
    both = {r.name for r in scan.step_records if r.direction == "forward"} & \
        {r.name for r in scan.golden_records if r.direction == "forward"}
    for key, row in target.items():
        if key in golden and key[0] in both and row["holders"] != golden[key]["holders"]:
            return _tied_in_one_run(scan, step, *key, int(golden[key]["holders"]), int(row["holders"]))
    common = [(key, row, golden[key]) for key, row in target.items()
              if key in golden and key[0] in both and row["holders"] == 1 and golden[key]["holders"] == 1]
    for (module, parameter), ours, theirs in common:
        # (zeros are no evidence of a read: zero_grad(set_to_none=False) leaves them on a parameter the step skips)
        if not ours["has_grad"] and _nonzero(theirs) or not theirs["has_grad"] and _nonzero(ours):
            return _read_in_one_run(scan, step, module, parameter, reads=bool(ours["has_grad"]))
    return _weight_gradient(scan, step, common) if _runs_float32(scan) else None


_TEXT = ("module", "parameter", "dtype")
_FIELDS = (*_TEXT, "has_grad", "holders", *STATS_FIELDS)
_COUNTS = ("has_grad", "holders", "count", "nan", "inf", "saturated")
_KINDS = {**{field: "S" for field in _TEXT}, **{field: "bu" for field in _COUNTS}}  # the rest: floats


def _rows(dump, step: int) -> dict | None:
    """The step's rows by (module, parameter); None where the dump has no table (an op-level dump, an older one).
    A table without these fields is an InputError naming the dump."""
    reader = getattr(dump, "step_table", None)
    table = reader(step, PARAMETER_GRADIENTS) if reader is not None else None
    if table is None:
        return None
    problem = _malformed(table)
    if problem:
        raise InputError(getattr(dump, "path", "dump"), f"step {step}'s {PARAMETER_GRADIENTS} {problem}")
    return {(bytes(row["module"]).decode(errors="replace"), bytes(row["parameter"]).decode(errors="replace")): row
            for row in table}


def _malformed(table) -> str:
    """What makes ``table`` no table of parameter gradients as the capture writes them; "" where nothing does."""
    names = table.dtype.names or ()
    missing = [field for field in _FIELDS if field not in names]
    if table.ndim != 1 or missing:
        return f"is not a table of parameter gradients (no field {', '.join(missing)})" if missing else \
            f"is not a table of parameter gradients ({table.ndim} dimensions)"
    for field in _FIELDS:
        kind = table.dtype[field].kind
        if kind not in _KINDS.get(field, "f"):
            return f"holds {table.dtype[field]} in its field {field}, where the capture writes " + \
                {"S": "bytes", "bu": "unsigned integers"}.get(_KINDS.get(field, "f"), "floats")
    if len(table) and (table["holders"].min() < 1 or table["has_grad"].max() > 1 or (table["norm"] < 0).any()):
        return "holds impossible values (a parameter no module holds, a has_grad other than 0 or 1, a negative norm)"
    return ""


def _read_in_one_run(scan, step: int, module: str, parameter: str, reads: bool) -> Verdict:
    where, other = ("the target", "golden") if reads else ("golden", "the target")
    evidence = (f"at step {step} the optimizer finds a gradient for {module}'s parameter {parameter} in {where} "
                f"and none in {other}, and both runs call {module}",
                f"the target's {module} " + ("reads a parameter golden's does not" if reads else
                                             f"does not read {parameter} (a bias left out, a parameter replaced by "
                                             "a copy or a constant)") + ": its output differs by what "
                f"{parameter} adds, which may be below the dtype's rounding at first; the update then differs")
    return Verdict(module, "kernel_bug", step, "forward", _module_type(scan, module), evidence,
                   f"compare {module}'s forward with golden's: which parameters it reads", module=module)


def _tied_in_one_run(scan, step: int, module: str, parameter: str, golden: int, target: int) -> Verdict:
    evidence = (f"{module}'s parameter {parameter} is held by {golden} of the modules golden calls at step {step} and "
                f"by {target} of the target's: a weight tied in one run only",
                "a tied weight's gradient sums what each holder's backward hands it, and one update moves every "
                "holder's weight: from the first update on the runs differ")
    return Verdict(module, "kernel_bug", step, "backward", _module_type(scan, module), evidence,
                   f"tie (or untie) {module}'s {parameter} as golden does", module=module)


def _weight_gradient(scan, step: int, common: list) -> Verdict | None:
    """One module's parameter gradients depart, every other's and every module call are golden's to the bit."""
    departed, exact = [], 0
    for (module, parameter), ours, theirs in common:
        if not (_measured(ours) and _measured(theirs)):
            continue
        a, b = _stats(ours), _stats(theirs)
        if stats_row(a) == stats_row(b):
            exact += b.norm > 0.0  # (zeros in both, any factor keeps: no evidence either way)
            continue
        error = stats_split(a, b, ours["dtype"].decode(errors="replace")).error
        if not error >= FLOAT32_DEPARTURE:
            return None  # (another kernel's rounding: nothing is golden's to the last bit)
        departed.append((module, parameter, error))
    modules = {module for module, _, _ in departed}
    calls = _same_step(scan.golden, scan.target, step) if modules else None
    if calls is None:
        return None
    if not exact:  # every gradient: the loop's code between backward and the update, if by one factor
        return _scaled_in_the_loop(scan, step, common, calls[0])
    if len(modules) != 1:
        return None
    module = modules.pop()
    names = ", ".join(parameter for _, parameter, _ in departed)
    error = max(e for _, _, e in departed)
    evidence = (f"every module call of step {step} matches golden's to the last bit, forward and backward "
                f"({calls[0]} calls): {module} reads golden's inputs and gets golden's gradients at its outputs",
                f"the gradient the optimizer reads for {module}'s {names} departs by {_fmt(error)} (from "
                f"statistics), while the other {exact} parameters' gradients are golden's to the last bit",
                f"{module}'s backward computes its parameters' gradients otherwise than golden's (a custom autograd "
                "Function, a hook on a parameter)")
    return Verdict(module, "kernel_bug", step, "backward", _module_type(scan, module), evidence, (
        f"collect step {step} again at op level (ptt.dump(path, mode=\"dump\", steps=[{step}], "
        f"modules=[{module!r}])) or run precision-tool zoom"), module=module)


def _scaled_in_the_loop(scan, step: int, common: list, calls: int) -> Verdict | None:
    """Every parameter's gradient is golden's times one factor, every module call golden's to the last bit."""
    pairs = [(_stats(ours), _stats(theirs), ours["dtype"].decode(errors="replace"))
             for _, ours, theirs in common if _measured(ours) and _measured(theirs) and theirs["norm"] > 0.0]
    scales = [a.norm / b.norm for a, b, _ in pairs if b.norm > 0.0]
    if len(pairs) < 2 or len(scales) != len(pairs):
        return None
    scale = sum(scales) / len(scales)
    if not abs(scale - 1.0) >= FLOAT32_DEPARTURE or \
            any(not stats_split(a, b, dtype, scale).error < FLOAT32_DEPARTURE for a, b, dtype in pairs):
        return None
    evidence = (f"every module call of step {step} matches golden's to the last bit, forward and backward ({calls} "
                "calls): backward computes golden's gradients",
                f"the gradient the optimizer reads for every one of the {len(pairs)} parameters is golden's times "
                f"{scale:.6g} (from statistics)",
                "the training loop's code between backward and the optimizer's step scales the gradients otherwise "
                "than golden's (gradient clipping with another max norm, a loss scale not divided out, gradients "
                "accumulated and not averaged)")
    return Verdict("optimizer", "kernel_bug", step, "optimizer", UPDATE_TYPE, evidence,
                   "compare the code between loss.backward() and optimizer.step() with golden's (clip_grad_norm_'s "
                   "max_norm, unscaling, the accumulation's division)")


def _nonzero(row) -> bool:
    """A gradient the optimizer found, not all zeros."""
    return bool(row["has_grad"]) and (row["norm"] != 0.0 or row["nan"] > 0 or row["inf"] > 0)


def _measured(row) -> bool:
    """A float gradient of finite statistics over some values (an empty, complex or sparse-less one has none)."""
    return bool(row["has_grad"]) and row["count"] > 0 and is_float(row["dtype"].decode(errors="replace")) and \
        all(math.isfinite(float(row[name])) for name in ("min", "max", "mean", "std", "norm"))


def _stats(row) -> TensorStats:
    return TensorStats(*(row[name].item() for name in STATS_FIELDS))


def _module_type(scan, module: str) -> str | None:
    return next((r.type for r in scan.step_records if r.name == module), None)
