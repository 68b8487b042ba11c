"""A target that recomputes its blocks in backward (transformers' gradient checkpointing) against a golden run
that does not: its ops pair with golden's, so a clean port passes `check` (the variations' verdicts are in
tests/realmodels/variation.py, ``checkpoint``)."""

from __future__ import annotations

import pytest

from precision_tool.compare import compare_dumps
from tests.realmodels.variation import Variation, collect

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.mark.parametrize("how", ["reentrant", "nonreentrant"])
def test_a_clean_float32_port_that_recomputes_its_blocks_passes_check(how, tmp_path, run_cli):
    golden, target = collect(Variation("gpt2", "fp32", checkpoint=how), tmp_path)
    checked = run_cli("check", golden, target)
    assert checked.status == 0, checked.stdout[-2000:]
    assert "PASSED | 806 tensors checked | 16 golden and" in " ".join(checked.stdout.split())
    # golden's 16 left over: the key/value cache's cat and their backward, which transformers leaves out when
    # it checkpoints; the target's: the recomputation, and the checkpoint's own ops
    report = compare_dumps(golden, target)
    assert {u.type for u in report.unmatched_golden} == {"aten.cat", "aten.zeros"}
    assert report.summary(0.98).flagged_ops == 0
