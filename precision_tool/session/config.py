"""`SessionConfig`: what to train, on which device, with which loss scale; checked on creation."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from precision_tool.defaults import MAX_SCHEDULE
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

    The schedule follows Rec SDK's ``init`` (-1 to 2147483647 each):
    ``max_steps`` is the run length, overriding ``steps`` unless -1;
    evaluation on held-out batches runs after every ``train_steps`` steps
    (-1: once, after the last step; 0: never) over ``eval_steps`` batches
    (-1: the whole held-out set of `EVAL_SET_BATCHES`; 0: no evaluation);
    a checkpoint goes into ``checkpoint_dir`` after every ``save_steps`` steps
    (-1: once, after the last step; 0: never). ``if_load`` resumes from
    the latest checkpoint there, or from step ``restore_model_version``.
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
    max_steps: int = -1
    train_steps: int = -1
    eval_steps: int = -1
    save_steps: int = -1
    checkpoint_dir: str | None = None
    if_load: bool = False
    restore_model_version: int | None = None
    # -- boost (precision_tool.session.boost) --
    boost_level: str = "O0"
    boost_config: dict | str | None = None
    boost: BoostConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_model_name(self.model)
        self._check_schedule()
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

    def _check_schedule(self) -> None:
        """Rec SDK's ranges and consistency rules; ``max_steps`` given sets ``steps``."""
        for name in ("max_steps", "train_steps", "eval_steps", "save_steps"):
            setattr(self, name, _whole(name, getattr(self, name), -1, MAX_SCHEDULE))
        if self.max_steps == self.train_steps == self.eval_steps == 0:
            raise ConfigError("max_steps, train_steps and eval_steps cannot all be 0")
        if self.max_steps == 0:
            raise ConfigError("max_steps 0 trains nothing: give at least 1 (or -1 to run `steps`)")
        if self.max_steps != -1:
            self.steps = self.max_steps
        steps = self.steps if isinstance(self.steps, int) and not isinstance(self.steps, bool) else None
        for name in ("train_steps", "save_steps"):
            value = getattr(self, name)
            if steps is not None and value > steps:
                what = "evaluation" if name == "train_steps" else "a checkpoint"
                raise ConfigError(f"{name} {value} is more than the run's {steps} steps: {what} would never happen")
        if self.checkpoint_dir is not None:
            self.checkpoint_dir = str(self.checkpoint_dir)
            if not self.checkpoint_dir:
                raise ConfigError("checkpoint_dir must not be empty")
        if self.save_steps > 0 and self.checkpoint_dir is None:
            raise ConfigError(f"save_steps {self.save_steps} needs checkpoint_dir: where should checkpoints go?")
        if not isinstance(self.if_load, bool):
            raise ConfigError(f"if_load must be True or False, got {self.if_load!r}")
        if self.if_load and self.checkpoint_dir is None:
            raise ConfigError("if_load needs checkpoint_dir: where are the checkpoints?")
        if self.restore_model_version is not None:
            self.restore_model_version = _whole("restore_model_version", self.restore_model_version, 0, MAX_SCHEDULE)
            if not self.if_load:
                raise ConfigError("restore_model_version needs if_load: it names the checkpoint to load")

    @property
    def saves_checkpoints(self) -> bool:
        return self.checkpoint_dir is not None and self.save_steps != 0

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
