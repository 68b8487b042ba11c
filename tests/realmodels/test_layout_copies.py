"""A clean float32 port to channels_last of a model that unfolds its feature map into patches, as MobileViT does.
``reshape`` cannot view a channels_last tensor as (batch x channels x rows, 2, columns, 2): it copies it (``clone``
then ``_unsafe_view``) where golden's contiguous tensor is only viewed. Every later copy in that module was
numbered one higher than golden's, pairing by name paired unrelated copies, and the backward of the extra copy was
blamed: kernel_bug, "an op golden does not run wrote the value it read" (a probe's MobileViT)."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, channels_last: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.MobileViTForImageClassification(tf.MobileViTConfig(
        image_size=32, patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
        num_attention_heads=2, mlp_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0, num_labels=4))
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        pixels = pixels.contiguous(memory_format=torch.channels_last)
    batch = {"pixel_values": pixels, "labels": torch.tensor([0, 1, 2, 3])}
    fit(path, model, torch.optim.AdamW(model.parameters(), lr=1e-3), lambda m, b: m(**b).loss, [batch])


def test_a_copy_only_the_target_makes_shifts_no_other_copy_of_its_module(tmp_path):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    assert (diagnosis.verdict.cls, diagnosis.verdict.op) == ("none", None)
