"""Training with fp8 fake-quantisation under capture: float8 tensors recorded by their statistics.

Before 2026-11-28 any float8 tensor stopped the user's training ("Got unsupported ScalarType Float8_e4m3fn" while
reading its values) in every mode and at module level; a dump's dtype column (12 bytes) also cut the name
"float8_e4m3fn" short. A float8 tensor is now read as float32 (exactly) for its statistics, and no dump keeps its
values: no format of the dump holds them.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")
ptt = pytest.importorskip("precision_tool.torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from precision_tool.analysis import diagnose  # noqa: E402
from precision_tool.dump.reader import open_dump  # noqa: E402

pytestmark = pytest.mark.torch


class FakeQuant(torch.autograd.Function):
    """An fp8 recipe's cast: e4m3 values forward (scaled by 8), e5m2 gradients backward."""

    @staticmethod
    def forward(ctx, x):
        return (x * 8.0).to(torch.float8_e4m3fn).to(x.dtype) / 8.0

    @staticmethod
    def backward(ctx, grad):
        return grad.to(torch.float8_e5m2).to(grad.dtype)


class Quantised(nn.Module):
    def forward(self, x):
        return x.to(torch.float8_e4m3fn)  # a module handing on an 8-bit tensor


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.q = nn.Linear(16, 32), nn.Linear(32, 4), Quantised()

    def forward(self, x):
        h = F.gelu(self.fc1(FakeQuant.apply(x)))
        return self.fc2(self.q(h).float())


def _train(path, mode: str, level: str = "op") -> float:
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)
    with ptt.dump(path, mode, level=level):
        for _ in range(2):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)
    return loss.item()


@pytest.mark.parametrize("mode, level", [("dump", "op"), ("stats", "op"), ("overflow", "op"), ("dump", "module"),
                                         ("stats", "module")])
def test_float8_tensors_are_recorded_by_their_statistics_and_training_goes_on(mode, level, tmp_path):
    _train(tmp_path / "golden.h5", mode, level)
    _train(tmp_path / "target.h5", mode, level)
    with open_dump(tmp_path / "target.h5") as dump:
        eight_bit = [(r.name, t.slot, t.dtype, t.has_data) for r in dump.ops(step=0) for t in r.tensors
                     if t.dtype.startswith("float8")]
        if mode != "overflow":  # (an overflow dump records the ops that overflow only)
            assert ("MLP/q", "output_0", "float8_e4m3fn", False) in eight_bit if level == "module" else \
                ("MLP/aten._to_copy_0", "output_0", "float8_e4m3fn", False) in eight_bit
            assert all(not has_data for *_, has_data in eight_bit)
            q = next(r for r in dump.ops(step=0) if r.name == "MLP/q" and r.direction == "forward")
            assert q.tensor("output_0").stats.count == 8 * 32
    if mode != "overflow":
        with open_dump(tmp_path / "golden.h5") as g, open_dump(tmp_path / "target.h5") as t:
            assert diagnose(g, t).verdict.cls == "none"
