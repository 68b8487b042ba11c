"""collect --boost-level / --boost-config, and diagnose naming the boost algorithm a divergence starts in."""

from __future__ import annotations

import json

import pytest

from precision_tool.dump.reader import open_dump


def test_invalid_boost_mode_is_one_line_exit_2(run_cli, tmp_path):
    config = tmp_path / "boost.json"
    config.write_text(json.dumps({"boost": {"mode": "fast"}}))
    out = tmp_path / "x.h5"
    result = run_cli("collect", "cnn", "-o", out, "--boost-config", config)
    assert result.status == 2 and result.stdout == ""
    assert result.stderr == (f"precision-tool: error: {config}: unknown boost mode 'fast'; "
                             "valid: auto, manual, enable_all, disable_all\n")
    assert not out.exists()


def test_invalid_boost_level_is_a_usage_error(run_cli, tmp_path):
    result = run_cli("collect", "cnn", "-o", tmp_path / "x.h5", "--boost-level", "O3")
    assert result.status == 2 and "Invalid value for '--boost-level'" in result.stderr


@pytest.fixture(scope="module")
def cnn_runs(tmp_path_factory):
    """A golden O0 run and an O2 run of cnn, 2 steps each."""
    from precision_tool.collect.run import CollectRequest, run_collect

    root = tmp_path_factory.mktemp("boost")
    paths = {}
    for name, level in (("golden", None), ("o2", "O2")):
        paths[name] = root / f"{name}.h5"
        run_collect(CollectRequest(model="cnn", output=str(paths[name]), device="golden", steps=2,
                                   boost_level=level))
    return paths


def test_collect_records_boost_level_and_config(cnn_runs):
    with open_dump(cnn_runs["o2"]) as dump:
        assert dump.metadata["boost_level"] == "O2"
        boost = dump.metadata["boost"]
        assert boost["active"] == ["less_bn", "grad_freeze"] and boost["grad_freeze"]["freeze_p"] == 0.7
        names = {r.name for r in dump.ops(step=0)}
    assert "boost/fn_head/head/MatMul" in names and "block1/bn1/BatchNorm" not in names
    with open_dump(cnn_runs["golden"]) as dump:
        assert dump.metadata["boost_level"] is None


def test_diagnose_o0_against_o2_names_less_bn(run_cli, cnn_runs):
    result = run_cli("diagnose", cnn_runs["golden"], cnn_runs["o2"], "--format", "json")
    assert result.status == 0, result.stderr
    verdict = json.loads(result.stdout)["verdict"]
    assert verdict["class"] == "boost"
    assert (verdict["op"], verdict["step"], verdict["module"]) == ("block1/bn1/BatchNorm", 0, "block1/bn1")
    assert verdict["evidence"][1].startswith("the runs first differ where less_bn changed the run: less_bn removed "
                                             "block1/bn1/BatchNorm, block2/bn1/BatchNorm")
    assert any(line.startswith("then fn_head:") for line in verdict["evidence"])


def test_diagnose_names_the_first_frozen_step(run_cli, tmp_path):
    config = tmp_path / "freeze.json"
    config.write_text(json.dumps({"boost": {"mode": "manual", "grad_freeze": True},
                                  "grad_freeze": {"param_groups": 2, "freeze_type": 0, "freeze_p": 0.5}}))
    golden, target = tmp_path / "g.h5", tmp_path / "t.h5"
    for path, extra in ((golden, []), (target, ["--boost-config", config])):
        result = run_cli("collect", "mlp", "-o", path, "--device", "golden", "--steps", "3", *extra)
        assert result.status == 0, result.stderr
    result = run_cli("diagnose", golden, target, "--format", "json")
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["class"], verdict["op"], verdict["step"]) == ("boost", "boost/grad_freeze/FreezeIndex", 1)
    assert "grad_freeze froze parameter groups at step 1 (freeze index 1: only 2 of 6 parameters updated)" \
        in verdict["evidence"][1]


def test_diagnose_names_the_fn_head_and_keeps_runs_with_the_same_boost(run_cli, tmp_path):
    config = tmp_path / "less_bn.json"
    config.write_text(json.dumps({"boost": {"mode": "manual", "less_bn": True}, "less_bn": {"gc_flag": False}}))
    paths = [tmp_path / f"{name}.h5" for name in ("g", "t", "t2")]
    for path, extra in zip(paths, ([], ["--boost-config", config], ["--boost-config", config])):
        result = run_cli("collect", "mlp", "-o", path, "--device", "golden", "--steps", "2", *extra)
        assert result.status == 0, result.stderr
    verdict = json.loads(run_cli("diagnose", paths[0], paths[1], "--format", "json").stdout)["verdict"]
    assert (verdict["class"], verdict["op"], verdict["module"]) == ("boost", "head/MatMul", "head")
    assert verdict["evidence"][1].startswith("the runs first differ where fn_head changed the run")
    same = json.loads(run_cli("diagnose", paths[1], paths[2], "--format", "json").stdout)["verdict"]
    assert same["class"] == "none"
