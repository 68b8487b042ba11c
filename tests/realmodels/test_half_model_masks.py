"""Clean float16 models (``model.half()``, no autocast) whose attention masks are finfo(float16).min where
golden's float32 models' are finfo(float32).min. A GPT-J writes its mask with ``scalar_tensor(-65504)``: full
dumps called that "overflow" (-65504 is float16's limit). A Llama adds the mask in float16 and casts the scores
up to float32 for its softmax: the cast's -65504 against golden's -3.4e38 read as error 1, "kernel_bug" at the
cast. Each is the mask of its run's own format: both runs are clean.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _model(family: str):
    import transformers as tf

    tf.logging.set_verbosity_error()
    if family == "gptj":
        config = tf.GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, vocab_size=64, n_positions=64,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return tf.GPTJForCausalLM(config)
    config = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = "eager"
    return tf.LlamaForCausalLM(config)


def _train(path, family: str, half: bool) -> None:
    torch.manual_seed(1)
    model = _model(family)
    if half:
        model.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(100)
    batches = []
    for _ in range(2):
        ids, mask = torch.randint(3, 64, (3, 10), generator=generator), torch.ones(3, 10, dtype=torch.long)
        mask[0, 7:] = 0
        batches.append((ids, mask))

    def loss_of(model, batch):
        ids, mask = batch
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))

    fit(path, model, optimizer, loss_of, batches)


@pytest.mark.parametrize("family", ["gptj", "llama"])
def test_a_clean_float16_model_s_own_mask_is_no_fault(tmp_path, family):
    _train(tmp_path / "golden.h5", family, False)
    _train(tmp_path / "target.h5", family, True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op) == ("none", None), verdict.evidence
