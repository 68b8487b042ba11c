"""Module-level dumps of a float32 run where one module computes in float16, its result cast back to float32.

Nothing inside a module call is recorded at module level, and a module call of a float32 run was judged only from
REWRITE_FLOOR (0.1 %), the departure at which op level judges another implementation: a Linear computed in float16
departs 3.6e-4 and a float16 softmax moves its attention's output 2e-4, so both got `none` while `zoom` named them.
On inputs golden's to the last bit (the first module that departs), two right float32 kernels part by under 1e-6;
a departure over 1,024 units of float32 counts there, and a float32 output lying wholly on float16's grid says the
module computed in float16.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _vit(path, half_fc1: bool, mode: str = "dump"):
    import transformers as tf

    torch.manual_seed(0)
    model = tf.ViTForImageClassification(tf.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=5))
    if half_fc1:
        fc1 = model.vit.layers[1].mlp.fc1
        fc1.forward = lambda x: F.linear(x.half(), fc1.weight.half(), fc1.bias.half()).float()
    generator = torch.Generator().manual_seed(6)
    batches = [(torch.randn(4, 3, 32, 32, generator=generator), torch.randint(0, 5, (4,), generator=generator))
               for _ in range(2)]
    fit(path, model, torch.optim.SGD(model.parameters(), lr=0.1),
        lambda m, b: m(pixel_values=b[0], labels=b[1]).loss, batches, mode, level="module")


@pytest.mark.parametrize("mode, evidence", [("dump", "holds only float16 values"),
                                            ("stats", "smallest and largest values are float16 values")])
def test_a_linear_computed_in_float16_is_precision_loss_at_its_module(mode, evidence, tmp_path):
    # from statistics its output departs under 1,024 units of float32 as far as they show; its smallest and
    # largest values lying on float16's grid (golden's not) are the evidence
    import transformers as tf

    tf.logging.set_verbosity_error()
    _vit(tmp_path / "golden.h5", False, mode)
    _vit(tmp_path / "target.h5", True, mode)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "precision_loss", "ViTForImageClassification/vit/layers.1/mlp/fc1", 0, "forward")
    assert evidence in verdict.evidence[2]


def _llama(path, softmax_in_float16: bool, monkeypatch):
    import transformers as tf
    import transformers.models.llama.modeling_llama as modeling

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = modeling.repeat_kv(key, module.num_key_value_groups)
        value = modeling.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = F.softmax(weights.half(), dim=-1).to(query.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    if softmax_in_float16:
        monkeypatch.setattr(modeling, "eager_attention_forward", attention)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager"))
    data = torch.randint(0, 128, (2, 2, 16), generator=torch.Generator().manual_seed(55))
    fit(path, model, torch.optim.AdamW(model.parameters(), lr=1e-3),
        lambda m, b: m(input_ids=b, labels=b).loss, list(data), "dump", level="module")
    monkeypatch.undo()


def test_a_softmax_in_float16_inside_an_attention_is_precision_loss_at_the_attention(tmp_path, monkeypatch):
    import transformers as tf

    tf.logging.set_verbosity_error()
    _llama(tmp_path / "golden.h5", False, monkeypatch)
    _llama(tmp_path / "target.h5", True, monkeypatch)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "precision_loss", "LlamaForCausalLM/model/layers.0/self_attn", 0, "forward")
    assert "o_proj reads input_0" in verdict.evidence[0] and "within two of float16's" in verdict.evidence[2]


@pytest.mark.parametrize("case_id, module", [
    ("gpt2-deep-half_module-fp32", "GPT2LMHeadModel/transformer/h.1/mlp/c_fc"),
    ("resnet-deep-half_module-fp32",
     "ResNetForImageClassification/resnet/encoder/stages.1/layers.0/layer/0/convolution")])
def test_a_module_halved_in_a_float32_run_is_precision_loss_from_module_statistics(case_id, module, tmp_path):
    # its calls read and write float16 where golden's compute in float32 (2e-5 and 1.3e-4 from golden, as far as
    # statistics show): the first such call, as op level names the first op computing in a format not declared
    from tests.realmodels.cases import collect, fault_cases

    case = next(c for c in fault_cases() if c.id == case_id)
    golden, target = collect(case, tmp_path, mode="stats", level="module")
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("precision_loss", module, 0, "forward")
    assert "computes in float16; golden computes it in float32" in verdict.evidence[0]
