"""A division golden makes and the target leaves out, in a bfloat16 autocast run (probe P f32).

Knowledge distillation: the student's loss adds KL(student / T || teacher / T). The target's loss code forgets
the temperature on the teacher's logits: its softmax reads the teacher's output as it is. In float32 the
diagnosis named the division the target skips; under autocast the target's softmax reads a cast of the
teacher's bfloat16 logits, a cast golden does not run, and the diagnosis said `none` (the loss off by 5).
The skipped division is found through the target's own casts now.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.realmodels.cases import diagnosis_of, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _distil(path, mode: str, target: bool, temperature_on_teacher: bool) -> None:
    import precision_tool.torch as ptt

    teacher, student = tiny_gpt2(seed=11), tiny_gpt2(seed=12)
    teacher.requires_grad_(False)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    t = 2.0
    with ptt.dump(path, mode=mode):
        for ids in token_batches(2):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                with torch.no_grad():
                    soft = teacher(input_ids=ids).logits.float()
                out = student(input_ids=ids, labels=ids)
                soft = soft / t if temperature_on_teacher else soft
                kl = F.kl_div(F.log_softmax(out.logits.float() / t, -1), F.softmax(soft, -1),
                              reduction="batchmean") * t * t
                loss = out.loss + kl
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_division_the_target_leaves_out_behind_its_casts_is_named(tmp_path, mode):
    _distil(tmp_path / "golden.h5", mode, target=False, temperature_on_teacher=True)
    _distil(tmp_path / "target.h5", mode, target=True, temperature_on_teacher=False)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.type, verdict.step) == ("kernel_bug", "aten.div_0", "aten.div", 0)
    assert verdict.evidence[1] == "the target does not run aten.div_0: the value goes on without it"


def test_the_same_distillation_in_bfloat16_is_clean(tmp_path):
    _distil(tmp_path / "golden.h5", "dump", target=False, temperature_on_teacher=True)
    _distil(tmp_path / "target.h5", "dump", target=True, temperature_on_teacher=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_a_gradient_sum_that_moves_is_no_step_the_target_skips(tmp_path):
    # Llama's RMSNorm casts its input to float32, a cast a model halved runs and a float32 one does not: autograd
    # then sums that input's gradients in another node, and golden's sum has no partner. No skipped step: the
    # target sums them elsewhere (a clean float16 Llama was blamed at a backward add while looking through casts)
    import transformers as tf

    import precision_tool.torch as ptt

    def train(path, half: bool) -> None:
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=64, max_position_embeddings=64, tie_word_embeddings=False))
        if half:
            model.half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with ptt.dump(path, mode="dump"):
            for ids in token_batches(2):
                optimizer.zero_grad()
                loss = model(input_ids=ids, labels=ids).loss
                loss.float().backward()
                optimizer.step()
                ptt.step(loss)

    train(tmp_path / "golden.h5", half=False)
    train(tmp_path / "target.h5", half=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
