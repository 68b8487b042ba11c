"""The zoom region of a statistics comparison, and the commands that re-collect it with full tensors."""

from __future__ import annotations

import json

import pytest

from precision_tool.analysis.zoom import (ZoomRegion, op_module, recollect_command, torch_call, zoom_path,
                                         zoom_region, zoomed_diagnosis)
from precision_tool.compare.report import CompareReport, DumpInfo, OpComparison, TensorRow
from precision_tool.compare.stats import StatsDelta


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


def _module_call(step: int, index: int, name: str, mean_diff: float = 0.0, norm_diff: float = 0.0,
                 magnitude: float = 2.0, direction: str = "forward") -> OpComparison:
    """A module call of a module-level statistics comparison, its output's statistics this far from golden's."""
    delta = StatsDelta(mean_diff, 0.0, norm_diff, 0.0, 0.0, magnitude)
    row = TensorRow(step, index, name, "module.Linear", direction, "output_0", name, "output_0", "float32",
                    "float32", (4, 8), (4, 8), stats=delta)
    return OpComparison(step, index, name, "module.Linear", direction, (row,))


def _stats_report(*ops) -> CompareReport:
    return CompareReport(DumpInfo("stats-golden.h5", mode="stats"), DumpInfo("stats-target.h5", mode="stats"),
                         list(ops))


FLOAT32 = {"framework": "torch", "precision_mode": "golden_float32"}
BF16 = {"framework": "torch", "precision_mode": "autocast_bfloat16"}


def test_two_float32_runs_zoom_where_statistics_first_depart_beyond_float32_rounding():
    report = _stats_report(_module_call(0, 0, "M/fc1", mean_diff=2e-7),  # 1e-7 of its magnitude: rounding
                           _module_call(0, 1, "M/block/act", mean_diff=8e-5),  # 4e-5: another function
                           _module_call(0, 2, "M/block/fc2", norm_diff=1e-3))
    region = zoom_region(report, FLOAT32, FLOAT32)
    assert (region.op, region.step, region.modules, region.ops) == (
        "M/block/act", 0, ("M/block/act",), ("M/fc1", "M/block/aten.*"))  # (the caller's own ops: what act reads)
    assert region.backward  # what it feeds in backward may show it more
    assert region.reasons == ("output_0: statistics 4e-05 from golden's, beyond float32 rounding (1e-05) in two "
                              "float32 runs",)
    assert zoom_region(report, FLOAT32, BF16) is None  # under a 16-bit run's rounding: not told apart
    assert zoom_region(_stats_report(_module_call(0, 0, "M/fc1", mean_diff=2e-7)), FLOAT32, FLOAT32) is None


def test_in_float32_runs_a_departure_under_the_threshold_before_the_first_flagged_op_is_where_to_zoom():
    report = _stats_report(_module_call(0, 0, "M/fc1"), _module_call(0, 1, "M", mean_diff=2e-4),  # the loss
                           _module_call(0, 2, "CrossEntropyLoss", norm_diff=0.1))  # its gradient, say
    region = zoom_region(report, FLOAT32, FLOAT32)
    assert (region.op, region.modules, region.ops) == ("M", (), ("M", "M/fc1", "M/aten.*"))  # the model's own ops
    region = zoom_region(report, BF16, BF16)
    assert (region.op, region.modules, region.ops, region.backward) == (
        "CrossEntropyLoss", (), ("CrossEntropyLoss", "M", "M/fc1", "CrossEntropyLoss/aten.*"), False)


def test_an_op_the_statistics_diagnosis_names_is_where_to_zoom():
    from precision_tool.analysis.results import Verdict

    report = _stats_report(_module_call(0, 0, "M/fc1", norm_diff=0.03), _module_call(0, 1, "M/block/attn"))
    named = Verdict("M/block/attn", "overflow", 0, "forward")  # say, from the step's float status
    region = zoom_region(report, BF16, BF16, verdict=named)
    assert (region.op, region.modules, region.reasons, region.backward, region.named) == (
        "M/block/attn", ("M/block/attn",), ("the statistics' diagnosis names it: overflow",), False, "overflow")
    assert zoom_region(report, BF16, BF16).named == ""
    assert zoom_region(report, BF16, BF16, verdict=Verdict(None, "none", None)).op == "M/fc1"
    assert zoom_region(report, BF16, BF16, verdict=Verdict("M/gone", "kernel_bug", 0, "backward")).op == "M/fc1"


