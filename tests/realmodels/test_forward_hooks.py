"""A fault planted by a forward hook on a module (its output scaled): the hook belongs to that module.

torch runs global module hooks, which the capture follows, before a module's own: the recorded output was the one
before the user's hook changed it, and the hook's ops ran in the caller's scope, so the verdict named the parent
(op level) or the parent's own code (module level). The capture now leaves a module with hooks of its own after
them."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]

_MLP = "GPT2LMHeadModel/transformer/h.0/mlp"


def _train(path, hooked: bool, level: str) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if hooked:
        model.transformer.h[0].mlp.register_forward_hook(lambda module, args, output: output * 1.5)
    batches = list(torch.randint(0, 64, (2, 2, 12), generator=torch.Generator().manual_seed(3)))
    fit(path, model, torch.optim.SGD(model.parameters(), lr=0.1), lambda m, ids: m(input_ids=ids, labels=ids).loss,
        batches, level=level)


@pytest.mark.parametrize("level", ["op", "module"])
def test_a_hook_scaling_a_module_s_output_is_named_at_that_module(level, tmp_path):
    _train(tmp_path / "golden.h5", False, level)
    _train(tmp_path / "target.h5", True, level)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.step, verdict.direction) == ("kernel_bug", 0, "forward")
    assert (verdict.module if level == "op" else verdict.op) == _MLP


def test_a_hook_rounding_a_module_s_output_to_bfloat16_is_named_from_statistics(tmp_path):
    # a float32 run: the round trip moves the LayerNorm's output by up to 2**-9, which its statistics hardly show
    # (`none` before); the cast to a format the run does not declare is the evidence
    import transformers as tf

    tf.logging.set_verbosity_error()
    for role in ("golden", "target"):
        torch.manual_seed(0)
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        if role == "target":
            model.transformer.h[1].ln_2.register_forward_hook(
                lambda module, args, output: output.to(torch.bfloat16).float())
        batches = list(torch.randint(0, 64, (2, 2, 12), generator=torch.Generator().manual_seed(3)))
        fit(tmp_path / f"{role}.h5", model, torch.optim.SGD(model.parameters(), lr=0.1),
            lambda m, ids: m(input_ids=ids, labels=ids).loss, batches, "stats")
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step) == (
        "precision_loss", "GPT2LMHeadModel/transformer/h.1/ln_2/aten._to_copy_0", 0)
    assert "casts a float32 value to bfloat16" in verdict.evidence[0]
