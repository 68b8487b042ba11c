"""A parameter updated twice: after `optimizer.step()` the target applies one more SGD step to GPT-2's first MLP
weight by hand (bfloat16 autocast). The next step's ops read the weight as the hand-written update left it, while
golden's read it as its optimizer left it; no op of golden's step wrote it, so no departure was looked for, and
the diagnosis said `none` (probe O f10). The op only the target runs that rewrote it is named now."""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, tiny_gpt2, token_batches

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.filterwarnings("ignore:TF32 acceleration")]


def _train(path, target: bool, twice: bool) -> None:
    import precision_tool.torch as ptt

    model = tiny_gpt2()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = model.transformer.h[0].mlp.c_fc.weight
    with ptt.dump(path, mode="dump"):
        for ids in token_batches(3):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            ptt.step(loss)
            if twice:
                with torch.no_grad():
                    weight.add_(weight.grad, alpha=-0.1)


def test_a_parameter_updated_again_by_hand_is_named_at_that_update(tmp_path):
    _train(tmp_path / "golden.h5", target=False, twice=False)
    _train(tmp_path / "target.h5", target=True, twice=True)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.type, verdict.step) == ("kernel_bug", "aten.add__0", "aten.add_", 1)
    assert verdict.evidence[1] == "aten.add__0 (aten.add_), an op golden does not run, wrote it in the target's step"


def test_master_weights_copied_back_are_no_second_update(tmp_path):
    # (a copy of float32 master weights into the model is one: a copy, not an update)
    import precision_tool.torch as ptt

    def train(path, half: bool) -> None:
        model = tiny_gpt2()
        master = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        optimizer = torch.optim.SGD(master if half else model.parameters(), lr=0.1)
        if half:
            model.to(torch.bfloat16)
        with ptt.dump(path, mode="dump"):
            for ids in token_batches(3):
                optimizer.zero_grad()
                model.zero_grad(set_to_none=True)
                loss = model(input_ids=ids, labels=ids).loss
                loss.float().backward()
                if half:
                    for m, p in zip(master, model.parameters()):
                        m.grad = p.grad.float()
                optimizer.step()
                ptt.step(loss)
                if half:
                    with torch.no_grad():
                        for m, p in zip(master, model.parameters()):
                            p.copy_(m)

    train(tmp_path / "golden.h5", half=False)
    train(tmp_path / "target.h5", half=True)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"
