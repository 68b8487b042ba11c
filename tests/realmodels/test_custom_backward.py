"""A backward written by hand: GPT-2's activation as a custom ``torch.autograd.Function`` (tanh GELU) in both runs,
the target's backward taking the cubic term's derivative as 0.044715 x² instead of 3 * 0.044715 x². Its ops are
backward ops whose constants are the user's: the one called with another number is named, in full dumps and in
statistics (the scan read the arguments of forward and optimizer ops only, and called the run clean).
"""

from __future__ import annotations

import math

import pytest
import torch


from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.slow, pytest.mark.torch]

CUBIC = 0.044715
ACT = "GPT2LMHeadModel/transformer/h.1/mlp/act"


class _TanhGelu(torch.autograd.Function):
    wrong = False  # the target's backward

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + CUBIC * x ** 3)))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        c = math.sqrt(2 / math.pi)
        t = torch.tanh(c * (x + CUBIC * x ** 3))
        inner = c * (1 + (CUBIC if _TanhGelu.wrong else 3 * CUBIC) * x ** 2)
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * inner)


class _Act(torch.nn.Module):
    def forward(self, x):
        return _TanhGelu.apply(x)


def _train(path, mode: str, wrong: bool, bf16: bool = False) -> None:
    import transformers as tf

    import precision_tool.torch as ptt

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    for block in model.transformer.h:
        block.mlp.act = _Act()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16))
    _TanhGelu.wrong = wrong
    try:
        with ptt.dump(path, mode=mode):
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(input_ids=ids, labels=ids).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                ptt.step(loss)
    finally:
        _TanhGelu.wrong = False


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_wrong_constant_in_a_hand_written_backward_is_named(tmp_path, mode):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, mode, False)
    _train(target, mode, True)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.direction, verdict.step, verdict.module) == ("kernel_bug", "backward", 0, ACT)
    assert f"args[1] (other): {3 * CUBIC:g} in golden, {CUBIC:g} in target" in verdict.evidence[0]


def test_the_same_backward_in_both_runs_is_clean(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, "dump", False)
    _train(target, "dump", False, bf16=True)  # (its backward under autocast's other dtypes)
    assert diagnosis_of(golden, target).verdict.cls == "none"
