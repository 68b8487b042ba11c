"""Dump a tiny MLP's training with msprobe (mindstudio-probe 26.2.0) on CPU: ``msprobe_real_run.py OUT TASK RUN``.

TASK is ``tensor`` or ``statistics``; RUN is ``golden``, or ``target``, where
``torch.nn.functional.gelu`` returns 1.25 times its value (a planted kernel
bug: same API, same shapes, cosine 1.0 on its output). Two steps, level mix
(API and module records). msprobe's debugger is a process-wide singleton, so
each dump is its own process. With ``GOLDEN RESULT`` after RUN the process
then waits for that golden dump to be done and runs msprobe's own ``compare``
(target = OUT) into RESULT, saving a process start (~4 s of imports).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

PLANTED_SCALE = 1.25


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.fc3(x)


def plant_bug() -> None:
    original = F.gelu

    def gelu(x, approximate="none"):
        return original(x, approximate=approximate) * PLANTED_SCALE

    F.gelu = gelu  # before msprobe wraps the API: its wrapper records this one as Functional.gelu


def main(out: str, task: str, run: str) -> None:
    os.makedirs(out, exist_ok=True)
    config = {"task": task, "level": "mix", "dump_path": out, "step": [], "rank": [],
              task: {"data_mode": ["all"]} if task == "tensor" else {"data_mode": ["all"],
                                                                      "summary_mode": "statistics"}}
    config_path = os.path.join(out, "config.json")
    with open(config_path, "w") as handle:
        json.dump(config, handle)
    if run == "target":
        plant_bug()
    from msprobe.pytorch import PrecisionDebugger, seed_all

    seed_all(1234)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    debugger = PrecisionDebugger(config_path=config_path)
    for _ in range(2):
        debugger.start(model)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        debugger.stop()
        debugger.step()
    with open(os.path.join(out, "done"), "w"):
        pass


def msprobe_compare(target: str, golden: str, result: str) -> None:
    """``msprobe compare -tp TARGET/step0 -gp GOLDEN/step0 -o RESULT``, once the golden dump is done."""
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(golden, "done")):
        if time.monotonic() > deadline:
            sys.exit(f"{golden}: not done after 120 s")
        time.sleep(0.05)
    from msprobe.msprobe import main as msprobe_main

    sys.argv = ["msprobe", "compare", "-tp", os.path.join(target, "step0"), "-gp", os.path.join(golden, "step0"),
                "-o", result]
    msprobe_main()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    if len(sys.argv) == 6:
        msprobe_compare(sys.argv[1], sys.argv[4], sys.argv[5])
