"""Loss-scale managers with the exact update rules of TF1/npu_bridge, MindSpore and PyTorch.

The rules are those of ``../shared/reference/NUMERICS.md`` section 4. Every
manager holds its scale as a float32, as the frameworks do (a float32
variable, parameter or tensor), so ``16 * 0.8`` is ``float32(12.8)``.

`parse_loss_scale` turns a CLI spec into a manager::

    none
    fixed:V[,CHECK]                                  CHECK true|false (default true)
    exponential:INIT[,INCR_EVERY_N_STEPS[,DECR_EVERY_N_NAN_OR_INF[,INCR_RATIO[,DECR_RATIO]]]]
                                                     defaults 1000, 2, 2, 0.8
    dynamic:INIT[,FACTOR[,WINDOW]]                   defaults 2, 2000 (MindSpore DynamicLossScaleUpdateCell)
    gradscaler:INIT[,GROWTH[,BACKOFF[,INTERVAL]]]    defaults 2, 0.5, 2000 (torch.amp.GradScaler)

Numbers may be written ``65536``, ``6.5e4``, ``2**16`` or ``2^16``.
"""

from __future__ import annotations

import math
import re

import numpy as np

from precision_tool.errors import ConfigError

# Defaults the frameworks document (NUMERICS.md 4.1-4.4); INCR_EVERY_N_STEPS has no
# framework default, 1000 is the value of the Ascend documentation's example.
EXPONENTIAL_INCR_EVERY_N_STEPS = 1000
DYNAMIC_SCALE_FACTOR = 2.0
DYNAMIC_SCALE_WINDOW = 2000  # mindspore.amp.DynamicLossScaleManager's default
GRADSCALER_INIT_SCALE = 2.0**16
NPU_BRIDGE_GROWTH_LIMIT = 3.4e38  # npu_bridge grows only while ls < 3.4e38 / incr_ratio

_F32 = np.float32


class LossScaleManager:
    """Base of the managers: a float32 scale and a rule that updates it after each step.

    ``check_overflow`` False means the optimizer treats every step as finite
    (never skips an update), as ``enable_overflow_check=False`` does.
    """

    kind = ""
    check_overflow = True

    def __init__(self, scale: float):
        with np.errstate(over="ignore"):
            self._scale = _F32(scale)
        if not np.isfinite(self._scale):
            raise ConfigError(f"loss scale must be a finite float32 (at most 3.4e38), got {scale:g}")
        self._init_scale = float(self._scale)  # kept for `config`

    @property
    def scale(self) -> float:
        """The current loss scale."""
        return float(self._scale)

    def update(self, overflow: bool) -> None:
        """Apply the rule after a step; ``overflow`` is whether its gradients overflowed."""

    def config(self) -> dict:
        """The constructor arguments, JSON-serialisable, with ``kind``."""
        raise NotImplementedError

    def state(self) -> dict:
        """What changes as it runs (scale and counters), JSON-serialisable; exact for the float32 scale."""
        return {key: value.item() if isinstance(value, np.generic) else value for key, value in vars(self).items()}

    def load_state(self, state: dict) -> None:
        """Continue from a `state` of a manager with the same config."""
        for key, value in state.items():
            current = getattr(self, key)
            setattr(self, key, type(current)(value))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "kind")
        return f"{type(self).__name__}({args})"


def _at_least(name: str, value, minimum, strict: bool = False):
    if not (value > minimum if strict else value >= minimum) or math.isnan(value):
        relation = ">" if strict else ">="
        raise ConfigError(f"{name} must be {relation} {minimum:g}, got {value:g}")
    return value


def _below(name: str, value, maximum):
    if not 0 < value < maximum:
        raise ConfigError(f"{name} must be in (0, {maximum:g}), got {value:g}")
    return value


def _count(name: str, value) -> int:
    if int(value) != value:
        raise ConfigError(f"{name} must be a whole number, got {value:g}")
    return int(_at_least(name, value, 1))


class FixedLossScaleManager(LossScaleManager):
    """npu_bridge/TF1 ``FixedLossScaleManager``: a constant scale, at least 1."""

    kind = "fixed"

    def __init__(self, loss_scale: float, enable_overflow_check: bool = True):
        super().__init__(_at_least("loss_scale", float(loss_scale), 1))
        self.check_overflow = bool(enable_overflow_check)

    def config(self) -> dict:
        return {"kind": self.kind, "loss_scale": self.scale, "enable_overflow_check": self.check_overflow}


