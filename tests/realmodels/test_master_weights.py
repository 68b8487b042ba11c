"""A 16-bit model trained through float32 master weights, as apex O2 and DeepSpeed's fp16 loops do by hand: the
model cast whole with ``model.to(torch.float16)``, the loss scaled by a static 1024, gradients copied to float32
masters and unscaled outside every module, AdamW stepping the masters, the masters copied back under no_grad
before ``ptt.step(loss, scale)``. The copies belong to the step they conclude, and the model is the run's, not
a module cast by hand in a float32 run.
"""

from __future__ import annotations

import pytest
import torch

from precision_tool.analysis import diagnose
from precision_tool.dump.reader import open_dump

pytestmark = [pytest.mark.slow, pytest.mark.torch]

SCALE = 1024.0
ACT = "BertForSequenceClassification/bert/encoder/layer.1/intermediate/intermediate_act_fn"


def _train(path, role: str, fault: bool = False) -> None:
    import transformers as tf

    import precision_tool.torch as ptt

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                           vocab_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3)
    model = tf.BertForSequenceClassification(config)
    ids, labels = torch.randint(0, 128, (3, 4, 16)), torch.randint(0, 3, (3, 4))
    if fault:
        act = model.get_submodule(ACT.split("/", 1)[1].replace("/", "."))
        forward = act.forward
        act.forward = lambda x: forward(x) * 1.02
    params = list(model.parameters())
    if role == "golden":
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        with ptt.dump(path):
            for step in range(3):
                loss = model(input_ids=ids[step], labels=labels[step]).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                ptt.step(loss)
        return
    masters = [p.detach().clone().requires_grad_() for p in params]
    model.to(torch.float16)
    optimizer = torch.optim.AdamW(masters, lr=1e-3)
    with ptt.dump(path):
        for step in range(3):
            logits = model(input_ids=ids[step]).logits
            loss = torch.nn.functional.cross_entropy(logits.float(), labels[step])
            model.zero_grad()
            (loss * SCALE).backward()
            for master, param in zip(masters, params):
                master.grad = param.grad.float() / SCALE
            optimizer.step()
            with torch.no_grad():
                for master, param in zip(masters, params):
                    param.copy_(master)
            ptt.step(loss, SCALE)


@pytest.mark.parametrize("fault", [False, True], ids=["clean", "scaled-act"])
def test_a_float16_model_with_float32_master_weights(tmp_path, fault):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, "golden")
    _train(target, "target", fault)
    with open_dump(golden) as g, open_dump(target) as t:
        steps = t.steps()
        assert [(s.step, s.loss_scale) for s in steps] == [(0, SCALE), (1, SCALE), (2, SCALE)]
        copies = [r for r in t.ops(step=0) if r.type == "aten.copy_" and not r.name.count("/")]
        updates = [r for r in t.ops(step=0, direction="optimizer") if r.type == "aten.addcdiv_"]
        assert len(copies) == len(updates) == 41  # each parameter copied back in the step that updated it
        verdict = diagnose(g, t).verdict
    if not fault:
        assert verdict.cls == "none", verdict.evidence  # it was precision_loss at the word embeddings
    else:
        assert (verdict.cls, verdict.direction, verdict.step, verdict.module) == (
            "kernel_bug", "forward", 0, ACT), verdict.evidence
