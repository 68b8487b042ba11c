"""``accelerate_train_mode``: train in low precision first, then switch back once, for good.

As in the TF adapter (``../shared/reference/NUMERICS.md`` section 5, seed 000):
the spec is ``"<fast|fast1>|<step|loss>[|ratio]"``. Training starts in mixed
precision (``fast``: fp16, ``fast1``: bf16) and the graph is recompiled with
the original precision mode when the trigger fires:

* ``step``: ratio in [0.2, 0.9], default 0.9; fires when
  ``step_now >= int(total_steps * ratio)``;
* ``loss``: ratio in [1.01, 1.5], default 1.05; fires when
  ``loss != 0 and loss <= target_loss * ratio``.

The session tells the mode what `TellMeStepOrLossHook` would: after each step,
``step_now`` = the number of steps run so far (iterations_per_loop is 1, so a
step trigger at ratio 0.5 of 20 steps makes step 10 the first one run at the
original precision), or the step's loss and the target loss.

On the golden device the mode only keeps time: golden computes everything in
its own format whatever the precision mode, so its device never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from precision_tool.engine.device import DeviceProfile
from precision_tool.errors import ConfigError

# acceleration type -> (precision_mode, precision_mode_v2) it trains in first
LOW_PRECISION = {
    "fast": ("allow_mix_precision_fp16", "mixed_float16"),
    "fast1": ("allow_mix_precision_bf16", "mixed_bfloat16"),
}
# trigger -> (lowest ratio, highest ratio, default ratio)
TRIGGERS = {"step": (0.2, 0.9, 0.9), "loss": (1.01, 1.5, 1.05)}
ALLOWED_PRECISION_MODES = ("allow_fp32_to_fp16", "must_keep_origin_dtype")
ALLOWED_PRECISION_MODES_V2 = ("origin",)
FORM = "fast|fast1 '|' step|loss ['|' ratio], e.g. fast|step|0.9 or fast1|loss|1.05"


@dataclass(frozen=True)
class AccelerateSpec:
    """A parsed and checked ``accelerate_train_mode`` value."""

    kind: str  # "fast" or "fast1"
    trigger: str  # "step" or "loss"
    ratio: float

    @property
    def spec(self) -> str:
        return f"{self.kind}|{self.trigger}|{self.ratio:g}"


def parse_accelerate(spec: str) -> AccelerateSpec:
    """Check the fields of an ``accelerate_train_mode`` value; ConfigError names what is wrong."""
    fields = [f.strip() for f in str(spec).split("|")]
    if len(fields) not in (2, 3):
        raise ConfigError(f"bad accelerate_train_mode {spec!r}: expected {FORM}")
    kind, trigger = fields[0], fields[1]
    if kind not in LOW_PRECISION:
        raise ConfigError(f"bad accelerate_train_mode {spec!r}: first field must be fast or fast1, got {kind!r}")
    if trigger not in TRIGGERS:
        raise ConfigError(f"bad accelerate_train_mode {spec!r}: second field must be step or loss, got {trigger!r}")
    low, high, default = TRIGGERS[trigger]
    if len(fields) == 2:
        return AccelerateSpec(kind, trigger, default)
    try:
        ratio = float(fields[2])
    except ValueError:
        raise ConfigError(f"bad accelerate_train_mode {spec!r}: ratio {fields[2]!r} is not a number") from None
    if not low <= ratio <= high:
        raise ConfigError(
            f"bad accelerate_train_mode {spec!r}: a {trigger} ratio must be in {low:g}-{high:g}, got {fields[2]}")
    return AccelerateSpec(kind, trigger, ratio)


def check_precision_mode(spec: AccelerateSpec, device: DeviceProfile) -> None:
    """Refuse the mode with a precision mode the TF adapter refuses it with."""
    mode, mode_v2 = device.precision_mode or None, device.precision_mode_v2 or None
    if mode_v2 is not None and mode_v2 not in ALLOWED_PRECISION_MODES_V2:
        raise ConfigError(f"accelerate_train_mode {spec.spec!r} needs precision_mode_v2 origin or none, "
                          f"got {mode_v2!r}")
    if mode is not None and mode not in ALLOWED_PRECISION_MODES:
        raise ConfigError(f"accelerate_train_mode {spec.spec!r} needs precision_mode "
                          f"{' or '.join(ALLOWED_PRECISION_MODES)} or none, got {mode!r}")


class AccelerateTrainMode:
    """Tracks one run: which device to train on now, and when to switch back."""

    def __init__(self, spec: AccelerateSpec | str, original: DeviceProfile):
        self.spec = spec if isinstance(spec, AccelerateSpec) else parse_accelerate(spec)
        check_precision_mode(self.spec, original)
        self.original = original
        self.low = _low_precision_device(self.spec, original)
        self.recovered = False  # one-way, as the adapter's is_recovered_

    @property
    def device(self) -> DeviceProfile:
        """The device to compile for now."""
        return self.original if self.recovered else self.low

    def tell(self, step: int | None = None, total_steps: int | None = None,
             loss: float | None = None, target_loss: float | None = None) -> bool:
        """Report progress as TellMeStepOrLossHook does; True the one time the trigger fires."""
        if self.recovered:
            return False
        if self.spec.trigger == "step":
            if step is None or total_steps is None:
                return False
            fired = step >= int(total_steps * self.spec.ratio)
        else:
            if loss is None or target_loss is None:
                return False
            fired = loss != 0 and loss <= target_loss * self.spec.ratio
        self.recovered = bool(fired)
        return self.recovered


def _low_precision_device(spec: AccelerateSpec, original: DeviceProfile) -> DeviceProfile:
    if original.kind != "npu":
        return original
    mode, mode_v2 = LOW_PRECISION[spec.kind]
    if original.precision_mode_v2:
        return original.with_precision(None, mode_v2)
    return original.with_precision(mode, None)
