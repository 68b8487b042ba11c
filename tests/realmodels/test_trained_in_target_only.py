"""A parameter golden freezes and the target trains (a fine-tuning script that forgot to freeze a layer).

The target's backward runs ops in the layer where golden's runs none, and its optimizer runs more ops. The
difference reaches the values only through the update, so every op of the next step inherited it and the
diagnosis said `none` ("accumulated rounding"): now the layer is named in backward at step 0, the mirror of a
layer frozen in the target only (`analysis.missing`).
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]

WPE = "GPT2LMHeadModel/transformer/wpe"


def _train(path, mode: str, frozen: bool) -> None:
    model = tiny_gpt2()
    if frozen:
        model.transformer.wpe.weight.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    fit(path, model, optimizer, lambda m, ids: m(input_ids=ids, labels=ids).loss, token_batches(2), mode=mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_layer_trained_in_the_target_only_is_named_in_backward(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, frozen=True)
    _train(tmp_path / "target.h5", mode, frozen=False)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", WPE, 0, "backward")
    assert verdict.evidence == (
        f"the target's backward runs 1 op(s) in {WPE} [embedding_dense_backward]; golden's runs none there, "
        "though both run its forward",
        "the target computes 1 gradient(s) there that golden does not, and its optimizer runs 11 op(s) more than "
        "golden's: parameters the target trains and golden does not")
