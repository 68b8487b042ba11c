"""Models with planted faults of each verdict class, and a hook that plants a kernel bug.

Each factory is loaded by the session as ``tests/analysis/planted.py:NAME``.
"""

from __future__ import annotations

import fnmatch

import numpy as np

from precision_tool.engine import functional as F
from precision_tool.engine import layers as L


class _Features(L.Model):
    def __init__(self, rng):
        super().__init__()
        self.data = L.DataSpec(kind="features", shape=(16,), task="classification", num_classes=4)


class SensorNet(_Features):
    """Fusion: raw readings around 30 go through a LayerNorm that GE fuses into a one-pass kernel."""

    def __init__(self, rng):
        super().__init__(rng)
        self.norm = L.LayerNorm(16, composite=True)
        self.fc1 = L.Dense(16, 32, activation="relu", rng=rng)
        self.fc2 = L.Dense(32, 4, rng=rng)

    def forward(self, x):
        return self.fc2(self.fc1(self.norm(F.add(x, 30.0))))


class HotAttention(_Features):
    """Overflow: a hand-written softmax (no max subtraction) over large scores."""

    def __init__(self, rng):
        super().__init__(rng)
        self.score = L.Dense(16, 16, rng=rng)
        self.fc = L.Dense(16, 4, rng=rng)

    def forward(self, x):
        scores = F.mul(self.score(x), 8.0)
        weights = F.exp(scores)
        probs = F.div(weights, F.reduce_sum(weights, axis=-1, keepdims=True))
        return self.fc(probs)


class Standardize(_Features):
    """Precision loss: readings 30 + 0.01 z, standardised as (x - 30) * 100 in the model."""

    def __init__(self, rng):
        super().__init__(rng)
        self.fc1 = L.Dense(16, 32, activation="relu", rng=rng)
        self.fc2 = L.Dense(32, 4, rng=rng)

    def forward(self, x):
        raw = F.add(F.mul(x, 0.01), 30.0)
        return self.fc2(self.fc1(F.mul(F.sub(raw, 30.0), 100.0)))


class Plain(_Features):
    """No fault: a small MLP."""

    def __init__(self, rng):
        super().__init__(rng)
        self.fc1 = L.Dense(16, 32, activation="gelu", rng=rng)
        self.fc2 = L.Dense(32, 4, rng=rng)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def sensor(rng):
    return SensorNet(rng)


def hot_attention(rng):
    return HotAttention(rng)


def standardize(rng):
    return Standardize(rng)


def plain(rng):
    return Plain(rng)


class KernelBug:
    """A hook that plants a kernel bug: it scales one op's forward output in place."""

    def __init__(self, op_glob: str, scale: float = 1.5):
        self.op_glob = op_glob
        self.scale = np.float32(scale)

    def after_op(self, event) -> None:
        if event.direction == "forward" and fnmatch.fnmatch(event.name, self.op_glob):
            for output in event.outputs:
                output *= self.scale