def test_a_backward_call_only_golden_made_zooms_into_the_module_that_calls_it():
    from precision_tool.analysis.results import Verdict
    from precision_tool.compare.matching import Unmatched

    report = _stats_report(_module_call(0, 0, "M/block/attn"), _module_call(0, 1, "M/block", norm_diff=0.03))
    report.unmatched_golden.append(Unmatched("golden", 0, 5, "M/block/attn", "module.Attention", "backward"))
    region = zoom_region(report, BF16, BF16, verdict=Verdict("M/block/attn", "kernel_bug", 0, "backward"))
    assert (region.op, region.direction, region.modules, region.backward) == (
        "M/block/attn", "backward", ("M/block",), True)  # its parent's backward, which the target does run


def test_a_module_whose_backward_only_golden_runs_in_an_op_level_dump_is_the_region_itself():
    """The statistics' diagnosis names a Linear no gradient reaches in the target (its parameters frozen): an
    op-level dump keeps no record of the call, only golden's backward ops inside it. The region was the first
    flagged op, the LayerNorm's backward after it, whose missing input gradient its tensors then blamed."""
    from precision_tool.analysis.results import Verdict
    from precision_tool.compare.matching import Unmatched

    report = _stats_report(_module_call(0, 0, "M/fc1"), _module_call(0, 1, "M/norm", norm_diff=0.03,
                                                                          direction="backward"))
    report.unmatched_golden.append(Unmatched("golden", 0, 9, "M/fc1/aten.addmm_0/aten.mm_0", "aten.mm", "backward"))
    frozen = Verdict("M/fc1", "kernel_bug", 0, "backward", "aten.mm", module="M/fc1")
    region = zoom_region(report, FLOAT32, FLOAT32, verdict=frozen)
    assert (region.op, region.type, region.direction, region.modules, region.backward, region.named) == (
        "M/fc1", "module.Linear", "backward", ("M/fc1",), True, "kernel_bug")
    elsewhere = Verdict("M/fc3", "kernel_bug", 0, "backward", "aten.mm", module="M/fc3")  # (no op of it at all)
    assert zoom_region(report, FLOAT32, FLOAT32, verdict=elsewhere).op == "M/norm"


def test_a_departure_first_seen_after_the_first_step_zooms_into_the_step_before_and_the_optimizer():
    report = _stats_report(_module_call(0, 0, "M/block/fc2"), _module_call(1, 0, "M/fc1"),
                           _module_call(1, 1, "M/block/fc2", norm_diff=0.05))
    region = zoom_region(report, FLOAT32, FLOAT32)
    assert (region.op, region.step, region.steps, region.backward) == ("M/block/fc2", 1, (0, 1), True)
    # with the training loop's own ops (a GradScaler's unscaling: without it the optimizer of a clean float16 run
    # read gradients 65536 times golden's, and "an op golden does not run" was blamed)
    assert region.ops == ("M/fc1", "M/block/aten.*", "optimizer/*", "aten.*")
    assert region.selection()["steps"] == [0, 1]
    from precision_tool.render.zoom_view import region_words

    assert region_words(region) == ("steps 0 and 1, every op in module M/block/fc2, and the ops M/fc1, M/block/aten.*, "
                                    "optimizer/*, aten.*")
    assert torch_call(region, "z.h5") == ('ptt.dump("z.h5", mode="dump", steps=[0, 1], ops=["M/fc1", '
                                          '"M/block/aten.*", "optimizer/*", "aten.*"], modules=["M/block/fc2"])')
    engine = _region(steps=(2, 3), backward=True)
    assert recollect_command("precision-tool collect sensor --mode stats", engine, "z.h5") == (
        "precision-tool collect sensor --mode dump --dump-steps 2,3 --modules norm --ops fc0/MatMul -o z.h5")


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


