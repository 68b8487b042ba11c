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

from tests.realmodels.cases import bert_layernorm_by_hand, diagnosis_of, fit

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
    bert_layernorm_by_hand(golden, False, 2)
    bert_layernorm_by_hand(target, True, 2)
    assert diagnosis_of(golden, target).verdict.cls == "none"
