"""Ops whose output does not follow from their inputs: a recorded kernel that does not compute its op, and an op
of backward that is not proportional to the loss-scaled gradients it reads (`unexplained_verdict`).

Every op autograd runs is linear in the gradient it is given, so a target scaled by its loss scale computes
golden's values times that scale; an op that does not (a clamp a gradient hook applies, written for unscaled
values) computes golden's output from golden's unscaled inputs and another one from them times the scale.
"""

from __future__ import annotations

from precision_tool.analysis.scaling import loss_scale_ratios


def unexplained_verdict(scan, record, a, floor: float):
    """kernel_bug at ``record``, whose output departs from golden's beyond its inputs and what its dtype explains
    (``a``, replayed), where the recorded kernel does not compute its op from its own recorded inputs; or, in
    backward under a loss scale, where it computes golden's output from golden's unscaled inputs to the last
    bits, yet departs from golden's times the scale while its inputs match golden's times the scale: it is not
    proportional to the gradients it reads (a clamp or threshold a hook applies, written for unscaled values).
    None otherwise."""
    from precision_tool.analysis.attribution import self_consistency
    from precision_tool.analysis.results import Verdict
    from precision_tool.analysis.structure import owning_module
    from precision_tool.defaults import INTRODUCED_EXCESS, SIGNIFICANT_ERROR

    check = self_consistency(scan.target, record)
    if check is not None and check[0] >= floor and check[0] > INTRODUCED_EXCESS * check[1]:
        return scan._kernel_verdict(
            record, a, f"does not compute its op: its recorded output is {check[0]:.3g} away from the op "
                       f"replayed on its own recorded inputs, which {a.compute_dtype} explains to "
                       f"{check[1]:.3g}", recorded=True)
    scale = loss_scale_ratios(scan.golden, scan.target).get(record.step, 1.0)
    if record.direction != "backward" or scale == 1.0 or check is None or a.introduced is None or \
            a.observed < SIGNIFICANT_ERROR or INTRODUCED_EXCESS * max(a.introduced, a.expected or 0.0) >= a.observed:
        return None
    departure = _unproportional(scan, record, scale)
    if departure is None or departure < SIGNIFICANT_ERROR:
        return None
    evidence = (f"its inputs match golden's times the step's loss scale, {scale:g}, within {a.inherited:.3g}; its "
                f"output departs {a.observed:.3g} from golden's times the scale",
                f"replayed on golden's unscaled inputs in {a.compute_dtype} it computes golden's output (introduces "
                f"{a.introduced:.3g}); on them times the scale, divided by it after, {departure:.3g} from golden's: "
                f"{record.type} is not proportional to the gradients it reads, and the target runs it on gradients "
                "multiplied by the loss scale")
    action = (f"{record.type} at {record.name} reads loss-scaled gradients (a hook that clamps or thresholds "
              "them, written for unscaled values): apply it after scaler.unscale_(optimizer), or scale its "
              "constants by scaler.get_scale()")
    return Verdict(record.name, "kernel_bug", record.step, record.direction, record.type, evidence, action,
                   module=owning_module(record))


def _unproportional(scan, record, scale: float) -> float | None:
    """How far ``record``, replayed exactly on golden's inputs with the ones that carry gradients multiplied by
    ``scale``, then divided by it, departs from golden's output: 0 for every op autograd runs (a backward is
    linear in the gradient it is given; a ReLU's mask reads the forward value, unscaled); None where it cannot be
    replayed."""
    import numpy as np

    from precision_tool.analysis.attribution import GoldenView
    from precision_tool.analysis.errors import split_error
    from precision_tool.analysis.replay import is_float
    from precision_tool.compare.judged import gradient_scale

    view = scan.views.get(id(record)) or GoldenView(scan.golden, [])
    inputs = view.input_list(record)
    golden_outputs = [view.get(t.slot) for t in record.outputs]
    if inputs is None or any(g is None for g in golden_outputs):
        return None
    factors = [gradient_scale(t, view.record(t.slot), scale) if view.record(t.slot) is not None else 1.0
               for t in record.inputs]
    if all(f == 1.0 for f in factors):
        return None
    scaled = [np.asarray(x) * f if f != 1.0 and np.asarray(x).dtype.kind == "f" else x
              for x, f in zip(inputs, factors)]
    if scan.target.metadata.get("framework") != "torch":
        return None  # (the engine's ops, and msprobe's APIs, are the library's own: no hook computes there)
    try:
        from precision_tool.torch import NotReplayable, replay
    except ImportError:
        return None
    try:  # exactly, in float64, on golden's values as they are (rounded to float16, unscaled gradients vanish)
        ideal = replay(record, scaled, device="golden", exact=True)
        unscaled = replay(record, inputs, device="golden", exact=True)
    except NotReplayable:
        return None
    # against the same exact replay unscaled, not golden's recorded output: a sum that cancels to float32's noise
    # (a key bias's gradient) departs from that by orders of magnitude either way; a power-of-two scale is exact
    errors = [split_error(np.asarray(i, dtype=np.float64) / scale, np.asarray(u, dtype=np.float64), "float64").error
              for i, u, t in zip(ideal, unscaled, record.outputs) if is_float(t.dtype)]
    return max(errors, default=None)
