"""A target run whose loss goes NaN where golden's stays finite, seen from dumps that do not record the op that
overflows (module level): the verdict says so, and where to collect ops, not 'accumulated rounding'."""

from __future__ import annotations

import pytest

from tests.realmodels.variation import Variation, run_variation

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_a_loss_gone_nan_at_module_level_is_no_accumulated_rounding(tmp_path):
    """The model in float16 throughout: Adam's update writes inf into the parameters at step 0, which module
    records do not show; step 1's loss is NaN. Before: none, 'the difference is accumulated rounding'."""
    variation = Variation("gpt2", "half", "", "", "overflow", "optimizer")
    diagnosis, _, _ = run_variation(variation, tmp_path, "stats", "module")
    verdict = diagnosis.verdict
    assert (verdict.cls, verdict.op) == ("none", None)
    assert verdict.evidence[0].startswith("the target's loss is nan at step 1, where golden's is 4.06")
    assert verdict.evidence[0].endswith("not accumulated rounding, but an overflow this dump does not show; the "
                                        "first record holding inf or NaN where golden's holds none: "
                                        "GPT2LMHeadModel/transformer/wte (forward, step 1)")
    assert verdict.action.startswith("collect steps [0, 1] again at op level with tensors")
