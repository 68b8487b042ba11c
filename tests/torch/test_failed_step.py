"""A script that fails inside a step (it stops when its loss goes NaN): the ops of that step up to the failure
are the evidence, kept in the dump as a step marked cut short, and diagnosed with ``--allow-incomplete``."""

from __future__ import annotations

import json

import pytest

from precision_tool.dump.reader import open_dump
from tests.torch.torch_helpers import make_mlp

torch = pytest.importorskip("torch")
ptt = pytest.importorskip("precision_tool.torch")


def _run(path, blow_up_at: int | None, stop: bool = True):
    """Three steps of the MLP; from step ``blow_up_at`` its ReLU multiplies by 1e39 (inf in float32), and the
    loop stops at the non-finite loss, as training scripts do (unless not ``stop``)."""
    model, optimizer, x, y = make_mlp()
    calls = {"n": 0}
    relu = model.act.forward

    def act(value):
        calls["n"] += 1
        return relu(value) * (1e39 if blow_up_at is not None and calls["n"] > blow_up_at else 1.0)

    model.act.forward = act
    with ptt.dump(path, mode="dump", seed=0):
        for step in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if stop and not torch.isfinite(loss):
                raise FloatingPointError(f"loss is {loss.item()} at step {step}")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ptt.step(loss)


def test_the_step_a_script_fails_in_is_kept_up_to_the_failure_and_marked(tmp_path, run_cli):
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _run(golden, None)
    with pytest.raises(FloatingPointError, match="loss is nan at step 1"):
        _run(target, 1)
    with open_dump(target) as dump:
        steps = dump.steps()
        assert not dump.complete and dump.steps_complete == 2
        assert [(s.step, s.cut_short) for s in steps] == [(0, False), (1, True)]
        failed = dump.ops(step=1)
        assert {r.direction for r in failed} == {"forward"}  # no backward: the script stopped before it
        names = [r.name for r in failed]  # up to the loss and the script's look at it (isfinite's eq)
        assert names[-1] == "aten.eq_0" and "aten.nll_loss_forward_0" in names
        # as step 0's forward, less backward's seed gradient (ones_like), which never ran
        assert names == [r.name for r in dump.ops(step=0, direction="forward") if r.name != "aten.ones_like_0"]

    inspected = run_cli("inspect", target)
    assert "INCOMPLETE (2 steps readable; the run failed in step 1, kept up to the failure)" in \
        " ".join(inspected.stdout.split())
    refused = run_cli("diagnose", golden, target)
    assert refused.status == 2
    assert ("the target run failed in step 1, whose ops up to the failure are kept: 2 steps committed; "
            "--allow-incomplete compares those only") in refused.stderr
    diagnosed = run_cli("diagnose", golden, target, "--allow-incomplete", "--format", "json")
    import json

    verdict = json.loads(diagnosed.stdout)["verdict"]
    # the 1e39 is inf in float32: the ReLU's product overflows there, and its NaN ruins the loss the script
    # stops at (before, the script's isfinite check, the last to read it, made it look absorbed: none)
    assert (verdict["class"], verdict["op"], verdict["step"]) == ("overflow", "MLP/act/aten.mul_0", 1)


def test_a_step_the_optimizer_concluded_before_the_failure_is_whole(tmp_path):
    """An exception in the next batch's loading, after the optimizer stepped: the step is whole, not cut."""
    model, optimizer, x, y = make_mlp()
    with pytest.raises(RuntimeError):
        with ptt.dump(tmp_path / "d.h5", mode="stats"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            raise RuntimeError("the data loader failed")
    with open_dump(tmp_path / "d.h5") as dump:
        assert [(s.step, s.cut_short) for s in dump.steps()] == [(0, False)]


def test_zoom_goes_on_with_a_target_run_that_fails_in_a_step_it_kept(tmp_path, run_cli, monkeypatch):
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.chdir(tmp_path)
    script = [sys.executable, root / "tests/torch/failing_script.py"]
    result = run_cli("zoom", "-o", tmp_path / "zoom", "--", *script)
    assert result.status == 0, result.stderr
    warning = ("exited with status 1 in the stats phase, target run, failing in step 1: its steps up to the "
               "failure are compared")
    assert warning in " ".join(result.stderr.split())
    out = " ".join(result.stdout.split())
    assert "Verdict: overflow" in out and "Op: MLP/act/aten.mul_0 (step 1, forward, aten.mul)" in out
    refused = run_cli("zoom", "-o", tmp_path / "early", "--", *script, "early")
    assert refused.status == 2 and "exited with status 1 in the stats phase, target run" in refused.stderr


def test_ctrl_c_inside_a_step_is_no_failure_and_keeps_the_completed_steps_only(tmp_path):
    model, optimizer, x, y = make_mlp()
    with pytest.raises(KeyboardInterrupt):
        with ptt.dump(tmp_path / "d.h5", mode="stats"):
            model(x)
            raise KeyboardInterrupt
    with open_dump(tmp_path / "d.h5") as dump:
        assert not dump.complete and dump.steps() == []


def test_a_golden_run_that_overflows_as_the_target_does_is_told_not_nothing_to_do(tmp_path, run_cli):
    """Both runs blow up alike: nothing to blame on the port, but "nothing to do" would hide that neither trains."""
    golden, target = tmp_path / "golden.h5", tmp_path / "target.h5"
    _run(golden, 1, stop=False)
    _run(target, 1, stop=False)
    result = run_cli("diagnose", golden, target, "--format", "json")
    import json

    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["class"], verdict["op"]) == ("none", None)
    assert verdict["evidence"][1] == ("golden's own run overflows: MLP/act/aten.mul_0 (aten.mul, float32) at step 1 "
                                      "forward holds 45 inf and 35 NaN value(s); its loss is nan at step 1")
    assert verdict["action"].startswith("fix the model in golden's precision first")
    clean = json.loads(run_cli("diagnose", golden, golden, "--format", "json").stdout)["verdict"]
    assert clean["action"].startswith("fix the model in golden's precision first")  # golden against itself too
    healthy = tmp_path / "healthy.h5"
    _run(healthy, None)
    assert json.loads(run_cli("diagnose", healthy, healthy, "--format", "json").stdout)["verdict"]["action"] == \
        "nothing to do"


