"""Loop code reading gradients still multiplied by a GradScaler's loss scale (a float16 autocast BERT): a
clip_grad_norm_ before ``scaler.unscale_``, ``optimizer.step()`` called past the scaler. The gradients match
golden's times the scale, so every backward op was right; the loop's op reading them departed 4,096-fold, and
the verdict blamed the backward cast that wrote them (an op golden does not run). The reader is named now.
"""

from __future__ import annotations

import pytest
import torch

from tests.realmodels.cases import diagnosis_of, tiny_bert_classifier

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def _train(path, target: bool, mode: str, loop: str = "right", golden_loop: str = "right") -> None:
    import precision_tool.torch as ptt

    model = tiny_bert_classifier()
    if "clamp hooks" in (loop, golden_loop):  # a "safety" clamp on every gradient, in both runs
        for parameter in model.parameters():
            parameter.register_hook(lambda grad: grad.clamp(-1.0, 1.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=4096.0, enabled=target)
    generator = torch.Generator().manual_seed(100)
    data = [(torch.randint(3, 64, (3, 10), generator=generator), torch.randint(0, 3, (3,), generator=generator))
            for _ in range(2)]
    logged = []
    with ptt.dump(path, mode=mode):
        for ids, labels in data:
            with torch.autocast("cpu", dtype=torch.float16, enabled=target):
                loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            if "log first" in (loop, golden_loop):  # a norm for a log, of the gradients as they are (still scaled)
                logged.append(float(torch.stack([p.grad.norm() for p in model.parameters()]).norm()))
            if loop == "past the scaler":
                optimizer.step()
            else:
                if loop == "clip first":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if loop == "divided first":  # by hand, then the scaler unscales again in step
                    with torch.no_grad():
                        for parameter in model.parameters():
                            parameter.grad.div_(scaler.get_scale())
                scaler.unscale_(optimizer)
                if loop == "unscaled twice":  # by hand too, as a loop written before the scaler did
                    with torch.no_grad():
                        for parameter in model.parameters():
                            parameter.grad.div_(scaler.get_scale())
                if loop != "clip first":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            ptt.step(loss, scaler.get_scale() if target else 1.0)


@pytest.mark.parametrize("mode", ["dump", "stats"])
@pytest.mark.parametrize("loop, op", [("clip first", "aten._foreach_norm_0"),
                                      ("past the scaler", "optimizer/SGD/aten.add__0")])
def test_loop_code_reading_scaled_gradients_is_named(tmp_path, mode, loop, op):
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode, loop)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step) == ("kernel_bug", op, 0), verdict.evidence
    assert "golden's value times the step's loss scale, 4096, matches it within" in verdict.evidence[0]


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_the_loop_unscaling_first_is_clean(tmp_path, mode):
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode)
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


def test_a_gradient_hook_clamping_loss_scaled_gradients_is_named(tmp_path):
    """Both runs clamp every gradient to [-1, 1] in a tensor hook; the target's hooks see gradients 4,096 times
    golden's, and clamp them. On golden's unscaled inputs the clamp computes golden's output: it is not
    proportional to the gradients it reads. (From statistics nothing is replayed, and it is not named.)"""
    _train(tmp_path / "golden.h5", False, "dump", golden_loop="clamp hooks")
    _train(tmp_path / "target.h5", True, "dump", "clamp hooks")
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step, verdict.direction) == \
        ("kernel_bug", "BertForSequenceClassification/classifier/weight/aten.clamp_0", 0, "backward")
    assert verdict.evidence[1].startswith("replayed on golden's unscaled inputs in float32 it computes golden's")


@pytest.mark.parametrize("mode", ["dump", "stats"])
def test_a_norm_of_scaled_gradients_taken_for_a_log_is_harmless(tmp_path, mode):
    """What it computes reaches no update and no module: the run is clean (it named the norm, then the cast)."""
    _train(tmp_path / "golden.h5", False, mode, golden_loop="log first")
    _train(tmp_path / "target.h5", True, mode, "log first")
    assert diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict.cls == "none"


@pytest.mark.parametrize("mode,loop", [("dump", "unscaled twice"), ("stats", "unscaled twice"),
                                       ("dump", "divided first")])
def test_gradients_unscaled_twice_name_the_unscaling_by_hand(tmp_path, mode, loop):
    """The scalings walked past, from the reader back to the backward op that wrote the gradient, undo the loss
    scale twice: the one written by hand is named, before or after the scaler's own (the backward cast was
    named; with the hand's first, the scaler's)."""
    _train(tmp_path / "golden.h5", False, mode)
    _train(tmp_path / "target.h5", True, mode, loop)
    verdict = diagnosis_of(tmp_path / "golden.h5", tmp_path / "target.h5").verdict
    assert (verdict.cls, verdict.op, verdict.step) == ("kernel_bug", "aten.div__0", 0), verdict.evidence
