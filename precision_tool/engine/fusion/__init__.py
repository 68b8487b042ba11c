"""Graph fusion passes of the simulated NPU, and the fusion switch file.

A pass finds op chains in the traced graph and replaces each with one fused
node that computes the chain the way a fused kernel does and remembers the
pass name and the ops it replaced (`graph.FusionInfo`).
"""

from __future__ import annotations

from precision_tool.engine.fusion.base import PASSES, FusionPass, apply_fusion
from precision_tool.engine.fusion.switch import load_fusion_switch, parse_fusion_switch
from precision_tool.engine.fusion import passes  # noqa: F401  (registers the passes)

__all__ = ["PASSES", "FusionPass", "apply_fusion", "load_fusion_switch", "parse_fusion_switch"]
