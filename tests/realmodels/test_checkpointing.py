"""A target that recomputes its blocks in backward (transformers' gradient checkpointing) against a golden run
that does not: its ops pair with golden's, so a clean port passes `check` (the variations' verdicts are in
tests/realmodels/variation.py, ``checkpoint``)."""

from __future__ import annotations

import pytest

from precision_tool.compare import compare_dumps
from tests.realmodels.cases import diagnosis_of
from tests.realmodels.variation import Variation, collect

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.mark.parametrize("how", ["reentrant", "nonreentrant"])
def test_a_clean_float32_port_that_recomputes_its_blocks_passes_check(how, tmp_path, run_cli):
    golden, target = collect(Variation("gpt2", "fp32", checkpoint=how), tmp_path)
    checked = run_cli("check", golden, target)
    assert checked.status == 0, checked.stdout[-2000:]
    assert "PASSED | 806 tensors checked | 16 golden and" in " ".join(checked.stdout.split())
    # golden's 16 left over: the key/value cache's cat and their backward, which transformers leaves out when
    # it checkpoints; the target's: the recomputation, and the checkpoint's own ops
    report = compare_dumps(golden, target)
    assert {u.type for u in report.unmatched_golden} == {"aten.cat", "aten.zeros"}
    assert report.summary(0.98).flagged_ops == 0


def _distilbert(path, checkpointing: bool, bf16: bool, fault: bool = False) -> None:
    import torch
    import transformers as tf

    import precision_tool.torch as ptt
    from tests.realmodels.plant import backward_only

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.DistilBertForTokenClassification(tf.DistilBertConfig(
        vocab_size=128, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32, num_labels=5,
        dropout=0.0, attention_dropout=0.0))
    if checkpointing:
        model.activation_checkpointing_enable()
    if fault:
        backward_only(type("Run", (), {"model": model})(), "distilbert.transformer.layer.1.ffn.activation")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 128, (3, 2, 16)), torch.randint(0, 5, (3, 2, 16))
    with ptt.dump(path):
        for step in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=data[0][step], labels=data[1][step]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("fault", [False, True], ids=["clean", "backward_only"])
def test_a_bf16_port_that_recomputes_its_blocks_sums_gradients_elsewhere(tmp_path, fault):
    # recomputing a block builds its graph again in backward: the engine adds a residual stream's gradients
    # where the last of them arrives, in another op's group than golden's; a fault in backward is still named
        
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _distilbert(golden, False, False)
    _distilbert(target, True, True, fault)
    verdict = diagnosis_of(golden, target).verdict
    if not fault:
        assert verdict.cls == "none", verdict.evidence  # it was kernel_bug at a LayerNorm's backward, step 1
    else:
        assert (verdict.cls, verdict.direction, verdict.module) == (
            "kernel_bug", "backward", "DistilBertForTokenClassification/distilbert/transformer/layer.1/ffn/activation")


def test_a_port_that_recomputes_its_dropout_draws_the_same_masks(tmp_path):
    # a recomputed call of a module paired with golden's backward record of it, which runs no op: "dropout on in
    # one run only", in a clean float32 run
        
    golden, target = collect(Variation("gpt2", "fp32", dropout=0.1, checkpoint="reentrant"), tmp_path)
    verdict = diagnosis_of(golden, target).verdict
    assert verdict.cls == "none", verdict.evidence