class ExponentialUpdateLossScaleManager(LossScaleManager):
    """npu_bridge ``ExponentialUpdateLossScaleManager`` (TF1 rule, npu_bridge growth guard).

    Grows by ``incr_ratio`` after ``incr_every_n_steps`` consecutive finite
    steps; shrinks by ``decr_ratio`` (floor 1) after ``decr_every_n_nan_or_inf``
    accumulated bad steps (reset only when the scale changes); grows only while
    ``scale < 3.4e38 / incr_ratio``, so it stays a finite float32.
    """

    kind = "exponential"

    def __init__(self, init_loss_scale: float, incr_every_n_steps: int = EXPONENTIAL_INCR_EVERY_N_STEPS,
                 decr_every_n_nan_or_inf: int = 2, incr_ratio: float = 2, decr_ratio: float = 0.8):
        super().__init__(_at_least("init_loss_scale", float(init_loss_scale), 1))
        self.incr_every_n_steps = _count("incr_every_n_steps", incr_every_n_steps)
        self.decr_every_n_nan_or_inf = _count("decr_every_n_nan_or_inf", decr_every_n_nan_or_inf)
        self.incr_ratio = float(_at_least("incr_ratio", float(incr_ratio), 1, strict=True))
        self.decr_ratio = float(_below("decr_ratio", float(decr_ratio), 1))
        self.good_steps = 0
        self.bad_steps = 0

    def update(self, overflow: bool) -> None:
        if not overflow:
            if self.good_steps + 1 >= self.incr_every_n_steps:
                if self._scale < _F32(NPU_BRIDGE_GROWTH_LIMIT / self.incr_ratio):
                    self._scale = _F32(self._scale * _F32(self.incr_ratio))
                self.good_steps = self.bad_steps = 0
            else:
                self.good_steps += 1
        elif self.bad_steps + 1 >= self.decr_every_n_nan_or_inf:
            self._scale = max(_F32(1.0), _F32(self._scale * _F32(self.decr_ratio)))
            self.good_steps = self.bad_steps = 0
        else:
            self.bad_steps += 1
            self.good_steps = 0

    def config(self) -> dict:
        return {"kind": self.kind, "init_loss_scale": self._init_scale, "incr_every_n_steps": self.incr_every_n_steps,
                "decr_every_n_nan_or_inf": self.decr_every_n_nan_or_inf, "incr_ratio": self.incr_ratio,
                "decr_ratio": self.decr_ratio}


class DynamicLossScaleUpdateCell(LossScaleManager):
    """MindSpore ``nn.DynamicLossScaleUpdateCell``: floor 1, no upper cap.

    On overflow the scale is divided by ``scale_factor``; after
    ``scale_window`` steps without overflow (the first increase on step
    ``scale_window``) it is multiplied by it.
    """

    kind = "dynamic"

    def __init__(self, loss_scale_value: float, scale_factor: float = DYNAMIC_SCALE_FACTOR,
                 scale_window: int = DYNAMIC_SCALE_WINDOW):
        super().__init__(_at_least("loss_scale_value", float(loss_scale_value), 1))
        self.scale_factor = float(_at_least("scale_factor", float(scale_factor), 1, strict=True))
        self.scale_window = _count("scale_window", scale_window)
        self.cur_iter = 1
        self.last_overflow_iter = 0

    def update(self, overflow: bool) -> None:
        factor = _F32(self.scale_factor)
        scale = max(_F32(self._scale / factor), _F32(1.0)) if overflow else self._scale
        should_inc = (self.cur_iter - self.last_overflow_iter) >= self.scale_window
        if overflow or should_inc:
            self.last_overflow_iter = self.cur_iter
        with np.errstate(over="ignore"):
            self._scale = _F32(scale * factor) if should_inc and not overflow else _F32(scale)
        self.cur_iter += 1

    def config(self) -> dict:
        return {"kind": self.kind, "loss_scale_value": self._init_scale, "scale_factor": self.scale_factor,
                "scale_window": self.scale_window}


