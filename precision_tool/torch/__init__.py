"""PyTorch front end: dump real training at aten-op granularity, and simulate NPU numerics on it.

Install with ``pip install 'precision-tool[torch]'``. Three lines instrument a
training script (see ``docs/torch.md``)::

    import precision_tool.torch as ptt
    with ptt.dump("golden.h5", mode="stats"):      # or: with ptt.simulate_npu("force_fp16"), ptt.dump(...)
        train()                                    # steps end at each optimizer.step()

`dump` records every aten op executed inside it, forward, backward and
optimizer, into the project's HDF5 dump, named ``<module path>/<op>_<k>``
so names match across runs and devices (`precision_tool.torch.naming`).
`simulate_npu` computes every float32 op with the simulated NPU's formats
and overflow mode (`precision_tool.torch.simulate`); the two combine in
either order. `step` ends a step explicitly (and records its loss); `replay`
re-runs a recorded op through PyTorch. Nothing outside this package imports
torch.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "precision_tool.torch needs PyTorch: pip install 'precision-tool[torch]'"
    ) from exc

from precision_tool.torch.capture import MODES, dump
from precision_tool.torch.replay import NotReplayable, replay, replay_as_recorded, replay_op
from precision_tool.torch.session import step
from precision_tool.torch.simulate import simulate_npu
from precision_tool.collect.zoom_env import zoom_role

__all__ = ["MODES", "NotReplayable", "dump", "replay", "replay_as_recorded", "replay_op", "simulate_npu", "step",
           "zoom_role"]