def test_zoom_says_when_its_region_is_the_op_the_statistics_diagnosis_names(tmp_path):
    from rich.console import Console

    from precision_tool.analysis.results import Diagnosis, Verdict
    from precision_tool.cli.zoom import ZoomRun
    from precision_tool.render.zoom_run import zoom_outcome

    paths = {}
    for name in ("stats-golden", "stats-target", "zoom-golden", "zoom-target"):
        paths[name] = tmp_path / f"{name}.h5"
        paths[name].write_bytes(b"x" * 1024)
    report = _stats_report(_module_call(0, 0, "M/fc1", norm_diff=0.03), _module_call(0, 1, "M/block/attn"))
    region = zoom_region(report, BF16, BF16, verdict=Verdict("M/block/attn", "overflow", 0, "forward"))
    run = ZoomRun({"golden": str(paths["stats-golden"]), "target": str(paths["stats-target"])},
                  {"golden": str(paths["zoom-golden"]), "target": str(paths["zoom-target"])}, region,
                  Diagnosis(Verdict(None, "none", None)))
    console = Console(width=200, record=True)
    console.print(zoom_outcome(run))
    assert ("Zoomed into step 0, every op in module M/block/attn, and the ops M/fc1, M/block/aten.* (forward only): "
            "M/block/attn, which the statistics' diagnosis names (overflow)") in console.export_text()


def test_a_module_that_departs_in_forward_brings_its_callers_own_ops_into_the_region():
    """Module records do not show the ops a module's caller runs itself (an attention's scores and softmax
    between its projections): where the first departing record is a module's forward call, the region records its
    caller's own ops too; not in backward, whose gradients the step's later loss-scale decisions explain."""
    forward = zoom_region(_stats_report(_module_call(0, 0, "M/attn/q"), _module_call(0, 1, "M/attn/out",
                                                                                     norm_diff=0.05)), BF16, BF16)
    assert (forward.modules, forward.ops) == (("M/attn/out",), ("M/attn/q", "M/attn/aten.*"))
    backward = zoom_region(_stats_report(_module_call(0, 0, "M/attn/out", norm_diff=0.05, direction="backward")),
                           BF16, BF16)
    assert (backward.modules, backward.ops) == (("M/attn/out",), ())


def test_where_the_regions_tensors_name_nothing_the_statistics_verdict_stands():
    from precision_tool.analysis.results import Diagnosis, Verdict

    statistics = Verdict("M/fc2/weight/aten.add_0", "kernel_bug", 0, "backward", "aten.add",
                         ("M/fc2/weight/aten.add_0 (aten.add), an op golden does not run, wrote the value it read",),
                         "check M/fc2/weight")
    nothing = ("no op at or below cosine 0.98 and no unhandled overflow",)
    region = Diagnosis(Verdict(None, "none", None, evidence=nothing),
                       notes=["precision mode golden_float32, overflow mode inf_nan"], flagged=0)
    zoomed = zoomed_diagnosis(statistics, region)
    assert zoomed.verdict is statistics and zoomed.flagged == 0
    assert zoomed.notes == [
        "precision mode golden_float32, overflow mode inf_nan",
        "the region's tensors name no culprit (no op at or below cosine 0.98 and no unhandled overflow); it does not "
        "record what the statistics saw M/fc2/weight/aten.add_0 cause beyond it (the ops after it, the optimizer's "
        "step, the loss): the statistics' verdict stands"]
    assert region.verdict.cls == "none"  # (a copy: the region's own diagnosis is left as it was)


def test_where_the_regions_tensors_name_a_culprit_or_the_statistics_none_the_region_is_the_answer():
    from precision_tool.analysis.results import Diagnosis, Verdict

    statistics = Verdict("M/block", "kernel_bug", 0, "forward", "module.Block")
    named = Diagnosis(Verdict("M/block/aten.mean_0", "precision_loss", 0, "forward", "aten.mean"))
    nothing = Diagnosis(Verdict(None, "none", None))
    assert zoomed_diagnosis(statistics, named) is named
    assert zoomed_diagnosis(Verdict(None, "none", None), nothing) is nothing
    assert zoomed_diagnosis(None, nothing) is nothing
    departed = Verdict("M/block", "kernel_bug", 0, "forward", "module.Block", departure_only=True)  # (its outputs
    assert zoomed_diagnosis(departed, nothing) is nothing  # at least 0.1 from golden: the tensors say how far)
