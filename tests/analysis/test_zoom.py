"""The zoom region of a statistics comparison, and the commands that re-collect it with full tensors."""

from __future__ import annotations

import json

import pytest

from precision_tool.analysis.zoom import ZoomRegion, op_module, recollect_command, torch_call, zoom_path


def _region(**changes) -> ZoomRegion:
    values = dict(step=3, exec_index=7, op="norm/LayerNormFused", type="LayerNormFused", direction="forward",
                  reasons=(), module="norm", ops=("fc0/MatMul",), modules=("norm",), backward=False,
                  framework="engine")
    return ZoomRegion(**{**values, **changes})


def test_the_module_of_an_op():
    assert op_module("block1/conv1/Conv2D") == "block1/conv1"
    assert op_module("SoftmaxCrossEntropy") == ""
    assert op_module("Model/enc/layers.0/aten.mm_0") == "Model/enc/layers.0"
    assert op_module("Model/fc2/aten.addmm_0/aten.mm_1") == "Model/fc2"  # a backward op: its forward op's module
    assert op_module("aten.mul_0") == ""
    assert op_module("Model/enc", "module.Encoder") == "Model/enc"


def test_where_the_region_goes():
    assert zoom_path("runs/stats-golden.h5", "golden") == "runs/zoom-golden.h5"
    assert zoom_path("npu.h5", "target") == "npu-zoom.h5"
    assert zoom_path("msprobe/step0/", "golden") == "msprobe/step0-zoom.h5"


def test_the_recorded_collect_command_is_rewritten_for_the_region():
    recorded = ("precision-tool collect sensor --output /d/stats.h5 --device npu --steps 4 --mode overflow,stats "
                "--dump-steps 0-3 --ops 'x/*' --ops=y --modules m --op-types MatMul --no-backward --force --seed 1")
    assert recollect_command(recorded, _region(), "out dir/z.h5") == (
        "precision-tool collect sensor --device npu --steps 4 --seed 1 --mode dump --dump-steps 3 --modules norm "
        "--ops fc0/MatMul --no-backward -o 'out dir/z.h5'")
    assert recollect_command("pytest -q", _region(), "z.h5") is None
    assert recollect_command("precision-tool collect 'unclosed", _region(), "z.h5") is None


def test_the_torch_call_for_the_region():
    region = _region(framework="torch", ops=("M/aten.mul_0",), modules=("M/fc2",), backward=True)
    assert torch_call(region, "zoom-golden.h5") == (
        'ptt.dump("zoom-golden.h5", mode="dump", steps=[3], ops=["M/aten.mul_0"], modules=["M/fc2"])')
    assert region.selection() == {"steps": [3], "ops": ["M/aten.mul_0"], "modules": ["M/fc2"], "backward": True}


@pytest.fixture(scope="module")
def sensor_stats(tmp_path_factory):
    from precision_tool.cli.main import main

    folder = tmp_path_factory.mktemp("stats")
    for name, device in (("stats-golden.h5", ["--device", "golden"]), ("stats-target.h5", ["--precision-mode",
                                                                                           "force_fp16"])):
        assert main(["collect", "sensor", "-o", str(folder / name), "--steps", "2", "--mode", "stats", *device]) == 0
    return folder


def test_compare_of_statistics_dumps_names_the_region_and_its_commands(run_cli, sensor_stats):
    golden, target = sensor_stats / "stats-golden.h5", sensor_stats / "stats-target.h5"
    result = run_cli("compare", golden, target, "--format", "json", "-l", "1")
    assert result.status == 0, result.stderr
    zoom = json.loads(result.stdout)["zoom"]
    assert (zoom["op"], zoom["step"], zoom["direction"], zoom["module"]) == ("norm/LayerNormFused", 0, "forward",
                                                                             "norm")
    assert (zoom["modules"], zoom["ops"], zoom["backward"]) == (["norm"], [], False)
    assert zoom["region"] == "step 0, every op in module norm (forward only)"
    assert [side["command"] for side in zoom["recollect"]] == [
        f"precision-tool collect sensor --device golden --steps 2 --mode dump --dump-steps 0 --modules norm "
        f"--no-backward -o {sensor_stats / 'zoom-golden.h5'}",
        f"precision-tool collect sensor --steps 2 --precision-mode force_fp16 --mode dump --dump-steps 0 "
        f"--modules norm --no-backward -o {sensor_stats / 'zoom-target.h5'}"]
    table = run_cli("compare", golden, target, "-l", "1")
    out = " ".join(table.stdout.split())
    assert "Zoom: first divergent op norm/LayerNormFused (LayerNormFused, forward) at step 0" in out
    assert f"then: precision-tool diagnose {sensor_stats / 'zoom-golden.h5'} {sensor_stats / 'zoom-target.h5'}" in out
    vcs = run_cli("shell", golden, target, "-c", "vcs -l 1")
    assert "Zoom: first divergent op norm/LayerNormFused" in " ".join(vcs.stdout.split())


def test_full_dumps_have_no_zoom(run_cli, tmp_path):
    from pathlib import Path

    samples = Path(__file__).resolve().parents[2] / "sample_dumps"
    result = run_cli("compare", samples / "golden.h5", samples / "npu.h5", "--format", "json")
    assert result.status == 0 and json.loads(result.stdout)["zoom"] is None
