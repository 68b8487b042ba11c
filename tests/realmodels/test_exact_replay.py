"""Another function under REWRITE_FLOOR in a float32 run, told from rounding by replaying it in float64.

GPT-2's GELU is its tanh approximation written in eight ops; a port that calls torch's GELU (erf) computes
another function, 8.7e-6 from golden at the first step's small activations: under the 0.1 % below which two
float32 implementations of a module were never judged, since two right ones part by their rounding (the math
attention and a flash kernel: 1.5e-5). Replayed on golden's inputs in float64, rounding goes and the function
stays: still 8.7e-6 from golden for erf's GELU; a BERT LayerNorm written by hand (the same function) stays clean.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _gpt2(path, erf: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if erf:
        model.transformer.h[0].mlp.act = torch.nn.GELU()
    data = torch.randint(0, 128, (2, 3, 16), generator=torch.Generator().manual_seed(2))
    fit(path, model, torch.optim.AdamW(model.parameters(), lr=2e-3), lambda m, ids: m(input_ids=ids, labels=ids).loss,
        list(data))


def _bert(path, by_hand: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3)
    model = tf.BertForSequenceClassification(config)
    if by_hand:
        norm = model.bert.encoder.layer[1].attention.output.LayerNorm
        norm.forward = lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(
            x.var(-1, unbiased=False, keepdim=True) + norm.eps) * norm.weight + norm.bias
    generator = torch.Generator().manual_seed(39)
    batches = [(torch.randint(3, 64, (3, 10), generator=generator), torch.randint(0, 3, (3,), generator=generator))
               for _ in range(2)]
    fit(path, model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        lambda m, b: m(input_ids=b[0], labels=b[1]).loss, batches)


def test_erfs_gelu_for_gpt2s_tanh_one_is_another_function_in_float64(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _gpt2(golden, False)
    _gpt2(target, True)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/h.0/mlp/act", 0, "forward")
    assert verdict.evidence[-1].startswith("run again on golden's inputs in float64")
    assert verdict.evidence[-1].endswith("it computes another function")


def test_a_layernorm_written_by_hand_computes_golden_s_function_in_float64(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _bert(golden, False)
    _bert(target, True)
    assert diagnosis_of(golden, target).verdict.cls == "none"
