"""A loss written by hand in float16 inside a float32 run: GPT-2's logits cast to float16, divided by a temperature
of 0.05, softmax and log. Small probabilities flush to 0 in float16, the log writes -inf, and the loss goes NaN.
The verdict is the cast's first op (precision_loss: a format the run does not declare), and it says what that
format did next: the run's first overflow, and the loss lost.
"""

from __future__ import annotations

import pytest
import torch


from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, half: bool) -> None:
    import transformers as tf

    import precision_tool.torch as ptt

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 128, (2, 2, 16))
    with ptt.dump(path):
        for step in range(2):
            logits = model(input_ids=data[step]).logits[:, :-1]
            if half:
                logits = logits.to(torch.float16)
            nll = -torch.log(torch.softmax(logits / 0.05, -1)).gather(-1, data[step][:, 1:, None])
            loss = nll.float().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


def test_a_loss_cast_to_float16_by_hand_is_named_with_the_overflow_it_leads_to(tmp_path):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, False)
    _train(target, True)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("precision_loss", "aten.div_0", 0, "forward")
    assert verdict.evidence[-1].startswith("later in that step aten.log_0 (aten.log, in float16) writes ")
    assert verdict.evidence[-1].endswith("the run's first overflow; the loss is nan from step 1")
