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
           fused: bool = False) -> None:
    import precision_tool.torch as ptt

    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01,
                                  fused=True if target or fused else None)
    scaler = torch.amp.GradScaler("cpu", init_scale=4096.0) if target and float16 else None
    with ptt.dump(path, mode=mode):
        for ids in token_batches(2):
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
