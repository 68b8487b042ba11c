"""A module-level dump of a model inside a wrapper that computes the loss in its own forward and returns it in no
tensor a module call records (a namespace). The target's loss uses label smoothing: every forward call matches
golden's, the gradient reaching the classifier departs, and nothing recorded computes it: `none` in every mode.
The step's first backward call reading a gradient far beyond every forward call's error, the loss departing too,
names the loss code: the wrapper's own.
"""

from __future__ import annotations

import types

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, fit, tiny_bert_classifier

pytestmark = [pytest.mark.slow, pytest.mark.torch]


class LossWrap(torch.nn.Module):
    def __init__(self, model, smoothing: float):
        super().__init__()
        self.model, self.smoothing = model, smoothing

    def forward(self, input_ids, labels):
        logits = self.model(input_ids=input_ids).logits
        return types.SimpleNamespace(loss=torch.nn.functional.cross_entropy(logits, labels,
                                                                            label_smoothing=self.smoothing))


def _train(path, mode: str, smoothing: float, autocast: bool = False) -> None:
    wrapped = LossWrap(tiny_bert_classifier(), smoothing)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(100)
    batches = [(torch.randint(3, 64, (3, 10), generator=generator), torch.tensor([0, 2, 1])) for _ in range(2)]

    def loss_of(model, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(*batch).loss

    fit(path, wrapped, optimizer, loss_of, batches, mode, level="module")


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_loss_computed_otherwise_inside_the_wrapper_is_named(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, 0.0)
    _train(tmp_path / "target.h5", mode, 0.1)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.module, verdict.step) == ("kernel_bug", "LossWrap", "LossWrap", 0), \
        verdict.evidence


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16"])
def test_the_same_loss_in_both_runs_is_clean(tmp_path, autocast):
    _train(tmp_path / "golden.h5", "stats", 0.1)
    _train(tmp_path / "target.h5", "stats", 0.1, autocast)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_label_smoothing_in_the_loop_of_a_bf16_run_is_named(tmp_path, mode):
    """The loss computed outside every module, in a bf16 target: backward calls of 16-bit runs are not judged
    (their statistics move by rounding), but the gradient a loss hands back is its own, checked as in float32."""
    def train(path, smoothing: float, autocast: bool) -> None:
        model = tiny_bert_classifier()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(100)
        batches = [(torch.randint(3, 64, (3, 10), generator=generator), torch.tensor([0, 2, 1])) for _ in range(2)]

        def loss_of(model, batch):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=batch[0]).logits
            return torch.nn.functional.cross_entropy(logits.float(), batch[1], label_smoothing=smoothing)

        fit(path, model, optimizer, loss_of, batches, mode, level="module")

    train(tmp_path / "golden.h5", 0.0, False)
    train(tmp_path / "target.h5", 0.1, True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.module, verdict.step, verdict.direction) == ("kernel_bug", None, 0, "backward")
    assert verdict.evidence[1] == ("the loss is computed otherwise than golden's in the training loop's code after "
                                   "the model's last call: its gradient, not the model, differs")
    train(tmp_path / "clean.h5", 0.0, True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "clean.h5").verdict.cls == "none"


def test_a_scale_recorded_off_by_two_is_no_loss_code(tmp_path):
    """ptt.step given half the scale the gradients carry (bf16 autocast), as after a GradScaler halves it on an
    overflow deeper in the model (a clean fp16 LeViT): a module-level dump cannot correct it from a seed gradient (no op records
    one), so the gradient reaching the last call is golden's times twice the recorded ratio: no loss computed
    otherwise."""
    import precision_tool.torch as ptt

    def train(path, scale: float | None) -> None:
        model = tiny_bert_classifier()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(100)
        with ptt.dump(path, mode="dump", level="module"):
            for _ in range(2):
                ids = torch.randint(3, 64, (3, 10), generator=generator)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scale is not None):
                    logits = model(input_ids=ids).logits
                loss = torch.nn.functional.cross_entropy(logits.float(), torch.tensor([0, 2, 1]))
                optimizer.zero_grad()
                (loss * (scale or 1.0)).backward()
                if scale:
                    for parameter in model.parameters():
                        parameter.grad.div_(scale)
                optimizer.step()
                ptt.step(loss, scale / 2 if scale else 1.0)

    train(tmp_path / "golden.h5", None)
    train(tmp_path / "target.h5", 1024.0)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
