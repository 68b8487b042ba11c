"""`precision-tool replay`: one step of a long run, restored from its checkpoint, dumped on golden and target."""

import json

from precision_tool.collect.replay import DeviceOverrides, ReplayRequest, replay
from precision_tool.dump.reader import open_dump


def _collect(run_cli, tmp_path, *args):
    result = run_cli("collect", *args, "-o", tmp_path / "run.h5", "--checkpoint-dir", tmp_path / "ckpts")
    assert result.status == 0, result.stderr
    return tmp_path / "ckpts"


def test_a_replayed_step_is_the_runs_own_step_and_only_that_step(run_cli, tmp_path):
    ckpts = _collect(run_cli, tmp_path, "mlp", "--device", "npu", "--precision-mode", "force_fp16",
                     "--loss-scale", "dynamic:2**12,2,2", "--steps", "6", "--save-steps", "2")
    result = replay(ReplayRequest(str(ckpts), str(tmp_path / "r"), step=4))
    assert result.step == 4 and result.checkpoint.endswith("ckpt-00000004.h5")
    with open_dump(tmp_path / "run.h5") as run, open_dump(result.target) as target, \
            open_dump(result.golden) as golden:
        original = run.steps()[4]
        (replayed,) = target.steps()
        assert (replayed.step, replayed.loss, replayed.loss_scale) == (4, original.loss, original.loss_scale)
        assert [s.step for s in golden.steps()] == [4] and golden.role == "golden"
        assert target.metadata["device"]["precision_mode"] == "force_fp16"
        assert target.metadata["replay_of"].endswith("ckpt-00000004.h5")
        # the run's own tensors at that step, bit for bit
        first = run.ops(step=4)[0]
        assert first.name == target.ops(step=4)[0].name
        assert run.tensor(4, first.exec_index, "output_0").tobytes() == \
            target.tensor(4, first.exec_index, "output_0").tobytes()


def test_device_settings_can_be_overridden(run_cli, tmp_path):
    ckpts = _collect(run_cli, tmp_path, "mlp", "--device", "npu", "--steps", "2", "--save-steps", "1")
    result = replay(ReplayRequest(str(ckpts), str(tmp_path / "r"), step=1,
                                  overrides=DeviceOverrides(precision_mode="allow_mix_precision_bf16",
                                                            overflow_mode="inf_nan")))
    assert result.target_device["precision_mode"] == "allow_mix_precision_bf16"
    assert result.target_device["overflow_mode"] == "inf_nan"
    assert result.golden_device["device"] == "golden"


def test_replay_diagnoses_the_planted_fusion_fault_at_a_late_step(run_cli, tmp_path):
    ckpts = _collect(run_cli, tmp_path, "sensor", "--precision-mode", "force_fp16", "--steps", "10",
                     "--save-steps", "5", "--mode", "overflow")
    result = run_cli("replay", ckpts, "--step", "5", "-o", tmp_path / "r", "--format", "json")
    assert result.status == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["replay"]["step"] == 5
    verdict = document["diagnosis"]["verdict"]
    assert (verdict["class"], verdict["op"], verdict["step"]) == ("fusion", "norm/LayerNormFused", 5)


def test_bad_replays_are_one_line_and_write_nothing(run_cli, tmp_path):
    missing = run_cli("replay", tmp_path / "none", "-o", tmp_path / "r")  # (it said "holds no checkpoint")
    assert missing.status == 2 and missing.stderr == f"precision-tool: error: {tmp_path / 'none'}: no such directory\n"
    (tmp_path / "empty").mkdir()
    empty = run_cli("replay", tmp_path / "empty", "-o", tmp_path / "r")
    assert empty.status == 2 and "holds no checkpoint" in empty.stderr
    ckpts = _collect(run_cli, tmp_path, "mlp", "--steps", "2", "--save-steps", "1")
    wrong = run_cli("replay", ckpts, "--step", "7", "-o", tmp_path / "r")
    assert wrong.status == 2 and wrong.stderr.strip().endswith("no checkpoint of step 7; it holds steps 1, 2")
    golden_only = run_cli("replay", ckpts, "-o", tmp_path / "r", "--device", "golden", "--overflow-mode", "inf_nan")
    assert golden_only.status == 2 and "applies to an npu target only" in golden_only.stderr
    assert not (tmp_path / "r").exists()
    first = run_cli("replay", ckpts, "-o", tmp_path / "r")
    assert first.status == 0 and first.stdout.startswith("replayed step 2 from ")
    before = (tmp_path / "r" / "target.h5").read_bytes()
    again = run_cli("replay", ckpts, "-o", tmp_path / "r")
    assert again.status == 2 and "already exists" in again.stderr
    assert (tmp_path / "r" / "target.h5").read_bytes() == before
