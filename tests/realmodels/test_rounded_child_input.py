"""A float32 `nn.TransformerEncoder` whose second layer rounds its first Linear's input to bfloat16 (a pre-hook:
code between the layer's children), captured at module level with statistics only. The rounding moves the input
2.4e-4, the residual and the LayerNorm after hand on 9e-6 of it: under what a float32 departure needs on exact
inputs, and 8x less than the child's input, so the layer's own code was taken to absorb it (`none`). The
input's smallest and largest values lie on bfloat16's grid where golden's do not: that is the evidence."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.enc(x).mean(1))


def _train(path, rounded: bool) -> None:
    torch.manual_seed(0)
    model = Encoder()
    if rounded:
        model.enc.layers[1].linear1.register_forward_pre_hook(
            lambda module, args: (args[0].to(torch.bfloat16).float(),))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(3, 10, 32, generator=generator), torch.randint(0, 4, (3,), generator=generator))]
    fit(path, model, optimizer, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), batches,
        mode="stats", level="module")


def test_a_child_input_rounded_to_bfloat16_by_its_parent_is_precision_loss_there(tmp_path):
    _train(tmp_path / "golden.h5", rounded=False)
    _train(tmp_path / "target.h5", rounded=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "precision_loss", "Encoder/enc/layers.1", 0, "forward")
    assert verdict.evidence[2] == ("its input_0's smallest and largest values are bfloat16 values (golden's are "
                                   "not): the code before it computes in bfloat16 and casts the result back to "
                                   "float32")
