"""A residual stream cast to bfloat16 by hand in one block of a bf16 autocast target (probe P f08, f24).

The cast adds a node to the graph, and autograd then sums the residual's gradients in that node's backward
instead of in the LayerNorm's that reads the same tensor: the LayerNorm's backward group ran one `add` fewer than
golden's, and was blamed ("golden ran [native_layer_norm_backward, add]; the target ran
[native_layer_norm_backward]": a `kernel_bug`). A sum that moved, as many in all as golden's, is no other
implementation; a sum fewer in all still is (a weight golden ties and the target does not: `untied`).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, token_batches

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


class _Block(nn.Module):
    def __init__(self, cast: bool):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.mix = nn.Linear(32, 32)
        self.cast = cast

    def forward(self, x):
        return (x.bfloat16() if self.cast else x) + self.mix(self.norm(x))


class _Model(nn.Module):
    def __init__(self, cast: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 32)
        self.blocks = nn.ModuleList([_Block(cast), _Block(False)])
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_gradient_sum_that_moved_blames_no_layer_norm(tmp_path, mode):
    import precision_tool.torch as ptt

    for path, target in ((tmp_path / "golden.h5", False), (tmp_path / "target.h5", True)):
        model = _Model(cast=target)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        with ptt.dump(path, mode=mode):
            for ids in token_batches(2):
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                    logits = model(ids)
                loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), ids.reshape(-1))
                loss.backward()
                optimizer.step()
                ptt.step(loss)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert not (verdict.op or "").startswith("_Model/blocks.0/norm")
