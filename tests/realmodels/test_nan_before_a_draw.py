"""A module-level dump where NaN is made in a parent's own code, before a Dropout(p=0) child (probe R fr25m, fr52m).

The target computes a block's softmax numerator in float16 by hand: exp overflows, inf/inf is NaN. The dropout
reads those NaN, which statistics do not score (values non-finite where golden's are finite are counted, not
compared), so its inputs looked as if they agreed with golden's, and its output's statistics, not finite, were
"drawn from another distribution": kernel_bug at the dropout. Inputs holding NaN or inf where golden's are finite
agree in no way; the block whose own code made the NaN is named.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.realmodels.cases import diagnosis_of

pytestmark = [pytest.mark.torch]


class Block(nn.Module):
    def __init__(self, half_exp: bool):
        super().__init__()
        self.l1, self.l2, self.drop, self.half_exp = nn.Linear(32, 32), nn.Linear(32, 32), nn.Dropout(0.0), half_exp

    def forward(self, x):
        h = self.l1(x) * 12
        e = torch.exp(h.half()).float() if self.half_exp else torch.exp(h)
        return self.drop(self.l2(e / e.sum(-1, keepdim=True)))


class Model(nn.Module):
    def __init__(self, half_exp: bool):
        super().__init__()
        self.blk, self.head = Block(half_exp), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.blk(x)).mean(1)


def _train(path, half_exp: bool, mode: str) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(0)
    model = Model(half_exp)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 10, 32, generator=generator), torch.randint(0, 4, (3,), generator=generator)
    with ptt.dump(path, mode, level="module"):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ptt.step(loss)


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_nan_made_in_a_parent_s_own_code_is_named_there_not_at_the_dropout_reading_it(mode, tmp_path):
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == ("invalid_operation", "Model/blk", 0,
                                                                          "forward")
