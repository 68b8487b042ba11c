"""A fault in a model's own forward code, between its submodules: a tagger (Embedding, Conv1d, GRU, Linear) whose
``forward`` scales the convolution's output by 1.02 in the target. Under bfloat16 autocast the forward's extra
``mul`` stands 6x above what its inputs carry (under the 8x rewrites ask), and its gradient shows it in
backward: the verdict names the forward op the target alone runs, not the backward group that showed it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn


from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class Tagger(nn.Module):
    def __init__(self, scaled: bool):
        super().__init__()
        self.scaled = scaled
        self.emb = nn.Embedding(64, 24)
        self.conv = nn.Conv1d(24, 32, 3, padding=1)
        self.gru = nn.GRU(32, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        c = self.conv(self.emb(ids).transpose(1, 2))
        if self.scaled:
            c = c * 1.02
        x, _ = self.gru(torch.relu(c).transpose(1, 2))
        return self.head(x)


def _train(path, role: str, bf16: bool) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(0)
    target = role == "target"
    model = Tagger(scaled=target)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (2, 4, 20))
    with ptt.dump(path):
        for step in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target and bf16):
                logits = model(data[step])
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64).float(), data[step][:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_a_scale_in_the_models_own_forward_is_named_in_forward(tmp_path, bf16):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, "golden", bf16)
    _train(target, "target", bf16)
    verdict = diagnosis_of(golden, target).verdict
    assert (verdict.cls, verdict.direction, verdict.step, verdict.module) == ("kernel_bug", "forward", 0, "Tagger")
    if bf16:  # found through its gradient: the op itself is named
        assert (verdict.op, verdict.type) == ("Tagger/aten.mul_0", "aten.mul")
        assert "the target's forward runs Tagger/aten.mul_0 (aten.mul), which golden's Tagger does not run" \
            in verdict.evidence[0]
