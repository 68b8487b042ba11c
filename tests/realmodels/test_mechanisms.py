"""Each way the diagnosis used to go wrong on real models, with its exact expected verdict."""

from __future__ import annotations

import pytest

from precision_tool.analysis import diagnose
from precision_tool.dump.reader import open_dump
from tests.realmodels.cases import Case, collect

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_a_golden_bert_dump_against_itself_has_no_overflow(diagnosed):
    # SDPA with a boolean mask makes aten.scalar_tensor(-inf): golden holds it too, it is the computation
    diagnosis = diagnosed(Case("bert-sdpa", "fp32"), against_itself=True)
    assert diagnosis.verdict.cls == "none"


def test_a_saturated_additive_mask_is_absorbed_by_softmax_and_only_noted(diagnosed):
    diagnosis = diagnosed(Case("bert-eager", "fp16"))
    assert diagnosis.verdict.cls == "none"
    assert any("absorbed by the ops that read it" in note and "beyond float16" in note for note in diagnosis.notes)


def test_a_handwritten_activation_is_reported_with_both_op_sequences(diagnosed):
    diagnosis = diagnosed(Case("bert-sdpa", "fp32", "handwritten", "act", "kernel_bug"))
    verdict = diagnosis.verdict
    assert (verdict.cls, verdict.op, verdict.module) == (
        "kernel_bug", "BertForSequenceClassification/bert/encoder/layer.1/intermediate/intermediate_act_fn",
        "BertForSequenceClassification/bert/encoder/layer.1/intermediate/intermediate_act_fn")
    assert "golden ran [gelu]; the target ran [mul, sigmoid, mul]" in verdict.evidence[0]


def test_a_two_percent_scale_error_in_float32_is_a_kernel_bug_though_every_cosine_is_one(diagnosed):
    verdict = diagnosed(Case("gpt2-sdpa", "fp32", "scale", "act", "kernel_bug")).verdict
    assert (verdict.cls, verdict.op, verdict.direction) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/h.1/mlp/act", "forward")
    assert "its output is 0.02 from golden while its inputs are within 0" in verdict.evidence[1]


def test_nan_from_finite_inputs_is_an_invalid_operation(diagnosed):
    verdict = diagnosed(Case("resnet", "fp32", "sqrt_act", "act", "invalid_operation")).verdict
    assert (verdict.cls, verdict.op, verdict.type) == (
        "invalid_operation", "ResNetForImageClassification/resnet/encoder/stages.1/layers.0/layer/0/activation/"
        "aten.sqrt_0", "aten.sqrt")
    assert "invalid operation" in verdict.action


def test_exp_without_max_subtraction_is_the_overflow_not_a_later_op(diagnosed):
    verdict = diagnosed(Case("gpt2-eager", "fp16", "naive_softmax", "attn", "overflow",
                             model_kwargs=(("qk_scale", 24.0),))).verdict
    assert (verdict.cls, verdict.op, verdict.module) == (
        "overflow", "GPT2LMHeadModel/transformer/h.0/attn/aten.exp_0", "GPT2LMHeadModel/transformer/h.0/attn")


def test_an_lstm_workspace_output_is_not_compared_as_data(diagnosed):
    # aten.mkldnn_rnn_layer returns a uint8 workspace that differs on every run
    diagnosis = diagnosed(Case("lstm", "mix"))
    assert diagnosis.verdict.cls == "none"


def test_runs_from_different_seeds_are_said_to_differ_before_any_op(tmp_path, goldens):
    import precision_tool.torch as ptt
    from tests.realmodels.cases import build, train

    case = Case("gpt2-sdpa", "fp32")
    golden, _ = collect(case, tmp_path, goldens=goldens)
    run = build(case, seed=1)
    with ptt.dump(tmp_path / "other_seed.h5", model=case.model, seed=1):
        train(run)
    with open_dump(golden) as g, open_dump(tmp_path / "other_seed.h5") as t:
        diagnosis = diagnose(g, t)
    assert diagnosis.verdict.cls == "none"
    assert diagnosis.verdict.evidence[0].startswith(
        "the runs differ before any op: GPT2LMHeadModel/transformer/wte/aten.embedding_0 reads input_0 ")
    assert diagnosis.notes[0] == "the runs differ in seed: golden 0, target 1 (warning)"


