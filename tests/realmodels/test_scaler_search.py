"""A clean float16 MobileNetV2 under a GradScaler whose first scale is too high: every recorded step overflows and is
skipped, so the target never updates and golden does. The scan stops at the first skipped update (later steps
train other weights than golden's), but the overflows it could not judge from statistics, the last step's
included, were blamed anyway: "overflow ... lower the loss scale" at a convolution's backward of step 2."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    model = tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config(
        num_channels=3, image_size=32, depth_multiplier=0.25, num_labels=4, classifier_dropout_prob=0.0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12) if target else None
    batches = []
    for step in range(3):
        generator = torch.Generator().manual_seed(100 + step)
        torch.randint(3, 64, (3, 10), generator=generator)  # (the draws the probe that found it made first)
        batches.append((torch.randn(3, 3, 32, 32, generator=generator), torch.randint(0, 4, (3,),
                                                                                     generator=generator)))

    def loss_of(model, batch):
        with torch.autocast("cpu", dtype=torch.float16, enabled=target):
            return model(pixel_values=batch[0], labels=batch[1]).loss

    fit(path, model, optimizer, loss_of, batches, "stats", scaler=scaler)


def test_overflows_after_the_first_skipped_update_are_not_blamed_from_statistics(tmp_path):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    assert (diagnosis.verdict.cls, diagnosis.verdict.op) == ("none", None)
    assert any("skipped the optimizer update of step 0" in note for note in diagnosis.notes)
