"""A float16 model trained through float32 master weights, its loss scaled by 4096 by hand and the scale not given
to ``ptt.step``: the tool infers it from the seed gradient. Cohere's LayerNorm reads its weight through
``.to(float32)``, so the weight's gradient is rounded to float16 by that cast's backward; the loop then copies it to
float32 (exact) and divides by the scale (exact). Those two ops only the target runs were walked past only in runs
that declared a loss scale: the division was named a kernel bug.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.slow, pytest.mark.torch]

SCALE = 4096.0


def _train(path, target: bool) -> None:
    import transformers as tf

    import precision_tool.torch as ptt

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    model = tf.CohereForCausalLM(tf.CohereConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, max_position_embeddings=64, pad_token_id=0))
    params = list(model.parameters())
    masters = [p.detach().clone().requires_grad_() for p in params] if target else params
    if target:
        model.to(torch.float16)
    optimizer = torch.optim.Adam(masters, lr=1e-3)
    generator = torch.Generator().manual_seed(100)
    batches = [torch.randint(3, 64, (3, 10), generator=generator) for _ in range(2)]
    with ptt.dump(path):
        for ids in batches:
            loss = model(input_ids=ids, labels=ids).loss
            model.zero_grad()
            optimizer.zero_grad()
            if target:
                (loss.float() * SCALE).backward()
                for master, param in zip(masters, params):
                    master.grad = param.grad.float() / SCALE
            else:
                loss.backward()
            optimizer.step()
            if target:
                with torch.no_grad():
                    for master, param in zip(masters, params):
                        param.copy_(master)
            ptt.step(loss)


def test_exact_copies_and_unscaling_by_hand_are_walked_past(tmp_path):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert verdict.cls == "none", (verdict.op, verdict.evidence)