class GradScaler(LossScaleManager):
    """``torch.amp.GradScaler`` / torch_npu: backs off on every overflow, with no floor.

    Grows after ``growth_interval`` consecutive finite steps, unless the
    grown scale would not be a finite float32.
    """

    kind = "gradscaler"

    def __init__(self, init_scale: float = GRADSCALER_INIT_SCALE, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        super().__init__(_at_least("init_scale", float(init_scale), 0, strict=True))
        self.growth_factor = float(_at_least("growth_factor", float(growth_factor), 1, strict=True))
        self.backoff_factor = float(_below("backoff_factor", float(backoff_factor), 1))
        self.growth_interval = _count("growth_interval", growth_interval)
        self.growth_tracker = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self._scale = _F32(self._scale * _F32(self.backoff_factor))
            self.growth_tracker = 0
            return
        successful = self.growth_tracker + 1
        if successful == self.growth_interval:
            with np.errstate(over="ignore"):
                grown = _F32(self._scale * _F32(self.growth_factor))
            if np.isfinite(grown):
                self._scale = grown
            self.growth_tracker = 0
        else:
            self.growth_tracker = successful

    def config(self) -> dict:
        return {"kind": self.kind, "init_scale": self._init_scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval}



LOSS_SCALE_KINDS: dict[str, tuple[type, str]] = {
    "fixed": (FixedLossScaleManager, "fixed:V[,CHECK]"),
    "exponential": (ExponentialUpdateLossScaleManager,
                    "exponential:INIT[,INCR_EVERY_N_STEPS[,DECR_EVERY_N_NAN_OR_INF[,INCR_RATIO[,DECR_RATIO]]]]"),
    "dynamic": (DynamicLossScaleUpdateCell, "dynamic:INIT[,FACTOR[,WINDOW]]"),
    "gradscaler": (GradScaler, "gradscaler:INIT[,GROWTH[,BACKOFF[,INTERVAL]]]"),
}
LOSS_SCALE_FORMS = ("none", *(form for _, form in LOSS_SCALE_KINDS.values()))

_POWER = re.compile(r"^\s*([0-9.]+)\s*(?:\*\*|\^)\s*([0-9.+-]+)\s*$")
_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _number(text: str) -> float:
    power = _POWER.match(text)
    if power:
        return float(power.group(1)) ** float(power.group(2))
    return float(text)


def loss_scale_from_config(config: dict | None) -> LossScaleManager | None:
    """The manager `LossScaleManager.config` describes (a checkpoint's), in its initial state."""
    if config is None:
        return None
    values = dict(config)
    kind = values.pop("kind", None)
    if kind not in LOSS_SCALE_KINDS:
        raise ConfigError(f"unknown loss scale kind {kind!r}; valid: {', '.join(LOSS_SCALE_KINDS)}")
    try:
        return LOSS_SCALE_KINDS[kind][0](**values)
    except TypeError as exc:
        raise ConfigError(f"bad {kind} loss scale settings {config}: {exc}") from None


def parse_loss_scale(spec: str) -> LossScaleManager | None:
    """A manager from a CLI spec such as ``exponential:2**32,1000,2,2,0.5``; ``none`` gives None."""
    text = str(spec).strip()
    if text.lower() == "none":
        return None
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    if kind not in LOSS_SCALE_KINDS:
        raise ConfigError(f"bad loss scale {spec!r}; expected one of: {'; '.join(LOSS_SCALE_FORMS)}")
    cls, form = LOSS_SCALE_KINDS[kind]
    fields = [f.strip() for f in rest.split(",")] if rest.strip() else []
    max_fields = form.count(",") + 1
    if not fields or len(fields) > max_fields or "" in fields:
        raise ConfigError(f"bad loss scale {spec!r}; expected {form}")
    try:
        if kind == "fixed" and len(fields) == 2:
            check = _BOOLEANS.get(fields[1].lower())
            if check is None:
                raise ValueError(fields[1])
            return cls(_number(fields[0]), check)
        return cls(*(_number(f) for f in fields))
    except ConfigError as exc:  # a ValueError too: catch it first
        raise ConfigError(f"bad loss scale {spec!r}: {exc}") from None
    except (ValueError, OverflowError):
        raise ConfigError(f"bad loss scale {spec!r}; expected {form} with numbers") from None


def unscale(grads: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """Float32 gradients divided by ``scale``: times float32(1/scale), the reciprocal in float64."""
    result = {}
    with np.errstate(all="ignore"):
        inv_scale = np.float32(np.float64(1.0) / np.float64(scale))
        for name, grad in grads.items():
            grad = grad.astype(np.float32, copy=False)
            result[name] = grad if scale == 1.0 else grad * inv_scale
    return result
