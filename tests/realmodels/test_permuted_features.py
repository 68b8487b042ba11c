"""A layer's output features in another order (its weight's rows and bias permuted, the next layer's inputs not),
from statistics, float32. Statistics do not change when values move among positions: the layer's output matches
golden's statistics exactly, and the next matrix product, combining them with weights in golden's order, is where
the error shows. That product's output is smaller than its inputs, and such outputs were never judged from
statistics (a reduction can lose its inputs' unseen noise to cancellation): `none`, with the loss moved. Now an
op's smaller output is judged where its error is beyond what that noise becomes through the reduction.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, permuted: bool) -> None:
    model = tiny_gpt2()
    if permuted:
        fc = model.transformer.h[0].mlp.c_fc  # a Conv1D: weight (in, out)
        order = torch.randperm(fc.nf, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            fc.weight.copy_(fc.weight[:, order])
            fc.bias.copy_(fc.bias[order])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = token_batches(2)
    fit(path, model, optimizer, lambda model, ids: model(input_ids=ids, labels=ids).loss, batches, "stats")


def test_permuted_output_features_are_named_where_they_combine(tmp_path):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/h.0/mlp/c_proj/aten.addmm_0", 0, "forward"), verdict.evidence
    assert any("values moved among positions" in line for line in verdict.evidence)
