"""The gradients an optimizer reads, for module-level dumps: one table row per trained parameter of every module
called in the step (`layout.PARAMETER_GRADIENTS`).

Module records hold a call's inputs, outputs and boundary gradients, none of a parameter's gradient. So a
module whose forward leaves a parameter out (a Linear that forgets its bias) or whose backward computes its
weight gradient otherwise (a custom autograd Function) shows in no module record of the step: the first is
hidden under 16-bit rounding, the second until the update. Taken when the step's first optimizer step begins
(the gradients it reads: accumulated, clipped, unscaled by a GradScaler), in the first step a dump records:
the step `precision_tool.analysis.param_grads` reads (a table every step would cost a dataset every step).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from precision_tool.dump.layout import PARAMETER_GRADIENTS, STATS_DTYPE, STATS_FIELDS
from precision_tool.torch.modules import without_modes
from precision_tool.torch.ops import dtype_name
from precision_tool.torch.tensors import stats_of

_NO_GRADIENT = (0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)


def table_dtype(module_width: int, name_width: int, dtype_width: int) -> np.dtype:
    """A row: the module's path (as its records name it), the parameter's name in it, whether the optimizer
    found a gradient, how many of the step's modules hold the parameter (tied weights: 2), the gradient's dtype
    and its statistics (zeros without one)."""
    return np.dtype([("module", f"S{max(module_width, 1)}"), ("parameter", f"S{max(name_width, 1)}"),
                     ("has_grad", "u1"), ("holders", "<u2"), ("dtype", f"S{max(dtype_width, 1)}"),
                     *[(name, STATS_DTYPE[name]) for name in STATS_FIELDS]])


def gradient_table(calls, scale: float = 1.0) -> np.ndarray | None:
    """The table of ``calls``, (module, path) of each module called in the step, in first-call order; None
    where none trains a parameter. ``scale``: what the gradients carry, divided out of their statistics (a
    GradScaler's, left on them for a fused optimizer to divide out in its kernel)."""
    holders: dict[int, int] = {}
    for module, _ in calls:
        for param in module._parameters.values():
            if param is not None:
                holders[id(param)] = holders.get(id(param), 0) + 1
    rows = []
    with without_modes():  # (the optimizer's hook runs outside dispatch; an op-level dump beside it records none)
        for module, path in calls:
            for name, param in module._parameters.items():
                if param is None or not param.requires_grad:
                    continue
                grad = param.grad
                dtype = dtype_name(grad.dtype) if grad is not None else ""
                stats = stats_of(grad, dtype) if grad is not None else _NO_GRADIENT
                if scale != 1.0 and grad is not None:
                    stats = (stats[0], *(value / scale for value in stats[1:6]), *stats[6:])
                rows.append((path.encode(), name.encode(), grad is not None, min(holders[id(param)], 65535),
                             dtype.encode(), *stats))
    if not rows:
        return None
    widths = [max(len(row[i]) for row in rows) for i in (0, 1, 4)]
    return np.array(rows, dtype=table_dtype(*widths))


def note_parameter_gradients(recorders, trains: dict, optimizer) -> None:
    """Hand the step's table to the module-level recorders among ``recorders`` that have none yet (a second
    optimizer's step in the same iteration reads gradients computed before the first's), as ``optimizer``'s
    step is about to read them; ``trains`` is the session's (module, attrs, path) by module."""
    wanting = [r for r in recorders if getattr(r, "level", "op") == "module" and r.wants_gradient_table()]
    if wanting and trains:
        scale = getattr(optimizer, "grad_scale", None)  # (a GradScaler's hand-off to a fused optimizer)
        with without_modes():  # (read outside an op-level dump's dispatch mode beside it)
            scale = float(scale) if isinstance(scale, torch.Tensor) and scale.numel() == 1 else 1.0
        table = gradient_table([(known[0], known[2]) for known in trains.values()],
                               scale if math.isfinite(scale) and scale > 0.0 else 1.0)
        for recorder in wanting:
            recorder.tables[PARAMETER_GRADIENTS] = table
