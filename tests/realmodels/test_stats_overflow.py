"""An overflow seen in statistics: attention written by hand, q @ kᵀ taken before its 1/sqrt(d) scale, on large
activations (embeddings of std 20), passes 65504 under float16 autocast and the loss goes NaN at the first step.
Statistics show no error where values are not finite: the chain of inf and NaN readers from the matmul to the
loss (11 ops deep) is the harm, followed to the end where the loss was lost (`errors.harm_depth`).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from precision_tool.analysis import diagnose
from precision_tool.dump.reader import open_dump

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class Attention(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        for projection in (self.q, self.k):
            nn.init.normal_(projection.weight, std=1.0)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return self.o(torch.matmul(torch.softmax(scores, -1), v))


class Net(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.emb = nn.Embedding(64, width)
        nn.init.normal_(self.emb.weight, std=20.0)
        self.attn, self.ln, self.head = Attention(width), nn.LayerNorm(width), nn.Linear(width, 64)

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(self.ln(h + self.attn(h)))


def _train(path, mode: str, float16: bool) -> None:
    import precision_tool.torch as ptt

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (2, 4, 16))
    with ptt.dump(path, mode=mode):
        for step in range(2):
            with torch.autocast("cpu", dtype=torch.float16, enabled=float16):
                logits = model(data[step])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 64), data[step].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode", ["stats", "dump"])
def test_an_overflow_whose_nan_reaches_the_loss_is_named(tmp_path, mode):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _train(golden, mode, False)
    _train(target, mode, True)
    with open_dump(golden) as g, open_dump(target) as t:
        assert math.isnan(t.steps()[0].loss)
        verdict = diagnose(g, t).verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == (
        "overflow", "Net/attn/aten.bmm_0", 0, "forward"), verdict.evidence


def test_the_mask_constant_of_another_attention_kernel_is_no_overflow_in_statistics(tmp_path):
    # the math backend's scalar_tensor(-inf), which golden's fused kernel does not run: the model's own value,
    # listed as such, was the verdict's overflow when the scan had not judged it (no values to judge)
    from tests.realmodels.variation import Variation, run_variation

    diagnosis, right, said = run_variation(Variation("gpt2", "fp32", attention="math"), tmp_path, "stats")
    assert right and diagnosis.verdict.cls == "none", said
    assert diagnosis.overflow.asked == 12 and diagnosis.overflow.first is None


def test_t5s_own_mask_value_and_log_of_zero_leave_a_clean_float16_run_clean_in_statistics(tmp_path):
    # its causal mask's fill value is finfo(float16).min in the target, finfo(float32).min in golden (a constant
    # that follows the run's precision: the op was kernel_bug, "at least 1 from golden"); its relative-position
    # bucketing takes log(0) in both runs, which `where` then discards (the action was "fix the model in golden's
    # precision first", though golden's every loss is finite)
    from tests.realmodels.cases import Case, run_case

    diagnosis = run_case(Case("t5", "amp16"), tmp_path, mode="stats")
    verdict = diagnosis.verdict
    assert verdict.cls == "none", verdict.evidence
    assert not any("golden's own run overflows" in line for line in verdict.evidence)


@pytest.mark.parametrize("model,target", [("resnet", "mix"), ("gpt2-eager", "mix")])
def test_an_invalid_operation_a_saturation_mode_wrote_as_zeros_is_named_from_statistics(tmp_path, model, target):
    # a hand-written activation takes the square root of negative values on a simulated device in saturation
    # mode: its NaN are written as 0, the float status raised, and nothing it reads or writes reaches a
    # format's limit; from statistics it was a kernel_bug at the module (no values to run the op again on)
    from tests.realmodels.cases import Case, run_case

    verdict = run_case(Case(model, target, "sqrt_act", "act", "invalid_operation"), tmp_path, mode="stats").verdict
    assert (verdict.cls, verdict.type, verdict.direction, verdict.step) == \
        ("invalid_operation", "aten.sqrt", "forward", 0)
    assert verdict.op.endswith("/act/aten.sqrt_0" if model == "gpt2-eager" else "/activation/aten.sqrt_0")
