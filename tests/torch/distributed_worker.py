"""One rank of the 2-process gloo runs of tests/torch/test_distributed.py (run as a script, not collected).

argv: OUT_DIR. Writes three runs under OUT_DIR, each two steps of a tiny model under ``ptt.dump``:
``manual`` (gradients summed by ``dist.all_reduce``, then divided), ``ddp`` (DistributedDataParallel) and
``skewed`` (as manual, but rank 1 divides by 3: its weights leave rank 0's after the first update).
"""

import os
import sys

import torch
import torch.distributed as dist

import precision_tool.torch as ptt


def train(out: str, mode: str, rank: int, world: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    with ptt.dump(os.path.join(out, mode), mode="dump"):
        for _ in range(2):
            x, y = torch.randn(3, 4, generator=data), torch.randn(3, 2, generator=data)
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            if mode != "ddp":
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
                    parameter.grad /= 3 if (mode == "skewed" and rank == 1) else world
            optimizer.step()


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for mode in ("manual", "ddp", "skewed"):
            train(sys.argv[1], mode, rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
