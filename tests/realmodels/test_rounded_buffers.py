"""A float32 Llama whose rotary embedding's inverse frequencies were rounded to bfloat16 (a buffer loaded from a
bfloat16 checkpoint): four values, too few for a grid to prove anything by itself, but every one is golden's
rounded to bfloat16. Zoom's op-level region of the module-level finding said `none` before."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, mode: str, rounded: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                               max_position_embeddings=64))
    if rounded:
        rotary = model.model.rotary_emb
        rotary.inv_freq.copy_(rotary.inv_freq.to(torch.bfloat16).float())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    fit(path, model, optimizer, lambda m, ids: m(input_ids=ids, labels=ids).loss, token_batches(1), mode=mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_buffer_of_four_values_rounded_to_bfloat16_is_precision_loss_where_read(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, rounded=False)
    _train(tmp_path / "target.h5", mode, rounded=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "precision_loss", "LlamaForCausalLM/model/rotary_emb/aten.mul_0", 0, "forward")
    assert "whose every value bfloat16 holds" in verdict.evidence[0]
