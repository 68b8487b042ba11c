"""A training script for `precision-tool zoom` whose target run fails: from step 1 its ReLU multiplies by 1e39
(inf in float32), and the loop stops at the non-finite loss, as training scripts do. ``early``: it fails before
its first op instead."""

import sys

import torch

import precision_tool.torch as ptt
from tests.torch.test_failed_step import _run

if __name__ == "__main__":
    role = ptt.zoom_role()
    if role == "target" and sys.argv[1:] == ["early"]:
        raise SystemExit("no data")
    torch.manual_seed(0)
    _run("unused.h5", 1 if role == "target" else None)
