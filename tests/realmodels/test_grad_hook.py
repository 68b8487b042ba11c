"""A gradient hook only the target registers, on GPT-2's tied embedding weight (scaling its gradient by 1.02), is
named in full dumps and in statistics: the optimizer reads a gradient 2 % from the value its writer wrote, and
the hook's op wrote it in between. In statistics the optimizer's op is asked however little the parameter it
writes departs (a small step on a large weight: 1e-5 here).
"""

from __future__ import annotations

import pytest
import torch


from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]

HOOK = "GPT2LMHeadModel/transformer/wte/weight/aten.mul_0"


def _train(path, mode: str, hooked: bool) -> None:
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    assert model.lm_head.weight is model.transformer.wte.weight
    if hooked:
        model.transformer.wte.weight.register_hook(lambda grad: grad * 1.02)
    fit(path, model, torch.optim.SGD(model.parameters(), lr=0.05),
        lambda model, ids: model(input_ids=ids, labels=ids).loss, torch.randint(0, 128, (2, 2, 16)), mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_hook_on_a_tied_weights_gradient_is_named(tmp_path, mode):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, mode, False)
    _train(target, mode, True)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", HOOK, 0, "backward")
    assert f"{HOOK} (aten.mul), an op golden does not run, wrote the value it read" in verdict.evidence[1]
