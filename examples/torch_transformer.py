"""Train a small torch.nn.TransformerEncoderLayer model twice: plain, then as an fp16 NPU would.

    python examples/torch_transformer.py --out runs/transformer      # writes golden.h5 and target.h5
    precision-tool compare runs/transformer/golden.h5 runs/transformer/target.h5

The golden run is plain float32 PyTorch; the target run is the same script
under `precision_tool.torch.simulate_npu` (or, with ``--target autocast``,
under ``torch.autocast("cpu", torch.bfloat16)``). The instrumentation is the
lines marked ``# precision-tool``: the import, one ``with`` per run, and an
optional ``ptt.step(loss)`` that records the loss.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
from torch import nn

import precision_tool.torch as ptt  # precision-tool


class TokenClassifier(nn.Module):
    """Embedding -> TransformerEncoder -> mean over the sequence -> Linear."""

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def make_run(seed: int = 0, batch: int = 16, seq: int = 32, d_model: int = 64, heads: int = 4, layers: int = 2,
             vocab: int = 100, classes: int = 4, embed_scale: float = 1.0):
    """The model, its optimizer and a fixed batch, all from ``seed``."""
    torch.manual_seed(seed)
    model = TokenClassifier(vocab, d_model, heads, layers, classes)
    with torch.no_grad():
        model.embed.weight.mul_(embed_scale)
    tokens = torch.randint(0, vocab, (batch, seq))
    labels = tokens[:, 0] % classes
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer, tokens, labels


def train_step(model, optimizer, tokens, labels, autocast: bool = False) -> torch.Tensor:
    # autocast covers the forward pass only: around optimizer.step() its cached bf16 weights go stale
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = nn.functional.cross_entropy(model(tokens), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def train(run, steps: int, autocast: bool = False) -> list[float]:
    losses = []
    for _ in range(steps):
        loss = train_step(*run, autocast=autocast)
        ptt.step(loss)  # precision-tool: optional, ends the step and records its loss
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/transformer"), help="folder for golden.h5/target.h5")
    parser.add_argument("--mode", choices=ptt.MODES, default="dump", help="what the dumps record")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    parser.add_argument("--target", choices=("npu", "autocast"), default="npu",
                        help="npu: simulate_npu; autocast: torch.autocast to bfloat16")
    parser.add_argument("--precision-mode", default="allow_mix_precision", help="simulate_npu precision mode")
    parser.add_argument("--overflow-mode", choices=("saturation", "inf_nan"), default="saturation")
    parser.add_argument("--embed-scale", type=float, default=1.0,
                        help="scale the embedding init (try 300 to overflow fp16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {"embed_scale": args.embed_scale}

    run = make_run(args.seed, **sizes)
    with ptt.dump(args.out / "golden.h5", mode=args.mode):  # precision-tool
        golden = train(run, args.steps)
    autocast = args.target == "autocast"
    target_context = contextlib.nullcontext() if autocast else \
        ptt.simulate_npu(args.precision_mode, args.overflow_mode)  # precision-tool
    run = make_run(args.seed, **sizes)
    with target_context, ptt.dump(args.out / "target.h5", mode=args.mode):  # precision-tool
        target = train(run, args.steps, autocast=autocast)
    print(f"golden loss {golden}\ntarget loss {target}")
    print(f"wrote {args.out / 'golden.h5'} and {args.out / 'target.h5'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
