"""Run variations (tests/realmodels/variation.py): GradScaler loops, clipping, sizes, steps, optimizers and
faults under bf16 get their exact verdicts."""

from __future__ import annotations

import pytest

from tests.realmodels.variation import VARIATIONS, run_variation

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.mark.parametrize("variation", VARIATIONS, ids=lambda v: v.id)
def test_a_variation_gets_its_verdict(variation, tmp_path):
    diagnosis, right, said = run_variation(variation, tmp_path)
    assert right, f"{said}: {diagnosis.verdict.evidence}"
