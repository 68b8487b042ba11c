"""The pre-check (调优前检查): before tuning precision, make sure the two runs differ only where they should.

The original tool's checklist, held against the two dumps' metadata: the
precision mode and mix list, loss scale and its manager, boost, accelerate
mode, data seed and batch size, model, optimizer and its hyper-parameters,
step counts. Each setting is the same, differs (golden X, target Y), or was
not recorded by one side. A difference the user did not declare intended
(``expect``) fails the check. With a second golden dump the reference's
repeatability is checked too: two golden runs must hold identical values,
else the first op that differs is named (a nondeterministic reference makes
every comparison against it noise).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from precision_tool.errors import cut, printable

SAME, DIFFERS, NOT_RECORDED = "same", "differs", "not recorded"


def _device(key: str) -> Callable[[dict], object]:
    def get(meta: dict):
        device = meta.get("device")
        if isinstance(device, dict) and key in device:
            return device[key]
        return meta.get(key)
    return get


def _key(key: str) -> Callable[[dict], object]:
    return lambda meta: meta.get(key)


def _precision_mode(meta: dict):
    """The precision the run computed in: the npu's effective mode, or a torch run's autocast / golden float32."""
    value = _device("effective_precision_mode")(meta) or _device("precision_mode")(meta)
    return value if value not in (None, "") else None


def _mixlist(meta: dict):
    value = _device("modify_mixlist")(meta)
    if isinstance(value, dict) and not any(value.values()):
        return "unchanged"
    return value


# (name a user passes to --expect, what it is, how to read it from a dump's metadata)
SETTINGS: tuple[tuple[str, str, Callable[[dict], object]], ...] = (
    ("device", "device", _device("device")),
    ("precision_mode", "precision mode", _precision_mode),
    ("modify_mixlist", "mix list changes", _mixlist),
    ("overflow_mode", "overflow mode", _device("overflow_mode")),
    ("fusion_switch", "fusion passes switched off", _device("fusion")),
    ("loss_scale", "loss scale and its manager", _key("loss_scale")),
    ("boost", "boost level and config", lambda m: m.get("boost_level") if m.get("boost_level") is not None
     else m.get("boost")),
    ("accelerate_train_mode", "accelerate_train_mode", _key("accelerate_train_mode")),
    ("seed", "data and weight seed", _key("seed")),
    ("batch_size", "batch size", _key("batch_size")),
    ("model", "model", _key("model")),
    ("optimizer", "optimizer", _key("optimizer")),
    ("lr", "learning rate", _key("lr")),
    ("steps", "steps", _key("steps")),
)
SETTING_NAMES = tuple(name for name, _, _ in SETTINGS)


@dataclass(frozen=True)
class PrecheckItem:
    """One setting of the checklist on both runs."""

    name: str
    label: str
    status: str  # SAME, DIFFERS or NOT_RECORDED
    golden: object
    target: object
    expected: bool = False  # the user said this difference is intended

    @property
    def unexpected(self) -> bool:
        return self.status == DIFFERS and not self.expected

    def describe(self) -> str:
        if self.status == DIFFERS:
            said = ", intended" if self.expected else ""
            return f"differs{said}: golden {_show(self.golden)}, target {_show(self.target)}"
        if self.status == NOT_RECORDED:
            missing = [side for side, value in (("golden", self.golden), ("target", self.target)) if value is None]
            return f"not recorded by {' and '.join(missing)}"
        return "same (not used)" if self.golden is None else f"same: {_show(self.golden)}"


@dataclass(frozen=True)
class Repeatability:
    """Two golden runs against each other: identical, or the first op where they part."""

    checked: bool
    identical: bool = True
    first_difference: str = ""  # "step S #I name (direction) slot: max abs difference D"
    compared_tensors: int = 0


@dataclass
class PrecheckResult:
    """The checklist, the reference's repeatability, and whether the runs may be compared as they are."""

    golden: str
    target: str
    items: list[PrecheckItem]
    repeatability: Repeatability = field(default_factory=lambda: Repeatability(False))

    @property
    def unexpected(self) -> list[PrecheckItem]:
        return [item for item in self.items if item.unexpected]

    @property
    def passed(self) -> bool:
        return not self.unexpected and (not self.repeatability.checked or self.repeatability.identical)

    def summary(self) -> str:
        """One line: what differs that was not declared, and the reference's repeatability."""
        parts = []
        unexpected = self.unexpected
        if unexpected:
            count = "1 setting differs" if len(unexpected) == 1 else f"{len(unexpected)} settings differ"
            parts.append(f"{count}: " + "; ".join(
                f"{item.name} (golden {_show(item.golden)}, target {_show(item.target)})" for item in unexpected))
        else:
            parts.append("the runs differ only where intended" if any(i.status == DIFFERS for i in self.items)
                         else "every recorded setting is the same")
        r = self.repeatability
        if r.checked:
            parts.append("the reference repeats exactly" if r.identical else
                         f"the reference does not repeat: {r.first_difference}")
        return "; ".join(parts)


