"""The pre-check: each setting of the checklist, intended differences, and the reference's repeatability."""

from __future__ import annotations

import copy
import json

import pytest

from precision_tool.analysis.precheck import DIFFERS, NOT_RECORDED, SAME, SETTING_NAMES, precheck
from precision_tool.errors import ConfigError

GOLDEN = {"model": "mlp", "seed": 0, "batch_size": 32, "optimizer": "sgd", "lr": 0.3, "steps": 2,
          "loss_scale": None, "accelerate_train_mode": None,
          "device": {"device": "golden", "effective_precision_mode": "golden_float32", "overflow_mode": "inf_nan",
                     "fusion": {"all_off": True, "off": []}, "modify_mixlist": {"white": [], "black": [], "gray": []}}}


class Meta:
    def __init__(self, path, metadata):
        self.path, self.metadata = path, metadata


def _target(**changes):
    meta = copy.deepcopy(GOLDEN)
    for key, value in changes.items():
        if key in meta["device"] and key not in meta:
            meta["device"][key] = value
        else:
            meta[key] = value
    return Meta("t.h5", meta)


def _statuses(result):
    return {item.name: item.status for item in result.items}


def test_identical_settings_pass_and_unused_ones_say_so():
    result = precheck(Meta("g.h5", GOLDEN), _target())
    assert result.passed and set(_statuses(result).values()) == {SAME}
    assert {i.name: i.describe() for i in result.items}["loss_scale"] == "same (not used)"
    assert result.summary() == "every recorded setting is the same"


@pytest.mark.parametrize("setting, change", [
    ("precision_mode", {"effective_precision_mode": "allow_fp32_to_fp16"}),
    ("modify_mixlist", {"modify_mixlist": {"white": [], "black": ["Softmax"], "gray": []}}),
    ("loss_scale", {"loss_scale": {"kind": "fixed", "scale": 1024.0}}),
    ("accelerate_train_mode", {"accelerate_train_mode": "fast|step|0.9"}),
    ("boost", {"boost_level": "O2"}),
    ("seed", {"seed": 1}),
    ("batch_size", {"batch_size": 16}),
    ("model", {"model": "cnn"}),
    ("optimizer", {"optimizer": "adam"}),
    ("lr", {"lr": 0.01}),
    ("steps", {"steps": 20}),
])
def test_each_setting_that_differs_fails_unless_expected(setting, change):
    result = precheck(Meta("g.h5", GOLDEN), _target(**change))
    assert [i.name for i in result.items if i.status == DIFFERS] == [setting]
    assert not result.passed and [i.name for i in result.unexpected] == [setting]
    assert result.summary().startswith(f"1 setting differs: {setting} (golden ")
    assert precheck(Meta("g.h5", GOLDEN), _target(**change), expect=(setting,)).passed


def test_device_differences_follow_from_the_device_but_the_precision_mode_must_be_declared():
    npu = _target(device={"device": "npu", "effective_precision_mode": "allow_fp32_to_fp16",
                          "overflow_mode": "saturation", "fusion": {"all_off": False, "off": []},
                          "modify_mixlist": {"white": [], "black": [], "gray": []}})
    result = precheck(Meta("g.h5", GOLDEN), npu)
    assert [i.name for i in result.items if i.status == DIFFERS] == ["device", "precision_mode", "overflow_mode",
                                                                     "fusion_switch"]
    assert [i.name for i in result.unexpected] == ["precision_mode"]
    item = next(i for i in result.items if i.name == "precision_mode")
    assert item.describe() == "differs: golden golden_float32, target allow_fp32_to_fp16"
    assert precheck(Meta("g.h5", GOLDEN), npu, expect=("precision_mode",)).passed


def test_a_setting_one_side_did_not_record_is_said_and_does_not_fail():
    target = _target()
    del target.metadata["optimizer"]
    result = precheck(Meta("g.h5", GOLDEN), target)
    assert _statuses(result)["optimizer"] == NOT_RECORDED and result.passed
    assert next(i for i in result.items if i.name == "optimizer").describe() == "not recorded by target"


def test_unknown_expect_names_are_refused():
    with pytest.raises(ConfigError, match="unknown setting 'precison_mode'"):
        precheck(Meta("g.h5", GOLDEN), _target(), expect=("precison_mode",))
    assert "precision_mode" in SETTING_NAMES


def _collect(run_cli, path, *args):
    result = run_cli("collect", "mlp", "-o", path, "--steps", "2", "--device", "golden", *args)
    assert result.status == 0, result.stderr
    return path


def test_the_command_on_real_runs_exit_statuses_json_and_repeatability(run_cli, tmp_path):
    golden = _collect(run_cli, tmp_path / "g.h5")
    again = _collect(run_cli, tmp_path / "g2.h5")
    other_seed = _collect(run_cli, tmp_path / "g3.h5", "--seed", "1")
    target = _collect(run_cli, tmp_path / "t.h5", "--lr", "0.05", "--optimizer", "momentum")
    failed = run_cli("precheck", golden, target, "--golden2", again, "--format", "json")
    document = json.loads(failed.stdout)
    assert failed.status == 1 and document["unexpected"] == ["optimizer", "lr"]
    assert document["repeatability"]["checked"] and document["repeatability"]["identical"]
    passed = run_cli("precheck", golden, target, "--expect", "optimizer,lr")
    assert passed.status == 0 and "PASSED | the runs differ only where intended" in " ".join(passed.stdout.split())
    not_repeated = run_cli("precheck", golden, golden, "--golden2", other_seed)
    assert not_repeated.status == 1
    assert "the reference does not repeat: step 0 #0" in " ".join(not_repeated.stdout.split())
    bad = run_cli("precheck", golden, target, "--expect", "colour")
    assert bad.status == 2 and "unknown setting 'colour'" in bad.stderr


def test_the_pre_check_is_the_first_section_of_the_diagnosis(run_cli):
    from pathlib import Path

    samples = [Path(__file__).resolve().parents[2] / "sample_dumps" / n for n in ("golden.h5", "npu.h5")]
    out = " ".join(run_cli("diagnose", *samples).stdout.split())
    assert out.index("root cause") < out.index("Pre-check 1 setting differs: precision_mode (golden golden_float32, "
                                               "target force_fp16)") < out.index("Overflow")
    document = json.loads(run_cli("diagnose", *samples, "--format", "json").stdout)
    assert document["precheck"]["unexpected"] == ["precision_mode"]


def test_the_json_of_a_setting_held_as_nan_is_json():
    """A setting recorded as NaN (a loss scale not known yet) was written as a bare NaN, which no JSON reader
    takes; it is null now, as in every other command's JSON, and the document indents by 2 as theirs do."""
    import math
    from pathlib import Path

    from precision_tool.analysis.precheck import PrecheckItem, PrecheckResult
    from precision_tool.render.precheck_view import precheck_json

    items = [PrecheckItem("loss_scale", "loss scale", DIFFERS, math.nan, 1024.0),
             PrecheckItem("seed", "seed", SAME, Path("0"), Path("0"))]
    text = precheck_json(PrecheckResult("g.h5", "t.h5", items))
    document = json.loads(text)
    assert [(i["golden"], i["target"]) for i in document["items"]] == [(None, 1024.0), ("0", "0")]
    assert text.startswith('{\n  "passed": false,')