@pytest.mark.parametrize("same_path_again", [False, True])
def test_a_run_that_fails_before_committing_a_step_leaves_the_previous_dump(tmp_path, same_path_again):
    """A run that raises before its first step is committed (a shape error at the first float op, after an
    integer op opened the step; or the same path given to a second dump inside the first) keeps nothing worth the
    dump of that name: the previous one stays as it was, and no .partial is left."""
    path = tmp_path / "run.h5"
    _run(path, None)
    before = path.read_bytes()
    model, _, x, _ = make_mlp()
    with pytest.raises(Exception):
        with ptt.dump(path, mode="dump"):
            if same_path_again:
                with ptt.dump(path, mode="dump"):
                    model(x)
            torch.tensor([0, 1, 2])  # an integer op: the step opens, nothing is recorded
            model(x[:, :-1])  # the first float op fails
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]


def test_a_target_stopped_by_anomaly_mode_in_backward_is_diagnosed_as_without_it(tmp_path, run_cli):
    """torch.autograd.detect_anomaly() stops the run at the first NaN a backward op returns, after checking each
    gradient with isnan: those boolean checks were taken for the readers that absorb the overflow (verdict none,
    "harmless"), where without anomaly mode the verdict is the backward op that overflowed."""
    import contextlib

    def train(path, simulate):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(1)
        simulated = ptt.simulate_npu("force_fp16", "inf_nan") if simulate else contextlib.nullcontext()
        with contextlib.suppress(RuntimeError), pytest.warns(UserWarning), torch.autograd.detect_anomaly(), \
                simulated, ptt.dump(path):
            for _ in range(2):
                x, y = torch.randn(5, 8, generator=generator), torch.randint(0, 4, (5,), generator=generator)
                optimizer.zero_grad()
                (torch.nn.functional.cross_entropy(model(x), y) * 1e6).backward()  # 1e6 is inf in float16
                optimizer.step()

    train(tmp_path / "golden.h5", False)
    train(tmp_path / "target.h5", True)
    result = run_cli("diagnose", tmp_path / "golden.h5", tmp_path / "target.h5", "--allow-incomplete",
                     "--format", "json")
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["class"], verdict["op"], verdict["direction"]) == ("overflow", "aten.mul_0/aten.mul_0", "backward")


def test_a_run_that_failed_in_backward_is_not_blamed_on_the_update_it_never_reached(tmp_path, run_cli):
    """A target that stops in backward (a gradient hook raising) has no optimizer op in its last step: that is
    the failure, not an optimizer that "updates no parameter" (it was the verdict, kernel_bug at optimizer/SGD)."""
    _run(tmp_path / "golden.h5", None)
    model, optimizer, x, y = make_mlp()

    def stop(grad):
        raise FloatingPointError("gradient checked")

    with pytest.raises(FloatingPointError), ptt.dump(tmp_path / "target.h5", mode="dump", seed=0):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        model.fc1.weight.register_hook(stop)
        optimizer.zero_grad()
        loss.backward()
    result = run_cli("diagnose", tmp_path / "golden.h5", tmp_path / "target.h5", "--allow-incomplete",
                     "--format", "json")
    assert json.loads(result.stdout)["verdict"]["class"] == "none", result.stdout
