"""Dumps that start at a later step than their runs (a zoom region's steps): the runs trained before them.

A ViT trained with Adam in float32, the target with oneDNN off. Its attention key biases get gradients that are
rounding noise (softmax ignores them), and Adam turns the noise into steps of the learning rate's size: by step 1
the key biases are 0.6 apart. A dump of steps 1 and 2 read that as "a value no op of step 1 wrote (a parameter,
buffer or the data) ... while the step's first ops read the same weights and data as golden's", which holds at
a run's first step only.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, onednn: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(tf.ViTConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16,
        patch_size=4, num_labels=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 16, 16, generator=generator), torch.randint(0, 4, (4,), generator=generator))
               for _ in range(3)]
    with torch.backends.mkldnn.flags(enabled=onednn):
        fit(path, model, optimizer, lambda m, b: m(pixel_values=b[0], labels=b[1]).loss, batches, steps=[1, 2])


def test_a_dump_from_step_1_does_not_take_trained_parameters_for_changed_ones(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, True)
    _train(target, False)
    verdict = diagnosis_of(golden, target).verdict
    assert verdict.cls == "none", verdict.evidence
