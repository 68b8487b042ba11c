"""`Boost`: the boost algorithms of one session, applied where BoostTrainOneStepCell applies them.

Built before the model is traced (LessBN rewrites it), attached once the
session has weights and an optimizer, then called instead of the
optimizer's update at every step that is not skipped::

    dim_reduce                     replaces everything below
    loss_scale_group               each layer group's gradients at its own loss scale
    less_bn gc_flag                gradient centralisation
    grad_freeze                    only this step's freeze group is updated
    grad_accumulation              accum += grad / N; the update every N-th step
    adasum                         replica deltas combined (else the optimizer)

The forward and backward are the session's, so `Session.step` still returns
``(loss, overflow, loss_scale)`` as BoostTrainOneStepWithLossScaleCell does.
Every op a boost algorithm adds is named ``boost/<algorithm>/...``; what it
removes or replaces is listed in `changes` (dump metadata ``boost.changes``)
so an analysis can tell a boost change from a kernel fault.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.hooks import OPTIMIZER
from precision_tool.engine.layers import BatchNorm
from precision_tool.session.boost.adasum import AdaSum, check_device_number
from precision_tool.session.boost.config import BoostConfig
from precision_tool.session.boost.dim_reduce import DimReduce
from precision_tool.session.boost.grad_accumulation import GradientAccumulation
from precision_tool.session.boost.grad_freeze import GradientFreeze
from precision_tool.session.boost.group_loss_scale import GroupLossScaleManager
from precision_tool.session.boost.less_bn import apply_less_bn, gradient_centralization, output_axes

FREEZE_OP = "boost/grad_freeze/FreezeIndex"
FREEZE_SEQUENCE_SHOWN = 64  # freeze indices recorded in the metadata


class Boost:
    """The active boost algorithms of a session (see the module docstring)."""

    def __init__(self, config: BoostConfig, model, seed: int):
        self.config = config
        self.seed = seed
        active = config.active
        self.less_bn = apply_less_bn(model, config.section("less_bn")["fn_flag"]) if "less_bn" in active else None
        self.gc_axes = output_axes(model) if self.less_bn and config.section("less_bn")["gc_flag"] else None
        self._bn_params = {f"{path}/{name}" for path, m in model.named_modules() if isinstance(m, BatchNorm)
                           for name in ("gamma", "beta")}
        self.freeze: GradientFreeze | None = None
        self.accumulation = GradientAccumulation(config.section("grad_accumulation")["grad_accumulation_step"]) \
            if "grad_accumulation" in active else None
        self.adasum: AdaSum | None = None
        self.dim_reduce: DimReduce | None = None
        self.group_scale: GroupLossScaleManager | None = None

    def attach(self, session) -> None:
        """Build what needs the session's weights, batch size and optimizer."""
        active = self.config.active
        names = list(session.params)
        if "grad_freeze" in active:
            self.freeze = GradientFreeze.build(names, self._joins_group, self.config.section("grad_freeze"),
                                               self.seed)
        if "adasum" in active:
            device_number = self.config.section("common")["device_number"]
            check_device_number(device_number, session.batch_size)
            self.adasum = AdaSum(device_number)
        if "dim_reduce" in active:
            self.dim_reduce = DimReduce(self.config.section("dim_reduce"), session.params)
        if "loss_scale_group" in active:
            self.group_scale = GroupLossScaleManager.build(names, self.config.section("loss_scale_group"))

    def _joins_group(self, name: str) -> bool:
        """A parameter that stays in the current freeze group: a BatchNorm's, a bias, or a name holding bn."""
        return name in self._bn_params or name.endswith("bias") or "bn" in name

    # -- the step ---------------------------------------------------------------------------------

    def update(self, session, step: int, grads: dict, batch: dict, scale: float, loss: float) -> None:
        """Apply this step's update to ``session.params`` (the session's optimizer update is not run)."""
        executor = session.executor
        if self.dim_reduce is not None:
            self.dim_reduce.update(session, step, grads, batch, loss)
            return
        if self.group_scale is not None:
            grads = self.group_scale.regroup(session, step, grads, batch)
        if self.gc_axes is not None:
            grads = gradient_centralization(executor, grads, self.gc_axes)
        if self.freeze is not None:
            grads = self._freeze(executor, step, grads)
        if self.accumulation is not None:
            grads = self.accumulation.accumulate(executor, grads)
            if grads is None:
                return
        if self.adasum is not None:
            self.adasum.update(session, step, list(grads), batch, scale)
            return
        subset = {name: session.params[name] for name in grads}
        session.optimizer.apply(executor, subset, grads)
        session.params.update(subset)

    def _freeze(self, executor, step: int, grads: dict) -> dict:
        index = self.freeze.index(step)
        trained = set(self.freeze.groups[index])
        frozen = np.float32(len(grads) - len(trained & set(grads)))
        executor.run_external(FREEZE_OP, "GradFreeze", OPTIMIZER,
                              lambda s: [np.float32([index]), np.float32([frozen])], [np.float32([step])])
        return {name: grad for name, grad in grads.items() if name in trained}

    # -- what the dump records --------------------------------------------------------------------

    def changes(self, steps: int) -> list[dict]:
        """Each algorithm's change to the run: ops removed or replaced, ops it adds (by prefix), frozen groups."""
        changes = []
        if self.less_bn is not None:
            if self.less_bn.removed_ops:
                changes.append({"algorithm": "less_bn", "kind": "removed", "ops": list(self.less_bn.removed_ops),
                                "modules": list(self.less_bn.removed_modules),
                                "what": "BatchNorm removed from a residual branch"})
            if self.less_bn.fn_head:
                changes.append({"algorithm": "fn_head", "kind": "replaced", "ops": list(self.less_bn.replaced_ops),
                                "modules": [self.less_bn.fn_head], "prefix": f"boost/fn_head/{self.less_bn.fn_head}/",
                                "what": "last Dense replaced by the full-normalisation head"})
            if self.gc_axes is not None:
                changes.append({"algorithm": "gc", "kind": "added", "prefix": "boost/less_bn/gc/",
                                "what": "gradient centralisation before the update"})
        if self.freeze is not None:
            shown = min(steps, FREEZE_SEQUENCE_SHOWN)
            changes.append({"algorithm": "grad_freeze", "kind": "frozen", "prefix": "boost/grad_freeze/",
                            "groups": [len(g) for g in self.freeze.groups],
                            "group_params": self.freeze.groups,
                            "sequence": [self.freeze.index(s) for s in range(shown)],
                            "what": "parameters outside the step's freeze group get no update"})
        for algorithm, present in (("grad_accumulation", self.accumulation), ("adasum", self.adasum),
                                   ("dim_reduce", self.dim_reduce), ("loss_scale_group", self.group_scale)):
            if present is not None:
                changes.append({"algorithm": algorithm, "kind": "added", "prefix": f"boost/{algorithm}/",
                                "what": _WHAT[algorithm]})
        return changes

    def metadata(self, steps: int) -> dict:
        return {**self.config.to_dict(), "changes": self.changes(steps)}


_WHAT = {
    "grad_accumulation": "gradients accumulated, the update applied every grad_accumulation_step steps",
    "adasum": "the update combines the replicas' deltas by AdaSum",
    "dim_reduce": "the update is a quasi-Newton step in a PCA subspace plus momentum",
    "loss_scale_group": "each layer group's gradients come from a backward at its own loss scale",
}
