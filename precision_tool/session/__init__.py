"""The training session: sample models, synthetic data, optimizers, loss scaling, accelerate_train_mode.

    from precision_tool.session import Session, SessionConfig
    summary = Session(SessionConfig(model="cnn", steps=20, device=npu())).run()
"""

from precision_tool.session.accelerate import AccelerateSpec, AccelerateTrainMode, parse_accelerate
from precision_tool.session.config import SessionConfig
from precision_tool.session.loss_scale import (
    DynamicLossScaleUpdateCell,
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    GradScaler,
    LossScaleManager,
    parse_loss_scale,
)
from precision_tool.session.models import MODELS, load_model
from precision_tool.session.optim import OPTIMIZERS
from precision_tool.session.trainer import RunSummary, Session

__all__ = [
    "MODELS",
    "OPTIMIZERS",
    "AccelerateSpec",
    "AccelerateTrainMode",
    "DynamicLossScaleUpdateCell",
    "ExponentialUpdateLossScaleManager",
    "FixedLossScaleManager",
    "GradScaler",
    "LossScaleManager",
    "RunSummary",
    "Session",
    "SessionConfig",
    "load_model",
    "parse_accelerate",
    "parse_loss_scale",
]
