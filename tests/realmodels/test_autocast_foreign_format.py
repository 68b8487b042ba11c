"""A softmax computed in bfloat16 by hand inside a float16 autocast run (a Qwen2 under a GradScaler): autocast
computes it in float32, golden too, and no format of the run explains bfloat16's coarser rounding. Every op after
it carries float16's rounding anyway, so the departure itself (0.1 %) stands out nowhere; the op computing in a
format coarser than any the run declares is the evidence, as for a 16-bit op in a float32 run. It got `none`.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool, mode: str, softmax_in=None) -> None:
    import transformers as tf
    from torch.nn import functional

    tf.logging.set_verbosity_error()
    torch.manual_seed(1)
    config = tf.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = "eager"
    model = tf.Qwen2ForCausalLM(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=4096.0) if target else None
    generator = torch.Generator().manual_seed(100)
    batches = [torch.randint(3, 64, (3, 10), generator=generator) for _ in range(2)]
    softmax = functional.softmax

    def narrowed(x, dim=None, *args, **kwargs):
        return softmax(x.to(softmax_in), dim).to(x.dtype)

    def loss_of(model, ids):
        functional.softmax = narrowed if softmax_in is not None else softmax
        try:
            with torch.autocast("cpu", dtype=torch.float16, enabled=target):
                return model(input_ids=ids, labels=ids).loss
        finally:
            functional.softmax = softmax

    fit(path, model, optimizer, loss_of, batches, mode, scaler=scaler)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_bfloat16_softmax_in_a_float16_autocast_run_is_precision_loss(tmp_path, mode):
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode, torch.bfloat16)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step) == \
        ("precision_loss", "Qwen2ForCausalLM/model/layers.0/self_attn/aten._softmax_0", 0)
    assert verdict.evidence[0].startswith("the target runs under float16 autocast, yet ")


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_the_same_run_with_autocast_s_own_softmax_is_clean(tmp_path, mode):
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
