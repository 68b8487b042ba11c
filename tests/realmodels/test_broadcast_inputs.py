"""Position ids given as (batch, length) where golden's model makes them (1, length): the same positions, repeated.

Forward, the position embedding's output is golden's repeated along the batch; backward, golden's autograd sums the
broadcast gradient back to (1, length) (an extra ``sum``) and the target's does not. The runs compute the same
training, and a user passing ``position_ids`` explicitly must not be told of a kernel bug. Compared with golden
repeated (forward, statistics too: the norm grows by the square root of the copies) or summed over the copies
(a gradient), both agree. Shifted positions, given the same way, are still named.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _bert():
    import transformers as tf

    return tf.BertForSequenceClassification(tf.BertConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3))


def _train(path, family: str, mode: str, positions: str = "", autocast: bool = False) -> None:
    """``positions``: "" the model's own, "batch" arange given as (batch, length), "shifted" the same plus one."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    model = tiny_gpt2(None) if family == "gpt2" else _bert()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = token_batches(2, low=3)
    labels = torch.tensor([0, 2, 1])

    def loss_of(model, ids):
        extra = {}
        if positions:
            extra["position_ids"] = torch.arange(ids.shape[1]).expand(ids.shape[0], -1) + (positions == "shifted")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if family == "gpt2":
                return model(input_ids=ids, labels=ids, **extra).loss
            return model(input_ids=ids, labels=labels, **extra).loss

    fit(path, model, optimizer, loss_of, batches, mode)


@pytest.mark.parametrize("family,mode,autocast", [
    ("gpt2", "dump", True), ("gpt2", "stats", False), ("bert", "dump", False), ("bert", "stats", True)])
def test_positions_given_per_row_are_no_fault(tmp_path, family, mode, autocast):
    _train(tmp_path / "golden.h5", family, mode)
    _train(tmp_path / "target.h5", family, mode, "batch", autocast)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert verdict.cls == "none", (verdict.op, verdict.evidence)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_shifted_positions_given_per_row_are_named_at_the_position_embedding(tmp_path, mode):
    _train(tmp_path / "golden.h5", "gpt2", mode)
    _train(tmp_path / "target.h5", "gpt2", mode, "shifted")
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/wpe/aten.embedding_0", 0, "forward"), verdict.evidence
