"""The diagnosis on real models: clean runs get "none", each planted fault its op, class and module.

Tiny-config, random-init Hugging Face models (GPT-2, BERT, ViT, ResNet) and
an LSTM, trained two steps under precision_tool.torch (tests/realmodels/
cases.py). bench/bench_diagnosis.py runs the same cases as a scoreboard.
"""

from __future__ import annotations

import pytest

from tests.realmodels.cases import clean_cases, fault_cases, judge

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.mark.parametrize("case", clean_cases(), ids=lambda c: c.id)
def test_a_clean_run_gets_no_culprit(case, diagnosed):
    diagnosis = diagnosed(case)
    right, said = judge(case, diagnosis)
    assert right, said


@pytest.mark.parametrize("case", fault_cases(), ids=lambda c: c.id)
def test_a_planted_fault_is_named_with_its_class_and_module(case, diagnosed):
    diagnosis = diagnosed(case)
    right, said = judge(case, diagnosis)
    assert right, f"{said}: {diagnosis.verdict.evidence}"
