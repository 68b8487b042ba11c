"""A float32 backward group's reduced gradients (a weight's, a bias's), judged from statistics.

A hand-written Linear whose backward makes the weight gradient 5 % too large, in a float32 ViT's first MLP,
got `none` from statistics: a result holding fewer values than the gradient the group reads was never judged
there, for cancellation can turn that gradient's small error into a large one of a small result. Now such a
result counts where it departs beyond what norms allow (`analysis.reductions`, whose bound on a gradient that is
rounding noise alone is tested in tests/analysis/test_reductions.py): a right hand-written Linear at BERT's key
projection, whose bias gradient is zero in exact arithmetic, stays clean.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.realmodels import cases as C
from tests.realmodels.plant import module

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class _Linear(torch.autograd.Function):
    """A hand-written Linear: its backward computes the three gradients as addmm's does, in other ops; its
    forward rounds otherwise in the last bits (as another kernel would), so that the gradient its backward reads
    differs from golden's there too."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return nn.functional.linear(x, weight, bias) * 3.0 / 3.0

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        return grad @ weight, rows.t() @ x.reshape(-1, x.shape[-1]), rows.sum(0)


def _right_linear(run, path: str) -> None:
    linear = module(run.model, path)
    linear.forward = lambda x: _Linear.apply(x, linear.weight, linear.bias)


def test_a_weight_gradient_5_percent_too_large_is_named_from_statistics(tmp_path, monkeypatch):
    monkeypatch.setitem(C.MODELS, "vit-fc1", (C.MODELS["vit"][0], {}, {"at": "vit.layers.0.mlp.fc1"}))
    verdict = C.run_case(C.Case("vit-fc1", "fp32", "weight_grad", "at", "kernel_bug", "backward"), tmp_path,
                         mode="stats").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == \
        ("kernel_bug", "ViTForImageClassification/vit/layers.0/mlp/fc1", 0, "backward")
    assert verdict.evidence[1] == "its output is at least 0.05 from golden while its inputs are within 0 as far as " \
                                  "their statistics show"


def test_a_right_hand_written_linear_at_a_key_projection_is_clean_from_statistics(tmp_path, monkeypatch):
    monkeypatch.setitem(C.FAULTS, "right_linear", _right_linear)
    monkeypatch.setitem(C.MODELS, "bert-key", (C.MODELS["bert-eager"][0], C.MODELS["bert-eager"][1],
                                               {"at": "bert.encoder.layer.0.attention.self.key"}))
    diagnosis = C.run_case(C.Case("bert-key", "fp32", "right_linear", "at"), tmp_path, mode="stats")
    assert diagnosis.verdict.cls == "none", diagnosis.verdict
