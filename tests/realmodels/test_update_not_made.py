"""An update golden makes and the target does not, with no loss scaler to skip it (probe P f55, f56, f43).

A ``zero_grad()`` between ``backward()`` and ``step()`` leaves the optimizer no gradient, and an optimizer built
before adapters were put in holds none of the parameters that train: either way the target's optimizer runs no
op and nothing is ever updated. The diagnosis took the missing update for a loss scaler's skip ("the target
skipped the optimizer update of step 0 (loss scaling)"), scanned no later step and said `none`, the loss
drifting away step by step. Where the step records no skip and no overflow and the scale does not fall, the
update golden makes is named.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, mode: str, target: bool, misplaced: bool, scaler: bool = False) -> None:
    import precision_tool.torch as ptt

    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaling = torch.amp.GradScaler("cpu", init_scale=4096.0) if scaler else None
    dtype = torch.float16 if scaler else torch.bfloat16
    with ptt.dump(path, mode=mode):
        for ids in token_batches(3):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=target):
                loss = model(input_ids=ids, labels=ids).loss
            if scaling is not None:
                scaling.scale(loss).backward()
                scaling.unscale_(optimizer)
                if misplaced:
                    optimizer.zero_grad()
                scaling.step(optimizer)
                scaling.update()
                ptt.step(loss, scaling.get_scale())
                continue
            loss.backward()
            if misplaced:
                optimizer.zero_grad()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_an_update_the_target_never_makes_is_named(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, target=False, misplaced=False)
    _train(tmp_path / "target.h5", mode, target=True, misplaced=True)
    diagnosis = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5")
    verdict = diagnosis.verdict
    assert (verdict.cls, verdict.op, verdict.direction, verdict.step) == ("kernel_bug", "optimizer/AdamW",
                                                                          "optimizer", 0)
    assert verdict.evidence[1] == ("no loss scaler skipped it: step 0 records no skip and no overflow, and the loss "
                                   "scale does not fall after it")
    assert ("the target skipped the optimizer update of step 0: later steps train other weights than golden's and "
            "are not scanned") in diagnosis.notes


def test_behind_a_grad_scaler_whose_scale_stays(tmp_path):
    _train(tmp_path / "golden.h5", "dump", target=False, misplaced=False)
    _train(tmp_path / "target.h5", "dump", target=True, misplaced=True, scaler=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step) == ("kernel_bug", "optimizer/AdamW", 0)


def test_the_same_loop_in_bfloat16_is_clean(tmp_path):
    _train(tmp_path / "golden.h5", "dump", target=False, misplaced=False)
    _train(tmp_path / "target.h5", "dump", target=True, misplaced=False)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
