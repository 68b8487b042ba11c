"""Values read through views: what no recorded op writes, and what statistics alone cannot tell apart.

* BERT's attention merging its heads without their transpose (a view, no op): the output projection reads the
  attention's output, value for value golden's, in another order. It was `none` in float32 (every op agrees with
  golden's partner, on the values each reads) or, in bf16, a "cast golden does not run" at a bf16 layout copy.
* A clean BERT with large initial weights under float16 autocast: its attention output, written by a clone and
  read as a matrix by the output projection, has statistics whose norm differs in the last bits from the clone's
  (two passes summing in other orders), so the projection read "a value no op of step 0 wrote" and was blamed.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _merged_without_transpose(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.nn.functional.softmax(scores, dim=-1)
    return torch.matmul(weights, value).contiguous(), weights  # (batch, heads, seq, dim): heads scrambled


def _train(path, monkeypatch, scrambled: bool, dtype=None, initializer_range: float = 0.02, steps: int = 1):
    import transformers as tf
    from transformers.models.bert import modeling_bert

    tf.logging.set_verbosity_error()
    if scrambled:
        monkeypatch.setattr(modeling_bert, "eager_attention_forward", _merged_without_transpose)
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3, initializer_range=initializer_range)
    config._attn_implementation = "eager"
    model = tf.BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randint(3, 64, (3, 12)), torch.randint(0, 3, (3,))) for _ in range(steps)]

    def loss_of(model, batch):
        ids, labels = batch
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return model(input_ids=ids, labels=labels).loss

    fit(path, model, optimizer, loss_of, batches)
    monkeypatch.undo()


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float32", "bf16"])
def test_attention_heads_merged_without_their_transpose_are_named_at_the_attention(tmp_path, monkeypatch, dtype):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, monkeypatch, False)
    _train(target, monkeypatch, True, dtype)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == (
        "kernel_bug", "BertForSequenceClassification/bert/encoder/layer.0/attention/self", 0, "forward")


def test_a_clean_float16_bert_with_large_weights_blames_no_view_of_its_attention_output(tmp_path, monkeypatch):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, monkeypatch, False, initializer_range=1.0, steps=2)
    _train(target, monkeypatch, False, torch.float16, initializer_range=1.0, steps=2)
    verdict = diagnosis_of(golden, target).verdict
    assert verdict.cls == "none", verdict.evidence
