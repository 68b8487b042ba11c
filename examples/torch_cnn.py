"""Train a small CNN twice: plain float32 (golden), then as an fp16 NPU would (target).

    python examples/torch_cnn.py --out runs/cnn                  # writes golden.h5 and target.h5
    python examples/torch_cnn.py --out runs/cnn --pixel-scale 255 --loss-scale 2048   # fp16 overflows
    precision-tool diagnose runs/cnn/golden.h5 runs/cnn/target.h5

A static loss scale that suits normalised inputs pushes gradients past
65504 once the pixels are raw 0..255 values: float32 does not notice, a
saturating float16 NPU clips them silently.

The instrumentation is the lines marked ``# precision-tool``: the import, one
``with`` per run, and an optional ``ptt.step(loss)`` that records the loss.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import precision_tool.torch as ptt  # precision-tool


def make_model(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, classes),
    )


def make_run(seed: int = 0, batch: int = 16, pixel_scale: float = 1.0):
    """Model, optimizer and one fixed batch of 32x32 RGB images, all from ``seed``."""
    torch.manual_seed(seed)
    model = make_model()
    images = torch.rand(batch, 3, 32, 32) * pixel_scale
    labels = torch.randint(0, 10, (batch,))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, optimizer, images, labels


def train(run, steps: int, loss_scale: float = 1.0) -> list[float]:
    model, optimizer, images, labels = run
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        (loss * loss_scale).backward()
        for param in model.parameters():  # static loss scaling: unscale before the update
            param.grad.div_(loss_scale)
        optimizer.step()
        ptt.step(loss)  # precision-tool: optional, ends the step and records its loss
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/cnn"), help="folder for golden.h5/target.h5")
    parser.add_argument("--mode", choices=ptt.MODES, default="dump", help="what the dumps record")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    parser.add_argument("--precision-mode", default="force_fp16", help="simulate_npu precision mode")
    parser.add_argument("--overflow-mode", choices=("saturation", "inf_nan"), default="saturation")
    parser.add_argument("--pixel-scale", type=float, default=1.0, help="pixel range: 1 (normalised) or 255 (raw)")
    parser.add_argument("--loss-scale", type=float, default=1.0, help="static loss scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    run = make_run(args.seed, pixel_scale=args.pixel_scale)
    with ptt.dump(args.out / "golden.h5", mode=args.mode):  # precision-tool
        golden = train(run, args.steps, args.loss_scale)
    run = make_run(args.seed, pixel_scale=args.pixel_scale)
    with ptt.simulate_npu(args.precision_mode, args.overflow_mode), \
            ptt.dump(args.out / "target.h5", mode=args.mode):  # precision-tool
        target = train(run, args.steps, args.loss_scale)
    print(f"golden loss {golden}\ntarget loss {target}")
    print(f"wrote {args.out / 'golden.h5'} and {args.out / 'target.h5'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
