"""`diagnose` names the right op and class on planted faults, and nothing on clean runs."""

import pytest

from precision_tool.analysis import diagnose
from tests.analysis.planted import KernelBug


def verdict_of(dumps):
    golden, target, *rest = dumps
    fusion_off = rest[0] if rest else None
    with golden, target:
        return diagnose(golden, target, fusion_off=fusion_off)


def test_fused_layer_norm_on_offset_readings_is_a_fusion_fault(planted_dumps):
    diagnosis = verdict_of(planted_dumps("sensor", fusion_off=True))
    verdict = diagnosis.verdict
    assert (verdict.op, verdict.cls, verdict.step) == ("norm/LayerNormFused", "fusion", 0)
    assert "LayerNormFusionPass" in verdict.action
    assert [s.name for s in diagnosis.fusion.suspects] == ["norm/LayerNormFused"]
    suspect = diagnosis.fusion.suspects[0]
    assert suspect.fused_error > 1.0 and suspect.unfused_error < 0.05


def test_hand_written_softmax_overflow(planted_dumps):
    diagnosis = verdict_of(planted_dumps("hot_attention"))
    assert (diagnosis.verdict.op, diagnosis.verdict.cls) == ("Exp", "overflow")
    assert "subtract the max before exp" in diagnosis.verdict.action
    assert diagnosis.overflow.first.name == "Exp"


def test_cancellation_in_fp16_is_precision_loss(planted_dumps):
    verdict = verdict_of(planted_dumps("standardize")).verdict
    assert (verdict.op, verdict.cls) == ("Sub", "precision_loss")
    assert '"to-add": ["Sub"]' in verdict.action


def test_output_that_does_not_follow_from_inputs_is_a_kernel_bug(planted_dumps):
    dumps = planted_dumps("plain", hooks=(KernelBug("fc1/MatMulBiasAddGelu"),))
    verdict = verdict_of(dumps).verdict
    assert (verdict.op, verdict.cls) == ("fc1/MatMulBiasAddGelu", "kernel_bug")


@pytest.mark.parametrize("model, mode", [("plain", "force_fp16"), ("plain", "allow_mix_precision"),
                                         ("mlp", "force_fp16"), ("transformer", "force_fp16")])
def test_clean_low_precision_runs_are_not_flagged(planted_dumps, model, mode):
    diagnosis = verdict_of(planted_dumps(model, mode))
    assert diagnosis.verdict.cls == "none"
    assert diagnosis.verdict.op is None


def test_forward_overflow_that_loss_scaling_handled_is_not_the_culprit():
    from precision_tool.analysis.diagnose import handled_by_loss_scaling
    from precision_tool.analysis.results import OverflowEntry, OverflowReport
    from precision_tool.dump.records import StepRecord

    def entry(step, name="loss/aten.mul_0"):
        return OverflowEntry(step, 3, name, "aten.mul", "forward", "float16", False, 1, 0, 0, (), (), "")

    report = OverflowReport([entry(0), entry(1)], 2, [0, 1], [0, 1], [65536.0, 32768.0, 16384.0])
    steps = [StepRecord(0, 1.0, 65536.0, True, True), StepRecord(1, 1.0, 32768.0, True, True),
             StepRecord(2, 1.0, 16384.0, False)]
    assert handled_by_loss_scaling("loss/aten.mul_0", report, steps)
    # still overflowing on the last step: the scale did not cure it
    steps[-1] = StepRecord(2, 1.0, 16384.0, True, True)
    report.entries.append(entry(2))
    assert not handled_by_loss_scaling("loss/aten.mul_0", report, steps)
    # an activation that overflows every step whatever the scale
    assert not handled_by_loss_scaling("never", report, steps)


def test_a_target_that_stopped_early_is_diagnosed_on_the_steps_both_took_with_a_note(tmp_path):
    from precision_tool.dump.reader import open_dump
    from precision_tool.engine.device import golden, npu
    from tests.analysis.conftest import record

    g = record(tmp_path / "g.h5", "mlp", golden(), steps=3)
    t = record(tmp_path / "t.h5", "mlp", npu(precision_mode="allow_mix_precision"), steps=1)
    with open_dump(g) as golden_dump, open_dump(t) as target_dump:
        diagnosis = diagnose(golden_dump, target_dump)
    assert diagnosis.verdict.cls == "none"
    assert "the target stops after step 0; golden's 2 steps (1 to 2) after it have no target step and are not " \
           "compared: the verdict covers the steps both runs took" in diagnosis.notes


def test_an_overflow_verdict_places_its_op_in_the_overflow_views_order():
    """"the first of N" only when it is the first the overflow view lists; an earlier one absorbed or noted
    leaves it at its place (it said "the first of N" of any op named)."""
    from precision_tool.analysis.diagnose import _overflow_evidence
    from precision_tool.analysis.results import OverflowEntry, OverflowReport

    def entry(index, name):
        return OverflowEntry(0, index, name, "aten.exp", "forward", "float16", False, 1, 0, 0, (), (), "")

    report = OverflowReport([entry(3, "mask/aten.mul_0"), entry(9, "attn/aten.exp_0")], 5, [0], [], [1.0])
    head = "(aten.exp, computing in float16) raised the float status at step 0 in forward, "
    assert _overflow_evidence(report.entries[0], report)[0] == \
        f"mask/aten.mul_0 {head}the first of 5 overflowing op execution(s)"
    assert _overflow_evidence(report.entries[1], report)[0] == \
        f"attn/aten.exp_0 {head}overflowing op execution 2 of 5 in execution order"
    assert _overflow_evidence(entry(40, "late/aten.exp_0"), report)[0] == \
        f"late/aten.exp_0 {head}one of 5 overflowing op executions"
