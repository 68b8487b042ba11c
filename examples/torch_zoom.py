"""One training run per invocation, golden or target, ready for `precision-tool zoom`.

    precision-tool zoom -o runs/zoom -- python examples/torch_zoom.py --steps 4
    python examples/torch_zoom.py --role target --out runs/target.h5      # without zoom: one run, full dump

The model reads raw sensor values around 30 through a hand-written LayerNorm that takes the variance in one
pass, E[x^2] - E[x]^2: fine in float32, catastrophic cancellation in float16. The target run simulates an
fp16 NPU (`force_fp16`); the golden run is plain float32.

Under zoom the tool runs this script four times and sets the environment `ptt.dump` reads (phase, role,
folder, region): the script only has to run its target run when ``ptt.zoom_role() == "target"``. The lines
marked ``# precision-tool`` are the instrumentation.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from torch import nn

import precision_tool.torch as ptt  # precision-tool


class OnePassLayerNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(width)), nn.Parameter(torch.zeros(width))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean  # one pass: cancels when |mean| >> std
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


class SensorNet(nn.Module):
    def __init__(self, width: int = 32, classes: int = 4):
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.norm = OnePassLayerNorm(width)
        self.head = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        return self.head(self.norm(self.embed(x)))


def train(steps: int, seed: int = 0) -> list[float]:
    torch.manual_seed(seed)
    model = SensorNet()
    with torch.no_grad():
        model.embed.bias.add_(30.0)  # readings around 30, spread about 0.5
    x = torch.randn(64, 32)
    y = torch.randint(0, 4, (64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ptt.step(loss)  # precision-tool: record the loss
        losses.append(float(loss.detach()))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("golden", "target"), default="golden", help="without zoom: which run")
    parser.add_argument("--out", default="run.h5", help="without zoom: the dump to write")
    parser.add_argument("--mode", default="dump", choices=("dump", "stats"))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    role = ptt.zoom_role() or args.role  # precision-tool: zoom says which run this is
    npu = ptt.simulate_npu("force_fp16") if role == "target" else contextlib.nullcontext()  # precision-tool
    with npu, ptt.dump(args.out, mode=args.mode, model="torch_zoom"):  # precision-tool
        losses = train(args.steps)
    print(f"{role}: loss {losses[0]:.4g} -> {losses[-1]:.4g}")


if __name__ == "__main__":
    main()
