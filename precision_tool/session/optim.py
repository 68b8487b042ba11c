"""SGD, Momentum and Adam: float32 updates of the float32 master weights.

Each parameter's update runs through `Executor.run_external` as one op named
``<param>/Apply<Kind>`` of type ``ApplyGradientDescent``, ``ApplyMomentum`` or
``ApplyAdam``, so hooks see it (direction ``optimizer``). The kernels follow
TensorFlow's training ops, with their input order:

* ApplyGradientDescent(var, alpha, delta): ``var - alpha * delta``
* ApplyMomentum(var, accum, lr, grad, momentum): ``accum = accum * momentum + grad``;
  ``var - lr * accum``
* ApplyAdam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad):
  ``lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)``; ``m += (g - m) * (1 - beta1)``;
  ``v += (g*g - v) * (1 - beta2)``; ``var - lr_t * m / (sqrt(v) + epsilon)``

Kernels never modify their inputs (a hook may keep them) and return new arrays.
"""

from __future__ import annotations

import numpy as np

from precision_tool.defaults import OPTIMIZERS  # noqa: F401  (named once, for the CLI too)
from precision_tool.engine.executor import Executor
from precision_tool.engine.hooks import OPTIMIZER
from precision_tool.errors import choice_error

DEFAULT_LR = {"sgd": 0.1, "momentum": 0.05, "adam": 0.01}
MOMENTUM = 0.9
ADAM_BETA1, ADAM_BETA2, ADAM_EPSILON = 0.9, 0.999, 1e-8

_F32 = np.float32


def _scalar(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _apply_gradient_descent(var, alpha, delta):
    return [var - alpha * delta]


def _apply_momentum(var, accum, lr, grad, momentum):
    accum = accum * momentum + grad
    return [var - lr * accum, accum]


def _apply_adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad):
    one = _F32(1)
    lr_t = lr * np.sqrt(one - beta2_power) / (one - beta1_power)
    m = m + (grad - m) * (one - beta1)
    v = v + (grad * grad - v) * (one - beta2)
    return [var - lr_t * m / (np.sqrt(v) + epsilon), m, v]


class Optimizer:
    """Updates master weights from unscaled float32 gradients; keeps its slots."""

    name = ""
    op_type = ""

    def __init__(self, lr: float):
        self.lr = float(lr)
        self.slots: dict[str, dict[str, np.ndarray]] = {}

    def apply(self, executor: Executor, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        """One applied update: replace every array of ``params`` by its updated value."""
        for name in params:
            params[name] = self._apply_one(executor, name, params[name], grads[name])

    def _apply_one(self, executor, name, var, grad) -> np.ndarray:
        raise NotImplementedError

    def _run(self, executor: Executor, name: str, kernel, inputs: list) -> list[np.ndarray]:
        kind = self.op_type.removeprefix("Apply")
        return executor.run_external(f"{name}/Apply{kind}", self.op_type, OPTIMIZER, kernel, inputs)

    def config(self) -> dict:
        return {"optimizer": self.name, "lr": self.lr}

    def scalar_state(self) -> dict[str, float]:
        """The float32 scalars that change as it trains (Adam's beta powers), for checkpoints."""
        return {key: float(value) for key, value in vars(self).items() if isinstance(value, np.floating)}

    def load_scalar_state(self, state: dict[str, float]) -> None:
        for key, value in state.items():
            current = getattr(self, key)
            setattr(self, key, type(current)(value))


class SGD(Optimizer):
    name = "sgd"
    op_type = "ApplyGradientDescent"

    def _apply_one(self, executor, name, var, grad):
        (var,) = self._run(executor, name, _apply_gradient_descent, [var, _scalar(self.lr), grad])
        return var


class Momentum(Optimizer):
    name = "momentum"
    op_type = "ApplyMomentum"

    def __init__(self, lr: float, momentum: float = MOMENTUM):
        super().__init__(lr)
        self.momentum = float(momentum)

    def _apply_one(self, executor, name, var, grad):
        slots = self.slots.setdefault(name, {"accum": np.zeros_like(var)})
        var, slots["accum"] = self._run(executor, name, _apply_momentum,
                                        [var, slots["accum"], _scalar(self.lr), grad, _scalar(self.momentum)])
        return var

    def config(self) -> dict:
        return {**super().config(), "momentum": self.momentum}


class Adam(Optimizer):
    """TF's Adam: the beta powers are float32 accumulators that advance once per applied update."""

    name = "adam"
    op_type = "ApplyAdam"

    def __init__(self, lr: float, beta1: float = ADAM_BETA1, beta2: float = ADAM_BETA2,
                 epsilon: float = ADAM_EPSILON):
        super().__init__(lr)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.beta1_power, self.beta2_power = _F32(beta1), _F32(beta2)

    def apply(self, executor, params, grads) -> None:
        super().apply(executor, params, grads)
        self.beta1_power = _F32(self.beta1_power * _F32(self.beta1))
        self.beta2_power = _F32(self.beta2_power * _F32(self.beta2))

    def _apply_one(self, executor, name, var, grad):
        slots = self.slots.setdefault(name, {"m": np.zeros_like(var), "v": np.zeros_like(var)})
        inputs = [var, slots["m"], slots["v"], _scalar(self.beta1_power), _scalar(self.beta2_power),
                  _scalar(self.lr), _scalar(self.beta1), _scalar(self.beta2), _scalar(self.epsilon), grad]
        var, slots["m"], slots["v"] = self._run(executor, name, _apply_adam, inputs)
        return var

    def config(self) -> dict:
        return {**super().config(), "beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


_CLASSES = {"sgd": SGD, "momentum": Momentum, "adam": Adam}


def make_optimizer(name: str, lr: float | None = None) -> Optimizer:
    """An optimizer by name; ``lr`` None takes its default learning rate."""
    if name not in _CLASSES:
        raise choice_error("optimizer", name, OPTIMIZERS)
    return _CLASSES[name](DEFAULT_LR[name] if lr is None else lr)
