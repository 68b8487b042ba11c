"""An LSTM language model that carries its state across steps (truncated backpropagation through time).

The target rounds the state it carries to bfloat16 and back at the end of each forward, float32 in both runs. The
value is read by the next step's LSTM, where no op of that step wrote it: a full dump's diagnosis said `none`, its
statistics named the cast (probe O f05b). The cast is named from values too now: a float32 run's stray cast to a
16-bit format, the loss departing.

Only the target carries its state, where golden's nn.LSTM starts each batch from zeros (``torch.zeros`` inside
the module), under bfloat16 autocast (probe R fr24). With tensors the module's ops (golden runs two ``zeros`` the
target does not) and a replay name it; from statistics the module is a rewrite nothing replays, and the verdict
was `none`, "accumulated rounding". A forward op after the first step that reads a value no op of the target's
step wrote, where golden's step writes it afresh from no float input, is named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class _StatefulLM(nn.Module):
    def __init__(self, cast: bool, carry: bool = True):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(64, 32), nn.LSTM(32, 32, batch_first=True), nn.Linear(32, 64)
        self.cast, self.carry, self.state = cast, carry, None

    def forward(self, ids):
        with torch.autocast("cpu", enabled=False):  # (oneDNN has no 16-bit LSTM on every CPU)
            h, (hn, cn) = self.rnn(self.emb(ids).float(), self.state)
        state = (hn.detach(), cn.detach())
        self.state = None if not self.carry else tuple(x.bfloat16().float() for x in state) if self.cast else state
        return self.head(h)


def _train(path, mode: str, cast: bool, carry: bool = True, autocast: bool = False) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(1)
    model = _StatefulLM(cast, carry)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with ptt.dump(path, mode=mode):
        for ids in token_batches(4):
            optimizer.zero_grad()
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                logits = model(ids).float()
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


@pytest.mark.parametrize("mode, autocast", [("stats", True), ("dump", True), ("stats", False)])
def test_a_state_carried_in_the_target_only_is_named_at_the_lstm(mode, autocast, tmp_path):
    # (a float32 pair was named before: its later steps are judged from statistics as its first)
    _train(tmp_path / "golden.h5", mode, cast=False, carry=False)
    _train(tmp_path / "target.h5", mode, cast=False, autocast=autocast)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == \
        ("kernel_bug", "_StatefulLM/rnn", 1, "forward")
