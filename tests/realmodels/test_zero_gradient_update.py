"""A clean MobileBERT classifier under bfloat16 autocast, four labels, one of each, and logits nearly equal at
initialisation: bfloat16 rounds every probability to 0.25, so the classifier bias's gradient is exactly zero and
AdamW leaves the bias at its zeros. Golden's gradient is rounding noise (1e-8), which Adam turns into a full step
of 1e-3. The bias read at step 1 was the same to the last bit as at step 0 while golden's moved, and the clean run
was blamed: "the update did not reach what the target's model reads". The target's optimizer did write the bias;
its update left it as it was."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, bf16: bool) -> torch.Tensor:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.MobileBertForSequenceClassification(tf.MobileBertConfig(
        vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=32, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=4,
        classifier_dropout=0.0))
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 64, (4, 16), generator=generator)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[1, 12:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 3])}

    def loss_of(model, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return model(**batch).loss

    fit(path, model, torch.optim.AdamW(model.parameters(), lr=1e-3), loss_of, [batch, batch])
    return model.classifier.bias.detach().clone()


def test_a_parameter_the_update_leaves_as_it_was_is_not_stale(tmp_path):
    golden_bias = _train(tmp_path / "golden.h5", False)
    target_bias = _train(tmp_path / "target.h5", True)
    assert target_bias.tolist() == [0.0, 0.0, 0.0, 0.0]  # the premise: a gradient of zeros moved nothing
    assert golden_bias.abs().min().item() > 1e-4
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    assert (diagnosis.verdict.cls, diagnosis.verdict.op) == ("none", None)
