"""Activation checkpointing (Hugging Face's ``gradient_checkpointing_enable``) in both runs.

The checkpointed layers run their forward again during backward, with torch's reentrant checkpoint (the
Hugging Face default) or the non-reentrant one. The recomputed ops keep their modules' paths and the backward
ops their forward ops' names (precision_tool.torch.naming), so a fault is still named in its module: before,
under reentrant checkpointing, a gradient fault was named after an autograd node (``ScaledGradientBackward``).
"""

from __future__ import annotations

import pytest

from tests.realmodels import cases
from tests.realmodels.cases import Case, judge

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture
def checkpointed(monkeypatch, tmp_path):
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    def run(case: Case, reentrant: bool):
        build = cases.build

        def build_checkpointed(case, seed=0):
            built = build(case, seed)
            built.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            built.model.train()
            return built

        monkeypatch.setattr(cases, "build", build_checkpointed)
        golden, target = cases.collect(case, tmp_path)
        with open_dump(golden) as g, open_dump(target) as t:
            return diagnose(g, t)

    return run


@pytest.mark.parametrize("case, reentrant", [
    (Case("gpt2-sdpa", "fp32", "backward_only", "act", "kernel_bug", "backward"), True),
    (Case("bert-eager", "fp32", "backward_only", "act", "kernel_bug", "backward"), False),
    (Case("vit", "fp32", "scale", "act", "kernel_bug", "forward"), True),
    (Case("gpt2-sdpa", "bf16"), True),
    (Case("bert-eager", "mix"), False),
], ids=lambda v: v.id if isinstance(v, Case) else ("reentrant" if v else "non-reentrant"))
def test_checkpointed_layers_keep_the_verdict(case, reentrant, checkpointed):
    diagnosis = checkpointed(case, reentrant)
    right, said = judge(case, diagnosis)
    assert right, said
