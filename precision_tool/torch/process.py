"""What the torch session changes in the process while it runs, and puts back when it stops."""

from __future__ import annotations

import gc
import types

import torch


class StepTailHook:
    """While the session runs, ``torch._amp_update_scale_`` (what torch.amp.GradScaler.update calls) tells it
    each time it ran (`Session.step_tail_called`), and ``torch._amp_foreach_non_finite_check_and_unscale_``
    (GradScaler.unscale_) keeps the flag it sets where a gradient is inf or NaN (`found`, for `found_inf`): a
    scaler that found one skips the optimizer's step, whether its update runs before the step ends or after
    (``ptt.step(loss, scaler.get_scale())`` between ``scaler.step`` and ``scaler.update``). Removed like a hook
    handle."""

    def __init__(self, session):
        original, original_unscale = torch._amp_update_scale_, torch._amp_foreach_non_finite_check_and_unscale_
        self.found: list = []  # the flags unscaling set in the open step (the session clears it at each step)

        def update_scale(*args, **kwargs):
            result = original(*args, **kwargs)
            session.step_tail_called()
            return result

        def unscale(grads, found_inf, *args, **kwargs):
            result = original_unscale(grads, found_inf, *args, **kwargs)
            if session.step_open and isinstance(found_inf, torch.Tensor):
                self.found.append(found_inf)
            return result

        self._original, self._original_unscale = original, original_unscale
        torch._amp_update_scale_ = update_scale
        torch._amp_foreach_non_finite_check_and_unscale_ = unscale

    def found_inf(self) -> bool:
        """Whether a flag unscaling set in the open step says inf or NaN (the scaler read it before deciding to
        skip: reading it again waits for nothing). Read outside the capture's dispatch mode."""
        return any(bool(flag.detach().ne(0).any().item()) for flag in self.found)

    def remove(self) -> None:
        torch._amp_update_scale_ = self._original
        torch._amp_foreach_non_finite_check_and_unscale_ = self._original_unscale


def freeze_heap() -> bool:
    """Hide the objects alive now from the cyclic garbage collector for the session; whether it did.

    Capture allocates Python objects on every aten op (calls, statistics,
    cache entries), so the collector runs often, and each of its full
    collections walks every object of the process: with torch and a
    transformers model loaded, some 300,000 of them, 0.1-0.2 s a time, a
    2,000-op LSTM step paid one every other step. Frozen (`gc.freeze`), the
    model, the modules and everything imported are not walked; what the
    session allocates is collected as before. Cyclic garbage among the frozen
    objects is collected once the session ends (`gc.unfreeze`). Nothing is
    frozen where the process froze objects itself (a server before fork):
    unfreezing would undo that.
    """
    if not gc.isenabled() or gc.get_freeze_count():
        return False
    gc.freeze()
    return True


def run_eagerly(*functions) -> None:
    """Have torch.compile run ``functions``, and all they call, as they are rather than trace them: dynamo's
    frame strategy SKIP for their code, the frame and recursively, checked only while compiled code runs (no
    cost per call otherwise). A compiled model's ops reach the dispatch mode and its module calls the global
    hooks while dynamo's frame callback is set; without this it compiles the capture's own functions as frames
    of the user's program (one guard per aten op, to its recompile limit) or inlines its hooks into the user's
    graph. A torch without the strategy (older than 2.6) is left as it is."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # pragma: no cover - torch < 2.6
        return
    for function in functions:  # (a function, or the code of one defined inside another)
        code = function if isinstance(function, types.CodeType) else function.__code__
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


def compiled_code_eager():
    """Have torch.compile'd code run eagerly (dynamo's "force_eager" stance) until the returned function is
    called, which puts the stance back; None where nothing needs it. While the capture's dispatch mode is pushed
    dynamo compiles nothing anyway (a non-infra dispatch mode: it skips every frame), and a model compiled with
    ``fullgraph=True`` then raises that it compiled no frame, stopping the user's training. Only once torch.compile
    was imported (no import of dynamo otherwise), and not from inside a compiled region (dynamo refuses there)."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo import eval_frame

    try:
        prior = eval_frame._set_stance(eval_frame.DynamoStance("force_eager"))
    except (AttributeError, RuntimeError, TypeError):  # another torch, or inside a compiled region
        return None
    return lambda: eval_frame._set_stance(prior)
