"""GroupLossScaleManager: a loss scale per layer group.

MindSpore's manager (group_loss_scale_manager.py) rescales the backward
gradient between layer groups with ``enhanced_amp`` ops the user inserts;
its per-group overflow and update schedule is UNCONFIRMED (NUMERICS.md,
unconfirmed list). This tool's documented policy instead:

* groups: the parameters by top-level module of the model (``cnn``: stem,
  block1, block2, head), in order;
* each group has its own scale, starting at ``init_loss_scale``; its
  gradients come from an unrecorded backward seeded with that scale and
  divided by it (what a per-layer scale gives that layer's weights);
* a group whose gradients are not finite gets no update this step and its
  scale is divided by ``scale_factor`` (not below 1); after
  ``scale_window`` finite steps in a row it is multiplied by it;
* each group's bookkeeping is one recorded op ``boost/loss_scale_group/<group>``
  (type GroupLossScale: inputs its scale and overflow flag, output the next scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precision_tool.engine.executor import Executor
from precision_tool.engine.hooks import OPTIMIZER
from precision_tool.engine.status import FloatStatus
from precision_tool.session.boost.adasum import replica_gradients

PREFIX = "boost/loss_scale_group"


@dataclass
class LossScaleGroup:
    name: str
    params: list[str]
    scale: float
    good_steps: int = 0


class GroupLossScaleManager:
    """Per-group dynamic loss scales (the policy in the module docstring)."""

    def __init__(self, groups: list[LossScaleGroup], factor: float, window: int):
        self.groups, self.factor, self.window = groups, factor, window

    @classmethod
    def build(cls, names: list[str], settings: dict) -> "GroupLossScaleManager":
        by_module: dict[str, list[str]] = {}
        for name in names:
            by_module.setdefault(name.split("/", 1)[0], []).append(name)
        groups = [LossScaleGroup(module, params, float(np.float32(settings["init_loss_scale"])))
                  for module, params in by_module.items()]
        return cls(groups, settings["scale_factor"], settings["scale_window"])

    def next_scale(self, group: LossScaleGroup, overflow: bool) -> float:
        """Update ``group``'s scale after a step; return it."""
        if overflow:
            group.scale, group.good_steps = max(group.scale / self.factor, 1.0), 0
        else:
            group.good_steps += 1
            if group.good_steps >= self.window:
                group.scale, group.good_steps = float(np.float32(group.scale * self.factor)), 0
        return group.scale

    def regroup(self, session, step: int, grads: dict, batch: dict) -> dict:
        """Each group's gradients from a backward at its own scale; a group that overflowed is left out."""
        silent = Executor(session.program, status=FloatStatus(), seed=session.config.seed)
        result = {}
        for group in self.groups:
            scale = group.scale
            group_grads = {n: g for n, g in replica_gradients(silent, session.params, step, batch, scale).items()
                           if n in group.params}
            overflow = not all(np.isfinite(g).all() for g in group_grads.values())
            self.next_scale(group, overflow)
            session.executor.run_external(f"{PREFIX}/{group.name}", "GroupLossScale", OPTIMIZER,
                                          lambda s, o: [np.float32([group.scale])],
                                          [np.float32([scale]), np.float32([overflow])])
            if not overflow:
                result.update(group_grads)
        return result

    def scales(self) -> dict[str, float]:
        return {group.name: group.scale for group in self.groups}
