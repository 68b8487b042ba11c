"""A GPT-Neo under bfloat16 autocast whose layer-1 local attention window is 7 where golden's is 8. The masked
scores are float32's lowest value, beyond bfloat16: the `where` that writes them overflows in both runs, and was
judged as an overflow first, "absorbed by the ops that read it" (a note), so the mask it reads, which differs
from golden's, was not looked at until step 1, where it was named a step late."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]

ATTENTION = "GPTNeoForCausalLM/transformer/h.1/attn/attention"


def _train(path, target: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.GPTNeoForCausalLM(tf.GPTNeoConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
        window_size=8, max_position_embeddings=32, intermediate_size=64, embed_dropout=0.0, attention_dropout=0.0,
        resid_dropout=0.0))
    if target:
        attention = model.get_submodule("transformer.h.1.attn.attention")
        causal = torch.tril(torch.ones(attention.bias.shape[-2:], dtype=torch.bool))
        attention.bias.copy_((causal ^ torch.tril(causal, -7)).view(attention.bias.shape))  # a window of 7
    generator = torch.Generator().manual_seed(123)
    batches = [torch.randint(0, 64, (4, 16), generator=generator) for _ in range(2)]

    def loss_of(model, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
            return model(input_ids=ids, labels=ids).loss

    fit(path, model, torch.optim.AdamW(model.parameters(), lr=1e-3), loss_of, batches)


def test_a_mask_read_by_an_op_that_overflows_is_judged_at_the_step_it_differs(tmp_path):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", f"{ATTENTION}/aten.where_0", 0, "forward")
    assert "reads boolean input_0 that differs from golden's in 9 of 256 element(s)" in verdict.evidence[0]
