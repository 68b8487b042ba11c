"""Faults in the code around a model, on tiny transformers models: the labels and logits of a language-model loss
not shifted (an op that reads, whole, an output golden reads part of: `analysis.reshaped`), and a causal mask
off by one written with ``masked_fill(..., finfo.min)`` (the mask value is the model's constant, not an overflow;
the rewritten module's listing shows where its ops part from golden's).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn


from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _gpt2():
    import transformers as tf

    tf.logging.set_verbosity_error()
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _train(path, model, loss_of, steps: int = 2) -> None:
    data = torch.randint(0, 64, (steps, 2, 12), generator=torch.Generator().manual_seed(1))
    fit(path, model, torch.optim.AdamW(model.parameters(), lr=1e-3), loss_of, data)


def _shifted(model, ids):
    logits = model(input_ids=ids).logits
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))


def _unshifted(model, ids):
    logits = model(input_ids=ids).logits
    return nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))


def test_labels_not_shifted_are_named_where_the_loss_reads_the_whole_logits(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    torch.manual_seed(0)
    _train(golden, _gpt2(), _shifted)
    torch.manual_seed(0)
    _train(target, _gpt2(), _unshifted)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "aten._log_softmax_0", 0, "forward"), verdict.evidence
    assert verdict.evidence[0] == (
        "aten._log_softmax_0 (aten._log_softmax) reads input_0 of shape (24, 64), the whole output of "
        "GPT2LMHeadModel/lm_head/aten._unsafe_view_0, where golden's reads 1408 of its 1536 values (shape (22, 64))")


def _llama(monkeypatch, diagonal: int):
    import transformers as tf
    import transformers.models.llama.modeling_llama as llama

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = llama.repeat_kv(key, module.num_key_value_groups)
        value = llama.repeat_kv(value, module.num_key_value_groups)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        if diagonal == 1:
            scores = scores + attention_mask
        length = scores.shape[-1]
        future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=diagonal)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
        weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    monkeypatch.setattr(llama, "eager_attention_forward", attention)
    tf.logging.set_verbosity_error()
    config = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "eager"
    return tf.LlamaForCausalLM(config)


def test_a_causal_mask_off_by_one_is_named_at_its_attention_not_as_an_overflow(tmp_path, monkeypatch):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    torch.manual_seed(0)
    _train(golden, _llama(monkeypatch, 1), _shifted)
    torch.manual_seed(0)
    _train(target, _llama(monkeypatch, 2), _shifted)  # each token sees the next one
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == (
        "kernel_bug", "LlamaForCausalLM/model/layers.0/self_attn", 0, "forward"), verdict.evidence
    assert verdict.evidence[0].endswith("after 13 op(s) in common, golden ran [mul, add, masked_fill, _softmax, bmm]; "
                                        "the target ran [mul, masked_fill, _softmax, bmm]")  # its own ops: no o_proj


def test_a_padding_mask_left_out_is_named_where_the_mask_is_built(tmp_path, monkeypatch):
    # golden passes the attention mask of a left-padded batch, the target none: the first op that reads the
    # boolean mask (where) departs while its float inputs agree; it was named in a later layer's rotary half, as
    # "a value no op wrote" (a view of the query)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :4] = 0

    def loss_with(attention_mask):
        def loss_of(model, ids):
            logits = model(input_ids=ids, attention_mask=attention_mask).logits
            labels = ids.masked_fill(mask == 0, -100)
            return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), labels[:, 1:].reshape(-1))
        return loss_of

    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    torch.manual_seed(0)
    _train(golden, _llama(monkeypatch, 1), loss_with(mask))
    torch.manual_seed(0)
    _train(target, _llama(monkeypatch, 1), loss_with(None))
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "LlamaForCausalLM/model/aten.where_0", 0, "forward"), verdict.evidence
    assert verdict.evidence[0].startswith("LlamaForCausalLM/model/aten.where_0 (aten.where) reads boolean input_0 "
                                          "that differs from golden's in ")
