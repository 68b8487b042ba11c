"""What the two runs ended with: the last common step's loss and the last common held-out evaluation.

The symptom a user starts from ("accuracy differs from the reference"),
printed next to the verdict that explains it. The evaluation comes from the
dumps' ``evaluations`` metadata (`Session.evaluate`, on the schedule of
``train_steps``/``eval_steps``); dumps without it (torch captures, older
dumps) give the loss only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """The two runs' loss at their last common step, and their metric at their last common evaluation."""

    step: int | None = None
    golden_loss: float | None = None
    target_loss: float | None = None
    metric: str | None = None  # "accuracy" or "mse"
    eval_step: int | None = None
    golden_value: float | None = None
    target_value: float | None = None

    def summary(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"loss at step {self.step}: golden {_g(self.golden_loss)}, target {_g(self.target_loss)}")
        if self.metric is not None:
            gap = (self.target_value - self.golden_value
                   if _finite(self.golden_value) and _finite(self.target_value) else None)
            parts.append(f"held-out {self.metric} after step {self.eval_step}: golden {_g(self.golden_value)}, "
                         f"target {_g(self.target_value)}" + (f" ({gap:+.4g})" if gap else ""))
        return "; ".join(parts) if parts else "no loss recorded"


def outcome(golden, target) -> Outcome:
    """The `Outcome` of a golden and a target dump (readers)."""
    losses = [{s.step: s.loss for s in dump.steps()} for dump in (golden, target)]
    common = sorted(set(losses[0]) & set(losses[1]))
    step = common[-1] if common else None
    evaluations = [_evaluations(dump.metadata) for dump in (golden, target)]
    both = sorted(set(evaluations[0]) & set(evaluations[1]))
    metric = eval_step = golden_value = target_value = None
    if both:
        eval_step = both[-1]
        g, t = evaluations[0][eval_step], evaluations[1][eval_step]
        if g.get("metric") == t.get("metric"):
            metric, golden_value, target_value = g.get("metric"), _float(g.get("value")), _float(t.get("value"))
        else:
            eval_step = None
    return Outcome(step, losses[0].get(step), losses[1].get(step), metric, eval_step, golden_value, target_value)


def _evaluations(metadata: dict) -> dict[int, dict]:
    found = {}
    for item in metadata.get("evaluations") or []:
        if isinstance(item, dict) and isinstance(item.get("step"), int):
            found[item["step"]] = item
    return found


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _g(value) -> str:
    return "not recorded" if value is None else f"{value:.4g}"
