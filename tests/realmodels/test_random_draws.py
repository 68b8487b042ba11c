"""Other random draws than golden's (analysis/randomness.py) in statistics dumps, at op and module level, and
the zoom region such a verdict gives; full dumps are among the variations (tests/realmodels/variation.py)."""

from __future__ import annotations

import pytest

from precision_tool.analysis import diagnose
from precision_tool.analysis.zoom import zoom_region
from precision_tool.compare import compare_dumps
from precision_tool.dump.reader import open_dump
from tests.realmodels.variation import Variation, collect, run_variation

pytestmark = [pytest.mark.slow, pytest.mark.torch]

DRAWN = "GPT2LMHeadModel/transformer/drop"  # the embeddings' dropout: the first mask of a step


@pytest.mark.parametrize("target", ["fp32", "bf16"])
def test_other_masks_in_a_statistics_dump_stop_the_scan_at_the_first(target, tmp_path):
    diagnosis, right, said = run_variation(Variation("gpt2", target, dropout=0.1, draws=1), tmp_path, "stats")
    assert right, f"{said}: {diagnosis.verdict.evidence}"
    verdict = diagnosis.verdict
    assert (verdict.op, verdict.step) == (f"{DRAWN}/aten.bernoulli__0", 0)
    assert "(as its statistics show: the dumps keep no values)" in verdict.evidence[0]


@pytest.mark.parametrize("target", ["fp32", "bf16"])
def test_a_dropout_module_with_other_masks_is_named_and_zoom_looks_there(target, tmp_path):
    golden, target_path = collect(Variation("gpt2", target, dropout=0.1, draws=1), tmp_path, "stats", "module")
    with open_dump(golden) as g, open_dump(target_path) as t:
        verdict = diagnose(g, t).verdict
        region = zoom_region(compare_dumps(g, t), g.metadata, t.metadata, verdict=verdict)
    assert (verdict.cls, verdict.op, verdict.type) == ("none", DRAWN, "module.Dropout")
    assert "the same distribution" in verdict.evidence[1]
    assert DRAWN in region.selection()["modules"]


def test_the_same_masks_under_bf16_leave_a_fault_after_them_named(tmp_path):
    # the masks are the same draws in both runs (one seed, one generator): the fault is still found in statistics
    diagnosis, right, said = run_variation(Variation("gpt2", "bf16", "scale", "act", "kernel_bug", dropout=0.1),
                                           tmp_path, "stats")
    assert right, f"{said}: {diagnosis.verdict.evidence}"


def test_compare_and_check_say_what_a_first_flagged_random_draw_means(tmp_path, run_cli):
    golden, target = collect(Variation("gpt2", "fp32", dropout=0.1, draws=1), tmp_path)
    hint = "a random draw: the runs draw other random numbers from here on (dropout masks)"
    compared = run_cli("compare", golden, target)
    assert compared.status == 0 and f"{DRAWN}/aten.bernoulli__0" in compared.stdout
    assert hint in " ".join(compared.stdout.split())
    checked = run_cli("check", golden, target)
    assert checked.status == 1 and hint in " ".join(checked.stdout.split())
    clean = run_cli("check", golden, golden)  # nothing fails: no hint
    assert clean.status == 0 and "random draw" not in clean.stdout


@pytest.mark.parametrize("mode, level", [("stats", "op"), ("stats", "module"), ("dump", "module")])
def test_dropout_on_in_the_target_alone_is_named_at_its_module_in_every_capture(mode, level, tmp_path):
    variation = Variation("gpt2", "fp32", "", "drop", "kernel_bug", "forward", dropout=0.1, golden_eval=True)
    diagnosis, right, said = run_variation(variation, tmp_path, mode, level)
    assert right, f"{said}: {diagnosis.verdict.evidence}"
    assert "dropout is on in one run and off in the other" in diagnosis.verdict.evidence[1]


def test_at_module_level_the_dropout_on_in_one_run_only_is_told_by_its_output_equal_to_its_input(tmp_path):
    variation = Variation("gpt2", "fp32", "", "drop", "kernel_bug", "forward", dropout=0.1, golden_eval=True)
    diagnosis, _, _ = run_variation(variation, tmp_path, "stats", "module")
    assert diagnosis.verdict.evidence[0] == (
        f"in {DRAWN}, the target's call draws random values where golden's draws none (module.Dropout, which "
        "records no ops: its output equals its input in one run and not in the other)")
