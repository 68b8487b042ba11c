"""Module-level pairs the CLI meets in the field: mixed modes, other models, empty runs (from a probe)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precision_tool.torch as ptt

pytestmark = pytest.mark.torch


class Net(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.fc1, self.act, self.fc2, self.fc3 = nn.Linear(16, width), nn.GELU(), nn.Linear(width, width), \
            nn.Linear(width, 4)

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))  # (act called twice)


def train(path, mode="stats", bf16=False, fault=False, steps=3, width=32):
    torch.manual_seed(0)
    model = Net(width)
    if fault:  # fc2's output 5 % too large
        original = model.fc2.forward
        model.fc2.forward = lambda x: original(x) * 1.05
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(8 * max(steps, 1), 16, generator=generator), torch.randint(0, 4, (8 * max(steps, 1),),
                                                                                  generator=generator)
    with ptt.dump(path, mode=mode, level="module"):
        for i in range(steps):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(x[i * 8:(i + 1) * 8])
            nn.functional.cross_entropy(out.float(), y[i * 8:(i + 1) * 8]).backward()
            optimizer.step()
    return path


def test_a_golden_with_tensors_and_a_target_with_statistics_name_the_faulty_module(tmp_path, run_cli):
    """Reading a scale off a target kept as statistics asked the dump for its values: "step 0 op 2 output_0: no
    tensor data (statistics only)", exit 2, naming no file."""
    golden = train(tmp_path / "golden.h5", mode="dump")
    target = train(tmp_path / "target.h5", bf16=True, fault=True)
    result = run_cli("diagnose", golden, target, "--format", "json")
    assert result.status == 0, result.stderr
    import json

    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["class"], verdict["op"], verdict["direction"]) == ("kernel_bug", "Net/fc2", "forward")


def test_a_run_that_trained_nothing_under_the_dump_is_refused(tmp_path, run_cli):
    """It got verdict none ("nothing to do") where check refused it."""
    golden = train(tmp_path / "golden.h5")
    empty = train(tmp_path / "empty.h5", steps=0)
    for command in ("diagnose", "check"):
        result = run_cli(command, golden, empty)
        assert (result.status, result.stdout) == (2, "")
        assert result.stderr.strip().splitlines()[-1] == (
            f"precision-tool: error: {empty}: the target run holds no step (nothing ran under the dump, or its "
            "steps= selected none): nothing to compare")


def train_late(path, fault=False):
    """Three steps, the last two recorded (steps=[1, 2])."""
    torch.manual_seed(0)
    model = Net()
    if fault:
        original = model.fc2.forward
        model.fc2.forward = lambda x: original(x) * 1.5
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with ptt.dump(path, mode="stats", level="module", steps=[1, 2]):
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.ones(8, 16)).sum().backward()
            optimizer.step()
    return path


def test_a_step_selection_a_late_starting_dump_lacks_names_it_and_its_steps(tmp_path, run_cli):
    """A dump recorded with steps=[1, 2]: the error named the golden dump, or said "steps 0-1"."""
    golden = train(tmp_path / "golden.h5")
    late = train_late(tmp_path / "late.h5")
    for command in ("compare", "check"):
        result = run_cli(command, golden, late, "--steps", "0")
        assert result.status == 2
        assert result.stderr.strip().splitlines()[-1].endswith(
            f"{late}: no op in --steps 0 (it holds steps 1-2): nothing to {command}")


def test_late_starting_module_level_dumps_say_nothing_was_judged(tmp_path):
    """A float32 pair departing 50 % at fc2 got none: "the difference is accumulated rounding"."""
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    golden, target = train_late(tmp_path / "golden.h5"), train_late(tmp_path / "target.h5", fault=True)
    with open_dump(golden) as g, open_dump(target) as t:
        verdict = diagnose(g, t).verdict
    assert verdict.cls == "none" and verdict.evidence[1] == (
        "these module-level dumps start at step 1 (steps=[1, 2]): a module call is judged at the run's first step "
        "only, where the parameters it reads are golden's, so nothing here was judged")
    assert verdict.action.startswith("collect both runs from step 0 (no steps=)")


def test_runs_of_another_width_say_their_shapes_differ(tmp_path):
    """A golden of hidden width 32 and a target of 64: none, "the difference is accumulated rounding"."""
    from precision_tool.analysis import diagnose
    from precision_tool.dump.reader import open_dump

    golden, target = train(tmp_path / "golden.h5"), train(tmp_path / "target.h5", width=64)
    with open_dump(golden) as g, open_dump(target) as t:
        verdict = diagnose(g, t).verdict
    assert verdict.cls == "none" and verdict.evidence[1] == (
        "27 of the 30 compared ops hold tensors whose shapes differ from golden's (first: Net/fc1 output_0, 8x64 "
        "where golden's is 8x32): other models, batch sizes or sequence lengths, whose values are not compared")


def test_the_shells_check_says_a_run_is_incomplete(tmp_path, run_cli):
    """The batch check refuses an incomplete run (exit 2); the shell's, which judges what it is given, passed
    without a word."""
    paths = []
    for name in ("golden", "target"):
        path = tmp_path / f"{name}.h5"
        torch.manual_seed(0)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(KeyboardInterrupt), ptt.dump(path, mode="stats", level="module"):
            for step in range(3):
                if step == 2:
                    raise KeyboardInterrupt
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "target"):
                    out = model(torch.ones(8, 16))
                out.float().sum().backward()
                optimizer.step()
        paths.append(path.with_name(path.name + ".partial") if not path.exists() else path)
    assert run_cli("check", *paths).status == 2
    result = run_cli("shell", *paths, "-c", "check")
    assert result.status == 0 and "PASSED" in result.stdout
    said = " ".join(result.stdout.split())
    assert f"note: {paths[0]}: the golden run is incomplete (killed or failed): 2 steps committed; only those are " \
           "compared" in said


def test_compare_warns_of_dumps_captured_at_two_levels(tmp_path, run_cli):
    """Only the module calls pair: 123 op records were left unmatched without a word, where check, diagnose and
    the shell's vcs refuse the pair."""
    golden = train(tmp_path / "golden.h5")
    target = tmp_path / "ops.h5"
    torch.manual_seed(0)
    model = Net()
    with ptt.dump(target, mode="stats"):
        model(torch.ones(8, 16)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    result = run_cli("compare", golden, target)
    assert result.status == 0
    assert f"the dumps were captured at different levels: golden {golden} at module level" in \
        " ".join(result.stderr.split())
