"""How far a backward group's reduced gradients may carry the error of what it reads, from statistics.

A rewritten backward group (`rewrites`) computes, besides the gradient of its input, reduced ones: a weight's
gradient (the incoming gradient g, N rows, against the saved input x: G = gᵀx) and a bias's (the rows of g
summed). Cancellation in such a sum can turn the incoming gradient's small error into a large relative error of
a small result (a key projection's bias gradient is zero in exact arithmetic: its values are rounding noise
alone), and statistics show neither where it cancels nor the element-wise error. The norms they do hold bound
it: ‖δ(gᵀx)‖ ≤ ‖δg‖‖x‖ and ‖Σ_n δg_n‖ ≤ √N‖δg‖ (Frobenius norms; Cauchy-Schwarz), so a reduced result departs
from golden's at most ``amplification`` times the incoming gradient's relative error, where

    amplification = ‖g‖ · max(‖x‖ for each tensor the group reads from outside, √N) / ‖G_golden‖

(at least 1). A departure beyond that, by `INTRODUCED_EXCESS`, is the group's own: the plant of a hand-written
Linear whose backward makes the weight gradient 5 % too large, in a float32 ViT, departs 0.05 where the bound
allows 12 times its inputs' 1e-7.
"""

from __future__ import annotations

import math

from precision_tool.analysis.replay import is_float
from precision_tool.analysis.structure import Rewritten, fingerprint
from precision_tool.dump.records import OpRecord


def incoming_size(rewrite: Rewritten) -> int:
    """How many values the gradient a rewritten backward group reads holds (0 when unknown)."""
    incoming = _incoming(rewrite)
    return incoming.stats.count if incoming is not None else 0


def amplification(rewrite: Rewritten, members: list[OpRecord], result, golden_norm: float) -> float:
    """The bound (module docstring) on how many times the relative error of the gradient ``rewrite``'s group
    reads its reduced ``result`` (a tensor of fewer values) can carry, against golden's result of norm
    ``golden_norm``; inf where it is not known."""
    incoming = _incoming(rewrite)
    if incoming is None or not incoming.stats.count or not result.stats.count or not golden_norm > 0:
        return math.inf
    made = {fingerprint(t) for record in members for t in record.outputs if t.stats.count}
    key = fingerprint(incoming)
    outside = [t.stats.norm for record in members for t in record.inputs
               if t.stats.count and is_float(t.dtype) and fingerprint(t) not in made and fingerprint(t) != key]
    rows = math.sqrt(max(incoming.stats.count / result.stats.count, 1.0))
    bound = incoming.stats.norm * max([rows, *outside]) / golden_norm
    return max(bound, 1.0) if math.isfinite(bound) else math.inf


def _incoming(rewrite: Rewritten):
    try:
        return rewrite.target_first.tensor(rewrite.target_slot) if rewrite.target_first else None
    except KeyError:
        return None
