"""Activation checkpointing that does not restore the random state (``preserve_rng_state=False``) around
transformer layers with dropout on: the recomputation in backward draws other masks than the forward applied,
so the gradients are not the forward's. Both runs draw golden's masks in the forward; the verdict was `none`
("other random draws: turn dropout off") at the recomputed draw. It is named as what it is now.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class _Encoder(torch.nn.Module):
    def __init__(self, preserve: bool):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.layers = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
                                          for _ in range(2))
        self.head = torch.nn.Linear(32, 3)
        self.preserve = preserve

    def forward(self, ids):
        from torch.utils.checkpoint import checkpoint

        x = self.embed(ids)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=self.preserve)
        return self.head(x.mean(1))


def _train(path, mode: str, preserve: bool) -> None:
    torch.manual_seed(1)
    model = _Encoder(preserve)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100)
    batches = [(torch.randint(0, 64, (3, 10), generator=generator), torch.randint(0, 3, (3,), generator=generator))
               for _ in range(2)]
    torch.manual_seed(2)
    fit(path, model, optimizer, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), batches, mode)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_recomputation_drawing_other_masks_is_named(tmp_path, mode):
    """Backward recomputes the last layer first: its draw is the first that differs."""
    _train(tmp_path / "golden.h5", mode, True)
    _train(tmp_path / "target.h5", mode, False)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step) == ("kernel_bug", "_Encoder/layers.1/self_attn", 0)
    assert "draws other random values than its first call did" in verdict.evidence[0]


def test_a_recomputation_restoring_the_random_state_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", "dump", True)
    _train(tmp_path / "target.h5", "dump", True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
