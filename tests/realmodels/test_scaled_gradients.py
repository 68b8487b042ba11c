"""A clean BERT with large initial weights (initializer_range 3) under float16 autocast and a GradScaler.

Its backward's float16 values are far from golden's (1.44 at the key projection's weight-gradient matmul of step
2, by rounding alone), and golden's gradients times the loss scale lie beyond float16's range there. Such an
element counted as "overflowed" although the target's value was finite and under the limit: the verdict was an
overflow with "0 saturated, 0 inf and 0 NaN value(s)", in a run where no op raised the float status. (And the
output of its intermediate dense, 4 % from golden's value for value, read whole by its GELU, was taken for
golden's values in another order: sorting pairs each value with a near one.)
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(26)
    config = tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3, initializer_range=3.0)
    config._attn_implementation = "eager"
    model = tf.BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12) if target else None
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[0, 12:] = 0
    batches = []
    for step in range(3):
        generator = torch.Generator().manual_seed(2600 + step)
        batches.append((torch.randint(3, 64, (4, 16), generator=generator),
                        torch.randint(0, 3, (4,), generator=generator)))

    def loss_of(model, batch):
        with torch.autocast("cpu", dtype=torch.float16, enabled=target):
            return model(input_ids=batch[0], attention_mask=mask, labels=batch[1]).loss

    fit(path, model, optimizer, loss_of, batches, scaler=scaler)


def test_golden_gradients_beyond_float16_times_the_scale_are_no_overflow_where_the_target_stays_finite(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, False)
    _train(target, True)
    verdict = diagnosis_of(golden, target).verdict
    assert verdict.cls == "none", verdict.evidence
