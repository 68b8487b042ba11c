"""ALBERT reuses one layer for every layer of its encoder; a forward hook scales the shared FFN output Linear's output
(float32, module level, statistics). Nothing reads that output whole: the layer adds it to the attention's output
and normalises the sum, its own code between the calls. The call departing 20 % on inputs golden's to the last bit
was not harmful, as no module call read it and the layer does not return it: `none`. A later call the parent makes
in the same call, whose input departs, reads it.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]

FFN = "AlbertForSequenceClassification/albert/encoder/albert_layer_groups.0/albert_layers.0/ffn_output"


def _train(path, scale: float | None) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    model = tf.AlbertForSequenceClassification(tf.AlbertConfig(
        embedding_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        vocab_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0, num_labels=3))
    if scale is not None:
        ffn = model.get_submodule(FFN.split("/", 1)[1].replace("/", "."))
        ffn.register_forward_hook(lambda module, args, output: output * scale)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(100)
    batches = [(torch.randint(3, 64, (3, 10), generator=generator), torch.tensor([0, 2, 1])) for _ in range(2)]
    fit(path, model, optimizer, lambda model, b: model(input_ids=b[0], labels=b[1]).loss, batches, "stats",
        level="module")


def test_a_shared_layer_s_output_summed_by_its_parent_is_named(tmp_path):
    _train(tmp_path / "golden.h5", None)
    _train(tmp_path / "target.h5", 1.2)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", FFN, 0, "forward"), \
        verdict.evidence


def test_the_same_layer_without_the_hook_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", None)
    _train(tmp_path / "target.h5", 1.0)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