def precheck(golden, target, golden2=None, expect=()) -> PrecheckResult:
    """Hold the checklist against two opened dumps (``golden2``: a second golden run, for repeatability)."""
    unknown = sorted(set(expect) - set(SETTING_NAMES))
    if unknown:
        from precision_tool.errors import choice_error

        raise choice_error("setting", unknown[0], SETTING_NAMES)
    items = []
    for name, label, read in SETTINGS:
        g, t = read(golden.metadata), read(target.metadata)
        if (g is None or t is None) and name not in _OPTIONAL:  # an optional setting's None is "not used"
            status = NOT_RECORDED
        else:
            status = SAME if _canonical(g) == _canonical(t) else DIFFERS
        items.append(PrecheckItem(name, label, status, g, t, name in expect))
    by_name = {item.name: item for item in items}
    if by_name["device"].status == DIFFERS:  # a golden against an npu run: these follow from that choice
        for name in DEVICE_SETTINGS:
            item = by_name[name]
            items[items.index(item)] = PrecheckItem(item.name, item.label, item.status, item.golden, item.target,
                                                    item.status == DIFFERS)
    repeat = repeatability(golden, golden2) if golden2 is not None else Repeatability(False)
    return PrecheckResult(str(golden.path), str(target.path), items, repeat)


# settings that differ because the devices do (golden against npu): intended without --expect
DEVICE_SETTINGS = ("device", "overflow_mode", "fusion_switch")
# settings whose absence on both sides means "not used" (no loss scaling, no boost, no accelerate mode)
_OPTIONAL = {"loss_scale", "boost", "accelerate_train_mode", "modify_mixlist", "fusion_switch"}


def repeatability(golden, again) -> Repeatability:
    """Every tensor of two golden runs compared: identical, or the first op (in execution order) that differs."""
    from precision_tool.compare.comparator import compare_sources

    report = compare_sources(golden, again)
    rows = [row for op in report.ops for row in op.rows]
    for op in report.ops:
        for row in op.rows:
            differs = (row.problem or (row.metrics is not None and row.metrics.max_abs_err != 0.0)
                       or (row.stats is not None and row.stats.abs_max_diff != 0.0))
            if differs:
                amount = row.metrics.max_abs_err if row.metrics is not None else None
                return Repeatability(True, False, f"step {op.step} #{op.exec_index} {op.name} ({op.direction}) "
                                                  f"{row.tensor}: max abs difference {_show(amount)}", len(rows))
    if report.unmatched_golden or report.unmatched_target:
        first = (report.unmatched_golden or report.unmatched_target)[0]
        return Repeatability(True, False, f"step {first.step} #{first.exec_index} {first.name}: recorded by "
                                          f"one run only", len(rows))
    return Repeatability(True, True, "", len(rows))


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _show(value) -> str:
    """``value`` on one line, its control characters escaped (a dump's strings may hold a terminal's escapes)."""
    if value is None:
        return "not used"
    if isinstance(value, (dict, list)):
        return cut(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))  # (JSON escapes them)
    if isinstance(value, float):
        return f"{value:g}"
    return printable(cut(value))
