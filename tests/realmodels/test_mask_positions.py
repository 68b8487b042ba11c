"""A causal mask built off by one (``triu(diagonal=2)`` for ``triu(diagonal=1)``: each position sees the next token),
filled with -inf by ``masked_fill``, in a bf16 target. The positions set to -inf are not scored (the model asks
for infinity), the finite rest agrees, and the mask is a boolean no recorded op wrote: `none` from full dumps.
An op that reads integers or booleans and writes infinities in other numbers than golden's is judged for its
integer inputs as one whose output departs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class TinyCausalLM(nn.Module):
    def __init__(self, diagonal: int, vocab: int = 32, width: int = 16):
        super().__init__()
        self.embed, self.qkv = nn.Embedding(vocab, width), nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, vocab)
        self.diagonal = diagonal

    def forward(self, ids):
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 4.0
        mask = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).triu(self.diagonal)
        weights = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.out(x + weights @ v)


def _train(path, diagonal: int, autocast: bool) -> None:
    torch.manual_seed(0)
    model = TinyCausalLM(diagonal)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 32, (3, 10), generator=generator) for _ in range(2)]

    def loss_of(model, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids)
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32).float(), ids[:, 1:].reshape(-1))

    fit(path, model, optimizer, loss_of, batches, "dump")


def test_a_mask_off_by_one_is_named_where_it_is_applied(tmp_path):
    _train(tmp_path / "golden.h5", 1, False)
    _train(tmp_path / "target.h5", 2, True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step) == ("kernel_bug", "TinyCausalLM/aten.masked_fill_0", 0), \
        verdict.evidence


def test_the_same_mask_in_a_bf16_run_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", 1, False)
    _train(tmp_path / "target.h5", 1, True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
