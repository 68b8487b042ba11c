"""A recurrent state the target carries across batches where golden starts each batch from zeros (probe R fr24).

A "stateful" port keeps the LSTM's (h, c) from one batch to the next (detached); golden's nn.LSTM starts each
from zeros (``torch.zeros`` inside the module). From the second step the LSTM reads another initial state. With
tensors the module's ops (golden runs two ``zeros`` the target does not) and a replay name it; from statistics
the module is a rewrite nothing replays, and the verdict was `none`, "accumulated rounding", the loss 166 times
further from golden's than a clean target's. A forward op after the first step that reads a value no op of the
target's step wrote, where golden's step writes it afresh from no float input, is named.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.torch]


class LSTMLM(nn.Module):
    def __init__(self, carry: bool):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(40, 16), nn.LSTM(16, 16, batch_first=True), nn.Linear(16, 40)
        self.carry, self.state = carry, None

    def forward(self, ids):
        with torch.autocast("cpu", enabled=False):  # (oneDNN has no 16-bit LSTM on every CPU)
            out, state = self.rnn(self.emb(ids).float(), self.state)
        if self.carry:
            self.state = tuple(s.detach() for s in state)
        return self.head(out)


def _train(path, carry: bool, mode: str, autocast: bool = False) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(0)
    model = LSTMLM(carry)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 40, (3, 10), generator=generator) for _ in range(3)]
    with ptt.dump(path, mode):
        for ids in batches:
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 40), ids[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode, autocast", [("stats", True), ("dump", True), ("stats", False)])
def test_a_state_carried_across_batches_is_named_at_the_lstm(mode, autocast, tmp_path):
    # (a float32 pair was named before: its later steps are judged from statistics as its first)
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode, autocast)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == ("kernel_bug", "LSTMLM/rnn", 1, "forward")
