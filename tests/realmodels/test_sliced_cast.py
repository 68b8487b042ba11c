"""A module's output rounded to float16 and back in a float32 run, read by its parent one slice at a time (probe S).

RWKV's attention reads its key Linear's output one time step at a time (``key[:, t]``: a view, which no op
records), and allocates its output as ``zeros_like(key)``. The target's key returned ``.half().float()`` of its
output: every value the recurrence reads lies on float16's grid. The diagnosis found no op that wrote what the
recurrence's first add reads and named that add: "a value no op of step 0 wrote ... rounded to float16 before the
step (a checkpoint saved in float16)". Golden's value is a slice of what the key Linear wrote, so it is no
parameter: the cast only the target runs, whose value the slice holds, is named.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels.cases import diagnosis_of, fit

pytestmark = [pytest.mark.torch]


class _Recurrent(nn.Module):
    def __init__(self, round_trip: bool):
        super().__init__()
        self.key, self.decay, self.head = nn.Linear(16, 16), nn.Parameter(torch.linspace(0.1, 0.9, 16)), \
            nn.Linear(16, 3)
        if round_trip:  # the target's key, patched as a porting engineer might
            forward = self.key.forward
            self.key.forward = lambda x: forward(x).half().float()

    def forward(self, x):
        key = self.key(x)
        output = torch.zeros_like(key)  # (an op that reads the whole output: no stray cast whose value goes unread)
        state = torch.zeros_like(key[:, 0])
        for t in range(key.shape[1]):  # one time step at a time, through views
            state = state * self.decay + key[:, t]
            output[:, t] = state
        return self.head(output.mean(1))


def _pair(tmp_path):
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 0])
    paths = []
    for name, round_trip in (("golden", False), ("target", True)):
        torch.manual_seed(0)
        model = _Recurrent(round_trip)
        paths.append(tmp_path / f"{name}.h5")
        fit(paths[-1], model, torch.optim.SGD(model.parameters(), lr=0.1),
            lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), [(x, y)] * 2)
    return paths


def test_the_cast_whose_slices_are_read_is_named(tmp_path):
    verdict = diagnosis_of(*_pair(tmp_path)).verdict
    assert (verdict.cls, verdict.op, verdict.module, verdict.step) == \
        ("precision_loss", "_Recurrent/key/aten._to_copy_0", "_Recurrent/key", 0)
    assert verdict.evidence[0] == ("_Recurrent/key/aten._to_copy_0 (aten._to_copy), a cast golden does not run, "
                                   "rounds a float32 value to float16; golden keeps it in float32")
