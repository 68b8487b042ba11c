"""A target that updates through PyTorch's fused Adam (`fused=True`, Hugging Face's `adamw_torch_fused`) where
golden runs the for-loop form: another implementation of the same update, clean. The diagnosis blamed the update
(`kernel_bug` at optimizer/AdamW, "0.333 from golden"): in a float16 run with a GradScaler the replay of the fused
kernel could not find golden's gradients behind the scaler's unscaling, so it ran on the target's own, and Adam's
normalised step turns the noise of a gradient that is zero in exact arithmetic (the key projection's bias) into a
step of full size; from statistics, which cannot replay it, the update's results were paired with golden's by size
alone. A learning rate set otherwise in the fused target is still named from a full dump."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, mode: str, target: bool, float16: bool = True, unscale: bool = True, lr: float = 1e-3,
           fused: bool = False, sgd: bool = False, scale: float = 4096.0, steps: int = 2) -> None:
    import precision_tool.torch as ptt

    model = tiny_gpt2()
    fused = True if target or fused else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused) if sgd else \
        torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale) if target and float16 else None
    with ptt.dump(path, mode=mode):
        for ids in token_batches(steps):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16, enabled=target and float16):
                loss = model(input_ids=ids, labels=ids).loss
            if scaler is None:
                loss.backward()
                optimizer.step()
                ptt.step(loss)
                continue
            scaler.scale(loss).backward()
            if unscale:
                scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            ptt.step(loss, scaler.get_scale())


@pytest.mark.parametrize("mode,unscale", [("dump", True), ("dump", False), ("stats", True)])
def test_fused_adam_in_a_float16_target_with_a_scaler_is_clean(tmp_path, mode, unscale):
    _train(tmp_path / "golden.h5", mode, target=False)
    _train(tmp_path / "target.h5", mode, target=True, unscale=unscale)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    assert diagnosis.verdict.cls == "none", diagnosis.verdict
    if mode == "stats":
        assert ("optimizer/AdamW: the target updates with the fused implementation, golden with the for-loop one; "
                "statistics cannot replay it on golden's gradients, so it is not judged (a dump mode run of the "
                "first step would)") in diagnosis.notes


def test_fused_adam_in_a_float32_target_is_clean_from_statistics(tmp_path):
    _train(tmp_path / "golden.h5", "stats", target=False)
    _train(tmp_path / "target.h5", "stats", target=True, float16=False)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_a_learning_rate_set_otherwise_in_a_fused_target_is_named_from_a_dump(tmp_path):
    _train(tmp_path / "golden.h5", "dump", target=False)
    _train(tmp_path / "target.h5", "dump", target=True, lr=3e-3)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == \
        ("kernel_bug", "optimizer/AdamW", 0, "optimizer")


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_fused_adam_in_both_runs_the_target_with_a_scaler_is_clean(tmp_path, mode):
    # Hugging Face's default optimizer in both runs; the target's GradScaler hands the fused step found_inf, and
    # the step runs _foreach_sub_ on its step counters, which golden's does not: judged as another update from
    # statistics ("0.0735 from golden", results paired by size)
    _train(tmp_path / "golden.h5", mode, target=False, fused=True)
    _train(tmp_path / "target.h5", mode, target=True)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    assert diagnosis.verdict.cls == "none", diagnosis.verdict
    if mode == "stats":
        assert ("optimizer/AdamW: the target's update runs ops golden's does not on its step counters only "
                "(_foreach_sub_: a GradScaler's fused step); the update itself runs golden's ops") in diagnosis.notes


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_fused_sgd_in_both_runs_is_not_called_differently_for_the_scalers_found_inf(tmp_path, mode):
    # (the target's GradScaler hands the kernel found_inf; golden's run has no scaler: "kwargs.found_inf: not
    # given in golden, a tensor in target" was a kernel_bug at _fused_sgd_)
    _train(tmp_path / "golden.h5", mode, target=False, sgd=True)
    _train(tmp_path / "target.h5", mode, target=True, sgd=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_a_step_a_fused_optimizer_skips_for_the_scaler_is_a_skipped_step(tmp_path):
    # a loss scale of 2**24 overflows float16 at the first step: the scaler hands the fused kernel found_inf and
    # the kernel leaves the parameters as they were; the dump marked the step as updated, and the overflow was
    # named as unhandled ("no update was skipped")
    from precision_tool.dump.reader import open_dump

    _train(tmp_path / "golden.h5", "dump", target=False, fused=True, steps=3)
    _train(tmp_path / "target.h5", "dump", target=True, scale=2.0 ** 24, steps=3)
    with open_dump(tmp_path / "target.h5") as dump:
        steps = dump.steps()
    assert steps[0].skipped  # (and each later step whose scale the scaler halved again)
    assert [s.skipped for s in steps[:-1]] == [b.loss_scale < a.loss_scale for a, b in zip(steps, steps[1:])]
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
