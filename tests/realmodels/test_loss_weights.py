"""A loss's optional tensors: class weights dropped or changed in cross-entropy, pos_weight dropped in BCE.

Dropped, the op is called with None where golden passes a tensor: its calls were taken for two different calls
sharing a name, and nothing was compared (`none`, the loss 4 % off). Changed, the weights are a value no op wrote,
read first by the loss: in a bf16 ResNet a max pooling's indices differing by rounding counted as a decision
flipped before it, which excused every changed leaf after it, although only its backward reads them.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit
from tests.realmodels.models import resnet

pytestmark = [pytest.mark.slow, pytest.mark.torch]

GOLDEN_WEIGHTS = [0.5, 1.0, 2.0, 1.0]


def _train(path, mode: str, weights, autocast: bool = True, bce: bool = False) -> None:
    torch.manual_seed(0)
    run = resnet()
    generator = torch.Generator().manual_seed(7)
    batches = [torch.randn(4, 3, 32, 32, generator=generator) for _ in range(2)]
    labels = torch.tensor([0, 1, 2, 3])

    def loss_of(model, pixels):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(pixel_values=pixels).logits.float()
        if bce:
            return torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.nn.functional.one_hot(labels, 4).float(),
                pos_weight=None if weights is None else torch.tensor(weights))
        return torch.nn.functional.cross_entropy(logits, labels,
                                                 weight=None if weights is None else torch.tensor(weights))

    fit(path, run.model, run.optimizer, loss_of, batches, mode)


@pytest.mark.parametrize("mode,weights,autocast,bce", [
    ("dump", None, True, False), ("stats", None, True, False),  # class weights dropped (bf16)
    ("dump", [1.0, 1.0, 2.0, 0.5], True, False),  # changed
    ("stats", None, False, True)])  # BCE's pos_weight dropped (float32)
def test_a_loss_s_weights_dropped_or_changed_are_named_at_the_loss(tmp_path, mode, weights, autocast, bce):
    _train(tmp_path / "golden.h5", mode, GOLDEN_WEIGHTS, autocast=False, bce=bce)
    _train(tmp_path / "target.h5", mode, weights, autocast, bce)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    op = "aten.binary_cross_entropy_with_logits_0" if bce else "aten.nll_loss_forward_0"
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("kernel_bug", op, 0, "forward"), \
        verdict.evidence
    if weights is None:
        name = "pos_weight" if bce else "weight"
        assert f"({name}): a tensor in golden, not given in target" in verdict.evidence[0]


def test_the_same_weights_in_a_bf16_run_are_clean(tmp_path):
    _train(tmp_path / "golden.h5", "dump", GOLDEN_WEIGHTS, autocast=False)
    _train(tmp_path / "target.h5", "dump", GOLDEN_WEIGHTS)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
