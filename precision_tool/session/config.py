"""`SessionConfig`: what to train, on which device, with which loss scale; checked on creation."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from precision_tool.engine.device import DeviceProfile, golden
from precision_tool.errors import ConfigError
from precision_tool.session.accelerate import AccelerateSpec, check_precision_mode, parse_accelerate
from precision_tool.session.boost.config import BoostConfig, resolve_boost
from precision_tool.session.loss_scale import LossScaleManager, parse_loss_scale
from precision_tool.session.models import check_model_name
from precision_tool.session.optim import OPTIMIZERS


MAX_SEED = 2**64 - 1  # dumps store the seed as a 64-bit unsigned integer: a larger one would not read back


@dataclass
class SessionConfig:
    """A training run's settings.

    ``model`` is a built-in name (`MODELS`) or ``FILE.py:FACTORY``;
    ``batch_size`` and ``lr`` None take the model's and optimizer's defaults;
    ``loss_scale`` is a manager, a `parse_loss_scale` spec, or None (no
    scaling: overflow is reported but the update is applied);
    ``accelerate_train_mode`` is ``"fast|step|0.9"`` style, and a ``loss``
    trigger needs ``target_loss``; ``boost_level`` (O0, O1, O2) and
    ``boost_config`` (a mindspore.boost config dict or a JSON file's path)
    resolve into ``boost``. Invalid values raise `ConfigError`.
    """

    model: str = "mlp"
    steps: int = 20
    seed: int = 0
    batch_size: int | None = None
    optimizer: str = "sgd"
    lr: float | None = None
    device: DeviceProfile = field(default_factory=golden)
    loss_scale: LossScaleManager | None = None
    accelerate_train_mode: str | None = None
    target_loss: float | None = None
    # -- boost (precision_tool.session.boost) --
    boost_level: str = "O0"
    boost_config: dict | str | None = None
    boost: BoostConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_model_name(self.model)
        self.steps = _whole("steps", self.steps, 1)
        self.seed = _whole("seed", self.seed, 0, MAX_SEED)
        if self.batch_size is not None:
            self.batch_size = _whole("batch_size", self.batch_size, 1)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        if self.lr is not None and not (isinstance(self.lr, numbers.Real) and 0 < self.lr < math.inf):
            raise ConfigError(f"lr must be a positive number, got {self.lr!r}")
        if not isinstance(self.device, DeviceProfile):
            raise ConfigError(f"device must be a DeviceProfile (golden() or npu()), got {type(self.device).__name__}")
        if isinstance(self.loss_scale, str):
            self.loss_scale = parse_loss_scale(self.loss_scale)
        elif self.loss_scale is not None and not isinstance(self.loss_scale, LossScaleManager):
            raise ConfigError(f"loss_scale must be a LossScaleManager or a spec, got {type(self.loss_scale).__name__}")
        self._check_accelerate()
        self.boost = resolve_boost(self.boost_level, self.boost_config)

    def _check_accelerate(self) -> None:
        if self.target_loss is not None and not (isinstance(self.target_loss, numbers.Real)
                                                 and 0 < self.target_loss < math.inf):
            raise ConfigError(f"target_loss must be a positive number, got {self.target_loss!r}")
        if not self.accelerate_train_mode:
            self.accelerate_train_mode = None
            return
        spec = parse_accelerate(self.accelerate_train_mode)
        check_precision_mode(spec, self.device)
        if spec.trigger == "loss" and self.target_loss is None:
            raise ConfigError(f"accelerate_train_mode {self.accelerate_train_mode!r} triggers on loss: "
                              "set target_loss too")

    @property
    def accelerate(self) -> AccelerateSpec | None:
        """The parsed ``accelerate_train_mode``, or None."""
        return parse_accelerate(self.accelerate_train_mode) if self.accelerate_train_mode else None


def _whole(name: str, value, minimum: int, maximum: int | None = None) -> int:
    whole = (isinstance(value, numbers.Real) and not isinstance(value, bool)
             and math.isfinite(value) and int(value) == value)
    if not whole or value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value!r}")
    return int(value)
