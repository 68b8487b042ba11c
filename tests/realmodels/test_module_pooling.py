"""Module-level dumps of a pooling written otherwise than golden's, in float32.

* The ResNet's pooler a max where golden's averages, and BERT's pooler a mean of all tokens where golden takes
  the first: from statistics, a pooled output holds fewer values than its input, and a reduction's output can
  lose to cancellation the noise its inputs' statistics do not show, so such outputs were not judged. Inputs
  whose statistics are golden's to the last bit (the first step) hide none: "accumulated rounding, as its dtypes
  allow" was said of a float32 run whose loss moved 40 %.
* A ViT whose script pools its tokens by hand before the classifier, the mean for golden's first token: the
  classifier, called outside every module, reads an input 0.99 from golden while the ViT's output agrees, and
  nothing judged the script's code between two outermost calls.
"""

from __future__ import annotations

import types

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _resnet(target: bool):
    import transformers as tf

    torch.manual_seed(0)
    model = tf.ResNetForImageClassification(tf.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32],
                                                            depths=[1, 1], layer_type="basic", num_labels=3))
    if target:
        model.resnet.pooler = torch.nn.AdaptiveMaxPool2d((1, 1))
    generator = torch.Generator().manual_seed(9)
    batches = [(torch.randn(2, 3, 32, 32, generator=generator), torch.randint(0, 3, (2,), generator=generator))
               for _ in range(2)]
    return model, batches, lambda m, b: m(pixel_values=b[0], labels=b[1]).loss


def _bert(target: bool):
    import transformers as tf

    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(tf.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3))
    if target:
        pooler = model.bert.pooler
        pooler.forward = types.MethodType(lambda self, h: self.activation(self.dense(h.mean(dim=1))), pooler)
    generator = torch.Generator().manual_seed(4)
    batches = [(torch.randint(5, 100, (4, 12), generator=generator), torch.randint(0, 3, (4,), generator=generator))
               for _ in range(2)]
    return model, batches, lambda m, b: m(input_ids=b[0], labels=b[1]).loss


@pytest.mark.parametrize("build, module", [(_resnet, "ResNetForImageClassification/resnet/pooler"),
                                           (_bert, "BertForSequenceClassification/bert/pooler")],
                         ids=["resnet-max", "bert-mean"])
def test_a_pooler_written_otherwise_is_named_from_module_statistics(build, module, tmp_path):
    import transformers as tf

    tf.logging.set_verbosity_error()
    paths = {}
    for role in ("golden", "target"):
        model, batches, loss_of = build(role == "target")
        paths[role] = tmp_path / f"{role}.h5"
        fit(paths[role], model, torch.optim.Adam(model.parameters(), lr=1e-3), loss_of, batches, "stats",
            level="module")
    verdict = diagnosis_of(paths["golden"], paths["target"]).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", module, 0, "forward")


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_pooling_in_the_script_between_two_outermost_calls_is_named_at_the_call_reading_it(mode, tmp_path):
    import transformers as tf

    tf.logging.set_verbosity_error()
    paths = {}
    for role in ("golden", "target"):
        torch.manual_seed(0)
        model = tf.ViTForImageClassification(tf.ViTConfig(
            image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=4))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(7)
        batches = [(torch.randn(3, 3, 32, 32, generator=generator), torch.randint(0, 4, (3,), generator=generator))
                   for _ in range(2)]
        paths[role] = tmp_path / f"{role}.h5"

        def loss_of(model, batch, mean=role == "target"):
            tokens = model.vit(pixel_values=batch[0]).last_hidden_state
            pooled = tokens.mean(dim=1) if mean else tokens[:, 0, :]
            return torch.nn.functional.cross_entropy(model.classifier(pooled), batch[1])

        fit(paths[role], model, optimizer, loss_of, batches, mode, level="module")
    verdict = diagnosis_of(paths["golden"], paths["target"]).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction, verdict.module) == (
        "kernel_bug", "Linear", 0, "forward", None)
    assert "outside every module" in verdict.evidence[1]
