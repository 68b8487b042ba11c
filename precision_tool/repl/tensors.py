"""The tensor grammar of `pt` and `cp`, and the element-wise comparison of `cp`.

    TENSOR    := [SIDE ":"] OP [":" SLOT] ["@" STEP] ["#" DIRECTION]  |  PATH.npy
    SIDE      := golden | target | overflow | fusion-off
    SLOT      := input_N | output_N                     (default output_0)
    STEP      := an integer                             (default: the first step that recorded OP)
    DIRECTION := forward | backward | optimizer | fwd | bwd | opt
                 (default forward, else the direction OP was recorded in)

Examples: ``fc1/MatMul:output_0``, ``golden:fc1/MatMul:input_1@2``,
``loss/Softmax:output_0#backward``, ``./saved/x.npy``. Op names may hold
``/`` and ``:``; the suffixes are matched from the right.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from precision_tool.errors import PrecisionToolError

SIDES = ("golden", "target", "overflow", "fusion-off")
DIRECTIONS = {"forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward",
              "optimizer": "optimizer", "opt": "optimizer"}
GRAMMAR = "[SIDE:]OP[:SLOT][@STEP][#DIRECTION], SIDE golden|target|overflow|fusion-off, SLOT input_N|output_N"

_TENSOR = re.compile(
    r"^(?:(?P<side>golden|target|overflow|fusion-off):)?"
    r"(?P<op>.+?)"
    r"(?::(?P<slot>(?:input|output)_\d+))?"
    r"(?:@(?P<step>\d+))?"
    r"(?:#(?P<direction>[A-Za-z]+))?$"
)


class TensorSyntaxError(PrecisionToolError):
    """A tensor argument does not follow the grammar."""


@dataclass(frozen=True)
class TensorRef:
    """A parsed TENSOR argument; ``path`` is set for a .npy file instead."""

    op: str = ""
    slot: str = "output_0"
    side: str | None = None
    step: int | None = None
    direction: str | None = None  # None: forward, else the direction the op was recorded in
    path: str | None = None

    def label(self, side: str | None = None, step: int | None = None) -> str:
        """The canonical spelling, with the side and step actually used."""
        if self.path:
            return self.path
        text = f"{side or self.side or '?'}:{self.op}:{self.slot}"
        step = self.step if step is None else step
        if step is not None:
            text += f"@{step}"
        if self.direction not in (None, "forward"):
            text += f"#{self.direction}"
        return text


def parse_tensor(text: str) -> TensorRef:
    """Parse one TENSOR argument."""
    if text.endswith(".npy"):
        return TensorRef(path=text)
    match = _TENSOR.match(text)
    if not match or match["op"].endswith(":"):
        raise TensorSyntaxError(f"cannot read tensor {text!r}; expected {GRAMMAR}")
    direction = match["direction"].lower() if match["direction"] else None
    if direction is not None and direction not in DIRECTIONS:
        valid = ", ".join(DIRECTIONS)
        raise TensorSyntaxError(f"unknown direction {match['direction']!r} in {text!r}; valid: {valid}")
    if match["step"] is not None and len(match["step"].lstrip("0")) > 18:  # (int() refuses over 4,300 digits)
        raise TensorSyntaxError(f"step {match['step'][:20]}... ({len(match['step'])} digits) is beyond any step a "
                                "dump holds")
    step = int(match["step"]) if match["step"] is not None else None
    return TensorRef(op=match["op"], slot=match["slot"] or "output_0", side=match["side"], step=step,
                     direction=DIRECTIONS.get(direction))
