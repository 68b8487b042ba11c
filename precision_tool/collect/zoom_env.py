"""`precision-tool zoom -- python train.py`: the environment `precision_tool.torch.dump` reads (no torch here).

The tool runs the script four times, golden and target, in two phases, and sets:

``PRECISION_TOOL_ZOOM_PHASE``
    ``stats`` (phase 1: statistics of every op) or ``tensors`` (phase 2: full tensors of the region);
``PRECISION_TOOL_ZOOM_ROLE``
    ``golden`` or ``target``: the script reads it with `zoom_role` and simulates the NPU (or whatever makes its
    target run) only for ``target``;
``PRECISION_TOOL_ZOOM_DIR``
    where the dumps go: ``stats-<role>.h5``, ``zoom-<role>.h5`` (the path given to `dump` is ignored);
``PRECISION_TOOL_ZOOM_REGION``
    in phase 2, the region as JSON: ``{"steps": [N], "ops": [GLOB, ...], "modules": [GLOB, ...],
    "backward": bool, "float32": bool}`` (``float32``: whether phase 1's target computes in float32, which a
    region of a module cast to 16 bits alone does not show).

Outside zoom none is set and `dump` records what its arguments say.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

PHASE, ROLE, DIR, REGION = ("PRECISION_TOOL_ZOOM_PHASE", "PRECISION_TOOL_ZOOM_ROLE", "PRECISION_TOOL_ZOOM_DIR",
                            "PRECISION_TOOL_ZOOM_REGION")
PHASES = {"stats": ("stats", "stats-{role}.h5"), "tensors": ("dump", "zoom-{role}.h5")}  # phase -> (mode, file)
ROLES = ("golden", "target")


def zoom_role() -> str | None:
    """``"golden"`` or ``"target"`` when the script runs under `precision-tool zoom`, else None."""
    role = os.environ.get(ROLE)
    return role if role in ROLES else None


@dataclass(frozen=True)
class ZoomSettings:
    """What a `dump` records under zoom, in place of its arguments."""

    path: str
    mode: str
    role: str
    steps: list | None = None
    ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    backward: bool = True
    runs_float32: bool | None = None  # whether phase 1's target computes in float32 (its region may not show)


def zoom_settings(environ=None) -> ZoomSettings | None:
    """The settings the zoom environment asks for; None outside zoom. ValueError when it is malformed."""
    environ = os.environ if environ is None else environ
    phase = environ.get(PHASE)
    if not phase:
        return None
    if phase not in PHASES or environ.get(ROLE) not in ROLES or not environ.get(DIR):
        raise ValueError(f"{PHASE}={phase!r} needs {ROLE} (golden or target) and {DIR}; phases: stats, tensors")
    mode, file = PHASES[phase]
    role = environ[ROLE]
    path = os.path.join(environ[DIR], file.format(role=role))
    if phase == "stats":
        return ZoomSettings(path, mode, role)
    try:
        region = json.loads(environ.get(REGION) or "")
    except json.JSONDecodeError as exc:
        raise ValueError(f"{REGION} is not JSON: {exc}") from None
    return ZoomSettings(path, mode, role, steps=region.get("steps"), ops=tuple(region.get("ops") or ()),
                        modules=tuple(region.get("modules") or ()), backward=bool(region.get("backward", True)),
                        runs_float32=region.get("float32") if isinstance(region.get("float32"), bool) else None)
