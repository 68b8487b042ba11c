"""A Llama whose MLP up-projection holds weights beyond float16's range (both runs), trained under float16
autocast without a loss scale: autocast's cast of that weight to float16 writes inf and the loss is NaN.

That cast is an op golden does not run, so no golden op pairs with it and the scan could not judge it; the
matmul reading it inherits the inf. `none` said "an overflow this dump does not show" of a full dump, and the
hint called the cast's result "not finite in float32"."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(1e6)
    batches = list(torch.randint(3, 64, (2, 3, 10), generator=torch.Generator().manual_seed(5)))

    def loss_of(model, ids):
        with torch.autocast("cpu", dtype=torch.float16, enabled=target):
            return model(input_ids=ids, labels=ids).loss

    fit(path, model, torch.optim.Adam(model.parameters(), lr=1e-3), loss_of, batches)


def test_an_autocast_cast_that_overflows_is_named_where_the_loss_is_lost(tmp_path):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "overflow", "LlamaForCausalLM/model/layers.1/mlp/up_proj/aten._to_copy_0", 0, "forward")
    assert verdict.action.startswith("a cast to float16 overflows")