def test_compare_names_the_first_module_whose_output_diverges_and_inputs_do_not(tmp_path, goldens):
    from precision_tool.compare.comparator import compare_dumps

    case = Case("gpt2-eager", "fp16", "attn_overflow", "attn", "overflow", model_kwargs=(("qk_scale", 3000.0),))
    summary = compare_dumps(*collect(case, tmp_path, goldens=goldens)).summary()
    assert summary.first_flagged.name == "GPT2LMHeadModel/transformer/h.0/attn/aten.bmm_0"
    assert summary.first_flagged_module.name == "GPT2LMHeadModel/transformer/h.0/attn"


def test_force_fp16_overrides_llamas_float32_rmsnorm_and_its_backward_overflows(diagnosed):
    # HF's LlamaRMSNorm computes in float32 whatever the input dtype; force_fp16 computes every op that has a
    # float16 kernel in float16, so rsqrt's backward (x^-1.5 of a variance near 4e-4: 2.8e5 in golden) saturates
    diagnosis = diagnosed(Case("llama", "fp16"))
    verdict = diagnosis.verdict
    assert verdict.cls == "overflow" and verdict.direction == "backward"
    assert verdict.op == "LlamaForCausalLM/model/norm/aten.rsqrt_0/aten.pow_0"


def test_an_optimizer_state_reset_is_judged_as_one_update_group(diagnosed):
    # golden's second step updates the momentum buffers (mul_, add_); the target's makes them again (clone, not a
    # computation): its add_ ops are other updates than golden's of the same name
    verdict = diagnosed(Case("mlp-sgd", "fp32", "state_reset", "", "kernel_bug", "optimizer")).verdict
    assert (verdict.cls, verdict.op, verdict.direction, verdict.step) == (
        "kernel_bug", "optimizer/SGD", "optimizer", 1)
    assert verdict.evidence[0].startswith(
        "in the update of optimizer/SGD, golden ran [mul_, add_, add, add_, mul_, add_, add, add_, ")
    assert verdict.evidence[0].endswith("the target ran [add, add_, add, add_, add, add_, add, add_, add, add_, add, "
                                        "add_, ...]")


def test_a_loss_not_divided_over_micro_batches_is_named_at_the_division_the_target_skips(diagnosed):
    verdict = diagnosed(Case("gpt2-accumulate", "fp32", "undivided", "", "kernel_bug", "backward")).verdict
    assert (verdict.cls, verdict.op, verdict.direction, verdict.type) == (
        "kernel_bug", "aten.div_0/aten.div_0", "backward", "aten.div")
    assert "in golden aten.div_0/aten.div_0 (aten.div) wrote it; in the target aten.ones_like_0" in verdict.evidence[0]


def test_a_loss_smoothed_in_the_training_loop_is_named_where_the_target_computes_the_logits_gradient(diagnosed):
    # golden's model computes its loss (CrossEntropyLoss inside it), the target's training loop with label
    # smoothing 0.1: the logits' gradient departs 10 %, and neither run's op that wrote it pairs with the other's
    verdict = diagnosed(Case("albert", "fp32", "outside_smoothed", "", "kernel_bug", "backward")).verdict
    assert (verdict.cls, verdict.op, verdict.direction, verdict.step, verdict.type) == (
        "kernel_bug", "aten._log_softmax_0/aten._log_softmax_backward_data_0", "backward", 0,
        "aten._log_softmax_backward_data")
    assert verdict.evidence[0].startswith(
        "AlbertForSequenceClassification/classifier/aten.addmm_0/aten.mm_0 (aten.mm) reads input_0 0.0998 from "
        "golden: in golden CrossEntropyLoss/aten._log_softmax_0/aten._log_softmax_backward_data_0 "
        "(aten._log_softmax_backward_data) wrote it, in the target aten._log_softmax_0/"
        "aten._log_softmax_backward_data_0 (aten._log_softmax_backward_data); neither has a partner")
