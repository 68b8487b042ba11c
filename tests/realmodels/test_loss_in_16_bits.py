"""A loss computed in 16 bits in an autocast run: the target takes GPT-2's cross-entropy on its bfloat16 logits
with autocast off (a loss computed after the autocast block). Autocast computes every loss in float32; the
target's loss is rounded to bfloat16 (4.184 to 4.1875), its Δloss 100 times a clean bf16 run's. Each op's
error was what its dtype explains, and the loss, a scalar, has cosine 1: `none` (probe O f45, f12b, f58, f59)."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, mode: str, target: bool, outside: bool) -> None:
    import precision_tool.torch as ptt

    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ptt.dump(path, mode=mode):
        for ids in token_batches(2):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                logits = model(input_ids=ids).logits
                if not outside:
                    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
            if outside:
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            ptt.step(loss)


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_loss_taken_outside_autocast_on_bfloat16_logits_is_a_precision_loss(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, target=False, outside=False)
    _train(tmp_path / "target.h5", mode, target=True, outside=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == \
        ("precision_loss", "aten.nll_loss_forward_0", 0, "forward")
    assert verdict.evidence[0] == ("aten.nll_loss_forward_0 (aten.nll_loss_forward) computes in bfloat16, where "
                                   "autocast computes a loss in float32 (golden computes it in float32): the target "
                                   "took it outside autocast, on bfloat16 values")


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_loss_taken_inside_autocast_is_clean(tmp_path, mode):
    _train(tmp_path / "golden.h5", mode, target=False, outside=False)
    _train(tmp_path / "target.h5", mode, target=True, outside=False)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
