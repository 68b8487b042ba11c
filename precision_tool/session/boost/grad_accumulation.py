"""GradientAccumulation: ``accum += grad / N`` every step; after N steps the optimizer applies it, then zero.

Each parameter's accumulation is one recorded op
``boost/grad_accumulation/<param>`` (type GradAccumulation: inputs the
accumulator and the gradient, output the new accumulator), so a dump shows
what the update will apply. A parameter that gets no gradient at a step
(frozen by grad_freeze) does not accumulate; at the N-th step only the
parameters that accumulated since the last update are applied.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.hooks import OPTIMIZER

PREFIX = "boost/grad_accumulation"


class GradientAccumulation:
    """Accumulates gradients over ``max_accumulation_step`` steps."""

    def __init__(self, max_accumulation_step: int):
        self.max_accumulation_step = max_accumulation_step
        self.accumulated: dict[str, np.ndarray] = {}
        self.count = 0  # steps accumulated since the last update

    def accumulate(self, executor, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Add ``grads / N``; the accumulated gradients when the N-th step is reached (and reset), else None."""
        divisor = np.float32(self.max_accumulation_step)
        for name, grad in grads.items():
            accum = self.accumulated.get(name)
            if accum is None:
                accum = np.zeros_like(grad, dtype=np.float32)
            (self.accumulated[name],) = executor.run_external(
                f"{PREFIX}/{name}", "GradAccumulation", OPTIMIZER,
                lambda a, g: [(a + g / divisor).astype(np.float32)], [accum, grad])
        self.count += 1
        if self.count < self.max_accumulation_step:
            return None
        ready, self.accumulated, self.count = self.accumulated, {}, 0
        return ready

    def state(self) -> dict:
        return {"accumulated_steps": self.count}
