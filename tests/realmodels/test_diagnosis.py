"""The diagnosis on real models: clean runs get "none", each planted fault its op, class and module.

Tiny-config, random-init Hugging Face models (GPT-2, BERT, ViT, ResNet) and
an LSTM, trained two steps under precision_tool.torch (tests/realmodels/
cases.py). bench/bench_diagnosis.py runs the same cases as a scoreboard.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")
pytest.importorskip("transformers", reason="transformers not installed: pip install -e '.[dev]'")

from precision_tool.analysis import diagnose  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402
from tests.realmodels.cases import clean_cases, collect, fault_cases, judge  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    """Golden dumps shared by the cases of one model."""
    return tmp_path_factory.mktemp("goldens")


def _diagnose(case, tmp_path, goldens):
    golden, target = collect(case, tmp_path, goldens=goldens)
    with open_dump(golden) as g, open_dump(target) as t:
        return diagnose(g, t)


@pytest.mark.parametrize("case", clean_cases(), ids=lambda c: c.id)
def test_a_clean_run_gets_no_culprit(case, tmp_path, goldens):
    diagnosis = _diagnose(case, tmp_path, goldens)
    right, said = judge(case, diagnosis)
    assert right, said


@pytest.mark.parametrize("case", fault_cases(), ids=lambda c: c.id)
def test_a_planted_fault_is_named_with_its_class_and_module(case, tmp_path, goldens):
    diagnosis = _diagnose(case, tmp_path, goldens)
    right, said = judge(case, diagnosis)
    assert right, f"{said}: {diagnosis.verdict.evidence}"
