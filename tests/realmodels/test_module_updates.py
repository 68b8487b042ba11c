"""A float32 GPT-2 whose update differs from golden's, captured at module level.

Module records hold no parameter and no optimizer op: a learning rate set otherwise shows first in step 1, as
the embedding's output departing on golden's inputs. Both runs compute in float32 and agree to the last bit
through step 0, so that departure is no rounding: the update differs (`analysis.module_updates`). Before, every
such fault got `none`: "the difference is accumulated rounding".
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]

FC = "GPT2LMHeadModel/transformer/h.1/mlp/c_fc"


def _train(path, lr: float = 1e-3, frozen: bool = False, hooked: bool = False, foreach: bool = False,
           sgd: bool = False, late_scaling: bool = False, group_lr: bool = False) -> None:
    model = tiny_gpt2()
    if late_scaling:  # the first layer's activation scaled from its second call (step 1) on
        calls = []
        model.transformer.h[0].mlp.act.register_forward_hook(
            lambda module, args, output: calls.append(1) or (output * 1.1 if len(calls) > 1 else output))
    if frozen:
        model.transformer.wpe.weight.requires_grad_(False)
    if hooked:
        model.transformer.h[1].mlp.c_fc.weight.register_hook(lambda grad: grad * 1.5)
    trained = [p for p in model.parameters() if p.requires_grad]
    if group_lr:  # h.1's c_fc in a parameter group of its own, with twice the learning rate
        own = {id(p) for p in model.transformer.h[1].mlp.c_fc.parameters()}
        trained = [{"params": [p for p in trained if id(p) not in own]},
                   {"params": [p for p in trained if id(p) in own], "lr": 0.1}]
    optimizer = torch.optim.SGD(trained, lr=0.05) if sgd else torch.optim.AdamW(trained, lr=lr, foreach=foreach)
    fit(path, model, optimizer, lambda m, ids: m(input_ids=ids, labels=ids).loss, token_batches(3), mode="stats",
        level="module")


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    path = tmp_path_factory.mktemp("updates") / "golden.h5"
    _train(path)
    return path


def test_another_learning_rate_is_named_at_the_update_the_first_call_reads(golden, tmp_path):
    _train(tmp_path / "target.h5", lr=2e-3)
    verdict = diagnosis_of(golden, tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction, verdict.type) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/wte", 0, "optimizer", "update")
    assert verdict.evidence[0] == ("every module call of step 0 matches golden's to the last bit, forward and "
                                   "backward (58 calls): the same data, weights and boundary gradients")
    assert "the step's first call to read trained parameters" in verdict.evidence[2]


def test_a_parameter_frozen_in_one_run_is_named_at_its_module(golden, tmp_path):
    _train(tmp_path / "target.h5", frozen=True)
    verdict = diagnosis_of(golden, tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/wpe", 0, "backward")
    assert verdict.evidence[2] == ("GPT2LMHeadModel/transformer/wpe trains 1 parameter(s) of its own in golden "
                                   "and 0 in the target: a parameter frozen (requires_grad) or removed in one run only")


def test_a_hook_scaling_a_later_weight_gradient_is_named_at_its_module(tmp_path):
    """From the first step's parameter gradients (`param_grads`); before them, from step 1's update."""
    _train(tmp_path / "golden.h5", sgd=True)
    _train(tmp_path / "target.h5", hooked=True, sgd=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", FC, 0, "backward")
    assert verdict.evidence[1] == (f"the gradient the optimizer reads for {FC}'s weight departs by 0.5 (from "
                                   "statistics), while the other 26 parameters' gradients are golden's to the last "
                                   "bit")


def test_another_learning_rate_for_one_module_is_named_at_its_module(tmp_path):
    _train(tmp_path / "golden.h5", sgd=True)  # (Adam's first step is the gradient's sign: a scale does nothing)
    _train(tmp_path / "target.h5", group_lr=True, sgd=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction, verdict.type) == (
        "kernel_bug", FC, 0, "backward", "update")
    assert verdict.evidence[2].startswith("the 12 call(s) before it in step 1 read trained parameters that match")


def test_a_call_training_nothing_that_departs_after_the_first_step_computes_otherwise(golden, tmp_path):
    _train(tmp_path / "target.h5", late_scaling=True)
    verdict = diagnosis_of(golden, tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "kernel_bug", "GPT2LMHeadModel/transformer/h.0/mlp/act", 1, "forward")
    assert verdict.evidence[2] == ("GPT2LMHeadModel/transformer/h.0/mlp/act trains no parameter of its own: no "
                                   "update explains it; it computes otherwise than golden's from step 1 on (or "
                                   "reads a buffer that changed)")


def test_another_implementation_of_the_same_update_is_clean(golden, tmp_path):
    _train(tmp_path / "target.h5", foreach=True)  # (golden's loops over the parameters one by one)
    assert diagnosis_of(golden, tmp_path / "target.h5").verdict.cls == "none"


def test_forward_module_records_say_how_many_parameters_of_their_own_they_train(golden):
    from precision_tool.dump.reader import open_dump

    records = {r.name: r.attrs for r in open_dump(golden).ops(step=0, direction="forward")}
    assert records["GPT2LMHeadModel/transformer/wte"] == {"trains": 1}
    assert records["GPT2LMHeadModel/transformer/h.0/ln_1"] == {"trains": 2}
    assert records["GPT2LMHeadModel/transformer/h.0/attn"] == {"trains": 0}


def _train_mlp(path, frozen: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    if frozen:
        model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 8, generator=generator), torch.randn(4, 1, generator=generator)) for _ in range(2)]
    fit(path, model, optimizer, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), batches, mode="stats",
        level="module")


def test_a_first_layer_frozen_in_the_target_is_named_though_a_backward_call_goes_unrecorded(tmp_path):
    # (the LayerNorm after it gets no backward record in the target: its input needs no gradient there)
    _train_mlp(tmp_path / "golden.h5", frozen=False)
    _train_mlp(tmp_path / "target.h5", frozen=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", "Sequential/0", 0, "backward")
    assert verdict.evidence[0].endswith("(1 backward call(s) one run records only: their inputs need no gradient "
                                        "there)")
