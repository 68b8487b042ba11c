import pytest

from precision_tool.dump.reader import open_dump


def test_collect_writes_a_dump_and_says_so_in_one_line(run_cli, tmp_path):
    out = tmp_path / "run.h5"
    result = run_cli("collect", "mlp", "-o", out, "--steps", "2", "--mode", "stats", "--seed", "3")
    assert result.status == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{out}: 2 steps") and "ops" in lines[0]
    with open_dump(out) as dump:
        assert dump.complete and dump.mode == "stats" and dump.metadata["seed"] == 3
        assert dump.metadata["command"].startswith("precision-tool collect mlp --output")
        assert "--mode stats" in dump.metadata["command"]


def test_collect_golden_with_selection(run_cli, tmp_path):
    out = tmp_path / "g.h5"
    result = run_cli("collect", "mlp", "-o", out, "--device", "golden", "--steps", "3", "--dump-steps", "1-2",
                     "--op-types", "MatMul", "--no-backward")
    assert result.status == 0, result.stderr
    with open_dump(out) as dump:
        ops = dump.ops()
        assert dump.role == "golden" and {o.step for o in ops} == {1, 2}
        assert {o.type for o in ops} == {"MatMul"} and {o.direction for o in ops} == {"forward"}


def test_collect_by_module_adds_to_ops_and_is_recorded(run_cli, tmp_path):
    out = tmp_path / "m.h5"
    result = run_cli("collect", "sensor", "-o", out, "--device", "golden", "--steps", "1", "--modules", "norm",
                     "--ops", "head/MatMul", "--no-backward")
    assert result.status == 0, result.stderr
    with open_dump(out) as dump:
        names = [o.name for o in dump.ops()]
        assert names == ["norm/ReduceMean", "norm/Sub", "norm/Square", "norm/ReduceMean_1", "norm/Add",
                         "norm/Rsqrt", "norm/Mul", "norm/Mul_1", "norm/Add_1", "head/MatMul",
                         "norm/gamma/ApplyGradientDescent", "norm/beta/ApplyGradientDescent"]
        assert dump.metadata["selection"] == {"steps": None, "ops": ["head/MatMul"], "modules": ["norm"],
                                              "op_types": None, "backward": False}
        assert "--modules norm" in dump.metadata["command"]


@pytest.mark.parametrize("args, message", [
    (["--mode", "dump,stats"], "cannot be combined"),
    (["--mode", "everything"], "unknown collection mode"),
    (["--dump-steps", "a-b"], "bad step selection"),
    (["--loss-scale", "exponential:x"], "bad loss scale"),
    (["--accelerate-train-mode", "slow|step"], "accelerate_train_mode"),
    (["--overflow-mode", "wrap"], "Invalid value for '--overflow-mode'"),
    (["--steps", "0"], "Invalid value for '--steps'"),
    (["--device", "golden", "--precision-mode", "force_fp16"], "applies to --device npu only"),
    # a learning rate of 0 passed the option and failed in other words; one beyond float32 trained with inf
    (["--lr", "0"], "Invalid value for '--lr': '0' is not in the range 0 to 3.40282e+38, above 0"),
    (["--lr", "1e308"], "Invalid value for '--lr': '1e308' is not in the range 0 to 3.40282e+38"),
])
def test_bad_options_are_one_line_usage_errors(run_cli, tmp_path, args, message):
    out = tmp_path / "bad.h5"
    result = run_cli("collect", "mlp", "-o", out, *args)
    assert result.status == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_unknown_model_and_missing_directory(run_cli, tmp_path):
    result = run_cli("collect", "nonesuch", "-o", tmp_path / "x.h5")
    assert result.status == 2 and "unknown model" in result.stderr
    missing = tmp_path / "no" / "x.h5"
    result = run_cli("collect", "mlp", "-o", missing)
    assert result.status == 2
    expected = f"precision-tool: error: {missing}: cannot create the dump: no directory {missing.parent}"
    assert result.stderr.strip() == expected


def test_missing_fusion_switch_file(run_cli, tmp_path):
    result = run_cli("collect", "mlp", "-o", tmp_path / "x.h5", "--fusion-switch", tmp_path / "none.cfg")
    assert result.status == 2 and "does not exist" in result.stderr


