from dataclasses import dataclass, field

import pytest

from precision_tool.compare.preflight import ERROR, WARNING, Problem, RunMismatch, raise_for_errors, run_problems
from precision_tool.errors import ExitStatus


@dataclass
class Run:
    """What run_problems reads of an opened dump."""

    path: str
    metadata: dict
    complete: bool = True
    steps_complete: int = 3
    being_written: bool = False
    steps: list = field(default_factory=lambda: [0, 1, 2])

    def step_numbers(self):
        return list(self.steps)


MLP = {"model": "mlp", "seed": 0, "steps": 3, "batch_size": 32, "parameters": {"fc1/weight": [16, 64]}}


def golden(**changes):
    return Run("g.h5", {**MLP, "role": "golden", **changes.pop("metadata", {})}, **changes)


def target(**changes):
    return Run("t.h5", {**MLP, "role": "target", **changes.pop("metadata", {})}, **changes)


def codes(problems):
    return [(p.code, p.severity) for p in problems]


def test_runs_of_one_model_have_no_problem():
    assert run_problems(golden(), target()) == []


def test_different_models_are_an_error():
    problems = run_problems(golden(), target(metadata={"model": "cnn"}))
    assert problems == [Problem("different-model", ERROR,
                                "the dumps are of different models: golden 'mlp' (g.h5), target 'cnn' (t.h5)")]


def test_different_parameters_under_one_name_are_an_error():
    problems = run_problems(golden(), target(metadata={"parameters": {"fc1/weight": [16, 32]}}))
    assert codes(problems) == [("different-model", ERROR)]
    assert "first: fc1/weight" in problems[0].message


def test_torch_scripts_of_other_names_are_only_a_warning():
    problems = run_problems(golden(metadata={"framework": "torch", "model": "train_cpu.py"}),
                            target(metadata={"framework": "torch", "model": "train_npu.py"}))
    assert codes(problems) == [("different-model-name", WARNING)]


def test_torch_dumps_of_other_capture_levels_are_an_error():
    """An op-level golden against a module-level target diagnosed the ops the target lacks as a fault ("golden's
    call draws random values where the target's draws none")."""
    torch = {"framework": "torch"}
    problems = run_problems(golden(metadata={**torch, "capture_level": "op"}),
                            target(metadata={**torch, "capture_level": "module"}))
    assert problems == [Problem("different-capture-level", ERROR, "the dumps were captured at different levels: "
                                "golden g.h5 at op level (every aten op), target t.h5 at module level (module calls "
                                "only); collect both at one level (ptt.dump(..., level=...))")]
    assert run_problems(golden(metadata={**torch, "capture_level": "module"}),
                        target(metadata={**torch, "capture_level": "module"})) == []
    assert run_problems(golden(metadata=torch), target(metadata={**torch, "capture_level": "op"})) == []


def test_swapped_roles_are_an_error():
    problems = run_problems(target(), golden())
    assert codes(problems) == [("swapped", ERROR)]
    assert problems[0].message == ("golden and target are swapped: g.h5 is the golden run and t.h5 a target run; "
                                   "give the golden dump first")


def test_an_incomplete_target_is_an_error_unless_allowed():
    killed = target(complete=False, steps_complete=10, steps=list(range(10)), metadata={"steps": 100})
    [problem, *rest] = run_problems(golden(metadata={"steps": 100}), killed)
    assert (problem.code, problem.severity, problem.side) == ("incomplete", ERROR, "target")
    assert problem.message == ("t.h5: the target run is incomplete (killed or failed): 10 of 100 steps committed; "
                               "--allow-incomplete compares those only")
    allowed = run_problems(golden(metadata={"steps": 100}), killed, allow_incomplete=True)
    assert ("incomplete", WARNING) in codes(allowed) and not any(p.is_error for p in allowed)


def test_fewer_steps_than_planned_is_incomplete_even_when_marked_complete():
    problems = run_problems(golden(), target(steps_complete=2, steps=[0, 1]))
    assert codes(problems) == [("incomplete", ERROR)]


def test_a_target_being_written_is_incomplete():
    problems = run_problems(golden(), target(complete=False, steps_complete=1, steps=[0], being_written=True))
    assert problems[0].message.startswith("t.h5: the target run is still being written by another process: 1 of 3")


def test_other_settings_are_warnings_after_the_errors():
    problems = run_problems(golden(), target(metadata={"model": "cnn", "seed": 7, "steps": 5},
                                             steps=[0, 1, 2, 3, 4], steps_complete=5))
    assert codes(problems) == [("different-model", ERROR), ("different-seed", WARNING),
                               ("different-steps", WARNING), ("steps-not-in-golden", WARNING)]
    assert problems[1].message == "the runs differ in seed: golden 0, target 7"
    assert problems[3].message == "2 target steps have no golden step to compare with (first: 3); they are not checked"


def test_in_memory_dumps_without_metadata_pass():
    class Memory:
        path, metadata = "<memory>", {"role": "golden"}

    assert run_problems(Memory(), Memory()) == []


def test_raise_for_errors_raises_the_first_error_and_returns_the_warnings():
    warning = Problem("different-seed", WARNING, "seed")
    assert raise_for_errors([warning]) == [warning]
    with pytest.raises(RunMismatch) as info:
        raise_for_errors([Problem("swapped", ERROR, "swapped!"), warning])
    assert str(info.value) == "swapped!" and info.value.exit_status == ExitStatus.USAGE


@pytest.mark.parametrize("command", ["compare", "check", "diagnose"])
def test_one_file_given_as_golden_and_target_is_warned_of(run_cli, tmp_path, command):
    from pathlib import Path

    golden = Path(__file__).resolve().parents[2] / "sample_dumps" / "golden.h5"
    link = tmp_path / "target.h5"
    link.symlink_to(golden)  # (the same file under another name: passed silently before)
    result = run_cli(command, golden, link)
    assert result.status == 0
    assert result.stderr == (f"precision-tool: warning: golden and target are the same file ({link}): every tensor "
                             "agrees with itself; give the target run's dump\n")
