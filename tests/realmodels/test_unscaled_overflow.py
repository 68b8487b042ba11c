"""A float16 OLMo 2 under a GradScaler whose layer-1 post-feedforward RMSNorm (it normalises the MLP's small output) is
computed in float16, where the model upcasts to float32. The backward of its rsqrt cubes the forward's output, about
300 here: 3e7, beyond float16's range at any loss scale, so every update is skipped. The overflow was read as the
scaler still searching for its scale ("golden's gradients times the loss scale are beyond the target's format") and
the verdict was none, "nothing to fix"."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]

NORM = "model.layers.1.post_feedforward_layernorm"


def _train(path, target: bool, init_scale: float = 2.0 ** 10) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.Olmo2ForCausalLM(tf.Olmo2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=32, pad_token_id=0))
    if target:
        norm = model.get_submodule(NORM)

        def in_float16(x):  # the port's RMSNorm: no upcast
            return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

        norm.forward = in_float16
    generator = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 64, (4, 16), generator=generator) for _ in range(2)]

    def loss_of(model, ids):
        with torch.autocast("cpu", dtype=torch.float16, enabled=target):
            return model(input_ids=ids, labels=ids).loss

    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if target else None
    fit(path, model, torch.optim.AdamW(model.parameters(), lr=1e-3), loss_of, batches, scaler=scaler)


@pytest.mark.parametrize("init_scale", [2.0 ** 10, 1.0])
def test_an_overflow_no_loss_scale_causes_is_blamed_where_it_starts(tmp_path, init_scale):
    _train(tmp_path / "golden.h5", False)
    _train(tmp_path / "target.h5", True, init_scale)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    verdict = diagnosis.verdict
    module = "Olmo2ForCausalLM/model/layers.1/post_feedforward_layernorm"
    assert (verdict.cls, verdict.op, verdict.direction) == ("overflow", f"{module}/aten.rsqrt_0/aten.pow_0",
                                                            "backward")
    assert verdict.action.startswith("golden's values there reach ")
    assert "beyond the float16 range at any loss scale" in verdict.action
    searching = [note for note in diagnosis.notes if "still searching for its scale" in note]
    assert not any(verdict.op in note for note in searching)  # (at 1024, gradients elsewhere do overflow by it)
    assert bool(searching) == (init_scale > 1)
    scaled = {e.hint for e in diagnosis.overflow.entries if e.step == 0 and e.hint.startswith("gradient overflow")}
    # the scale step 0's gradients carry, not the one recorded after scaler.update() halved it
    assert scaled == ({"gradient overflow (loss scale 1024): lower the loss scale or use a dynamic loss-scale "
                       "manager, which skips such steps and shrinks the scale"} if init_scale > 1 else set())
