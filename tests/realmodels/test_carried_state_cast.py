"""An LSTM language model carries its state across steps (truncated backpropagation through time), float32 in
both runs; the target rounds the state it carries to bfloat16 and back at the end of each forward. The value is
read by the next step's LSTM, where no op of that step wrote it: a full dump's diagnosis said `none`, its
statistics named the cast (probe O f05b). The cast is named from values too now: a float32 run's stray cast to a
16-bit format, the loss departing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class _StatefulLM(nn.Module):
    def __init__(self, cast: bool):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(64, 32), nn.LSTM(32, 32, batch_first=True), nn.Linear(32, 64)
        self.cast, self.state = cast, None

    def forward(self, ids):
        h, (hn, cn) = self.rnn(self.emb(ids), self.state)
        state = (hn.detach(), cn.detach())
        self.state = tuple(x.bfloat16().float() for x in state) if self.cast else state
        return self.head(h)


def _train(path, mode: str, cast: bool) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(1)
    model = _StatefulLM(cast)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with ptt.dump(path, mode=mode):
        for ids in token_batches(4):
            optimizer.zero_grad()
            logits = model(ids)
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_carried_state_rounded_to_bfloat16_is_named_at_its_cast(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, cast=False)
    _train(tmp_path / "target.h5", mode, cast=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == \
        ("precision_loss", "_StatefulLM/aten._to_copy_0", 0, "forward")
    assert verdict.evidence[0] == ("the target declares float32 throughout, yet _StatefulLM/aten._to_copy_0 "
                                   "(aten._to_copy) casts a float32 value to bfloat16, which golden holds in float32")