def test_ctrl_c_leaves_an_incomplete_dump_and_exits_130(run_cli, tmp_path, monkeypatch):
    from precision_tool.session import trainer

    real_step = trainer.Session.step

    def step(self):
        if self.next_step == 2:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(trainer.Session, "step", step)
    out = tmp_path / "int.h5"
    result = run_cli("collect", "mlp", "-o", out, "--steps", "5")
    assert result.status == 130
    assert result.stderr == (  # one line: no blank one before it when stderr is not a terminal
        f"precision-tool: interrupted; {out} keeps the 2 of 5 steps it finished, marked incomplete\n")
    with open_dump(out) as dump:
        assert not dump.complete and dump.steps_complete == 2


def test_help_names_every_builtin_model(run_cli):
    from precision_tool.session import MODELS

    text = " ".join(run_cli("collect", "--help").stdout.split())
    for name in MODELS:
        assert name in text


def test_collect_runs_the_rec_sdk_schedule_and_resumes_from_a_checkpoint(run_cli, tmp_path):
    ckpts = tmp_path / "ckpts"
    whole = run_cli("collect", "mlp", "-o", tmp_path / "whole.h5", "--max-steps", "6", "--train-steps", "3",
                    "--save-steps", "2", "--checkpoint-dir", ckpts)
    assert whole.status == 0, whole.stderr
    assert whole.stdout.strip().endswith("eval accuracy 0.543 after step 5, 3 checkpoints written")  # 139/256
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-00000002.h5", "ckpt-00000004.h5", "ckpt-00000006.h5"]
    again = run_cli("collect", "mlp", "-o", tmp_path / "again.h5", "--max-steps", "6", "--save-steps", "2",
                    "--checkpoint-dir", ckpts)
    assert again.status == 2 and not (tmp_path / "again.h5").exists()
    assert again.stderr.strip().endswith("resume from them (if_load, --if-load) or choose an empty directory")
    resumed = run_cli("collect", "mlp", "-o", tmp_path / "resumed.h5", "--max-steps", "6", "--train-steps", "3",
                      "--checkpoint-dir", ckpts, "--save-steps", "2", "--if-load", "--restore-model-version", "2")
    assert resumed.status == 0, resumed.stderr
    assert "4 steps" in resumed.stdout and "resumed from the checkpoint of step 2" in resumed.stdout
    with open_dump(tmp_path / "whole.h5") as w, open_dump(tmp_path / "resumed.h5") as r:
        assert [s.loss for s in w.steps()][2:] == [s.loss for s in r.steps()]
        assert w.metadata["evaluations"] == r.metadata["evaluations"]
        assert r.metadata["resumed_from"] == 2 and r.metadata["schedule"]["save_steps"] == 2
        assert [s.step for s in r.steps()] == [2, 3, 4, 5]
    golden = run_cli("collect", "mlp", "--device", "golden", "-o", tmp_path / "golden.h5", "--max-steps", "6")
    assert golden.status == 0, golden.stderr
    compared = run_cli("compare", tmp_path / "golden.h5", tmp_path / "resumed.h5")  # not taken for a cut-short run
    assert compared.status == 0 and "incomplete" not in compared.stderr + compared.stdout, compared.stderr


@pytest.mark.parametrize("args, message", [
    (["--max-steps", "0", "--train-steps", "0", "--eval-steps", "0"], "cannot all be 0"),
    (["--steps", "4", "--max-steps", "5"], "--steps 4 and --max-steps 5 disagree; give one"),
    (["--save-steps", "2"], "save_steps 2 needs checkpoint_dir"),
    (["--if-load"], "if_load needs checkpoint_dir"),
    (["--max-steps", "-2"], "Invalid value for '--max-steps'"),
    (["--restore-model-version", "1", "--checkpoint-dir", "x"], "restore_model_version needs if_load"),
])
def test_a_bad_schedule_is_one_line_with_exit_2(run_cli, tmp_path, args, message):
    result = run_cli("collect", "mlp", "-o", tmp_path / "x.h5", *args)
    assert result.status == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.h5").exists()
