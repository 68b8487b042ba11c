"""AdaSum over simulated data-parallel replicas.

MindSpore combines the delta weights of node groups pairwise over
log2(group_number) rounds (adasum.py); here ``device_number`` replicas (a
power of two) each take one shard of the step's batch (``np.array_split``
along the batch axis), compute their gradient with the run's program and
loss scale, and apply their own copy of the optimizer to the old weights:
``delta_i = old - updated_i``. The deltas are combined pairwise, (0,1),
(2,3), ... then the results again, with::

    res = (1 - g1.g2 / (2 |g1|^2 + eps)) g1 + (1 - g1.g2 / (2 |g2|^2 + eps)) g2      eps = 1e-12

and ``param = old - delta``. The step's recorded forward and backward are
the whole batch's (the loss reported, and what golden compares with); the
replica passes run unrecorded; each parameter's combination is one recorded
op ``boost/adasum/<param>`` (type AdaSum: inputs the old weight and every
replica's delta, outputs the new weight and the combined delta).
"""

from __future__ import annotations

import copy

import numpy as np

from precision_tool.engine.executor import Executor
from precision_tool.engine.hooks import OPTIMIZER
from precision_tool.engine.status import FloatStatus
from precision_tool.errors import ConfigError
from precision_tool.session.loss_scale import unscale

ADASUM_EPSILON = 1e-12
PREFIX = "boost/adasum"


def adasum_pair(g1: np.ndarray, g2: np.ndarray, eps: float = ADASUM_EPSILON) -> np.ndarray:
    """The AdaSum of two deltas, in float64, returned as float32."""
    a, b = np.asarray(g1, np.float64), np.asarray(g2, np.float64)
    dot = float(np.sum(a * b))
    res = (1 - dot / (2 * float(np.sum(a * a)) + eps)) * a + (1 - dot / (2 * float(np.sum(b * b)) + eps)) * b
    return res.astype(np.float32)


def adasum_combine(deltas: list[np.ndarray]) -> np.ndarray:
    """Hierarchical pairwise AdaSum of a power-of-two number of deltas."""
    level = list(deltas)
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def check_device_number(device_number: int, batch_size: int) -> None:
    if device_number < 1 or device_number & (device_number - 1):
        raise ConfigError(f"boost config common.device_number must be a power of two for adasum, "
                          f"got {device_number}")
    if batch_size < device_number:
        raise ConfigError(f"adasum splits the batch over {device_number} replicas: batch size {batch_size} "
                          "is smaller")


class AdaSum:
    """Replica gradients, local updates and the combination of their deltas."""

    def __init__(self, device_number: int):
        self.device_number = device_number
        self.optimizers: list = []  # each replica's optimizer (its own slots)

    def update(self, session, step: int, params: list[str], batch: dict, scale: float) -> None:
        """Replace ``params`` of ``session.params`` by old minus the AdaSum of the replicas' deltas."""
        if not self.optimizers:
            self.optimizers = [copy.deepcopy(session.optimizer) for _ in range(self.device_number)]
        silent = Executor(session.program, status=FloatStatus(), seed=session.config.seed)
        old = {name: session.params[name] for name in params}
        deltas: dict[str, list[np.ndarray]] = {name: [] for name in params}
        for rank, shard in enumerate(_shards(batch, self.device_number)):
            grads = replica_gradients(silent, session.params, step, shard, scale)
            local = dict(old)
            self.optimizers[rank].apply(silent, local, {name: grads[name] for name in params})
            for name in params:
                deltas[name].append((old[name] - local[name]).astype(np.float32))
        for name in params:
            session.params[name], _ = session.executor.run_external(
                f"{PREFIX}/{name}", "AdaSum", OPTIMIZER, _apply_adasum, [old[name], *deltas[name]])


def _apply_adasum(old, *deltas):
    delta = adasum_combine(list(deltas))
    return [(old - delta).astype(np.float32), delta]


def _shards(batch: dict, n: int) -> list[dict]:
    split = {name: np.array_split(np.asarray(array), n) for name, array in batch.items()}
    return [{name: parts[i] for name, parts in split.items()} for i in range(n)]


def replica_gradients(executor: Executor, params: dict, step: int, batch: dict,
                      scale: float) -> dict[str, np.ndarray]:
    """One unrecorded forward and backward of ``batch`` at ``params``, seeded with ``scale``, unscaled."""
    executor.begin_step(step)
    executor.forward(batch, params)
    return unscale(executor.backward({"loss": np.float32(scale)}), scale)
